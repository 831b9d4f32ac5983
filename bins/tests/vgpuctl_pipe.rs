//! `vgpuctl … | head`: a closed stdout (EPIPE) ends the command cleanly, with no "Broken pipe" panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::process::{Command, Stdio};

/// Runs vgpuctl with stdout a pipe whose read end is already closed, so its first write fails with EPIPE.
fn run_into_closed_pipe(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (child.wait().unwrap(), stderr)
}

#[test]
fn closed_stdout_is_a_clean_exit() {
    let cases: &[&[&str]] = &[
        &["gates", "list"],
        &["gates", "list", "--json"],
        &["gates", "check", "--component", "device-plugin"],
        &["decode", "pod-devices", "main[0_GPU-a_50_4096]"],
        &["simulate", "--nodes", "4", "--pods", "20"],
    ];
    for args in cases {
        let (status, stderr) = run_into_closed_pipe(args);
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        assert!(!stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert!(status.success(), "{args:?} exited with {status}: {stderr}");
    }
}

#[test]
fn reading_one_line_then_closing_is_a_clean_exit() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(["gates", "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{}: {stderr}", output.status);
}
