//! A child process in its own process group, with stdout and stderr in a log file.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, kill_process_group};

/// How long a process gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

pub(crate) struct ManagedProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ManagedProcess {
    /// Starts `program` with `args` in a new process group; output goes to `log`.
    pub(crate) fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> Result<Self> {
        Self::spawn_with_env(name, program, args, &[], log)
    }

    /// [`ManagedProcess::spawn`] with extra environment variables. The log is appended to, so a
    /// restarted process keeps its predecessor's output.
    pub(crate) fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self> {
        Self::spawn_in(name, program, args, env, None, log)
    }

    /// [`ManagedProcess::spawn_with_env`] in the working directory `cwd` (`None`: this process's).
    pub(crate) fn spawn_in(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        cwd: Option<&Path>,
        log: &Path,
    ) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        if let Some(dir) = cwd {
            command.current_dir(dir);
        }
        let child = command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self { name: name.to_owned(), child: Some(child), log: log.to_owned() })
    }

    /// CPU time (user + system, seconds) the process has used so far, from `/proc/<pid>/stat`; `None` when
    /// it has exited or the file does not parse.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold spaces) start at state: utime and stime are 14 and 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // USER_HZ is 100 on Linux for every architecture the kernel exports to user space.
        Some(ticks as f64 / 100.0)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Fails (with the end of its log) if the process has exited.
    pub(crate) fn check_running(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} was stopped", self.name);
        };
        if let Some(status) = child.try_wait()? {
            bail!("{} exited early ({status}); last log lines:\n{}", self.name, log_tail(&self.log, 40));
        }
        Ok(())
    }

    /// SIGKILL to the process group at once (a crash, as far as the process can tell); waits for it.
    pub(crate) fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pgid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
            let _ = kill_process_group(pgid, Signal::KILL);
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGTERM to the process group, SIGKILL after [`TERM_GRACE`]; waits for the process.
    pub(crate) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = i32::try_from(child.id()).ok().and_then(Pid::from_raw);
        let signal = |sig| {
            if let Some(pgid) = pgid {
                // The group may already be gone; that is fine.
                let _ = kill_process_group(pgid, sig);
            }
        };
        if matches!(child.try_wait(), Ok(None)) {
            signal(Signal::TERM);
            let deadline = Instant::now() + TERM_GRACE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Also reaches children that outlived the leader.
        signal(Signal::KILL);
        match child.kill().and_then(|()| child.wait().map(drop)) {
            Err(e) if e.kind() != std::io::ErrorKind::InvalidInput => {
                eprintln!("vgpu-e2e: waiting for {}: {e}", self.name);
            }
            _ => {}
        }
    }
}

impl std::fmt::Debug for ManagedProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedProcess").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file (for error messages).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_kills_the_whole_group_and_reports_early_exit() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sh.log");
        // A shell whose child ignores nothing: both must be gone after stop().
        let mut p = ManagedProcess::spawn(
            "sleeper",
            Path::new("/bin/sh"),
            &["-c".into(), "echo started; sleep 30 & sleep 30".into()],
            &log,
        )
        .unwrap();
        p.check_running().unwrap();
        let started = Instant::now();
        p.stop();
        assert!(started.elapsed() < Duration::from_secs(4));
        assert!(p.check_running().is_err());

        let mut quick = ManagedProcess::spawn(
            "quick",
            Path::new("/bin/sh"),
            &["-c".into(), "echo boom; exit 3".into()],
            &log,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let err = loop {
            match quick.check_running() {
                Err(e) => break e.to_string(),
                Ok(()) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(()) => panic!("sh did not exit"),
            }
        };
        assert!(err.contains("exited early") && err.contains("boom"), "{err}");
    }
}
