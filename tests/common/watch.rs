//! A function binary served by `cargo lambda watch --only-lambda-apis` on 127.0.0.1: the
//! runtime API the binary polls and the invoke API a test posts events to, as Lambda would run
//! it. The ledger's end-to-end tests start the binary this way; each used to spell the start-up
//! out on its own.
//!
//! The binary is started by the test rather than by `cargo lambda watch`, which would build it a
//! second time (the AWS SDK included).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{http, moto::python};

/// The runtime API and the function polling it; both stopped on drop.
pub struct Watched {
    /// The function first, then `cargo lambda watch`, in the order they are stopped.
    processes: Vec<Child>,
    url: String,
    log: PathBuf,
    /// How the function was started, to start it again after it died.
    function: Command,
}

impl Watched {
    /// Starts `cargo lambda watch` on a free port, waits until it listens, then starts `binary`
    /// as the function `name` with the variables Lambda gives a function, and `env`. Both write
    /// to `log`. The name `_` is the one `cargo lambda watch` serves when it starts no function
    /// itself; any other name gets its own runtime path, as with several functions.
    pub fn start(binary: &Path, name: &str, log: PathBuf, env: &[(&str, &str)]) -> Self {
        Self::start_with(binary, name, log, env, &[])
    }

    /// [`start`](Self::start), with more arguments for `cargo lambda watch` (`--timeout`, say).
    pub fn start_with(
        binary: &Path,
        name: &str,
        log: PathBuf,
        env: &[(&str, &str)],
        watch_args: &[&str],
    ) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let file = std::fs::File::create(&log).unwrap();
        let mut api = Command::new(cargo_lambda())
            .args(["lambda", "watch", "--only-lambda-apis", "-A", "127.0.0.1"])
            .args(["-P", &port.to_string()])
            .args(watch_args)
            .current_dir(super::root().join("functions/ledger"))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file.try_clone().unwrap())
            .spawn()
            .expect("cargo lambda starts; run `make test`, which installs it");
        let deadline = Instant::now() + Duration::from_mins(1);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = api.try_wait().unwrap();
            if exited.is_some() || Instant::now() >= deadline {
                let _ = api.kill();
                panic!(
                    "cargo lambda watch did not listen ({exited:?}); see {}",
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let runtime = if name == "_" {
            format!("http://127.0.0.1:{port}/.rt")
        } else {
            format!("http://127.0.0.1:{port}/.rt/{name}")
        };
        let mut command = Command::new(binary);
        command
            .env("AWS_LAMBDA_RUNTIME_API", runtime)
            .env("AWS_LAMBDA_FUNCTION_NAME", name)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let function = match command.spawn() {
            Ok(function) => function,
            Err(error) => {
                let _ = api.kill();
                panic!("the function {} starts: {error}", binary.display());
            }
        };
        Self {
            processes: vec![function, api],
            url: format!("http://127.0.0.1:{port}/2015-03-31/functions/{name}/invocations"),
            log,
            function: command,
        }
    }

    /// Starts the function again when its process has ended (it crashed, or was killed), as
    /// Lambda starts a new execution environment; whether it had to.
    #[allow(dead_code, reason = "not every test binary crashes its function")]
    pub fn restart_if_dead(&mut self) -> bool {
        if self.processes[0].try_wait().unwrap().is_none() {
            return false;
        }
        self.processes[0] = self.function.spawn().expect("the function starts again");
        true
    }

    /// The invoke API's URL for this function.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The file both processes write to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Invokes the function with `event` and returns its answer, which must be a 200 with JSON.
    pub fn invoke(&self, event: &impl serde::Serialize) -> Value {
        invoke(&self.url, event)
    }

    /// Invokes the function with `event`: its answer when it is a 200 with JSON, `None` when the
    /// invocation failed (the function crashed, or ran past `cargo lambda watch`'s timeout).
    #[allow(dead_code, reason = "not every test binary crashes its function")]
    pub fn try_invoke(&self, event: &impl serde::Serialize) -> Option<Value> {
        let body = serde_json::to_vec(event).unwrap();
        let (status, answer) = http::request("POST", &self.url, &body).ok()?;
        (status == 200).then(|| serde_json::from_slice(&answer).ok())?
    }
}

/// Invokes the function at `url` with `event` and returns its answer, which must be a 200 with
/// JSON. Blocking: a test invoking several at once calls it on threads of their own.
pub fn invoke(url: &str, event: &impl serde::Serialize) -> Value {
    let body = serde_json::to_vec(event).unwrap();
    let (status, answer) = http::request("POST", url, &body).expect("the invoke API answers");
    let answer: Value = serde_json::from_slice(&answer).unwrap_or_else(|_| {
        panic!(
            "a JSON answer, got {status}: {}",
            String::from_utf8_lossy(&answer)
        )
    });
    assert_eq!(status, 200, "{answer}");
    answer
}

impl Drop for Watched {
    fn drop(&mut self) {
        for child in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `cargo lambda`: `$CARGO_LAMBDA`, else the one `make test` installs into the venv, else the
/// one on `PATH`.
pub fn cargo_lambda() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_LAMBDA") {
        return path.into();
    }
    let venv = python().with_file_name("cargo-lambda");
    if venv.exists() {
        venv
    } else {
        "cargo-lambda".into()
    }
}
