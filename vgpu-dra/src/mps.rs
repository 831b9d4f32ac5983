//! Gate `MPSSupport` (mutually exclusive with `VGPUSupport`, so whole `gpu` devices only): [`MpsMode`] runs
//! one CUDA MPS control daemon per claim whose opaque config asks for `sharing.strategy: MPS`
//! ([`crate::opaque`]), and stops it on Unprepare.
//!
//! # Host process, not a Deployment
//!
//! Upstream creates a Deployment per claim from a template (a privileged pod that `chroot`s into the driver
//! root and runs `nvidia-cuda-mps-control -d`). This plugin starts the daemon itself as a host process
//! through the [`MpsDaemonControl`] trait: no image, namespace, RBAC on Deployments or readiness polling of
//! the API, and the daemon's life follows the checkpoint's host action exactly. [`ProcessMpsDaemon`] is the
//! real implementation, a test fake implements the same trait. The cost: the daemon lives in the plugin's
//! container, so a plugin restart ends it; [`MpsMode::restart_daemons`] starts the daemons of the claims
//! that stay prepared again at start-up (the lead wires it after [`crate::state::DeviceState::with_modes`]).
//!
//! # Files, env and mounts
//!
//! | what | where |
//! |---|---|
//! | daemon directories | `<manager>/mps/<claimUID>/{pipe,shm,log}` (0755; 01777 with `multiUser`) |
//! | daemon env | `CUDA_VISIBLE_DEVICES=<uuids>`, `CUDA_MPS_PIPE_DIRECTORY=<…>/pipe`, `CUDA_MPS_LOG_DIRECTORY=<…>/log` |
//! | daemon shm | with [`ProcessMpsDaemon::unshare`]: started as `unshare --mount -- sh -c 'mount --bind <shm> /dev/shm && exec nvidia-cuda-mps-control -d'`, so its MPS server's `/dev/shm` is the claim's `shm` directory |
//! | daemon start | `nvidia-cuda-mps-control -d`, then `set_default_active_thread_percentage <n>` and `set_default_device_pinned_mem_limit <uuid> <MiB>M` written to the control (`echo … \| nvidia-cuda-mps-control`) |
//! | daemon running | `<pipe>/nvidia-cuda-mps-control.pid` names a live process |
//! | daemon stop | `quit` written to the control, then wait for the pid to end |
//! | GPU compute mode | `EXCLUSIVE_PROCESS` while the claim is prepared (backend [`DeviceBackend::set_compute_mode`]), `DEFAULT` after |
//! | CDI (claim-wide) | env `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`, `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<n>` (when set), `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<uuid>=<MiB>M,…` (when set); mounts `<host manager>/mps/<claimUID>/pipe` → `/tmp/nvidia-mps`, `…/shm` → `/dev/shm` (rw, nosuid, nodev, bind) |
//!
//! Apply is idempotent (a running daemon of the claim is adopted), revert stops the daemon (fine when none
//! runs), restores `DEFAULT` and removes `<manager>/mps/<claimUID>`. A claim's MPS devices must share one
//! `mpsConfig`; MPS on a device published with `allowMultipleAllocations` (gate `ConsumableShares`) or on a
//! MIG device is refused with the reason.

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use vgpu_core::backend::{ComputeMode, DeviceBackend};

use crate::{
    checkpoint::{Checkpoint, ClaimState},
    config::DriverConfig,
    modes::{self, ClaimContext, ClaimMode, ModeEdits, ModeError},
    opaque::{self, MpsConfig, Sharing},
};
use vgpu_core::cdi::Mount;
use vgpu_core::dra::DeviceType;

const MODE: &str = "mps";
/// Where the pipe directory is mounted in containers.
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// Where the shm directory is mounted in containers.
pub const CONTAINER_SHM_DIR: &str = "/dev/shm";
/// The control daemon's pid file inside the pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

/// One GPU of a daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsGpu {
    /// Backend index when planned.
    pub index: u32,
    /// UUID.
    pub uuid: String,
}

