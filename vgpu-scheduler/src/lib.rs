//! vgpu-scheduler: the scheduling core of the vgpu kube-scheduler extender.
//!
//! Filter, dry-run filter, prioritize, bind and preempt with vgpu-manager semantics
//! (`shared/reference/vgpu-manager-contract.md` §3) over an incremental cluster cache behind a cluster-access
//! trait. The HTTP server and the kube-backed cluster live on top of this API; results mirror the extender
//! protocol so that layer only translates.
//!
//! # Module map
//!
//! | module | what it holds |
//! |---|---|
//! | [`cluster`] | light [`Node`]/[`Pod`] types, [`Cluster`] (snapshot, patch, bind, events), [`MemoryCluster`] with failure injection |
//! | [`cache`] | [`ClusterCache`]: decoded nodes, per-node usage kept from pod events, in-flight reservations |
//! | [`decoded`] | [`decoded::DecodedNode`]: a node's decoded annotations and the static numbers the filter ranks by |
//! | [`node_state`] | [`node_state::NodeState`]: one node's usage, reservations and rank-table row, behind its own lock |
//! | [`prealloc`] | reading `pre-allocated`/`predicate-*` back, `ShouldCountPodDeviceAllocation`, stuck grace period |
//! | [`pdb`] | [`pdb::PodDisruptionBudget`] and label selectors |
//! | [`budgets`] | [`budgets::Budgets`]: the budget accounting preempt orders victims by |
//! | [`gang`] | [`gang::GangPlacement`]: gang siblings' placements → cross-pod alignment windows per node |
//! | [`rank`] | node ordering over the rank table (same keys as `vgpu_core::alloc::order_nodes`) |
//! | [`rank_table`] | every node's ranking inputs in one dense row, read without node locks |
//! | [`extender`] | [`Extender`]: the verbs and their protocol-shaped results |
//! | [`fixture`] | nodes and pods as the device plugin and users publish them (tests, simulator, benches) |
//! | [`api_pod`] | [`api_pod::ApiPod`]: a Pod's JSON decoded into only the fields the extender reads (requests, watch events) |
//! | [`convert`] | Kubernetes `Pod`/`Node` (k8s-openapi) → [`Pod`]/[`Node`], gang identity |
//! | [`kube_cluster`] | [`KubeCluster`]: [`Cluster`] over a `kube::Client` (paged lists, merge patches, `pods/binding`, events) |
//! | [`watch`] | [`CacheDriver`]: list+watch of nodes and pods feeding the [`ClusterCache`], re-lists, sync, expiry sweeps |
//! | [`wire`] | the `k8s.io/kube-scheduler/extender/v1` JSON types and their conversions to and from the verb results |
//! | [`server`] | the axum router ([`server::router`]) and [`server::serve`]/[`server::run`]: verbs, `/healthz`, `/readyz`, `/metrics`, `/version` |
//! | [`metrics`] | [`Metrics`]: the contract's `vgpu_scheduler_*` families (prometheus-client) |
//! | [`work`] | [`work::WorkPool`]: admission and blocking-thread workers for the verbs, so the probes always answer |
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use vgpu_core::alloc::{PodContainer, PodSpec};
//! use vgpu_core::codec::{node_config_info, node_devices};
//! use vgpu_core::domain::ResourceDomain;
//! use vgpu_core::model::{GpuDevice, NodeDeviceInventory, NodeVgpuConfig};
//! use vgpu_core::clock::ManualClock;
//! use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Node, Pod};
//!
//! let d = ResourceDomain::default();
//! let cluster = MemoryCluster::new();
//! let inventory = NodeDeviceInventory::new(vec![GpuDevice {
//!     index: 0, uuid: "GPU-0".into(), memory_mib: 16384, cores: 100, split_count: 4, ..Default::default()
//! }]);
//! let mut node = Node { name: "n1".into(), ..Node::default() };
//! node.allocatable.insert(d.vgpu_number(), 4);
//! node.annotations.insert(d.node_device_register(), node_devices::encode(&inventory)?);
//! node.annotations.insert(d.node_config_info(), node_config_info::encode(&NodeVgpuConfig::default())?);
//! cluster.upsert_node(node);
//!
//! let ext = Extender::new(cluster.clone(), Arc::new(ManualClock::new(1_000_000_000)), ExtenderConfig::default());
//! ext.attach();
//! let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! rt.block_on(ext.sync())?;
//!
//! let pod = cluster.upsert_pod(Pod {
//!     uid: "u1".into(), namespace: "default".into(), name: "p1".into(),
//!     spec: PodSpec::new().container(PodContainer::app("main").limit(d.vgpu_number(), 1).limit(d.vgpu_memory(), 4096)),
//!     ..Pod::default()
//! });
//! let filtered = rt.block_on(ext.filter(Some(&pod), vec!["n1".to_string()]));
//! assert_eq!(filtered.node_names(), ["n1"]);
//! // The filter reserved the GPU in the cache; the bind writes the pre-allocation and binds.
//! let bound = rt.block_on(ext.bind("default", "p1", "u1", "n1"));
//! assert_eq!(bound.error, "");
//! assert_eq!(cluster.pod("default", "p1").unwrap().annotations[&d.pre_allocated()], "main[0_GPU-0_0_4096]");
//! assert_eq!(ext.cache().counted_node("u1").as_deref(), Some("n1"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Serving it over HTTP
//!
//! ```no_run
//! use std::sync::Arc;
//! use vgpu_scheduler::server::{AppState, ServerConfig};
//! use vgpu_lease::Readiness;
//! use vgpu_core::clock::SystemClock;
//! use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Metrics};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let metrics = Arc::new(Metrics::new());
//! let ext = Extender::new(MemoryCluster::new(), Arc::new(SystemClock), ExtenderConfig::default())
//!     .with_observer(metrics.clone());
//! ext.sync().await?;
//! let readiness = Readiness::ready();
//! let state = AppState::new(Arc::new(ext), readiness, metrics);
//! // Plain HTTP on 127.0.0.1:3456 until Ctrl-C; set `tls: Some(TlsFiles::new(cert, key))` for HTTPS
//! // (and `.with_client_ca(ca, ClientAuth::Optional)` for client certificates, see `server`).
//! let shutdown = async {
//!     let _ = tokio::signal::ctrl_c().await;
//! };
//! vgpu_scheduler::server::run(ServerConfig::default(), state, shutdown).await?;
//! # Ok(())
//! # }
//! ```
//!
//! `examples/serve_memory.rs` runs this against an in-memory cluster of four nodes.
//!
//! # Differences from vgpu-manager (bugs fixed, all deliberate)
//! * Per-filter pod listing is replaced by usage kept incrementally from events; the filter reserves the chosen
//!   GPUs under the node's lock before patching, so with `SerializedNodeFilter=false` no GPU is over-committed
//!   (upstream relied on the informer mutation cache and could double-book between concurrent filters).
//! * The failure patch removes `metrics-node` from the labels and writes annotations to the annotations map
//!   (upstream `CleanupMetadata` deleted annotation keys from the labels map).
//! * Bind does not hold its per-node lock for a minimum of 30 ms (`minLockingDuration`).
//! * The live filter's answer lists no rejected nodes once one passed (upstream sends every other candidate as
//!   "pod already scheduled to another node"; kube-scheduler decodes them and drops them, which at 1,000 nodes
//!   was about a tenth of its CPU). When no node passes, every reason is sent; the dry run always sends all.
//! * Success events (`FilteringSucceed`, `BindingSucceed`) are rate-limited and wait for a quiet moment
//!   ([`event_queue`]) instead of two API writes per pod in the middle of a burst.
//! * Stale watch events (older resource version) never undo newer state.
//! * Preempt reads the cluster's PodDisruptionBudgets: a victim whose eviction would violate one is added only
//!   after every other candidate (kube-scheduler's default preemption), added victims the pod fits without are
//!   given back, and `NumPDBViolations` is the count over the answer's victims instead of the bound
//!   `min(sent, kept) + added` (kept only when the budgets cannot be listed).
//! * Preempt's fit check runs the filter's placement, cross-pod windows included, and resolves victims before
//!   taking the node's lock (upstream-style lookups under the node lock could deadlock with pod events).
//! * With `TopologyAwareGPUAllocation` off, `node-device-topology` is not even decoded, so link-mode pods see
//!   exactly the placement of a node without topology.

pub mod api_pod;
pub mod budgets;
pub mod cache;
pub mod cluster;
pub mod convert;
pub mod decoded;
pub mod event_queue;
pub mod extender;
pub mod fixture;
pub mod gang;
pub mod kube_cluster;
pub mod metrics;
pub mod names;
mod node_index;
pub mod node_state;
pub mod pdb;
mod pod_lock;
pub mod prealloc;
pub mod rank;
pub mod rank_table;
pub mod server;
pub mod watch;
pub mod wire;
pub mod work;

pub use cache::ClusterCache;
pub use cluster::{Cluster, MemoryCluster, MetadataPatch, Node, Pod, PodPhase, WatchEvent};
pub use extender::{
    BindResult, BindWrites, Extender, ExtenderConfig, ExtenderError, ExtenderObserver, FailedNode,
    FilterResult, FilterStage, HostPriority, PreemptResult,
};
pub use kube_cluster::KubeCluster;
pub use metrics::Metrics;
pub use names::CandidateNames;
pub use watch::{CacheDriver, WatchConfig};

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
