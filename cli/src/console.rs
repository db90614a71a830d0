//! Talking to the operator: a confirmation before a write, and a progress line while a long
//! scan or import runs.
//!
//! The progress line goes to standard error and only when it is a terminal, so that scripts
//! reading standard output (`--json`) and logs of automated runs stay clean.

use std::io::{BufRead, IsTerminal, Write};

/// Asks `question` on `out` and reads the answer from `input`: only `yes` (or `y`) goes on.
/// An empty input (no terminal, end of file) answers no.
///
/// # Errors
///
/// Reading the answer or writing the question failed.
///
/// ```
/// use kinesis_checkpoint_cli::console::confirm;
///
/// let mut out = Vec::new();
/// assert!(confirm("Move it?", &mut "yes\n".as_bytes(), &mut out)?);
/// assert!(!confirm("Move it?", &mut "no\n".as_bytes(), &mut out)?);
/// assert!(!confirm("Move it?", &mut "".as_bytes(), &mut out)?);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn confirm(
    question: &str,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> std::io::Result<bool> {
    write!(out, "{question} Type 'yes' to go on: ")?;
    out.flush()?;
    let mut answer = String::new();
    input.read_line(&mut answer)?;
    let yes = matches!(answer.trim().to_ascii_lowercase().as_str(), "yes" | "y");
    if !yes {
        writeln!(out)?;
    }
    Ok(yes)
}

/// A one-line progress counter on standard error, redrawn in place; silent when standard error
/// is not a terminal.
///
/// ```
/// use kinesis_checkpoint_cli::console::Progress;
///
/// let mut progress = Progress::new("rows read");
/// progress.set(10);
/// progress.done();
/// ```
#[derive(Debug)]
pub struct Progress {
    label: &'static str,
    shown: bool,
    enabled: bool,
}

impl Progress {
    /// A counter of `label`.
    ///
    /// ```
    /// # use kinesis_checkpoint_cli::console::Progress;
    /// let progress = Progress::new("shards checked");
    /// ```
    #[must_use]
    pub fn new(label: &'static str) -> Self {
        Self {
            label,
            shown: false,
            enabled: std::io::stderr().is_terminal(),
        }
    }

    /// Shows `count` so far.
    ///
    /// ```
    /// # use kinesis_checkpoint_cli::console::Progress;
    /// Progress::new("rows read").set(3);
    /// ```
    pub fn set(&mut self, count: usize) {
        if self.enabled {
            eprint!("\r{count} {}", self.label);
            self.shown = true;
        }
    }

    /// Shows `count` of `total`.
    ///
    /// ```
    /// # use kinesis_checkpoint_cli::console::Progress;
    /// Progress::new("rows copied").of(3, 10);
    /// ```
    pub fn of(&mut self, count: usize, total: usize) {
        if self.enabled {
            eprint!("\r{count}/{total} {}", self.label);
            self.shown = true;
        }
    }

    /// Ends the line.
    ///
    /// ```
    /// # use kinesis_checkpoint_cli::console::Progress;
    /// Progress::new("rows read").done();
    /// ```
    pub fn done(&mut self) {
        if self.shown {
            eprintln!();
            self.shown = false;
        }
    }
}