/// A claim's MPS control daemon: the recorded host action, enough to start, adopt and stop it after a
/// restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemon {
    /// The claim's UID.
    pub claim: String,
    /// The GPUs the daemon serves, in claim order.
    pub gpus: Vec<MpsGpu>,
    /// `<manager>/mps/<claimUID>` as this process sees it.
    pub root: PathBuf,
    /// The same directory as the container runtime sees it (CDI mount sources).
    pub host_root: PathBuf,
    /// `set_default_active_thread_percentage`.
    pub active_thread_percentage: Option<u8>,
    /// `set_default_device_pinned_mem_limit`: UUID → MiB.
    pub pinned_limits_mib: BTreeMap<String, u64>,
    /// `multiUser`: world-writable directories.
    pub multi_user: bool,
}

impl MpsDaemon {
    /// `<root>/pipe`.
    pub fn pipe_dir(&self) -> PathBuf {
        self.root.join("pipe")
    }

    /// `<root>/shm`.
    pub fn shm_dir(&self) -> PathBuf {
        self.root.join("shm")
    }

    /// `<root>/log`.
    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    /// The daemon's environment.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "CUDA_VISIBLE_DEVICES".into(),
                self.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(","),
            ),
            ("CUDA_MPS_PIPE_DIRECTORY".into(), self.pipe_dir().display().to_string()),
            ("CUDA_MPS_LOG_DIRECTORY".into(), self.log_dir().display().to_string()),
        ]
    }

    /// The control commands written after start, in order.
    pub fn startup_commands(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(p) = self.active_thread_percentage {
            out.push(format!("set_default_active_thread_percentage {p}"));
        }
        for (uuid, mib) in &self.pinned_limits_mib {
            out.push(format!("set_default_device_pinned_mem_limit {uuid} {mib}M"));
        }
        out
    }

    /// The claim-wide CDI edits.
    pub fn edits(&self) -> ModeEdits {
        let mut edits = ModeEdits::default();
        edits.common.env.push(format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"));
        if let Some(p) = self.active_thread_percentage {
            edits.common.env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={p}"));
        }
        if !self.pinned_limits_mib.is_empty() {
            let limits: Vec<String> =
                self.pinned_limits_mib.iter().map(|(u, m)| format!("{u}={m}M")).collect();
            edits.common.env.push(format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={}", limits.join(",")));
        }
        edits.common.mounts.push(Mount::bind(CONTAINER_SHM_DIR, &self.host_root.join("shm"), false));
        edits.common.mounts.push(Mount::bind(CONTAINER_PIPE_DIR, &self.host_root.join("pipe"), false));
        edits
    }
}

/// Starting, finding and stopping MPS control daemons.
pub trait MpsDaemonControl: Send + Sync + std::fmt::Debug {
    /// Whether the daemon of this claim runs.
    fn is_running(&self, daemon: &MpsDaemon) -> Result<bool, std::io::Error>;
    /// Starts the daemon (its directories exist) and writes its start-up commands.
    fn start(&self, daemon: &MpsDaemon) -> Result<(), std::io::Error>;
    /// Stops the daemon; fine when it does not run.
    fn stop(&self, daemon: &MpsDaemon) -> Result<(), std::io::Error>;
}

/// The real [`MpsDaemonControl`]: runs `nvidia-cuda-mps-control` (see the module table).
#[derive(Debug, Clone)]
pub struct ProcessMpsDaemon {
    /// The `nvidia-cuda-mps-control` binary (e.g. `<container driver root>/usr/bin/nvidia-cuda-mps-control`).
    pub binary: PathBuf,
    /// `LD_LIBRARY_PATH` for it (the driver root's library directories), when set.
    pub library_path: Option<String>,
    /// Where `/proc` is (liveness of the pid in the pid file).
    pub proc_root: PathBuf,
    /// How long `stop` waits for the daemon to end after `quit`.
    pub stop_timeout: Duration,
    /// `unshare` (util-linux), when set: the daemon starts in a mount namespace of its own where the
    /// claim's `shm` directory is bind-mounted over `/dev/shm`, so the MPS server it spawns shares memory
    /// with the claim's containers (which get the same directory at `/dev/shm`). Without it the daemon
    /// uses the plugin container's `/dev/shm` and clients only work if that is the same (host IPC).
    pub unshare: Option<PathBuf>,
}

impl ProcessMpsDaemon {
    /// The daemon at `binary`, `/proc`, a 10 s stop limit.
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            library_path: None,
            proc_root: PathBuf::from("/proc"),
            stop_timeout: Duration::from_secs(10),
            unshare: None,
        }
    }

    /// The daemon of the driver mounted at `driver_root` (`--container-driver-root`): the first
    /// `nvidia-cuda-mps-control` of `usr/bin`, `bin`, `usr/local/bin` (else `usr/bin`'s path, failing at
    /// start with that path), `LD_LIBRARY_PATH` of the driver's library directories, and `unshare` from
    /// `PATH` for the private `/dev/shm`.
    pub fn under_driver_root(driver_root: &Path) -> Self {
        let binary = ["usr/bin", "bin", "usr/local/bin"]
            .iter()
            .map(|d| driver_root.join(d).join("nvidia-cuda-mps-control"))
            .find(|p| p.exists())
            .unwrap_or_else(|| driver_root.join("usr/bin/nvidia-cuda-mps-control"));
        let libs: Vec<String> =
            ["usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64", "usr/lib"]
                .iter()
                .map(|d| driver_root.join(d).display().to_string())
                .collect();
        Self {
            library_path: Some(libs.join(":")),
            unshare: Some(PathBuf::from("unshare")),
            ..Self::new(binary)
        }
    }

    /// The program and arguments that start the daemon (`-d`), inside the private mount namespace when
    /// [`ProcessMpsDaemon::unshare`] is set.
    pub fn launch(&self, daemon: &MpsDaemon) -> (PathBuf, Vec<String>) {
        match &self.unshare {
            None => (self.binary.clone(), vec!["-d".to_owned()]),
            Some(unshare) => (
                unshare.clone(),
                vec![
                    "--mount".to_owned(),
                    "--propagation".to_owned(),
                    "private".to_owned(),
                    "--".to_owned(),
                    "sh".to_owned(),
                    "-c".to_owned(),
                    "mount --bind \"$0\" /dev/shm && exec \"$1\" -d".to_owned(),
                    daemon.shm_dir().display().to_string(),
                    self.binary.display().to_string(),
                ],
            ),
        }
    }

    fn command(&self, program: &Path, daemon: &MpsDaemon) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(daemon.env());
        if let Some(path) = &self.library_path {
            cmd.env("LD_LIBRARY_PATH", path);
        }
        cmd
    }

    /// Runs the binary with `args`, `input` on stdin; a failure names the command and its output.
    fn run(&self, daemon: &MpsDaemon, args: &[&str], input: &str) -> Result<String, std::io::Error> {
        self.run_program(&self.binary, daemon, args, input)
    }

    fn run_program(
        &self,
        program: &Path,
        daemon: &MpsDaemon,
        args: &[&str],
        input: &str,
    ) -> Result<String, std::io::Error> {
        let what = format!("{} {}", program.display(), args.join(" "));
        let mut tries = 0;
        let mut child = loop {
            let mut cmd = self.command(program, daemon);
            cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            match cmd.spawn() {
                // A binary just written may still be open for writing in a child forked elsewhere.
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other.map_err(|e| std::io::Error::new(e.kind(), format!("{what}: {e}")))?,
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            // A control that fails before it reads (no daemon) closes its stdin: its exit status and words
            // below are the error, not the broken pipe.
            match stdin.write_all(input.as_bytes()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                other => other?,
            }
        }
        let output = child.wait_with_output()?;
        let text =
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        if !output.status.success() {
            return Err(std::io::Error::other(format!(
                "{what} ({input:?}) exited with {}: {}",
                output.status,
                text.trim()
            )));
        }
        Ok(text)
    }

    fn pid(&self, daemon: &MpsDaemon) -> Option<u32> {
        let text = std::fs::read_to_string(daemon.pipe_dir().join(PID_FILE)).ok()?;
        let pid: u32 = text.trim().parse().ok()?;
        let stat = std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat")).ok()?;
        // `pid (comm) S …`: a zombie (Z) or dead (X) process does not serve.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next())?;
        (!matches!(state, "Z" | "X")).then_some(pid)
    }
}

