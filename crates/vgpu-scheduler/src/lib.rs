//! vgpu-scheduler: the kube-scheduler extender of vgpu.
//!
//! This crate will hold the extender's HTTP server (filter, filter-dryrun, prioritize, bind,
//! preempt, health, readiness, metrics), the incremental cluster cache behind a cluster-access
//! trait (kube-backed and in-memory), and the filter/bind/preempt semantics of the contract
//! (`shared/reference/vgpu-manager-contract.md` §3). The server is tracked in issue #5; for now the
//! crate holds the contract's well-known names and the component's gate registry.
//!
//! ```
//! use vgpu_scheduler::{DEFAULT_PORT, FILTER_PATH, feature_gates};
//! use vgpu_gates::CoreGate;
//!
//! assert_eq!(format!("http://127.0.0.1:{DEFAULT_PORT}{FILTER_PATH}"), "http://127.0.0.1:3456/scheduler/filter");
//! let gates = feature_gates().configure(Vec::<String>::new())?;
//! assert!(gates.enabled(CoreGate::SerializedNodeFilter), "Beta, on by default");
//! # Ok::<(), vgpu_gates::Error>(())
//! ```

/// Default `--server-bind-port`.
pub const DEFAULT_PORT: u16 = 3456;
/// Default `--scheduler-name` (also the event source).
pub const DEFAULT_SCHEDULER_NAME: &str = "vgpu-scheduler";
/// Filter verb path.
pub const FILTER_PATH: &str = "/scheduler/filter";
/// Side-effect-free filter path.
pub const FILTER_DRYRUN_PATH: &str = "/scheduler/filter-dryrun";
/// Prioritize verb path (new in vgpu; vgpu-manager has none).
pub const PRIORITIZE_PATH: &str = "/scheduler/prioritize";
/// Bind verb path.
pub const BIND_PATH: &str = "/scheduler/bind";
/// Preempt verb path.
pub const PREEMPT_PATH: &str = "/scheduler/preempt";

/// The scheduler-extender's feature-gate registry (Core).
pub fn feature_gates() -> &'static vgpu_gates::Registry<vgpu_gates::CoreGate> {
    vgpu_gates::scheduler_extender()
}
