//! Why a claim could not be prepared or unprepared ([`ClaimFailure`]), and why start-up recovery or the
//! stale-claim sweep failed ([`StateError`]).

use std::path::PathBuf;

use super::fault::FaultPoint;
use crate::{cdi, checkpoint::CheckpointError, devices::DeviceError, lock::LockError};

/// The error text of the claim-sharing rule (upstream's words).
pub const SHARED_CLAIM_ERROR: &str = "claim cannot be used for multiple Pods simultaneously";

/// Why one claim could not be prepared or unprepared (the text the kubelet gets in the claim's `error`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimFailure {
    /// `pu.lock` could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The checkpoint could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The API could not be read.
    #[error(transparent)]
    Api(#[from] crate::claims::ClaimError),
    /// The claim does not exist.
    #[error("ResourceClaim {0} not found")]
    NotFound(String),
    /// The claim exists with another UID (it was re-created).
    #[error("ResourceClaim {claim} has UID {found}, the kubelet asked for {expected}")]
    Uid {
        /// `namespace/name`.
        claim: String,
        /// The API's UID.
        found: String,
        /// The kubelet's UID.
        expected: String,
    },
    /// The claim has no allocation.
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(String),
    /// An allocation result of this driver is in another pool.
    #[error("ResourceClaim {claim}: device {device} is in pool {pool:?}, not this node's pool {node:?}")]
    Pool {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node.
        node: String,
    },
    /// The claim-sharing rule.
    #[error("ResourceClaim {claim}: {SHARED_CLAIM_ERROR} (reserved for {consumers} consumers)")]
    Shared {
        /// `namespace/name`.
        claim: String,
        /// How many consumers it is reserved for.
        consumers: usize,
    },
    /// The claim has vGPU devices and the runtime files their containers mount are not installed.
    #[error("ResourceClaim {claim}: {source}")]
    RuntimeFiles {
        /// `namespace/name`.
        claim: String,
        /// Which file and why.
        #[source]
        source: vgpu_core::abi::runtime_files::RuntimeFileError,
    },
    /// A device (share) is already prepared for another claim, or twice in this one.
    #[error("ResourceClaim {claim}: device {device}{share} is already prepared for claim {other}")]
    Overlap {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// ` (share <id>)` or empty.
        share: String,
        /// The other claim (`namespace/name (uid)`).
        other: String,
    },
    /// A device or consumed capacity is wrong.
    #[error("ResourceClaim {claim}: {source}")]
    Device {
        /// `namespace/name`.
        claim: String,
        /// What is wrong.
        #[source]
        source: DeviceError,
    },
    /// A file system step failed.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A claim directory's mode could not be set safely (e.g. a symbolic link was planted at its path).
    #[error(transparent)]
    Permissions(#[from] vgpu_core::abi::perms::PermsError),
    /// The CDI spec could not be written.
    #[error(transparent)]
    Cdi(#[from] cdi::CdiError),
    /// The whole call could not start (`pu.lock` not taken); the same text for every claim of the call.
    #[error("{0}")]
    Batch(String),
    /// A mode could not plan, apply or revert a host action ([`crate::modes`]).
    #[error("ResourceClaim {claim}: {source}")]
    Mode {
        /// `namespace/name` (or the UID when only that is known).
        claim: String,
        /// What failed.
        #[source]
        source: crate::modes::ModeError,
    },
    /// The fault-injection hook stopped Prepare (tests only).
    #[error("fault injected at {0:?}: stopped as a crash would")]
    Injected(FaultPoint),
}

/// Start-up recovery or the stale-claim sweep failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// See [`ClaimFailure`].
    #[error(transparent)]
    Claim(#[from] ClaimFailure),
}