impl MpsDaemonControl for ProcessMpsDaemon {
    fn is_running(&self, daemon: &MpsDaemon) -> Result<bool, std::io::Error> {
        Ok(self.pid(daemon).is_some())
    }

    fn start(&self, daemon: &MpsDaemon) -> Result<(), std::io::Error> {
        let (program, args) = self.launch(daemon);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_program(&program, daemon, &args, "")?;
        for command in daemon.startup_commands() {
            self.run(daemon, &[], &format!("{command}\n"))?;
        }
        Ok(())
    }

    fn stop(&self, daemon: &MpsDaemon) -> Result<(), std::io::Error> {
        if self.pid(daemon).is_none() {
            return Ok(());
        }
        self.run(daemon, &[], "quit\n")?;
        let deadline = Instant::now() + self.stop_timeout;
        while let Some(pid) = self.pid(daemon) {
            if Instant::now() >= deadline {
                return Err(std::io::Error::other(format!(
                    "the MPS control daemon (pid {pid}) of claim {} did not end within {:?} after quit",
                    daemon.claim, self.stop_timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// The `MPSSupport` mode (see the module docs).
#[derive(Clone)]
pub struct MpsMode {
    backend: Arc<dyn DeviceBackend>,
    control: Arc<dyn MpsDaemonControl>,
    root: PathBuf,
    host_root: PathBuf,
}

impl std::fmt::Debug for MpsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpsMode")
            .field("control", &self.control)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl MpsMode {
    /// The mode: daemons through `control`, compute modes through `backend`, directories under
    /// `<config.manager_dir>/mps` (mounted from `<config.host_manager_dir>/mps`).
    pub fn new(
        backend: Arc<dyn DeviceBackend>,
        control: Arc<dyn MpsDaemonControl>,
        config: &DriverConfig,
    ) -> Self {
        Self {
            backend,
            control,
            root: config.manager_dir.join("mps"),
            host_root: config.host_manager_dir.join("mps"),
        }
    }

    /// Starts (or adopts) the daemon of a recorded action; with `dirs`, creates its directories first.
    fn ensure(&self, daemon: &MpsDaemon) -> Result<(), ModeError> {
        self.check_root(daemon)?;
        let mode = if daemon.multi_user { 0o1777 } else { 0o755 };
        for dir in [daemon.pipe_dir(), daemon.shm_dir(), daemon.log_dir()] {
            make_dir(&dir, mode)?;
        }
        for gpu in &daemon.gpus {
            self.backend.set_compute_mode(self.index_of(gpu), ComputeMode::ExclusiveProcess).map_err(
                |e| ModeError::host(MODE, format!("set GPU {} compute mode EXCLUSIVE_PROCESS", gpu.uuid), e),
            )?;
        }
        let running = self.control.is_running(daemon).map_err(|e| {
            ModeError::host(MODE, format!("check the MPS daemon of claim {}", daemon.claim), e)
        })?;
        if running {
            tracing::info!(claim = %daemon.claim, "MPS control daemon already runs: adopted");
            return Ok(());
        }
        self.control
            .start(daemon)
            .map_err(|e| ModeError::host(MODE, format!("start the MPS daemon of claim {}", daemon.claim), e))
    }

    /// Only `<manager>/mps/<claimUID>` is ever created or removed.
    fn check_root(&self, daemon: &MpsDaemon) -> Result<(), ModeError> {
        let named = daemon.root.file_name().is_some_and(|n| n == daemon.claim.as_str());
        if daemon.root.parent() != Some(self.root.as_path()) || !named || daemon.claim.contains('/') {
            return Err(ModeError::claim(
                MODE,
                format!(
                    "recorded directory {} is not {}/<claimUID>",
                    daemon.root.display(),
                    self.root.display()
                ),
            ));
        }
        Ok(())
    }

    fn index_of(&self, gpu: &MpsGpu) -> u32 {
        self.backend
            .devices()
            .ok()
            .and_then(|d| d.into_iter().find(|g| g.uuid == gpu.uuid).map(|g| g.index))
            .unwrap_or(gpu.index)
    }

    /// Start-up: starts again the daemons of the claims that stay prepared (a plugin restart ended them).
    /// Returns each such claim's UID with the outcome.
    pub fn restart_daemons(&self, checkpoint: &Checkpoint) -> Vec<(String, Result<(), ModeError>)> {
        let mut out = Vec::new();
        for (uid, claim) in checkpoint.claims() {
            if claim.checkpoint_state != ClaimState::PrepareCompleted {
                continue;
            }
            for recorded in claim.host_actions.iter().filter(|a| a.mode == MODE) {
                let result = modes::decode::<MpsDaemon>(MODE, &recorded.action).and_then(|d| self.ensure(&d));
                out.push((uid.clone(), result));
            }
        }
        out
    }
}

/// Creates an MPS directory (the pipe directory is mounted into the claim's containers) with `mode`, refusing
/// a symbolic link planted at `path` rather than changing its target's mode.
fn make_dir(path: &Path, mode: u32) -> Result<(), ModeError> {
    vgpu_core::abi::perms::create_dir_all_mode(path, mode)
        .map_err(|e| ModeError::host(MODE, format!("create {} with mode {mode:o}", path.display()), e))
}

impl ClaimMode for MpsMode {
    fn name(&self) -> &'static str {
        MODE
    }

    fn gate(&self) -> &'static str {
        "MPSSupport"
    }

    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
        let configs = opaque::configs_for(ctx).map_err(|e| ModeError::claim(MODE, e.to_string()))?;
        let mut chosen: Option<(MpsConfig, usize)> = None;
        let mut gpus: Vec<MpsGpu> = Vec::new();
        for device in ctx.devices {
            let Some(applied) = configs.get(&device.cdi_name) else { continue };
            let Some(Sharing::Mps(config)) = applied.config.sharing() else { continue };
            let name = &device.device.name;
            match device.device.kind {
                DeviceType::Gpu if device.device.shared => {
                    return Err(ModeError::claim(
                        MODE,
                        format!(
                            "device {name} is published with allowMultipleAllocations (ConsumableShares): MPS needs the whole GPU"
                        ),
                    ));
                }
                DeviceType::Gpu => {}
                other => {
                    return Err(ModeError::claim(
                        MODE,
                        format!(
                            "device {name} is a {} device: MPS runs on whole gpu devices only",
                            other.as_str()
                        ),
                    ));
                }
            }
            match &chosen {
                Some((first, index)) if first != config => {
                    return Err(ModeError::claim(
                        MODE,
                        format!(
                            "one MPS daemon per claim: device {name} has the mpsConfig of config[{}], other devices that of config[{index}]",
                            applied.index
                        ),
                    ));
                }
                Some(_) => {}
                None => chosen = Some((config.clone(), applied.index)),
            }
            let gpu = &device.device.gpu;
            if !gpus.iter().any(|g| g.uuid == gpu.uuid) {
                gpus.push(MpsGpu { index: gpu.index, uuid: gpu.uuid.clone() });
            }
        }
        let Some((config, _)) = chosen else { return Ok(Vec::new()) };
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        let pinned_limits_mib = config.pinned_limits_mib(&uuids).map_err(|e| ModeError::claim(MODE, e))?;
        let uid = &ctx.claim.uid;
        if uid.is_empty() || uid.contains('/') || uid.starts_with('.') {
            return Err(ModeError::claim(MODE, format!("claim UID {uid:?} cannot name a directory")));
        }
        let daemon = MpsDaemon {
            claim: uid.clone(),
            gpus,
            root: self.root.join(uid),
            host_root: self.host_root.join(uid),
            active_thread_percentage: config.default_active_thread_percentage,
            pinned_limits_mib,
            multi_user: config.multi_user,
        };
        Ok(vec![modes::encode(MODE, &daemon)?])
    }

    fn apply(&self, _ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
        let daemon: MpsDaemon = modes::decode(MODE, action)?;
        self.ensure(&daemon)?;
        Ok(daemon.edits())
    }

    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError> {
        let daemon: MpsDaemon = modes::decode(MODE, action)?;
        self.check_root(&daemon)?;
        self.control.stop(&daemon).map_err(|e| {
            ModeError::host(MODE, format!("stop the MPS daemon of claim {}", daemon.claim), e)
        })?;
        for gpu in &daemon.gpus {
            self.backend.set_compute_mode(self.index_of(gpu), ComputeMode::Default).map_err(|e| {
                ModeError::host(MODE, format!("set GPU {} compute mode DEFAULT", gpu.uuid), e)
            })?;
        }
        match std::fs::remove_dir_all(&daemon.root) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ModeError::host(MODE, format!("remove {}", daemon.root.display()), e)),
        }
    }
}

/// A fake [`MpsDaemonControl`] for tests: records which claims' daemons run, with the commands each got.
#[derive(Debug, Default)]
pub struct FakeMpsDaemons {
    running: std::sync::Mutex<BTreeMap<String, Vec<String>>>,
    starts: std::sync::atomic::AtomicUsize,
    fail_start: std::sync::atomic::AtomicBool,
}

impl FakeMpsDaemons {
    /// The running daemons: claim UID → the start-up commands they got.
    pub fn running(&self) -> BTreeMap<String, Vec<String>> {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// How many daemons were started so far (adopted ones are not started again).
    pub fn starts(&self) -> usize {
        self.starts.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Makes every later start fail (as a missing `nvidia-cuda-mps-control` would) until set back.
    pub fn fail_starts(&self, fail: bool) {
        self.fail_start.store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    /// Ends every daemon as a plugin restart would.
    pub fn kill_all(&self) {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }
}

impl MpsDaemonControl for FakeMpsDaemons {
    fn is_running(&self, daemon: &MpsDaemon) -> Result<bool, std::io::Error> {
        Ok(self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(&daemon.claim))
    }

    fn start(&self, daemon: &MpsDaemon) -> Result<(), std::io::Error> {
        if self.fail_start.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("nvidia-cuda-mps-control: not found (fake)"));
        }
        if !daemon.pipe_dir().is_dir() || !daemon.shm_dir().is_dir() || !daemon.log_dir().is_dir() {
            return Err(std::io::Error::other("the daemon's directories do not exist"));
        }
        self.starts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(daemon.claim.clone(), daemon.startup_commands());
        Ok(())
    }

    fn stop(&self, daemon: &MpsDaemon) -> Result<(), std::io::Error> {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&daemon.claim);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn daemon(root: &Path) -> MpsDaemon {
        MpsDaemon {
            claim: "uid-1".into(),
            gpus: vec![MpsGpu { index: 0, uuid: "GPU-a".into() }, MpsGpu { index: 1, uuid: "GPU-b".into() }],
            root: root.join("mps/uid-1"),
            host_root: PathBuf::from("/host/mps/uid-1"),
            active_thread_percentage: Some(40),
            pinned_limits_mib: BTreeMap::from([("GPU-a".into(), 1024), ("GPU-b".into(), 512)]),
            multi_user: false,
        }
    }

    #[test]
    fn make_dir_sets_the_mode_and_refuses_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("mps/uid-1/pipe");
        make_dir(&pipe, 0o1777).unwrap();
        assert_eq!(std::fs::metadata(&pipe).unwrap().permissions().mode() & 0o7777, 0o1777);

        let outside = tempfile::tempdir().unwrap();
        std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let log = dir.path().join("mps/uid-1/log");
        std::os::unix::fs::symlink(outside.path(), &log).unwrap();
        let e = make_dir(&log, 0o1777).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(&log.display().to_string()), "{text}");
        assert!(
            matches!(&e, ModeError::Host { source, .. } if matches!(
                source.downcast_ref::<vgpu_core::abi::perms::PermsError>(),
                Some(vgpu_core::abi::perms::PermsError::Symlink { .. })
            )),
            "{e:?}"
        );
        assert_eq!(std::fs::metadata(outside.path()).unwrap().permissions().mode() & 0o7777, 0o700);
    }

    #[test]
    fn env_commands_and_edits() {
        let d = daemon(Path::new("/m"));
        assert_eq!(d.env()[0], ("CUDA_VISIBLE_DEVICES".into(), "GPU-a,GPU-b".into()));
        assert_eq!(d.env()[1].1, "/m/mps/uid-1/pipe");
        assert_eq!(
            d.startup_commands(),
            [
                "set_default_active_thread_percentage 40",
                "set_default_device_pinned_mem_limit GPU-a 1024M",
                "set_default_device_pinned_mem_limit GPU-b 512M"
            ]
        );
        let e = d.edits();
        assert_eq!(
            e.common.env,
            [
                "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-a=1024M,GPU-b=512M"
            ]
        );
        assert_eq!(e.common.mounts[0].host_path, "/host/mps/uid-1/shm");
        assert_eq!(e.common.mounts[1].container_path, "/tmp/nvidia-mps");
    }

    /// A stand-in for `nvidia-cuda-mps-control`: `-d` starts a background process and writes its pid file;
    /// without arguments it appends stdin to `<log>/control.log` and on `quit` ends the background process.
    const FAKE: &str = r#"#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "$CUDA_VISIBLE_DEVICES" > "$CUDA_MPS_LOG_DIRECTORY/visible"
  sleep 300 > /dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  exit 0
fi
[ -f "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
while read -r line; do
  echo "$line" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  if [ "$line" = quit ]; then
    kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"
    rm -f "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  fi
done
"#;

    #[test]
    fn the_launch_can_give_the_daemon_the_claims_shm() {
        let d = daemon(Path::new("/m"));
        let plain = ProcessMpsDaemon::new("/drv/usr/bin/nvidia-cuda-mps-control");
        assert_eq!(
            plain.launch(&d),
            (PathBuf::from("/drv/usr/bin/nvidia-cuda-mps-control"), vec!["-d".to_owned()])
        );
        let private = ProcessMpsDaemon::under_driver_root(Path::new("/drv"));
        let (program, args) = private.launch(&d);
        assert_eq!(program, PathBuf::from("unshare"));
        assert_eq!(
            args.join(" "),
            "--mount --propagation private -- sh -c mount --bind \"$0\" /dev/shm && exec \"$1\" -d /m/mps/uid-1/shm /drv/usr/bin/nvidia-cuda-mps-control"
        );
        assert!(private.library_path.unwrap().starts_with("/drv/usr/lib64:"));
    }

    /// Where `unshare --mount` works (root, util-linux), the daemon started through it writes into the
    /// claim's `shm` directory when it writes `/dev/shm`; elsewhere the test says so and checks nothing.
    #[test]
    fn with_unshare_the_daemons_dev_shm_is_the_claims_shm() {
        let usable = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "true"])
            .status()
            .is_ok_and(|s| s.success());
        if !usable {
            eprintln!("unshare --mount is not permitted here: the private /dev/shm is not exercised");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("nvidia-cuda-mps-control");
        let script = FAKE.replacen("  sleep 300", "  touch /dev/shm/written-by-the-daemon\n  sleep 300", 1);
        std::fs::write(&binary, script).unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        let control =
            ProcessMpsDaemon { unshare: Some(PathBuf::from("unshare")), ..ProcessMpsDaemon::new(&binary) };
        let d = daemon(dir.path());
        for sub in [d.pipe_dir(), d.shm_dir(), d.log_dir()] {
            std::fs::create_dir_all(sub).unwrap();
        }
        control.start(&d).unwrap();
        assert!(control.is_running(&d).unwrap());
        assert!(d.shm_dir().join("written-by-the-daemon").exists());
        assert!(!Path::new("/dev/shm/written-by-the-daemon").exists(), "the plugin's /dev/shm is untouched");
        control.stop(&d).unwrap();
        assert!(!control.is_running(&d).unwrap());
    }

    #[test]
    fn the_process_control_starts_configures_and_stops_a_real_process() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("nvidia-cuda-mps-control");
        std::fs::write(&binary, FAKE).unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        let control = ProcessMpsDaemon::new(&binary);
        let d = daemon(dir.path());
        for sub in [d.pipe_dir(), d.shm_dir(), d.log_dir()] {
            std::fs::create_dir_all(sub).unwrap();
        }
        assert!(!control.is_running(&d).unwrap());
        control.stop(&d).unwrap(); // nothing runs: fine
        control.start(&d).unwrap();
        assert!(control.is_running(&d).unwrap());
        assert_eq!(std::fs::read_to_string(d.log_dir().join("visible")).unwrap().trim(), "GPU-a,GPU-b");
        control.stop(&d).unwrap();
        assert!(!control.is_running(&d).unwrap());
        let log = std::fs::read_to_string(d.log_dir().join("control.log")).unwrap();
        assert_eq!(
            log.lines().collect::<Vec<_>>(),
            [
                "set_default_active_thread_percentage 40",
                "set_default_device_pinned_mem_limit GPU-a 1024M",
                "set_default_device_pinned_mem_limit GPU-b 512M",
                "quit"
            ]
        );
        // A failing control command names the command and the tool's words.
        let err = control.run(&d, &[], "get_server_list\n").unwrap_err().to_string();
        assert!(
            err.contains("Cannot find MPS control daemon process") && err.contains("get_server_list"),
            "{err}"
        );
    }
}
