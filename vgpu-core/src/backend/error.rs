//! Errors of device backends.

use std::path::PathBuf;

/// A device backend operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// No device has this index.
    #[error("no GPU with index {index} (the node has {count})")]
    NoSuchDevice {
        /// The index asked for.
        index: u32,
        /// How many devices there are.
        count: usize,
    },
    /// The backend or the device cannot do this (e.g. MIG on a MetaX card, process samples without driver
    /// support).
    #[error("{operation} is not supported by the {backend} backend")]
    NotSupported {
        /// The backend's name.
        backend: &'static str,
        /// The operation.
        operation: &'static str,
    },
    /// The vendor library failed (NVML, MXSML, ...); the source is the library's error.
    #[error("{operation} failed")]
    Library {
        /// The operation.
        operation: &'static str,
        /// The library's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The vendor library could not be loaded or initialised.
    #[error("cannot initialise the {backend} backend: {message}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// Why.
        message: String,
    },
    /// A MIG request was refused (unknown profile, bad or overlapping placement, mode change with
    /// instances, ...).
    #[error("GPU {index}: {source}")]
    Mig {
        /// The GPU.
        index: u32,
        /// Why.
        #[source]
        source: super::mig::MigError,
    },
    /// The GPU cannot be reset now (processes use it, the driver refused); a node reboot is the remaining
    /// way to apply what waited for the reset.
    #[error("GPU {index} cannot be reset: {reason}")]
    ResetRefused {
        /// The GPU.
        index: u32,
        /// Why, e.g. `in use by 2 process(es)`.
        reason: String,
    },
    /// The mock description is invalid.
    #[error(transparent)]
    Mock(#[from] MockConfigError),
}

/// A mock backend description could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MockConfigError {
    /// The file could not be read.
    #[error("cannot read the mock description {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not a valid YAML/JSON mock description.
    #[error("cannot parse the mock description {source_name}: {message}")]
    Parse {
        /// The file, or `<string>`.
        source_name: String,
        /// The parser's message.
        message: String,
    },
    /// A field holds an impossible value.
    #[error("invalid mock description {source_name}: {field}: {message}")]
    Invalid {
        /// The file, or `<string>`.
        source_name: String,
        /// The field, e.g. `gpus[2].computeCapability`.
        field: String,
        /// What is wrong.
        message: String,
    },
}
