//! Cold start: the release build of `functions/ledger` against a bare `lambda_runtime`
//! function (`functions/bare`) built the same way, each timed from process start to its first
//! response under `cargo lambda watch --only-lambda-apis` on 127.0.0.1, alternated in one run.
//!
//! The ledger's first response is a real one: moto (started here) holds its lease and ledger
//! tables, the stream `orders` its parent gate reads and its dead-letter queue, and each cold
//! start gets a record it has not seen, so it claims the lease, writes the order and the
//! checkpoint (and, on the shard's very first batch only, asks the stream for its parents: the
//! row then records that it has none). The bare function answers "no failures" without any
//! I/O: the floor of what any Rust function pays. Each process also gets a second invocation,
//! timed on its own, so that the cold start can be split into start-up and the invocation's
//! own work, and the CPU time the process spent up to its first response (all its threads,
//! from `/proc`) is read: on a shared machine wall time swings with the load, CPU time much
//! less. The series with an empty event (`{"Records": []}`), which the ledger answers
//! without any request, are its start-up alone.
//!
//! The root certificates: the ledger trusts the Amazon Trust Services roots compiled in; the
//! series "system roots" set `SSL_CERT_FILE` and `SSL_CERT_DIR` to the system's bundle and
//! directory (what the SDK's own client reads by default), "bundle only" the bundle with an
//! empty directory.
//!
//! The floor is measured twice: `bare` as `lambda_runtime`'s examples write a function
//! (`#[tokio::main]`, a worker thread per CPU), and `bare-current-thread`, the same on tokio's
//! current-thread runtime, which the ledger uses when Lambda hands it one invocation at a time;
//! the ledger's series are reported as multiples of each.
//!
//! The binaries are `target/release/{ledger,bare,bare-current-thread}`; `make bench` builds them first
//! (`cargo build --release -p ledger -p bare`). `COLDSTART_BINARIES` names another directory
//! holding both (another profile's); `COLDSTART_BEFORE` a directory holding an earlier
//! `ledger`, run in the same alternation, for a before-and-after. `COLDSTART_RUNS` (default 20)
//! cold starts of each. `cargo bench --bench coldstart`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::moto::{Moto, create_lease_table, create_queue, create_table, python, unique};
use common::{http, lambda_record, root};
use serde_json::{Value, json};

/// `cargo lambda watch --only-lambda-apis` on a port of its own; stopped on drop.
struct RuntimeApi {
    child: Child,
    port: u16,
}

