//! Files the device plugin shares with the in-container control library, byte for byte.
//!
//! | item | file | what it holds |
//! |---|---|---|
//! | [`vgpu_config`] | `<manager-dir>/<podUID>_<ctr>/config/vgpu.config` | `resource_data_t`: magic `VGCF`, layout 1, exactly 8192 bytes (contract §7.1) |
//! | [`devices_json`] | `<manager-dir>/<podUID>_<ctr>/devices.json` | JSON array of the kubelet device IDs given to the container (§5.2) |
//! | [`vmem_node`] | `<manager-dir>/<podUID>_<ctr>/vmem_node/vmem_node.config` | virtual-memory ledger: magic `VMND`, layout 1, exactly 327 680 bytes (§7.2) |
//! | [`sm_util`] | `<manager-dir>/watcher/sm_util.config` | shared SM watcher samples: 16 × 81 952 bytes, no header (§7.3) |
//! | [`sm_node`] | `<manager-dir>/<podUID>_<ctr>/sm_node/sm_node.config` | shared SM token bucket: magic `SMND`, layout 3, exactly 8192 bytes (§7.4) |
//! | [`runtime_files`] | `<manager-dir>/libvgpu-control.so.<version>`, `<manager-dir>/ld.so.preload` | the host files every vGPU container bind-mounts: checked before a container is answered, installed atomically |
//! | [`atomic`] | – | write-temp-then-rename helper used by both writers |
//! | [`perms`] | – | `chmod` that refuses a symbolic link (the directories containers can write) |
//! | [`AbiError`] | – | every failure, naming the file |
//!
//! Readers use plain [`std::fs::read`] rather than a memory map: `memmap2::Mmap::map` is `unsafe` and the
//! workspace forbids `unsafe_code`; the files are small (8 KiB), so a copy costs nothing, and a copy cannot
//! observe a concurrent truncation. Seqlock-protected device entries are re-read until every sequence
//! word is even (see [`vgpu_config::read`]).
//!
//! ```
//! use vgpu_core::abi::vgpu_config::{self, VgpuConfig};
//!
//! let dir = std::env::temp_dir().join(format!("vgpu-abi-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("vgpu.config");
//! let mut config = VgpuConfig::default();
//! config.pod_uid = "0b1a".into();
//! vgpu_config::write(&path, &config)?;
//! assert_eq!(std::fs::metadata(&path)?.len(), 8192);
//! assert_eq!(vgpu_config::read(&path)?.pod_uid, "0b1a");
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod atomic;
pub mod devices_json;
mod le;
pub mod perms;
pub mod runtime_files;
pub mod sm_node;
pub mod sm_util;
pub mod vgpu_config;
pub mod vmem_node;

use std::path::PathBuf;

/// A shared file could not be read, written or understood.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AbiError {
    /// An I/O error on the file (or its temporary sibling).
    #[error("{}: {action}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`read`, `create temporary file`, `rename`, ...).
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not have the expected size.
    #[error("{}: size is {actual} bytes, expected {expected}", path.display())]
    Size {
        /// The file.
        path: PathBuf,
        /// Expected size.
        expected: usize,
        /// Actual size.
        actual: usize,
    },
    /// The magic number is wrong: not a file of this kind.
    #[error("{}: bad magic {actual:#010x}, expected {expected:#010x}", path.display())]
    Magic {
        /// The file.
        path: PathBuf,
        /// Expected magic.
        expected: u32,
        /// Found magic.
        actual: u32,
    },
    /// A header field (layout version, region size, device count) has an unsupported value.
    #[error("{}: unsupported {field} {actual}, expected {expected}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// The header field.
        field: &'static str,
        /// Expected value.
        expected: u32,
        /// Found value.
        actual: u32,
    },
    /// A device entry stayed mid-update (odd sequence word) across every re-read.
    #[error("{}: device {index} is being modified (sequence {seq} is odd)", path.display())]
    Busy {
        /// The file.
        path: PathBuf,
        /// Device slot.
        index: usize,
        /// The odd sequence word.
        seq: u32,
    },
    /// A value does not fit the layout (e.g. a device slot ≥ 16).
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The JSON content is malformed.
    #[error("{}: invalid JSON: {message}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}
