//! The shared SM-utilization watcher (gate `SharedSMUtilizationWatcher`, contract §7.3): one node-wide
//! sampler that publishes every GPU's per-process utilization and process lists to
//! `<manager-dir>/watcher/sm_util.config`, so that the in-container limiters (told by `Allocate` through
//! `EXTERNAL_SM_WATCHER_ENABLED=true`, `sm_watcher=1` in `vgpu.config` and the read-only `watcher/`
//! mount) and the device monitor read samples instead of each querying the driver.
//!
//! | step | what |
//! |---|---|
//! | [`SmWatcher::open`] | creates `watcher/` and the file ([`sm_util::FILE_SIZE`] bytes, atomically) unless one of the right size is there; keeps it open for writing |
//! | [`SmWatcher::sample`] | one pass over every GPU with a slot (host index < 16): compute and graphics processes, utilization samples newer than the slot's `last_seen_ts` |
//! | [`SmWatcher::publish`] | rewrites the image in place under a whole-file POSIX write lock (the library's per-device `F_RDLCK` bytes wait for it) |
//! | [`SmWatcher::run`] | `sample` + `publish` every period on a blocking thread until the stop future completes |
//!
//! The file is never replaced once created: readers keep it open (or mapped) across updates. A GPU whose
//! backend call fails gets an empty slot for that pass (logged), never stale samples. The module does not
//! depend on the device-plugin wiring, so the DRA kubelet plugin can run the same watcher.
//!
//! ```
//! use std::sync::Arc;
//! use vgpu_core::{abi::sm_util, backend::mock::MockBackend};
//! use vgpu_node::sm_watcher::SmWatcher;
//!
//! let dir = std::env::temp_dir().join(format!("vgpu-smw-doc-{}", std::process::id()));
//! let yaml = "gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034, processes: [{ pid: 7, usedMemoryMiB: 100 }] }\n\
//!             utilization:\n  - { gpu: 0, pid: 7, timestampUs: 5, smPercent: 40 }\n";
//! let backend = Arc::new(MockBackend::from_yaml_str(yaml)?);
//! let mut watcher = SmWatcher::open(backend, &dir)?;
//! watcher.tick()?;
//! let util = sm_util::read(&dir.join("watcher/sm_util.config"))?;
//! assert_eq!(util.devices[0].samples[0].sm_percent, 40);
//! assert_eq!(util.devices[0].compute[0].used_memory_bytes, Some(100 << 20));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{
    fs::{File, OpenOptions},
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use rustix::fs::{FlockOperation, fcntl_lock};
use vgpu_core::{
    abi::{
        AbiError,
        sm_util::{self, DeviceProcesses, ProcessInfo, SmUtil},
    },
    backend::{BackendError, DeviceBackend, GpuProcess, ProcessKind},
};

/// Default sampling period.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(100);

/// The watcher could not set up or write its file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SmWatcherError {
    /// Creating, opening, reading or writing the file failed.
    #[error(transparent)]
    Abi(#[from] AbiError),
    /// Taking or releasing the file lock failed.
    #[error("{}: {action}: {source}", path.display())]
    Lock {
        /// The file.
        path: PathBuf,
        /// `lock` or `unlock`.
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The device list could not be read.
    #[error("device backend: {0}")]
    Backend(#[from] BackendError),
}

/// The node-wide sampler and writer of `watcher/sm_util.config`.
pub struct SmWatcher {
    backend: Arc<dyn DeviceBackend>,
    path: PathBuf,
    file: File,
    indices: Vec<u32>,
    last_seen: [u64; sm_util::MAX_DEVICE_COUNT],
    scratch: Vec<u8>,
}

impl std::fmt::Debug for SmWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmWatcher")
            .field("path", &self.path)
            .field("gpus", &self.indices)
            .finish_non_exhaustive()
    }
}

fn io<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> AbiError + 'a {
    move |source| AbiError::Io { path: path.to_path_buf(), action, source }
}

impl SmWatcher {
    /// The file under `manager_dir`: `watcher/sm_util.config`.
    pub fn file_path(manager_dir: &Path) -> PathBuf {
        manager_dir.join(sm_util::DIR_NAME).join(sm_util::FILE_NAME)
    }