impl RuntimeApi {
    fn start(log: &Path) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(log).unwrap();
        let mut child = Command::new(cargo_lambda())
            .args(["lambda", "watch", "--only-lambda-apis", "-A", "127.0.0.1"])
            .args(["-P", &port.to_string()])
            .current_dir(root().join("functions/bare"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("cargo lambda starts; `make venv` installs it");
        let deadline = Instant::now() + Duration::from_mins(1);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = child.try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "cargo lambda watch did not listen ({exited:?})"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }

    fn invoke(&self, event: &Value) -> Value {
        let url = format!(
            "http://127.0.0.1:{}/2015-03-31/functions/_/invocations",
            self.port
        );
        let (status, body) = http::request("POST", &url, event.to_string().as_bytes())
            .expect("the invoke API answers");
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        answer
    }
}

impl Drop for RuntimeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cargo-lambda` from `CARGO_LAMBDA`, the repository's `.venv`, or the `PATH`.
fn cargo_lambda() -> PathBuf {
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

/// Where the function binaries are: `COLDSTART_BINARIES` (a directory holding `ledger` and
/// `bare`, such as `target/host-lambda/lambda` for the `lambda` profile), else the target
/// directory's `profile`.
fn binaries(profile: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("COLDSTART_BINARIES") {
        return dir.into();
    }
    let dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    dir.join(profile)
}

/// An event of one order record of the shard, numbered `n`: a record the ledger has not seen
/// when `n` grows.
fn event(n: u64) -> Value {
    json!({ "Records": [lambda_record(
        "orders",
        "shardId-000000000000",
        n,
        &format!("A-{}", n % 10),
        &json!({ "order_id": format!("A-{}", n % 10), "amount_cents": 100, "currency": "EUR" }),
    )] })
}

struct Function {
    name: &'static str,
    /// Whether its events carry a record; an empty event needs no I/O from the ledger, so its
    /// cold start is start-up alone.
    records: bool,
    binary: PathBuf,
    env: Vec<(String, String)>,
    /// Start to first response, per run.
    cold: Vec<Duration>,
    /// The second invocation of the same process, per run.
    warm: Vec<Duration>,
    /// CPU time the process spent up to its first response, every thread, per run: what the
    /// cold start costs, unlike wall time unaffected by other work on the machine.
    cpu: Vec<Duration>,
}

/// The CPU time of every thread of process `pid` so far, from `/proc/<pid>/task/*/schedstat`
/// (nanoseconds on a CPU, the first field; the workspace forbids the `unsafe` of `getrusage`).
fn cpu_time(pid: u32) -> Duration {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process runs");
    let nanos = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

impl Function {
    fn new(name: &'static str, records: bool, binary: PathBuf, env: Vec<(String, String)>) -> Self {
        assert!(
            binary.exists(),
            "{} is missing: `cargo build --release -p ledger -p bare` (make bench does)",
            binary.display()
        );
        Self {
            name,
            records,
            binary,
            env,
            cold: Vec::new(),
            warm: Vec::new(),
            cpu: Vec::new(),
        }
    }

    /// Starts the function against `api`, invokes it twice with fresh records and stops it.
    fn run(&mut self, api: &RuntimeApi, n: &mut u64) {
        let mut next_event = || {
            *n += 1;
            if self.records {
                event(*n)
            } else {
                json!({ "Records": [] })
            }
        };
        let (first_event, second_event) = (next_event(), next_event());
        let start = Instant::now();
        let mut child = Command::new(&self.binary)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "AWS_LAMBDA_RUNTIME_API",
                format!("http://127.0.0.1:{}/.rt", api.port),
            )
            .env("AWS_LAMBDA_FUNCTION_NAME", "_")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", self.binary.display()));
        let first = api.invoke(&first_event);
        self.cold.push(start.elapsed());
        self.cpu.push(cpu_time(child.id()));
        let warm = Instant::now();
        let second = api.invoke(&second_event);
        self.warm.push(warm.elapsed());
        let _ = child.kill();
        let _ = child.wait();
        for answer in [first, second] {
            assert_eq!(
                answer,
                json!({ "batchItemFailures": [] }),
                "{} answered with failures",
                self.name
            );
        }
    }
}

fn percentile(samples: &[Duration], p: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    // `cargo bench` passes `--bench`; under `cargo test` (`make test`) one run of the debug
    // binaries checks that the harness and both functions still work.
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let (profile, runs) = if benchmarking {
        let runs = std::env::var("COLDSTART_RUNS")
            .ok()
            .and_then(|runs| runs.parse().ok())
            .unwrap_or(20);
        ("release", runs)
    } else {
        ("debug", 1)
    };
    let moto = Moto::start(true);
    let (leases, ledger) = (unique("leases"), unique("ledger"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let queue = rt.block_on(async {
        let config = moto.sdk_config(3).await;
        create_lease_table(&config, &leases).await;
        create_table(&config, &ledger, "order_id").await;
        common::kinesis::Stream::create(&config, "orders").await;
        create_queue(&config).await
    });
    let ledger_env = aws(&[
        ("LEASE_TABLE", &leases),
        ("LEDGER_TABLE", &ledger),
        ("DEAD_LETTER_QUEUE_URL", &queue),
        ("AWS_ENDPOINT_URL", &moto.endpoint),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]);
    let dir = binaries(profile);
    let mut functions = series(&dir, &ledger_env);
    let order: Vec<&str> = functions.iter().map(|function| function.name).collect();

    let api = RuntimeApi::start(&root().join("target/coldstart-runtime-api.log"));
    let mut n = 0;
    // One of each first, not counted: the page cache then holds both binaries.
    for function in &mut functions {
        function.run(&api, &mut n);
        function.cold.clear();
        function.warm.clear();
        function.cpu.clear();
    }
    for run in 0..runs {
        // Alternated, in turn going first, so drift and noise hit each alike.
        functions.rotate_left(usize::from(run > 0));
        for function in &mut functions {
            function.run(&api, &mut n);
        }
    }
    drop(api);
    functions.sort_by_key(|function| order.iter().position(|name| *name == function.name));

    report(&functions, &dir, runs);
}

/// The series of `functions/bare`'s `bare-current-thread`.
const CURRENT_THREAD_BARE: &str = "bare, current-thread runtime";

/// Environment variables from pairs of strings.
fn aws(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The series, in the order they are reported: the bare function, then the ledger's.
fn series(dir: &Path, ledger_env: &[(String, String)]) -> Vec<Function> {
    // The SDK's own HTTPS client loads the system's root certificates: the bundle, then every
    // file of the certificate directory (292 here; Amazon Linux 2023, Lambda's image, keeps
    // little beside the bundle there). The ledger trusts the five Amazon Trust Services roots,
    // compiled in, unless `SSL_CERT_FILE`, `SSL_CERT_DIR` or a proxy is set (`ledger::aws`):
    // these series set them to compare. Both variables are set each time: either one alone
    // replaces the system's defaults, and an empty directory alone would leave the client
    // without any root.
    let no_cert_dir = root().join("target/coldstart-empty-cert-dir");
    std::fs::create_dir_all(&no_cert_dir).unwrap();
    let bundle = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ]
    .into_iter()
    .find(|path| Path::new(path).exists())
    .expect("a root certificate bundle");
    let cert_dir = Path::new(bundle).parent().unwrap().display().to_string();
    let with = |extra: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut env = ledger_env.to_vec();
        env.extend(aws(extra));
        env
    };
    let system_roots = with(&[("SSL_CERT_FILE", bundle), ("SSL_CERT_DIR", &cert_dir)]);
    let bundle_only = with(&[
        ("SSL_CERT_FILE", bundle),
        ("SSL_CERT_DIR", &no_cert_dir.display().to_string()),
    ]);
    let ledger = dir.join("ledger");
    let mut functions = vec![Function::new("bare", true, dir.join("bare"), Vec::new())];
    // The same floor on the current-thread runtime, which the ledger runs on when Lambda hands
    // it one invocation at a time; a directory of binaries built before it existed lacks it.
    let current_thread = dir.join("bare-current-thread");
    if current_thread.exists() {
        functions.push(Function::new(
            CURRENT_THREAD_BARE,
            true,
            current_thread,
            Vec::new(),
        ));
    } else {
        println!(
            "{} is missing: its series is left out",
            current_thread.display()
        );
    }
    functions.extend([
        Function::new("ledger", true, ledger.clone(), ledger_env.to_vec()),
        Function::new(
            "ledger, system roots",
            true,
            ledger.clone(),
            system_roots.clone(),
        ),
        Function::new(
            "ledger, empty event",
            false,
            ledger.clone(),
            ledger_env.to_vec(),
        ),
        Function::new(
            "ledger, empty event, system roots",
            false,
            ledger.clone(),
            system_roots,
        ),
        Function::new(
            "ledger, empty event, bundle only",
            false,
            ledger,
            bundle_only,
        ),
    ]);
    // The binaries of an earlier commit, for a before-and-after in the same run.
    if let Some(before) = std::env::var_os("COLDSTART_BEFORE").map(PathBuf::from) {
        let ledger = before.join("ledger");
        assert!(ledger.exists(), "{} is missing", ledger.display());
        functions.push(Function::new(
            "before: ledger",
            true,
            ledger.clone(),
            ledger_env.to_vec(),
        ));
        functions.push(Function::new(
            "before: ledger, empty event",
            false,
            ledger,
            ledger_env.to_vec(),
        ));
    }
    functions
}

/// Prints median and p90 of each series, and the ratios to the bare function.
fn report(functions: &[Function], dir: &Path, runs: usize) {
    println!(
        "cold start of the binaries in {} over {runs} runs of each, alternated (ms)",
        dir.display()
    );
    println!(
        "{:<35} {:>12} {:>10} {:>12} {:>19} {:>16}",
        "function",
        "cold median",
        "cold p90",
        "warm median",
        "cold - warm median",
        "cold CPU median"
    );
    for function in functions {
        let startup: Vec<Duration> = function
            .cold
            .iter()
            .zip(&function.warm)
            .map(|(cold, warm)| cold.saturating_sub(*warm))
            .collect();
        println!(
            "{:<35} {:>12.2} {:>10.2} {:>12.2} {:>19.2} {:>16.2}",
            function.name,
            ms(percentile(&function.cold, 50)),
            ms(percentile(&function.cold, 90)),
            ms(percentile(&function.warm, 50)),
            ms(percentile(&startup, 50)),
            ms(percentile(&function.cpu, 50)),
        );
    }
    let floors: Vec<&Function> = functions
        .iter()
        .filter(|f| f.name.starts_with("bare"))
        .collect();
    for bare in floors {
        for ledger in functions.iter().filter(|f| !f.name.starts_with("bare")) {
            println!(
                "ratio {} / {}, cold median: {:.2} (p90: {:.2}; CPU median: {:.2})",
                ledger.name,
                bare.name,
                ms(percentile(&ledger.cold, 50)) / ms(percentile(&bare.cold, 50)),
                ms(percentile(&ledger.cold, 90)) / ms(percentile(&bare.cold, 90)),
                ms(percentile(&ledger.cpu, 50)) / ms(percentile(&bare.cpu, 50)),
            );
        }
    }
    // The same series of the earlier binaries, when they ran.
    for before in functions.iter().filter(|f| f.name.starts_with("before: ")) {
        let name = &before.name["before: ".len()..];
        if let Some(after) = functions.iter().find(|f| f.name == name) {
            println!(
                "ratio {name}, now / before, cold median: {:.2} (CPU median: {:.2})",
                ms(percentile(&after.cold, 50)) / ms(percentile(&before.cold, 50)),
                ms(percentile(&after.cpu, 50)) / ms(percentile(&before.cpu, 50)),
            );
        }
    }
}
