//! Running a program whose PID is known before it starts, so a test can prepare what a server will read
//! about its caller (e.g. a fake `/proc/<pid>/cgroup` for the client-mode registry, which authenticates a
//! caller by its PID).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The shell: writes its PID (`$$`) to `$1`, waits until `$2` exists, then `exec`s the rest of its
/// arguments, which keeps the PID.
const SCRIPT: &str =
    r#"echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; while [ ! -e "$2" ]; do sleep 0.02; done; shift 2; exec "$@""#;

/// Runs `program` with `args` (and `env`), first calling `prepare` with the PID the program will have;
/// returns its exit status and output. `scratch` holds the two hand-over files (`<stem>.pid`, `<stem>.go`)
/// and must be writable. Blocking: call it from `spawn_blocking` in async tests.
pub fn run_with_known_pid(
    scratch: &Path,
    stem: &str,
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    prepare: impl FnOnce(u32) -> Result<()>,
) -> Result<Output> {
    let pid_file = scratch.join(format!("{stem}.pid"));
    let go_file = scratch.join(format!("{stem}.go"));
    for stale in [&pid_file, &go_file] {
        if stale.exists() {
            std::fs::remove_file(stale)?;
        }
    }
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("sh")
        .arg(&pid_file)
        .arg(&go_file)
        .arg(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting sh")?;
    let started = Instant::now();
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            break text.trim().parse::<u32>().with_context(|| format!("sh wrote {text:?} as its PID"))?;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            bail!("sh did not write its PID to {} in 20 s", pid_file.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Err(e) = prepare(pid) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e.context(format!("preparing for PID {pid}")));
    }
    std::fs::write(&go_file, "")?;
    child.wait_with_output().context("waiting for the program")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_has_the_pid_prepare_saw() {
        let dir = tempfile::tempdir().unwrap();
        let mut seen = 0;
        let out = run_with_known_pid(
            dir.path(),
            "t",
            Path::new("/bin/sh"),
            &["-c".into(), "echo $$".into()],
            &[],
            |pid| {
                seen = pid;
                Ok(())
            },
        )
        .unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), seen.to_string());
    }
}