    /// Creates `<manager_dir>/watcher/` and an empty `sm_util.config` unless a file of the right size is
    /// there, and opens it for writing; reads the GPU indices once (GPUs with index ≥ 16 have no slot).
    pub fn open(backend: Arc<dyn DeviceBackend>, manager_dir: &Path) -> Result<Self, SmWatcherError> {
        let dir = manager_dir.join(sm_util::DIR_NAME);
        std::fs::create_dir_all(&dir).map_err(io(&dir, "create directory"))?;
        let path = Self::file_path(manager_dir);
        let size_ok = std::fs::metadata(&path).is_ok_and(|m| m.len() == sm_util::FILE_SIZE as u64);
        if !size_ok {
            sm_util::create(&path, &SmUtil::default())?;
        }
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(io(&path, "open"))?;
        let indices = backend
            .devices()?
            .iter()
            .map(|d| d.index)
            .filter(|&i| (i as usize) < sm_util::MAX_DEVICE_COUNT)
            .collect();
        Ok(Self {
            backend,
            path,
            file,
            indices,
            last_seen: [0; sm_util::MAX_DEVICE_COUNT],
            scratch: Vec::new(),
        })
    }

    /// The file this watcher writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One pass over every GPU: processes and the utilization samples newer than the previous pass.
    pub fn sample(&mut self) -> SmUtil {
        let mut util = SmUtil::default();
        for &index in &self.indices {
            let i = index as usize;
            let (Some(slot), Some(last_seen)) = (util.devices.get_mut(i), self.last_seen.get_mut(i)) else {
                continue;
            };
            match sample_device(self.backend.as_ref(), index, *last_seen) {
                Ok(d) => {
                    *last_seen = d.last_seen_ts;
                    *slot = d;
                }
                Err(err) => tracing::warn!(gpu = index, %err, "SM watcher: sampling failed; slot left empty"),
            }
        }
        util
    }

    /// Rewrites the file in place with `util` under a whole-file write lock.
    pub fn publish(&mut self, util: &SmUtil) -> Result<(), SmWatcherError> {
        let lock_err = |path: &Path, action| {
            let path = path.to_path_buf();
            move |e: rustix::io::Errno| SmWatcherError::Lock { path, action, source: e.into() }
        };
        fcntl_lock(&self.file, FlockOperation::LockExclusive).map_err(lock_err(&self.path, "lock"))?;
        let written = sm_util::write_in_place(&self.file, &self.path, util, &mut self.scratch);
        let unlocked = fcntl_lock(&self.file, FlockOperation::Unlock).map_err(lock_err(&self.path, "unlock"));
        written?;
        unlocked
    }

    /// [`sample`](Self::sample) then [`publish`](Self::publish).
    pub fn tick(&mut self) -> Result<(), SmWatcherError> {
        let util = self.sample();
        self.publish(&util)
    }

    /// Ticks every `period` (on a blocking thread: the backend and the lock may block) until `stop`
    /// completes. A failed write is logged and retried next period.
    pub async fn run(self, period: Duration, stop: impl Future<Output = ()>) {
        let watcher = Arc::new(std::sync::Mutex::new(self));
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = interval.tick() => {}
            }
            let w = Arc::clone(&watcher);
            let result = tokio::task::spawn_blocking(move || {
                let mut w = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                w.tick()
            })
            .await;
            match result {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(%err, "SM watcher: publishing failed"),
                Err(err) => tracing::warn!(%err, "SM watcher: sampling task failed"),
            }
        }
    }
}

fn info(p: &GpuProcess) -> ProcessInfo {
    ProcessInfo {
        pid: p.pid,
        used_memory_bytes: p.used_memory_bytes,
        gpu_instance_id: 0,
        compute_instance_id: 0,
    }
}

/// One GPU's slot: its processes and the samples newer than `since_us` (the newest sample time becomes
/// the slot's `last_seen_ts`; without new samples it stays `since_us`).
pub fn sample_device(
    backend: &dyn DeviceBackend,
    index: u32,
    since_us: u64,
) -> Result<DeviceProcesses, BackendError> {
    let processes = backend.processes(index)?;
    let mut samples = backend.process_utilization(index, since_us)?;
    samples.truncate(sm_util::MAX_ENTRIES);
    let last_seen_ts = samples.iter().map(|s| s.timestamp_us).fold(since_us, u64::max);
    let (compute, graphics): (Vec<_>, Vec<_>) =
        processes.iter().partition(|p| p.kind == ProcessKind::Compute);
    Ok(DeviceProcesses {
        samples,
        last_seen_ts,
        compute: compute.into_iter().take(sm_util::MAX_ENTRIES).map(info).collect(),
        graphics: graphics.into_iter().take(sm_util::MAX_ENTRIES).map(info).collect(),
    })
}
