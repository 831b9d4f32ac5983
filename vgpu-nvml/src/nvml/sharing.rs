//! Sharing settings on NVIDIA GPUs: the compute mode through NVML (`nvmlDeviceGetComputeMode`,
//! `nvmlDeviceSetComputeMode`) and the time slice through `nvidia-smi`, because NVML has no call for it
//! (the upstream DRA driver runs the same command):
//!
//! | setting | how |
//! |---|---|
//! | compute mode | `nvmlDeviceSetComputeMode(device, DEFAULT / PROHIBITED / EXCLUSIVE_PROCESS)` |
//! | time slice | `<nvidia-smi> compute-policy -i <uuid> --set-timeslice <0..3>` ([`NvmlOptions::nvidia_smi`](super::NvmlOptions::nvidia_smi)) |
//!
//! The GPU reset that applies a pending MIG mode ([`vgpu_core::backend::DeviceBackend::reset_gpu`]) runs the
//! same `nvidia-smi`, because NVML has no reset call either: `<nvidia-smi> --gpu-reset -i <uuid>`
//! ([`gpu_reset_args`]). The driver refuses it while any process (a CUDA job, DCGM, `nvidia-persistenced`)
//! holds the GPU; the MIG manager then asks for a node reboot.
//!
//! A failing `nvidia-smi` is a [`BackendError::Library`] whose source, a [`SmiError`], carries the command
//! line, the exit status and the command's output.

use std::{path::Path, process::Command};

use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use vgpu_core::backend::{BackendError, ComputeMode, TimeSlice};

/// `nvidia-smi` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SmiError {
    /// It could not be started.
    #[error("cannot run {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// It exited with a failure.
    #[error("{command} exited with {status}: {output}")]
    Failed {
        /// The command line.
        command: String,
        /// The exit status.
        status: String,
        /// stdout and stderr, trimmed.
        output: String,
    },
}

/// The arguments of `nvidia-smi` that set GPU `uuid`'s time slice.
pub fn time_slice_args(uuid: &str, slice: TimeSlice) -> Vec<String> {
    vec![
        "compute-policy".to_owned(),
        "-i".to_owned(),
        uuid.to_owned(),
        "--set-timeslice".to_owned(),
        slice.smi_value().to_string(),
    ]
}

/// The arguments of `nvidia-smi` that reset GPU `uuid`.
pub fn gpu_reset_args(uuid: &str) -> Vec<String> {
    vec!["--gpu-reset".to_owned(), "-i".to_owned(), uuid.to_owned()]
}

/// Runs `smi args…` (with `LD_PRELOAD=<nvml>` when NVML was loaded from an explicit path, as upstream, so
/// `nvidia-smi` finds the same library) and turns a failure into a [`BackendError::Library`].
pub fn run_smi(smi: &Path, args: &[String], nvml: Option<&Path>) -> Result<(), BackendError> {
    let command = format!("{} {}", smi.display(), args.join(" "));
    let wrap = |source: SmiError| BackendError::Library { operation: "nvidia-smi", source: Box::new(source) };
    // A binary just written (an updated driver, a test's script) may still be open for writing in a child
    // forked elsewhere meanwhile: ETXTBSY passes once that child execs, so retry it briefly.
    let mut tries = 0;
    let output = loop {
        let mut cmd = Command::new(smi);
        cmd.args(args);
        if let Some(library) = nvml {
            let preload = match std::env::var("LD_PRELOAD") {
                Ok(existing) if !existing.is_empty() => format!("{}:{existing}", library.display()),
                _ => library.display().to_string(),
            };
            cmd.env("LD_PRELOAD", preload);
        }
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => {
                break other.map_err(|source| wrap(SmiError::Spawn { command: command.clone(), source }))?;
            }
        }
    };
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let err = String::from_utf8_lossy(&output.stderr);
    if !err.trim().is_empty() {
        if !text.is_empty() {
            text.push_str("; ");
        }
        text.push_str(err.trim());
    }
    Err(wrap(SmiError::Failed { command, status: output.status.to_string(), output: text }))
}

/// Ours → NVML's.
pub fn to_nvml(mode: ComputeMode) -> NvmlComputeMode {
    match mode {
        ComputeMode::Default => NvmlComputeMode::Default,
        ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
        ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
    }
}

/// NVML's → ours (`EXCLUSIVE_THREAD`, removed from the driver, reads as exclusive-process).
pub fn from_nvml(mode: NvmlComputeMode) -> ComputeMode {
    match mode {
        NvmlComputeMode::Default => ComputeMode::Default,
        NvmlComputeMode::Prohibited => ComputeMode::Prohibited,
        NvmlComputeMode::ExclusiveThread | NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn time_slice_command_is_upstreams() {
        assert_eq!(
            time_slice_args("GPU-a", TimeSlice::Medium).join(" "),
            "compute-policy -i GPU-a --set-timeslice 2"
        );
        assert_eq!(gpu_reset_args("GPU-a").join(" "), "--gpu-reset -i GPU-a");
        for mode in [ComputeMode::Default, ComputeMode::Prohibited, ComputeMode::ExclusiveProcess] {
            assert_eq!(from_nvml(to_nvml(mode)), mode);
        }
    }

    #[test]
    fn smi_runs_and_failures_carry_the_output() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("args");
        let smi = dir.path().join("nvidia-smi");
        std::fs::write(
            &smi,
            format!(
                "#!/bin/sh\necho \"$LD_PRELOAD $@\" > {}\n[ \"$3\" = GPU-bad ] && {{ echo 'No devices were found'; exit 6; }}\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        let nvml = Path::new("/drv/libnvidia-ml.so.1");
        run_smi(&smi, &time_slice_args("GPU-a", TimeSlice::Long), Some(nvml)).unwrap();
        let logged = std::fs::read_to_string(&log).unwrap();
        assert!(logged.starts_with("/drv/libnvidia-ml.so.1"), "LD_PRELOAD: {logged}");
        assert!(logged.trim().ends_with(" compute-policy -i GPU-a --set-timeslice 3"), "{logged}");
        let err = run_smi(&smi, &time_slice_args("GPU-bad", TimeSlice::Short), None).unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(
            source.contains("--set-timeslice 1 exited with exit status: 6: No devices were found"),
            "{source}"
        );
        let missing = run_smi(&dir.path().join("absent"), &[], None).unwrap_err();
        assert!(
            std::error::Error::source(&missing).unwrap().to_string().starts_with("cannot run"),
            "{missing}"
        );
    }
}
