//! Wire codecs for the vgpu-manager annotations (contract §2), byte-compatible with the Go encoders.
//!
//! | annotation | module | value |
//! |---|---|---|
//! | `node-device-register` | [`node_devices`] | [`NodeDeviceInventory`](crate::model::NodeDeviceInventory) |
//! | `node-config-info` | [`node_config_info`] | [`NodeVgpuConfig`](crate::model::NodeVgpuConfig) |
//! | `node-gpu-domain` | [`node_gpu_domain`] | [`GpuRails`](node_gpu_domain::GpuRails) (GPU UUID → rail) |
//! | `pre-allocated`, `real-allocated` | [`pod_devices`] | [`PodDeviceClaim`](crate::model::PodDeviceClaim) |
//! | `include-gpu-type`, `exclude-gpu-type`, `include-gpu-uuid`, `exclude-gpu-uuid` | [`device_filter`] | [`DeviceFilter`](device_filter::DeviceFilter) |
//!
//! [`go_duration`] parses Go duration text (`1m30s`), the form of duration flags and the `stuck-grace-period`
//! annotation.
//!
//! Every decoder returns a [`CodecError`] naming the annotation and what was expected; none panics.
//!
//! The JSON decoders accept what vgpu-manager's Go components accept (`encoding/json`) wherever the meaning
//! is unambiguous, so an operator's hand edit or an older writer does not make ours fail: object keys in
//! any letter case (an exact match preferred), duplicate keys (the last wins), missing fields (Go's zero
//! value), unknown fields (skipped), `null` member values (a scalar keeps its value, a map or list is
//! emptied). Where Go's acceptance is itself a defect (negative counts, ids out of range, unknown link
//! codes) they reject the value with an error naming the annotation and what was expected. Each module
//! lists its choices. The encoders write exactly what Go's `json.Marshal` writes.

pub mod device_filter;
pub mod go_duration;
mod gojson;
pub(crate) mod goread;
pub mod node_config_info;
pub mod node_devices;
pub mod node_gpu_domain;
pub mod pod_devices;

/// Name (without domain) of the node annotation holding the device inventory.
pub const NODE_DEVICE_REGISTER: &str = "node-device-register";
/// Name (without domain) of the node annotation holding the node vGPU config.
pub const NODE_CONFIG_INFO: &str = "node-config-info";
/// Name (without domain) of the optional node annotation mapping GPU UUIDs to rails.
pub const NODE_GPU_DOMAIN: &str = "node-gpu-domain";
/// Name (without domain) of the pod annotation with the scheduler's claim.
pub const PRE_ALLOCATED: &str = "pre-allocated";
/// Name (without domain) of the pod annotation with the device plugin's claim.
pub const REAL_ALLOCATED: &str = "real-allocated";

/// A value that could not be decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value is not JSON of the expected shape.
    #[error("invalid {annotation} value: expected {expected}: {source}")]
    Json {
        /// The annotation (without domain), e.g. `node-device-register`.
        annotation: &'static str,
        /// What the value should look like.
        expected: &'static str,
        /// The JSON error (with line/column).
        #[source]
        source: serde_json::Error,
    },
    /// A field holds a value outside its range.
    #[error("invalid {annotation} value: {location}: field {field:?} is {got}, expected {expected}")]
    Field {
        /// The annotation (without domain).
        annotation: &'static str,
        /// Where in the value, e.g. `device at position 2`.
        location: String,
        /// Field name as on the wire.
        field: &'static str,
        /// What was expected.
        expected: &'static str,
        /// The offending value, as text.
        got: String,
    },
    /// The text form does not follow the grammar.
    #[error("invalid {annotation} value: {location}: expected {expected}, found {found:?}")]
    Syntax {
        /// The annotation (without domain).
        annotation: &'static str,
        /// Where in the value, e.g. `container 2 ("main")`.
        location: String,
        /// What the grammar expects there.
        expected: &'static str,
        /// The text that was found.
        found: String,
    },
    /// The value is longer than the annotation allows.
    #[error("invalid {annotation} value: {len} bytes exceeds the limit of {max} bytes")]
    TooLong {
        /// The annotation (without domain).
        annotation: &'static str,
        /// Length of the value in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A value cannot be represented in the wire form (encoding only).
    #[error("cannot encode {annotation}: {location}: field {field:?} {problem}")]
    Unencodable {
        /// The annotation (without domain).
        annotation: &'static str,
        /// Where in the value.
        location: String,
        /// Field name as on the wire.
        field: &'static str,
        /// Why it cannot be written.
        problem: String,
    },
}
