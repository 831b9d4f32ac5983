//! `pu.lock`: the node-wide Prepare/Unprepare lock (contract §1.5): an exclusive `flock(2)` on
//! `<plugins-dir>/<driver>/pu.lock`, so two plugin processes (an old and a new pod during a rolling update)
//! never prepare or unprepare at the same time. Acquiring waits at most [`LOCK_TIMEOUT`](crate::config::LOCK_TIMEOUT)
//! (10 s), polling every [`POLL`]; the lock is released when the [`PuLock`] guard drops (the file is closed).
//!
//! ```
//! use std::time::Duration;
//! use vgpu_dra::lock::PuLock;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), vgpu_dra::lock::LockError> {
//! let dir = tempfile::tempdir().map_err(|e| vgpu_dra::lock::LockError::Io { path: ".".into(), source: e })?;
//! let path = dir.path().join("pu.lock");
//! let held = PuLock::acquire(&path, Duration::from_secs(1)).await?;
//! let err = PuLock::acquire(&path, Duration::from_millis(100)).await.unwrap_err();
//! assert!(err.to_string().contains("timed out after 100ms"));
//! drop(held);
//! PuLock::acquire(&path, Duration::from_millis(100)).await?;
//! # Ok(())
//! # }
//! ```

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rustix::fs::{FlockOperation, flock};

/// How often a held lock is tried again.
pub const POLL: Duration = Duration::from_millis(20);

/// The lock could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock file could not be opened or created.
    #[error("prepare/unprepare lock {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Another holder kept it past the limit.
    #[error("prepare/unprepare lock {path}: timed out after {waited:?} (another plugin process holds it)")]
    Timeout {
        /// The lock file.
        path: PathBuf,
        /// The limit.
        waited: Duration,
    },
}

/// A held `pu.lock` (released on drop).
#[derive(Debug)]
pub struct PuLock {
    _file: std::fs::File,
}

impl PuLock {
    /// Opens (creating, mode 0600) and exclusively locks `path`, waiting at most `timeout`.
    pub async fn acquire(path: &Path, timeout: Duration) -> Result<Self, LockError> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| LockError::Io { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let deadline = Instant::now() + timeout;
        loop {
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Self { _file: file }),
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io(e.into())),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout { path: path.to_path_buf(), waited: timeout });
            }
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
    }
}
