//! Writing results to stdout without panicking when the reader has gone (`vgpuctl … | head`).
//!
//! `println!` panics with "Broken pipe" when stdout is a closed pipe; here a closed pipe (EPIPE) is a clean
//! end instead: the reader took what it wanted.

use std::io::{self, Write};
use std::process::ExitCode;

/// Writes `text` to the locked stdout and flushes; a closed pipe counts as written.
pub fn write_stdout(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Prints `text` and returns `code`, or reports the write error on stderr and returns failure (1).
pub fn print(text: &str, code: ExitCode) -> ExitCode {
    match write_stdout(text) {
        Ok(()) => code,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// [`print()`] with a newline after `text`.
pub fn print_line(text: &str, code: ExitCode) -> ExitCode {
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    print(&line, code)
}
