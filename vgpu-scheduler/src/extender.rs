//! The extender verbs over a [`Cluster`] and the [`ClusterCache`]: filter, dry-run filter, prioritize, bind,
//! preempt (contract §3.1–§3.5). Results mirror the extender protocol so an HTTP layer only translates.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use vgpu_core::alloc::{
    AlignmentWindow, LinkSearch, NodeFailure, NodeUsage, NodeView, PodAllocation, PodFootprint, PodRequest,
    ReasonCode, RequestBuildError, place, place_aligned, precheck, quick_reject, record_link_searches,
    render_unavailable,
};
use vgpu_core::codec::pod_devices;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::PodDeviceClaim;
use vgpu_gates::{CoreGate, FeatureGates};

use crate::budgets::Budgets;
use crate::cache::ClusterCache;
use vgpu_core::clock::Clock;
use vgpu_kube::error::ClusterError;

use crate::cluster::{Binding, Cluster, Event, EventType, MemoryCluster, MetadataPatch, Pod};
use crate::decoded::DecodedNode;
use crate::event_queue::{DeferConfig, DeferredEvents, TokenBucket};
use crate::gang::GangPlacement;
use crate::names::CandidateNames;
use crate::node_state::{NodeSlot, NodeState};
use crate::pdb::PodDisruptionBudget;
use crate::pod_lock::PodLocks;
use crate::prealloc::{self, PREDICATE_TIME_DONE, phase};
use crate::rank::{Ranking, ResolveMemo, rank_candidates, row_reject};
use crate::rank_table::NO_ROW;

/// Default `--stuck-grace-period` (30 s).
pub const DEFAULT_STUCK_GRACE_NS: i64 = 30_000_000_000;
/// Default lifetime of an in-flight reservation (30 s; it normally lives from a filter to its bind).
pub const DEFAULT_RESERVATION_TTL_NS: i64 = 30_000_000_000;

/// Default [`ExtenderConfig::success_event_qps`] (the kubelet's `--event-qps` default).
pub const DEFAULT_EVENT_QPS: u32 = 50;

/// Default [`ExtenderConfig::success_event_burst`] (the kubelet's `--event-burst` default).
pub const DEFAULT_EVENT_BURST: u32 = 100;
/// Fixed part of the margin over the cache's node count that a candidate list may have before it is treated
/// as oversized (see [`candidate_bound`]).
pub const CANDIDATE_MARGIN: usize = 256;

/// The longest candidate list answered name by name for a cache of `nodes` nodes: `nodes + nodes / 8 +`
/// [`CANDIDATE_MARGIN`]. The margin covers nodes the scheduler saw before the cache did (new nodes, watch lag).
///
/// kube-scheduler sends each node it found feasible once, from its own node snapshot, so its lists are never
/// longer than the cluster and never repeat a name. Every verb taking a candidate list (filter, filter-dryrun,
/// prioritize) first collapses repeated names, keeping the first occurrence, so an answer names each node at
/// most once (kube-scheduler maps the answer's names back through a name → node map and sums prioritize
/// scores per host, so a repeated name would pass and fail at once, or be scored twice). A list longer than
/// this bound is answered for the cached nodes only: names the cache does not hold are dropped after one hash
/// lookup each, instead of each getting a `node missing from cache` entry. kube-scheduler treats a node that
/// is neither in `NodeNames` nor in `FailedNodes` as filtered out (without a reason in its diagnosis), and
/// gives it no extender score, so the answer means the same. Either way no answer lists more nodes than the
/// request's distinct candidates.
pub fn candidate_bound(nodes: usize) -> usize {
    nodes.saturating_add(nodes / 8).saturating_add(CANDIDATE_MARGIN)
}

/// The candidates of a verb after [`candidate_bound`]'s rules (repeats collapsed, unknown names of an oversized
/// list dropped), in request order, with their rank-table rows and the node generation those rows hold at
/// ([`ClusterCache::node_generation`]).
fn distinct_candidates(cache: &ClusterCache, mut names: CandidateNames) -> (CandidateNames, Vec<u32>, u64) {
    let (mut rows, generation) = cache.candidate_rows_at(&names);
    let oversized = names.len() > candidate_bound(cache.node_count());
    let keep: Vec<bool> = {
        // Known names are told apart by their row (one bit each); unknown ones by name.
        let mut seen_rows: Vec<u64> = Vec::new();
        let mut seen_unknown: HashSet<&str, foldhash::fast::RandomState> = HashSet::default();
        names
            .iter()
            .zip(&rows)
            .map(|(name, &row)| {
                if row == NO_ROW {
                    return !oversized && seen_unknown.insert(name);
                }
                let (word, bit) = ((row / 64) as usize, 1u64 << (row % 64));
                if seen_rows.len() <= word {
                    seen_rows.resize(word + 1, 0);
                }
                let fresh = seen_rows[word] & bit == 0;
                seen_rows[word] |= bit;
                fresh
            })
            .collect()
    };
    let dropped = keep.iter().filter(|k| !**k).count();
    if dropped > 0 {
        tracing::debug!(
            candidates = names.len(),
            dropped,
            oversized,
            "collapsed repeated candidate names{}",
            if oversized { " and dropped names the cache does not hold" } else { "" }
        );
        names = names.select(|i| keep.get(i).copied().unwrap_or(true));
        let mut k = keep.iter();
        rows.retain(|_| k.next().copied().unwrap_or(true));
    }
    (names, rows, generation)
}

/// Extender settings.
#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    /// Annotation/resource domain (`--domain`).
    pub domain: ResourceDomain,
    /// Scheduler name (event source).
    pub scheduler_name: String,
    /// Gate `SerializedNodeFilter`: one global lock around node evaluation, allocation and the patch.
    pub serialize_filter: bool,
    /// Gate `SerializedNodeBind`: the bindings to one node are created one after the other, in the order of
    /// their `predicate-time` (see [`Extender::bind`]).
    pub serialize_bind: bool,
    /// Default stuck grace period, ns.
    pub stuck_grace_ns: i64,
    /// In-flight reservation lifetime, ns.
    pub reservation_ttl_ns: i64,
    /// Attempts of a metadata patch on retriable errors (conflict, timeout, 429).
    pub patch_attempts: u32,
    /// Send events to the cluster.
    pub emit_events: bool,
    /// Also send the `Normal` events of a pod scheduled without trouble (`FilteringSucceed`,
    /// `BindingSucceed`; upstream sends both). Each is one more write to the API server per pod, which on a
    /// busy control plane is a measurable part of scheduling throughput; warnings are always sent.
    pub success_events: bool,
    /// Success events (above) sent per second on average, with bursts of up to
    /// [`success_event_burst`](Self::success_event_burst); sent at once, the ones over the limit are dropped
    /// and counted ([`Stats::events_dropped`]); deferred ([`defer_success_events`](Self::defer_success_events)),
    /// they wait their turn in the queue and are dropped only when it is full. The kubelet limits its events
    /// the same way (`--event-qps` 50, `--event-burst` 100, the defaults here too): at hundreds of pods per
    /// second, two more API writes per pod are a large part of a CPU-bound control plane's work. 0: no limit.
    /// Warnings are never limited.
    pub success_event_qps: u32,
    /// Burst of [`success_event_qps`](Self::success_event_qps).
    pub success_event_burst: u32,
    /// Hold success events back while scheduling is busy ([`event_queue`](crate::event_queue)): `Some`,
    /// they wait in a queue until no filter or bind has started for the quiet period (or until the maximum
    /// delay), and whoever runs the extender sends them with [`Extender::flush_events`] (the binary runs
    /// [`Extender::run_event_flusher`]); `None` ([`Default`]), each is sent when it happens.
    pub defer_success_events: Option<DeferConfig>,
    /// Gate `TopologyAwareGPUAllocation`: read the nodes' `node-device-topology`. Off, link-mode pods are
    /// placed as if no node published a topology (contract §3.2, §4.2): `link-strict` is rejected with
    /// `LinkTopologyUnsatisfied` ("node has no GPU link topology"), `link` falls back to the first GPUs in
    /// device-policy order with a `TopologyFallback` event, link fitness is 0 in node ordering, and cross-pod
    /// alignment has no NVLink component to align to. [`Default`] turns it on (the library places by topology
    /// wherever it is published); [`from_gates`](Self::from_gates) follows the gate, which is off by default.
    pub link_topology: bool,
    /// How a bind writes the pre-allocation onto the pod (`--bind-writes`).
    pub bind_writes: BindWrites,
}

/// How a bind writes a pod's pre-allocation (labels `assigned-phase`, `metrics-node`; annotations
/// `predicate-node`, `pre-allocated`, `real-allocated`, `predicate-time`) onto the pod.
///
/// kube-apiserver copies a `pods/binding`'s annotations onto the pod in the write that binds it, and its
/// labels too where the `PodTopologyLabelsAdmission` feature is on (beta, on by default, since Kubernetes
/// 1.35; "permits external schedulers to set labels on pods in an atomic operation"). A server without it
/// drops the labels without an error — and the device plugin finds the pod to allocate for by its
/// `assigned-phase=allocating` label — so the labels must not be trusted to the binding unseen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BindWrites {
    /// One write: the binding carries the labels and annotations (`--bind-writes=binding`: the operator
    /// knows the feature is on).
    Binding,
    /// [`Binding`](Self::Binding), checked: until one bind has been seen to carry its labels, every bind reads
    /// its pod back; if the labels were dropped they are patched on at once and every later bind writes with
    /// [`PatchThenBinding`](Self::PatchThenBinding) (`--bind-writes=auto` on a 1.35+ server).
    #[default]
    BindingChecked,
    /// Two writes: a merge patch with the pod's UID, then the binding (every Kubernetes version).
    PatchThenBinding,
}

impl BindWrites {
    /// The first Kubernetes minor version (1.x) whose kube-apiserver copies binding labels by default.
    pub const LABELS_ON_BINDING_SINCE: u32 = 35;

    /// What `--bind-writes=auto` picks for a kube-apiserver reporting this `/version` (`major` and `minor` as
    /// served, e.g. `"1"`, `"35+"`): [`BindingChecked`](Self::BindingChecked) from 1.35 on, else
    /// [`PatchThenBinding`](Self::PatchThenBinding) — also when the version does not parse.
    pub fn auto_for(major: &str, minor: &str) -> Self {
        let number = |s: &str| -> Option<u32> {
            let digits: String = s.trim().chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        match (number(major), number(minor)) {
            (Some(1), Some(m)) if m >= Self::LABELS_ON_BINDING_SINCE => Self::BindingChecked,
            (Some(major), Some(_)) if major > 1 => Self::BindingChecked,
            _ => Self::PatchThenBinding,
        }
    }

    /// The flag value (`binding`, `binding-checked`, `patch`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binding => "binding",
            Self::BindingChecked => "binding-checked",
            Self::PatchThenBinding => "patch",
        }
    }
}

/// [`Extender::bind_writes`] state: the labels ride the binding (confirmed or configured), not seen yet, or
/// the server drops them.
const LABELS_RIDE_BINDING: u8 = 0;
const LABELS_UNCHECKED: u8 = 1;
const LABELS_DROPPED: u8 = 2;

impl Default for ExtenderConfig {
    fn default() -> Self {
        Self {
            domain: ResourceDomain::default(),
            scheduler_name: crate::DEFAULT_SCHEDULER_NAME.to_owned(),
            serialize_filter: true,
            serialize_bind: true,
            stuck_grace_ns: DEFAULT_STUCK_GRACE_NS,
            reservation_ttl_ns: DEFAULT_RESERVATION_TTL_NS,
            patch_attempts: 3,
            emit_events: true,
            success_events: true,
            success_event_qps: DEFAULT_EVENT_QPS,
            success_event_burst: DEFAULT_EVENT_BURST,
            defer_success_events: None,
            link_topology: true,
            bind_writes: BindWrites::default(),
        }
    }
}

impl ExtenderConfig {
    /// Defaults with the serialization and topology gates taken from a configured gate set.
    pub fn from_gates(gates: &FeatureGates<'_, CoreGate>) -> Self {
        Self {
            serialize_filter: gates.enabled(CoreGate::SerializedNodeFilter),
            serialize_bind: gates.enabled(CoreGate::SerializedNodeBind),
            link_topology: gates.enabled(CoreGate::TopologyAwareGPUAllocation),
            ..Self::default()
        }
    }
}

/// Why a verb failed as a whole (the `Error` string of the protocol result).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtenderError {
    /// Filter without a pod.
    #[error("extenderArgs.Pod cannot be empty")]
    NoPod,
    /// Filter of a bound pod.
    #[error("pod has been bound to node \"{0}\"")]
    AlreadyBound(String),
    /// No candidate nodes.
    #[error("No schedulable nodes")]
    NoNodes,
    /// The pod's vGPU limits are invalid.
    #[error(transparent)]
    InvalidRequest(#[from] RequestBuildError),
    /// The pod holds a valid pre-allocation for a node that is not a candidate.
    #[error("pod {0} had been predicated")]
    AlreadyPredicated(String),
    /// The allocation could not be encoded (never expected).
    #[error("allocator internal error: {0}")]
    Internal(String),
    /// The pre-allocation patch failed.
    #[error("failed to patch pod {pod}: {source}")]
    Patch {
        /// `<namespace>/<name>`.
        pod: String,
        /// The API error.
        source: ClusterError,
    },
    /// Bind without a node.
    #[error("ExtenderBindingArgs.Node cannot be empty")]
    NoBindNode,
    /// The pod read back has another UID.
    #[error("different uid \"{0}\" from the target pod")]
    UidMismatch(String),
    /// The pre-allocation is for another node.
    #[error("predicate node \"{predicate}\" does not match the bound node \"{node}\"")]
    NodeMismatch {
        /// `predicate-node`.
        predicate: String,
        /// Bind target.
        node: String,
    },
    /// No valid, unexpired pre-allocation.
    #[error("device pre allocation check failed, unable to bind to node \"{0}\"")]
    PreallocExpired(String),
    /// Reading the pod or creating the binding failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// One rejected candidate node of a filter answer (an entry of `FailedNodes`), borrowed from its
/// [`FilterResult`] ([`FilterResult::failed_nodes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedNode<'a> {
    /// Node name.
    pub node: &'a str,
    /// Why it was rejected.
    pub code: ReasonCode,
    /// The `FailedNodes` text: the short phrase (live filter) or the detailed form (dry-run filter).
    pub reason: &'a str,
}

/// A rejected candidate, by its position in [`FilterResult`]'s names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// Position in the result's candidate names.
    pub(crate) pos: usize,
    pub(crate) code: ReasonCode,
    pub(crate) reason: Cow<'static, str>,
}

/// `ExtenderFilterResult`: passed node names, failed nodes (name → reason) and an error.
///
/// The names live once, in the call's [`CandidateNames`] (the request's list, moved in); passed and failed
/// nodes refer to them by position, so an answer over 50,000 candidates holds no `String` per node
/// ([`names`](crate::names) module docs). Read it with [`passed`](Self::passed) (or
/// [`node_names`](Self::node_names)), [`failed_nodes`](Self::failed_nodes) and [`failure`](Self::failure);
/// build one with [`push_passed`](Self::push_passed) and [`push_failed`](Self::push_failed).
#[derive(Clone, Default)]
pub struct FilterResult {
    pub(crate) names: CandidateNames,
    /// Positions of the nodes that passed (live: at most one), in input order.
    pub(crate) passed: Vec<usize>,
    /// Rejected nodes, in input order (live: short phrases; dry-run: detailed). A live filter that picked a node
    /// rejects every other candidate, most with [`ReasonCode::AlreadyScheduledElsewhere`].
    pub(crate) failed: Vec<Failure>,
    /// Whole-call error ("" on success).
    pub error: String,
}

impl FilterResult {
    /// The live answer from per-candidate outcomes: `None` passed, `Some(code)` rejected with its short phrase.
    fn from_outcome(names: CandidateNames, outcome: &[Option<ReasonCode>]) -> Self {
        let mut out = Self { failed: Vec::with_capacity(names.len()), names, ..Self::default() };
        for (pos, code) in outcome.iter().enumerate().take(out.names.len()) {
            match code {
                None => out.passed.push(pos),
                Some(c) => out.failed.push(Failure { pos, code: *c, reason: Cow::Borrowed(c.phrase()) }),
            }
        }
        out
    }

    /// The answer kube-scheduler needs from a live filter: where a node passed, without the rejected ones.
    /// kube-scheduler reads `FailedNodes` only to explain a pod that fits nowhere (its `FailedScheduling`
    /// diagnosis and preemption); once a node passes it schedules the pod there and drops them, after decoding
    /// every entry — at 1,000 nodes it sends about 420 candidates, and decoding the 419 "pod already scheduled
    /// to another node" took about a tenth of its CPU. A result where nothing passed keeps every reason.
    pub fn without_failures_if_passed(mut self) -> Self {
        if !self.passed.is_empty() {
            self.failed = Vec::new();
        }
        self
    }

    /// Every candidate passed (a pod without vGPUs).
    pub fn all_passed(names: CandidateNames) -> Self {
        Self { passed: (0..names.len()).collect(), names, ..Self::default() }
    }

    /// A whole-call error.
    pub fn failed_call(error: impl Into<String>) -> Self {
        Self { error: error.into(), ..Self::default() }
    }

    /// Adds a node that passed.
    pub fn push_passed(&mut self, node: &str) {
        self.names.push(node);
        self.passed.push(self.names.len() - 1);
    }

    /// Adds a rejected node with its `FailedNodes` text.
    pub fn push_failed(&mut self, node: &str, code: ReasonCode, reason: impl Into<Cow<'static, str>>) {
        self.names.push(node);
        self.failed.push(Failure { pos: self.names.len() - 1, code, reason: reason.into() });
    }

    /// Adds a rejected node with the code's short phrase (the live filter's text).
    pub fn push_short(&mut self, node: &str, code: ReasonCode) {
        self.push_failed(node, code, code.phrase());
    }

    /// The nodes that passed, in input order (live: at most one).
    pub fn passed(&self) -> impl ExactSizeIterator<Item = &str> + Clone + '_ {
        self.passed.iter().map(|&p| self.names.get(p).unwrap_or_default())
    }

    /// [`passed`](Self::passed), collected.
    pub fn node_names(&self) -> Vec<&str> {
        self.passed().collect()
    }

    /// The rejected nodes, in input order.
    pub fn failed_nodes(&self) -> impl ExactSizeIterator<Item = FailedNode<'_>> + Clone + '_ {
        self.failed.iter().map(|f| FailedNode {
            node: self.names.get(f.pos).unwrap_or_default(),
            code: f.code,
            reason: f.reason.as_ref(),
        })
    }

    /// The `FailedNodes` text of a node, if it was rejected.
    pub fn failure(&self, node: &str) -> Option<&str> {
        self.failed_nodes().find(|f| f.node == node).map(|f| f.reason)
    }
}

impl PartialEq for FilterResult {
    /// Same passed nodes, same failed nodes (name, code, text), same error, each in order.
    fn eq(&self, other: &Self) -> bool {
        self.error == other.error
            && self.passed().eq(other.passed())
            && self.failed_nodes().eq(other.failed_nodes())
    }
}

impl Eq for FilterResult {}

impl std::fmt::Debug for FilterResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilterResult")
            .field("node_names", &self.node_names())
            .field("failed_nodes", &self.failed_nodes().collect::<Vec<_>>())
            .field("error", &self.error)
            .finish()
    }
}

/// One `HostPriority`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPriority {
    /// Node name.
    pub host: String,
    /// 0..=10.
    pub score: i64,
}

/// `ExtenderBindingResult`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BindResult {
    /// "" on success.
    pub error: String,
}

/// `ExtenderPreemptionResult`: node → victim pod UIDs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreemptResult {
    /// Node → victim UIDs (nodes that cannot host the pod even after eviction are dropped).
    pub node_victims: BTreeMap<String, Vec<String>>,
    /// Node → how many of its victims violate a PodDisruptionBudget, counted against the cluster's budgets
    /// (`NumPDBViolations`). A node missing here (a passthrough, or the budget list failed) is answered with
    /// the conservative bound of [`ExtenderPreemptionResult::from_result`](crate::wire::ExtenderPreemptionResult::from_result).
    pub pdb_violations: BTreeMap<String, i64>,
}

/// Verb counters (`vgpu_scheduler_verb_total{verb,result}` of contract §3.6).
#[derive(Debug, Default)]
pub struct Stats {
    /// filter, result=fit.
    pub filter_fit: AtomicU64,
    /// filter, result=no_fit.
    pub filter_no_fit: AtomicU64,
    /// filter, result=error.
    pub filter_error: AtomicU64,
    /// bind, result=success.
    pub bind_success: AtomicU64,
    /// bind, any failure.
    pub bind_error: AtomicU64,
    /// preempt, result=victims.
    pub preempt_victims: AtomicU64,
    /// preempt, result=no_victims or passthrough.
    pub preempt_other: AtomicU64,
    /// Total filter time, ns.
    pub filter_ns: AtomicU64,
    /// Success events dropped: over the rate limit ([`ExtenderConfig::success_event_qps`]), refused by a full
    /// deferral queue, or still waiting there at shutdown.
    pub events_dropped: AtomicU64,
}

/// A timed stage of a live filter call (reported to [`ExtenderObserver::filter_stage`]).
///
/// `LockWait`, `Node` and `Device` are the contract's `stage` label values (`lock_wait`, `node`, `device`);
/// `Patch` and `CacheUpdate` are finer steps for diagnosis (`vgpuctl simulate --json`) that the metrics
/// leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FilterStage {
    /// Waiting for the `SerializedNodeFilter` lock (only reported when the gate is on).
    LockWait,
    /// Node gates and ranking of the candidates (expiry sweep included).
    Node,
    /// Allocation on the ranked nodes until one fits, including its reservation.
    Device,
    /// The round trip that writes the pre-allocation: the binding that carries it, or the patch before the
    /// binding (retries included; [`BindWrites`]). It runs in the bind, after kube-scheduler's serial filter,
    /// since the filter only reserves.
    Patch,
    /// Recording the reservation for expiry (filter) and the patched pod (bind) in the cache.
    CacheUpdate,
}

impl FilterStage {
    /// Every stage, in call order.
    pub const ALL: [FilterStage; 5] = [
        FilterStage::LockWait,
        FilterStage::Node,
        FilterStage::Device,
        FilterStage::Patch,
        FilterStage::CacheUpdate,
    ];

    /// A short name (`lock_wait`, `rank`, `allocation`, `patch`, `cache_update`).
    pub fn as_str(self) -> &'static str {
        match self {
            FilterStage::LockWait => "lock_wait",
            FilterStage::Node => "rank",
            FilterStage::Device => "allocation",
            FilterStage::Patch => "patch",
            FilterStage::CacheUpdate => "cache_update",
        }
    }
}

/// Hooks into the verbs for metrics; every method defaults to a no-op. Set with
/// [`Extender::with_observer`].
pub trait ExtenderObserver: Send + Sync {
    /// Time spent in one stage of a live filter call.
    fn filter_stage(&self, stage: FilterStage, elapsed: std::time::Duration) {
        let _ = (stage, elapsed);
    }

    /// A live filter placed a pod whose gang siblings were already placed, from this cross-pod window
    /// (reported once per placed pod, once its reservation is taken).
    fn crosspod_window(&self, window: AlignmentWindow) {
        let _ = window;
    }

    /// Link placement searched a GPU subset while a live filter tried a node (once per search, on every node
    /// tried, placed or not).
    fn link_subset_search(&self, search: LinkSearch) {
        let _ = search;
    }

    /// Success events sent and dropped since the last report ([`ExtenderConfig::success_event_qps`],
    /// [`ExtenderConfig::defer_success_events`]).
    fn success_events(&self, sent: u64, dropped: u64) {
        let _ = (sent, dropped);
    }

    /// Success events now waiting for a quiet moment (after each change).
    fn events_deferred(&self, waiting: usize) {
        let _ = waiting;
    }
}

const BIND_STRIPES: usize = 64;

/// The bind queue of a stripe of nodes (gate `SerializedNodeBind`): the signal the latest bind gives when its
/// binding is done, and the latest `predicate-time` handed out (kept strictly increasing).
#[derive(Debug, Default)]
struct BindQueue {
    tail: Option<tokio::sync::oneshot::Receiver<()>>,
    last_time_ns: i64,
}

/// A bind's place in its node's queue: wait for `previous` before creating the binding; dropping `done`
/// (bound, failed or cancelled) lets the next one go.
#[derive(Debug)]
struct BindTurn {
    previous: Option<tokio::sync::oneshot::Receiver<()>>,
    _done: tokio::sync::oneshot::Sender<()>,
}

/// The scheduling core: cache + cluster + clock + gates.
pub struct Extender<C, K> {
    cluster: C,
    clock: Arc<K>,
    cache: Arc<ClusterCache>,
    config: ExtenderConfig,
    filter_lock: tokio::sync::Mutex<()>,
    pod_locks: PodLocks,
    bind_queues: Vec<std::sync::Mutex<BindQueue>>,
    stats: Stats,
    observer: Option<Arc<dyn ExtenderObserver>>,
    /// Placements chosen by a filter and not yet bound (pod UID → placement); see [`Extender::filter`].
    pending: std::sync::Mutex<PendingPlacements>,
    /// `LABELS_*`: whether binds carry the pre-allocation on the binding ([`BindWrites`]).
    bind_labels: std::sync::atomic::AtomicU8,
    /// Success-event token bucket ([`ExtenderConfig::success_event_qps`]).
    event_tokens: std::sync::Mutex<TokenBucket>,
    /// Success events waiting for a quiet moment ([`ExtenderConfig::defer_success_events`]).
    deferred_events: Option<DeferredEvents>,
}

/// The pending placements, and the size at which the next insert sweeps out expired ones (twice the size
/// left by the last sweep, at least [`PENDING_SWEEP_AT`], so sweeping costs O(1) per insert amortised).
#[derive(Debug, Default)]
struct PendingPlacements {
    by_uid: HashMap<String, PendingPlacement>,
    sweep_at: usize,
}

/// A filter's choice waiting for its bind: what the bind writes onto the pod before it creates the binding.
#[derive(Debug, Clone)]
struct PendingPlacement {
    node: String,
    /// Expiry of the cache reservation that holds the GPUs meanwhile (Unix ns).
    expires_ns: i64,
    /// The encoded `pre-allocated` annotation.
    pre_allocated: String,
    /// The claim it encodes.
    claim: PodDeviceClaim,
}

/// Pending placements beyond this many are swept for expired ones on the next insert (an expired one is
/// otherwise dropped by its pod's bind or replaced by its next filter).
const PENDING_SWEEP_AT: usize = 1024;

impl<C, K> std::fmt::Debug for Extender<C, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extender").field("config", &self.config).finish_non_exhaustive()
    }
}

fn lock(slot: &NodeSlot) -> std::sync::MutexGuard<'_, NodeState> {
    slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fnv32a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Allocates the pod on a locked node, excluding the pod's own earlier counting there; with the pod's gang
/// placement, link placement tries its cross-pod windows on this node.
fn try_place(
    request: &PodRequest,
    memo: &mut ResolveMemo,
    state: &NodeState,
    uid: &str,
    gang: Option<&GangPlacement>,
) -> Result<PodAllocation, NodeFailure> {
    let d = state.decoded.as_ref().map_err(Clone::clone)?;
    let own;
    let usage = if state.usage.contains_pod(uid) {
        let mut u: NodeUsage = state.usage.clone();
        u.remove_pod(uid);
        own = u;
        &own
    } else {
        &state.usage
    };
    place_with(request, memo, &state.name, d, usage, gang)
}

/// Why [`try_place`] would reject the pod on a locked node, when that is known without a placement attempt
/// ([`quick_reject`]: a structural gate, or the first container's GPU filter); `None`: try it. Nodes that
/// fail the node checks are left to `try_place`, and so must be the nodes that count the pod already (the
/// caller skips them: `try_place` leaves the pod's own usage out).
fn quick_reject_on(request: &PodRequest, memo: &mut ResolveMemo, state: &NodeState) -> Option<ReasonCode> {
    let d = state.decoded.as_ref().ok()?;
    let view = NodeView {
        name: &state.name,
        inventory: &d.inventory,
        config: &d.config,
        links: d.links.as_ref(),
        usage: &state.usage,
    };
    view.check(request).ok()?;
    quick_reject(request, memo.get(request, d), &view)
}

/// Allocates the pod on a decoded node under a given usage (the filter's node, or preempt's simulation with
/// victims taken off).
fn place_with(
    request: &PodRequest,
    memo: &mut ResolveMemo,
    name: &str,
    d: &DecodedNode,
    usage: &NodeUsage,
    gang: Option<&GangPlacement>,
) -> Result<PodAllocation, NodeFailure> {
    let view = NodeView { name, inventory: &d.inventory, config: &d.config, links: d.links.as_ref(), usage };
    view.check(request)?;
    let resolved = memo.get(request, d);
    precheck(request, resolved, &view)?;
    match gang {
        None => place(request, resolved, &view),
        Some(g) => place_aligned(request, resolved, &view, Some(&g.alignment(name, &d.domains))),
    }
}

impl<C: Cluster, K: Clock + 'static> Extender<C, K> {
    /// A new extender with an empty cache (fill it with [`sync`](Self::sync) and watch events).
    pub fn new(cluster: C, clock: Arc<K>, config: ExtenderConfig) -> Self {
        let cache = Arc::new(
            ClusterCache::new(config.domain.clone(), config.stuck_grace_ns)
                .with_link_topology(config.link_topology),
        );
        let event_tokens = TokenBucket::new(config.success_event_qps, config.success_event_burst);
        let deferred_events = config.defer_success_events.map(DeferredEvents::new);
        let bind_labels = match config.bind_writes {
            BindWrites::Binding => LABELS_RIDE_BINDING,
            BindWrites::BindingChecked => LABELS_UNCHECKED,
            BindWrites::PatchThenBinding => LABELS_DROPPED,
        };
        Self {
            cluster,
            clock,
            cache,
            config,
            filter_lock: tokio::sync::Mutex::new(()),
            pod_locks: PodLocks::default(),
            bind_queues: (0..BIND_STRIPES).map(|_| std::sync::Mutex::new(BindQueue::default())).collect(),
            stats: Stats::default(),
            observer: None,
            pending: std::sync::Mutex::new(PendingPlacements::default()),
            bind_labels: std::sync::atomic::AtomicU8::new(bind_labels),
            event_tokens: std::sync::Mutex::new(event_tokens),
            deferred_events,
        }
    }

    /// Reports stage timings to `observer` (e.g. [`Metrics`](crate::metrics::Metrics)).
    pub fn with_observer(mut self, observer: Arc<dyn ExtenderObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The pod's gang placement when cross-pod alignment applies to it (one index lookup for a gang or
    /// controller pod; nothing otherwise).
    fn gang_of(&self, pod: &Pod, request: &PodRequest) -> Option<GangPlacement> {
        if GangPlacement::applies(request) { GangPlacement::resolve(&self.cache, pod) } else { None }
    }

    /// Calls the observer, if there is one.
    fn notify(&self, f: impl FnOnce(&dyn ExtenderObserver)) {
        if let Some(o) = &self.observer {
            f(o.as_ref());
        }
    }

    fn observe(&self, stage: FilterStage, since: Instant) {
        self.notify(|o| o.filter_stage(stage, since.elapsed()));
    }

    /// The cache.
    pub fn cache(&self) -> &Arc<ClusterCache> {
        &self.cache
    }

    /// The cluster.
    pub fn cluster(&self) -> &C {
        &self.cluster
    }

    /// The settings.
    pub fn config(&self) -> &ExtenderConfig {
        &self.config
    }

    /// Verb counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Loads the cluster's snapshot into the cache.
    pub async fn sync(&self) -> Result<(), ClusterError> {
        let (nodes, pods) = self.cluster.snapshot().await?;
        self.cache.load(nodes, pods, self.clock.now_ns());
        Ok(())
    }

    async fn event(&self, pod: &Pod, kind: EventType, reason: &'static str, message: String) {
        self.event_on(&pod.namespace, &pod.name, kind, reason, || message).await;
    }

    /// The `BindingSucceed` event of a pod bound to `node`.
    async fn bound_event(&self, namespace: &str, name: &str, node: &str) {
        let message = || format!("Successfully bound to node \"{node}\"");
        self.event_on(namespace, name, EventType::Normal, "BindingSucceed", message).await;
    }

    /// Records an event on the pod `namespace/name`. The event (its strings, its message) is only built once
    /// it is known to be kept: a success event over the rate limit costs no allocation.
    async fn event_on(
        &self,
        namespace: &str,
        name: &str,
        kind: EventType,
        reason: &'static str,
        message: impl FnOnce() -> String,
    ) {
        let success = matches!(reason, "FilteringSucceed" | "BindingSucceed");
        if !self.config.emit_events || (success && !self.config.success_events) {
            return;
        }
        let at_ns = self.clock.now_ns();
        let event = || Event {
            namespace: namespace.to_owned(),
            pod: name.to_owned(),
            kind,
            reason,
            message: message(),
            at_ns,
        };
        if success {
            let kept = match &self.deferred_events {
                Some(queue) => {
                    let kept = queue.push(event());
                    self.notify(|o| o.events_deferred(queue.len()));
                    kept
                }
                None if self.event_tokens().take(at_ns) => {
                    self.cluster.record_event(event()).await;
                    self.notify(|o| o.success_events(1, 0));
                    true
                }
                None => false,
            };
            if !kept {
                self.success_events_dropped(1);
            }
            return;
        }
        self.cluster.record_event(event()).await;
    }

    fn event_tokens(&self) -> std::sync::MutexGuard<'_, TokenBucket> {
        self.event_tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks scheduling busy now (a filter or bind started), so deferred success events wait.
    fn scheduling_busy(&self) {
        if let Some(queue) = &self.deferred_events {
            queue.busy(self.clock.now_ns());
        }
    }

    /// Sends the deferred success events that are due ([`ExtenderConfig::defer_success_events`]): all the rate
    /// limit allows once no filter or bind has started for the quiet period, else those past the maximum
    /// delay. With `drain`, every waiting event the rate limit allows, quiet or not (shutting down). Returns
    /// how many were sent; 0 without deferral.
    pub async fn flush_events(&self, drain: bool) -> usize {
        let Some(queue) = &self.deferred_events else { return 0 };
        let now = self.clock.now_ns();
        let due = {
            let mut tokens = self.event_tokens();
            if drain { queue.drain(now, &mut tokens) } else { queue.due(now, &mut tokens) }
        };
        let sent = due.len();
        if sent > 0 {
            self.notify(|o| {
                o.success_events(sent as u64, 0);
                o.events_deferred(queue.len());
            });
        }
        for event in due {
            self.cluster.record_event(event).await;
        }
        sent
    }

    fn success_events_dropped(&self, n: u64) {
        self.stats.events_dropped.fetch_add(n, Ordering::Relaxed);
        self.notify(|o| o.success_events(0, n));
    }

    /// Success events waiting to be sent (0 without deferral).
    pub fn deferred_events(&self) -> usize {
        self.deferred_events.as_ref().map_or(0, DeferredEvents::len)
    }

    /// Sends deferred success events every `tick` (see [`flush_events`](Self::flush_events)) until `shutdown`
    /// completes, then what the rate limit allows of the rest. Returns at once without deferral.
    pub async fn run_event_flusher(
        self: Arc<Self>,
        tick: std::time::Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        if self.deferred_events.is_none() {
            return;
        }
        let mut interval = tokio::time::interval(tick.max(std::time::Duration::from_millis(1)));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = interval.tick() => {
                    self.flush_events(false).await;
                }
            }
        }
        let sent = self.flush_events(true).await;
        let left = self.deferred_events();
        if left > 0 {
            self.success_events_dropped(left as u64);
        }
        tracing::debug!(sent, dropped = left, "deferred events flushed at shutdown");
    }

    async fn patch(&self, pod: &Pod, patch: &MetadataPatch) -> Result<Pod, ExtenderError> {
        let mut last = ClusterError::Other("no attempt".into());
        for _ in 0..self.config.patch_attempts.max(1) {
            match self.cluster.patch_pod_metadata(&pod.namespace, &pod.name, patch).await {
                Ok(p) => return Ok(p),
                Err(e) if e.is_retriable() => last = e,
                Err(e) => return Err(ExtenderError::Patch { pod: pod.key(), source: e }),
            }
        }
        Err(ExtenderError::Patch { pod: pod.key(), source: last })
    }

    fn request(&self, pod: &Pod) -> Result<PodRequest, RequestBuildError> {
        pod.vgpu_request(&self.config.domain)
    }

    /// The live filter (`/scheduler/filter`): picks one node and reserves its GPUs in the cache.
    ///
    /// The filter writes nothing to the API server: the chosen placement waits in memory, held by the cache's
    /// reservation ([`DEFAULT_RESERVATION_TTL_NS`]), until [`bind`](Self::bind) writes it onto the pod in one
    /// patch just before it creates the binding. kube-scheduler runs filters one pod at a time and binds in
    /// parallel, so the patch round trip (about as long as the rest of a scheduling cycle together) is off its
    /// serial path. Nothing reads a pre-allocation before the pod is bound: the device plugin allocates for
    /// bound pods only, and the follower replicas of the extender do not filter. If this process restarts
    /// between filter and bind, the bind finds no placement, fails, and kube-scheduler schedules the pod again.
    ///
    /// The candidate names are moved into the answer (the chosen node and the rejected ones refer to them by
    /// position), so a call over thousands of nodes copies none of them and makes no `String` per node
    /// ([`CandidateNames`]; a `Vec<String>` or a slice of names converts). Repeated names are collapsed and an
    /// oversized list is answered for the cached nodes only ([`candidate_bound`]).
    ///
    /// Filters of the same pod (by UID) run one after the other; a pod that already holds a valid placement
    /// (pending here from an earlier filter, or a pre-allocation in the pod's annotations) gets that node back
    /// if it is a candidate, so concurrent or repeated filters of one pod all answer the node its reservation
    /// is on and the bind that follows finds a matching placement. If
    /// that node is not a candidate the call fails (`pod <uid> had been predicated`), as upstream does once its
    /// informer has seen the patch. Filters of different pods never wait on each other for this.
    pub async fn filter(&self, pod: Option<&Pod>, nodes: impl Into<CandidateNames>) -> FilterResult {
        let start = Instant::now();
        self.scheduling_busy();
        let out = self.filter_inner(pod, nodes.into()).await;
        self.stats.filter_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match out {
            Ok(r) => {
                let c = if r.passed.is_empty() { &self.stats.filter_no_fit } else { &self.stats.filter_fit };
                c.fetch_add(1, Ordering::Relaxed);
                r
            }
            Err(e) => {
                self.stats.filter_error.fetch_add(1, Ordering::Relaxed);
                FilterResult::failed_call(e.to_string())
            }
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, PendingPlacements> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a pending placement on `node` expiring at `expires_ns` still holds its GPUs: not expired, and
    /// the cache's reservation for the pod is this placement's (same node, same expiry).
    fn holds(&self, uid: &str, node: &str, expires_ns: i64, now: i64) -> bool {
        expires_ns >= now && self.cache.reservation(uid).is_some_and(|(n, e)| n == node && e == expires_ns)
    }

    /// The node of the pod's pending placement, while it [holds](Self::holds).
    fn pending_node(&self, uid: &str, now: i64) -> Option<String> {
        let (node, expires_ns) = self.pending().by_uid.get(uid).map(|p| (p.node.clone(), p.expires_ns))?;
        self.holds(uid, &node, expires_ns, now).then_some(node)
    }

    fn remember_pending(&self, uid: &str, placement: PendingPlacement, now: i64) {
        let mut pending = self.pending();
        if pending.by_uid.len() >= pending.sweep_at.max(PENDING_SWEEP_AT) {
            pending.by_uid.retain(|_, p| p.expires_ns >= now);
            pending.sweep_at = pending.by_uid.len() * 2;
        }
        pending.by_uid.insert(uid.to_owned(), placement);
    }

    /// The device claim a pod is placed with: the one its filter chose while the bind is pending, else the
    /// planned claim of the cached pod (its `pre-allocated`, else `real-allocated` annotation).
    pub fn placed_claim(&self, uid: &str) -> Option<PodDeviceClaim> {
        if let Some(p) = self.pending().by_uid.get(uid) {
            return Some(p.claim.clone());
        }
        prealloc::planned_claim(&*self.cache.pod(uid)?, &self.config.domain)
    }

    /// Placements chosen by filters and not bound yet (for tests and diagnostics).
    pub fn pending_count(&self) -> usize {
        self.pending().by_uid.len()
    }

    /// The node of a valid pre-allocation the pod holds (contract §3.1 step 5), if any.
    fn held_node(&self, pod: &Pod, now: i64) -> Option<String> {
        let d = &self.config.domain;
        let target = prealloc::predicate_node(pod, d)?;
        (prealloc::planned_claim(pod, d).is_some()
            && prealloc::should_count(pod, d, self.config.stuck_grace_ns).at(now))
        .then(|| target.to_owned())
    }

    async fn checked_request<'p>(
        &self,
        pod: Option<&'p Pod>,
    ) -> Result<(&'p Pod, PodRequest), ExtenderError> {
        let pod = pod.ok_or(ExtenderError::NoPod)?;
        if let Some(n) = pod.node_name.as_deref().filter(|n| !n.is_empty()) {
            return Err(ExtenderError::AlreadyBound(n.to_owned()));
        }
        let request = match self.request(pod) {
            Ok(r) => r,
            Err(e) => {
                self.event(pod, EventType::Warning, "ResourceInvalid", e.to_string()).await;
                return Err(e.into());
            }
        };
        for p in &request.invalid_policies {
            self.event(pod, EventType::Warning, "PolicyInvalid", p.to_string()).await;
        }
        Ok((pod, request))
    }

    async fn filter_inner(
        &self,
        pod: Option<&Pod>,
        nodes: CandidateNames,
    ) -> Result<FilterResult, ExtenderError> {
        let (pod, request) = self.checked_request(pod).await?;
        let (nodes, rows, generation) = distinct_candidates(&self.cache, nodes);
        if request.is_empty() {
            return Ok(FilterResult::all_passed(nodes));
        }
        if nodes.is_empty() {
            return Err(ExtenderError::NoNodes);
        }
        let _pod_lock = self.pod_locks.lock(&pod.uid).await;
        let now = self.clock.now_ns();
        // The cache's copy of the pod is at least as fresh as the scheduler's: it carries the patch of an
        // earlier filter of this pod as soon as that filter returned.
        let cached = self.cache.pod(&pod.uid);
        if let Some(n) = cached.as_ref().and_then(|p| p.node_name.as_deref()).filter(|n| !n.is_empty()) {
            return Err(ExtenderError::AlreadyBound(n.to_owned()));
        }
        // A placement of this process's own earlier filter that kube-scheduler no longer offers (its cycle
        // failed after our filter, e.g. in another plugin's Reserve or Permit, and extenders are not told):
        // nothing was written, so it is given up and the pod placed anew instead of refused until it expires.
        let pending = match self.pending_node(&pod.uid, now) {
            Some(node) if !nodes.contains(&node) => {
                self.pending().by_uid.remove(&pod.uid);
                self.cache.release(&node, &pod.uid);
                None
            }
            held => held,
        };
        let held = pending.or_else(|| {
            [cached.as_deref(), Some(pod)].into_iter().flatten().find_map(|p| self.held_node(p, now))
        });
        if let Some(target) = held {
            let Some(at) = nodes.position(&target) else {
                return Err(ExtenderError::AlreadyPredicated(pod.uid.clone()));
            };
            let mut outcome = vec![Some(ReasonCode::AlreadyScheduledElsewhere); nodes.len()];
            outcome[at] = None;
            return Ok(FilterResult::from_outcome(nodes, &outcome));
        }
        let t_stage = Instant::now();
        let _serial = if self.config.serialize_filter { Some(self.filter_lock.lock().await) } else { None };
        if self.config.serialize_filter {
            self.observe(FilterStage::LockWait, t_stage);
        }
        // Nodes may have come and gone while this call waited for its locks: resolve the rows again, but only
        // then (a second pass over thousands of names was a quarter of an uncontended filter's time).
        let rows =
            if self.cache.node_generation() == generation { rows } else { self.cache.candidate_rows(&nodes) };
        let t_stage = Instant::now();
        self.cache.sweep(now);
        // Per input position: why the node was rejected (`None`: ranked and not tried yet, or chosen).
        let mut outcome: Vec<Option<ReasonCode>> = vec![None; nodes.len()];
        let mut memo = ResolveMemo::default();
        // Nodes whose usage counts this pod (as a rule none: a pod holding a placement was answered above):
        // they are never rejected from their rows (a placement attempt leaves the pod's own usage out).
        let own = self.cache.nodes_counting(&pod.uid);
        let ranked =
            rank_candidates(&self.cache, &request, &nodes, &rows, &mut memo, Some(&own), |pos, code| {
                outcome[pos] = Some(code)
            });
        // Only as much of the order as is tried gets sorted (usually the first node fits).
        let mut ranking = Ranking::new(request.node_policy, ranked);
        self.observe(FilterStage::Node, t_stage);
        let t_stage = Instant::now();
        let mut chosen: Option<(usize, PodAllocation)> = None;
        let expires = now.saturating_add(self.config.reservation_ttl_ns);
        let gang = self.gang_of(pod, &request);
        let table = self.cache.rank_rows();
        for (pos, name, _) in ranking.by_ref() {
            let own_node = own.iter().any(|n| n == name);
            if !own_node
                && let Some(code) = rows.get(pos).and_then(|&id| row_reject(&table, id, &request, &memo))
            {
                outcome[pos] = Some(code);
                continue;
            }
            let Some(slot) = self.cache.node(name) else {
                outcome[pos] = Some(ReasonCode::NodeCacheMiss);
                continue;
            };
            let mut s = lock(&slot);
            if !own_node && let Some(code) = quick_reject_on(&request, &mut memo, &s) {
                outcome[pos] = Some(code);
                continue;
            }
            let (placed, searches) =
                record_link_searches(|| try_place(&request, &mut memo, &s, &pod.uid, gang.as_ref()));
            self.notify(|o| searches.into_iter().for_each(|search| o.link_subset_search(search)));
            match placed {
                Ok(alloc) => {
                    let fp = prealloc::footprint(pod, &alloc.claim);
                    self.cache.reserve_locked(&mut s, &pod.uid, fp, expires);
                    chosen = Some((pos, alloc));
                    break;
                }
                Err(f) => outcome[pos] = Some(f.code),
            }
        }
        for &(pos, _, _) in ranking.rest() {
            outcome[pos] = Some(ReasonCode::AlreadyScheduledElsewhere);
        }
        drop(ranking);
        self.observe(FilterStage::Device, t_stage);
        let Some((pos, alloc)) = chosen else {
            let text = render_unavailable(
                nodes.len(),
                nodes.iter().zip(&outcome).filter_map(|(n, c)| c.map(|c| (n, c))),
            );
            self.event(pod, EventType::Warning, "FilteringFailed", text).await;
            return Ok(FilterResult::from_outcome(nodes, &outcome));
        };
        let node = nodes[pos].to_owned();
        let encoded = match pod_devices::encode(&alloc.claim) {
            Ok(e) => e,
            Err(e) => {
                self.cache.release(&node, &pod.uid);
                return Err(ExtenderError::Internal(e.to_string()));
            }
        };
        let t_stage = Instant::now();
        self.cache.track_reservation_of(&node, &pod.uid, expires, &alloc.claim);
        let placement = PendingPlacement {
            node: node.clone(),
            expires_ns: expires,
            pre_allocated: encoded,
            claim: alloc.claim.clone(),
        };
        self.remember_pending(&pod.uid, placement, now);
        self.observe(FilterStage::CacheUpdate, t_stage);
        if let (Some(o), Some(w)) = (&self.observer, alloc.alignment) {
            o.crosspod_window(w);
        }
        for n in &alloc.notices {
            self.event(pod, EventType::Warning, "TopologyFallback", n.message.clone()).await;
        }
        let message = || format!("Successfully matched node \"{node}\"");
        self.event_on(&pod.namespace, &pod.name, EventType::Normal, "FilteringSucceed", message).await;
        Ok(FilterResult::from_outcome(nodes, &outcome))
    }

    /// The side-effect-free filter (`/scheduler/filter-dryrun`): every node evaluated, every feasible node
    /// returned in input order, detailed reasons, no lock, no reservation, no patch, no event. Candidates as
    /// in [`filter`](Self::filter) ([`candidate_bound`]).
    pub fn filter_dry_run(&self, pod: Option<&Pod>, nodes: impl Into<CandidateNames>) -> FilterResult {
        let nodes = nodes.into();
        let run = || -> Result<FilterResult, ExtenderError> {
            let pod = pod.ok_or(ExtenderError::NoPod)?;
            if let Some(n) = pod.node_name.as_deref().filter(|n| !n.is_empty()) {
                return Err(ExtenderError::AlreadyBound(n.to_owned()));
            }
            let request = self.request(pod)?;
            let (nodes, _, _) = distinct_candidates(&self.cache, nodes);
            if request.is_empty() {
                return Ok(FilterResult::all_passed(nodes));
            }
            if nodes.is_empty() {
                return Err(ExtenderError::NoNodes);
            }
            let mut memo = ResolveMemo::default();
            let gang = self.gang_of(pod, &request);
            let slots = self.cache.nodes(nodes.iter());
            let mut out = FilterResult { names: nodes, ..FilterResult::default() };
            for (pos, slot) in slots.into_iter().enumerate() {
                let r = match slot {
                    None => Err(NodeFailure::new(ReasonCode::NodeCacheMiss)),
                    Some(slot) => {
                        try_place(&request, &mut memo, &lock(&slot), &pod.uid, gang.as_ref()).map(|_| ())
                    }
                };
                match r {
                    Ok(()) => out.passed.push(pos),
                    Err(f) => {
                        out.failed.push(Failure { pos, code: f.code, reason: Cow::Owned(f.detailed()) })
                    }
                }
            }
            Ok(out)
        };
        run().unwrap_or_else(|e| FilterResult::failed_call(e.to_string()))
    }

    /// Prioritize: host priorities 0..=10 from the node-policy score (0 for nodes that cannot fit, are
    /// unknown, or for pods without vGPUs), one per distinct candidate ([`candidate_bound`]: repeats collapsed,
    /// unknown names of an oversized list left out). A pod whose vGPU limits are invalid (a bad quantity, too
    /// many GPUs) is an error, not a row of zeros.
    pub fn prioritize(
        &self,
        pod: &Pod,
        nodes: impl Into<CandidateNames>,
    ) -> Result<Vec<HostPriority>, ExtenderError> {
        let request = self.request(pod)?;
        let (nodes, rows, _) = distinct_candidates(&self.cache, nodes.into());
        let mut scores = vec![0; nodes.len()];
        if !request.is_empty() {
            let mut memo = ResolveMemo::default();
            for (pos, _, score) in
                rank_candidates(&self.cache, &request, &nodes, &rows, &mut memo, None, |_, _| ())
            {
                scores[pos] = score.host_priority();
            }
        }
        Ok(nodes
            .iter()
            .zip(scores)
            .map(|(host, score)| HostPriority { host: host.to_owned(), score })
            .collect())
    }

    async fn mark_failed(&self, pod: &Pod, message: &str) {
        let d = &self.config.domain;
        // Upstream CleanupMetadata removed annotation keys from the labels map; here each key goes to its map.
        // The UID precondition keeps the mark off a pod re-created under the same name since `pod` was read.
        let patch = MetadataPatch::default()
            .with_uid(pod.uid.clone())
            .label(d.assigned_phase(), phase::FAILED)
            .remove_label(d.metrics_node())
            .annotation(d.predicate_time(), PREDICATE_TIME_DONE.to_string());
        if let Ok(updated) = self.patch(pod, &patch).await {
            self.cache.upsert_pod(updated, self.clock.now_ns());
        }
        self.event(pod, EventType::Warning, "BindingFailed", message.to_owned()).await;
    }

    /// Bind (`/scheduler/bind`): writes the filter's placement onto the pod (or checks the pre-allocation the
    /// pod carries), marks the pod allocating and creates the binding.
    ///
    /// With `SerializedNodeBind` (upstream: a per-node mutex around the whole bind) the binds to one node form
    /// a queue: their patches run concurrently, and each binding is created once the one queued before it is
    /// done, so bindings land in `predicate-time` order as upstream's mutex makes them, at one API round trip
    /// per pod and node instead of two.
    pub async fn bind(&self, namespace: &str, name: &str, uid: &str, node: &str) -> BindResult {
        self.scheduling_busy();
        match self.bind_inner(namespace, name, uid, node).await {
            Ok(()) => {
                self.stats.bind_success.fetch_add(1, Ordering::Relaxed);
                BindResult::default()
            }
            Err(e) => {
                self.stats.bind_error.fetch_add(1, Ordering::Relaxed);
                BindResult { error: e.to_string() }
            }
        }
    }

    async fn bind_inner(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
    ) -> Result<(), ExtenderError> {
        if node.is_empty() {
            return Err(ExtenderError::NoBindNode);
        }
        // Binds of one pod (kube-scheduler retrying after a timeout) run one after the other, so a retry sees
        // what the first one did.
        let _pod_lock = self.pod_locks.lock(uid).await;
        let (turn, now) = self.take_turn(node);
        let pending = self.pending().by_uid.remove(uid);
        let (pod, is_vgpu, carried) = match pending {
            Some(placement) => {
                let (pod, carried) = self.bind_pending(namespace, name, uid, node, placement, now).await?;
                (pod, true, carried)
            }
            None => {
                let pod = self.cluster.get_pod(namespace, name).await?;
                if pod.uid != uid {
                    return Err(ExtenderError::UidMismatch(uid.to_owned()));
                }
                // A repeated bind must not touch a bound pod: binding to the same node again is a success, to
                // another node an error; neither marks the pod failed.
                match pod.node_name.as_deref() {
                    Some(bound) if bound == node => return Ok(()),
                    Some(bound) => return Err(ExtenderError::AlreadyBound(bound.to_owned())),
                    None => {}
                }
                self.bind_annotated(pod, node, now).await?
            }
        };
        // The turn is held until the binding is created (or failed): only then may the next bind of the node go.
        let _done = match turn {
            Some(BindTurn { previous, _done }) => {
                if let Some(previous) = previous {
                    // Done or dropped: either way it is this bind's turn.
                    let _ = previous.await;
                }
                Some(_done)
            }
            None => None,
        };
        self.create_binding(pod, node, is_vgpu, carried, now).await
    }

    /// How binds write the pre-allocation now: [`BindWrites::BindingChecked`] until the first bind's labels
    /// are seen on its pod, then [`BindWrites::Binding`] — or [`BindWrites::PatchThenBinding`] for good if
    /// they were dropped (or when so configured).
    pub fn bind_writes(&self) -> BindWrites {
        match self.bind_labels.load(Ordering::Acquire) {
            LABELS_RIDE_BINDING => BindWrites::Binding,
            LABELS_UNCHECKED => BindWrites::BindingChecked,
            _ => BindWrites::PatchThenBinding,
        }
    }

    /// Whether the pre-allocation rides on the binding (else it is patched first).
    fn binding_carries(&self) -> bool {
        self.bind_labels.load(Ordering::Acquire) != LABELS_DROPPED
    }

    /// Writes a bind's pre-allocation: patched now (the patched pod is returned, nothing is carried), or, when
    /// it rides on the binding, returned to be carried (the pod unchanged).
    async fn write_or_carry(
        &self,
        pod: Pod,
        patch: MetadataPatch,
        now: i64,
    ) -> Result<(Pod, Option<MetadataPatch>), ExtenderError> {
        if self.binding_carries() {
            return Ok((pod, Some(patch)));
        }
        let t_stage = Instant::now();
        let patched = self.patch(&pod, &patch).await;
        self.observe(FilterStage::Patch, t_stage);
        let updated = patched?;
        let t_stage = Instant::now();
        self.cache.upsert_pod(updated.clone(), now);
        self.observe(FilterStage::CacheUpdate, t_stage);
        Ok((updated, None))
    }

    /// After each bind that carried labels before they were seen on a pod ([`BindWrites::BindingChecked`]):
    /// reads the pod back; labels seen → binds carry them unchecked from now on (unless another check found
    /// them dropped); labels dropped → they are patched on now (the device plugin finds the pod by them) and
    /// every later bind patches first. A failed read leaves the check to the next bind.
    async fn check_carried_labels(&self, pod: &Pod, carried: &MetadataPatch, now: i64) {
        let live = match self.cluster.get_pod(&pod.namespace, &pod.name).await {
            Ok(p) if p.uid == pod.uid => p,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(pod = %pod.key(), error = %e, "cannot read the bound pod back to check its labels");
                return;
            }
        };
        let missing: Vec<&String> = carried
            .labels
            .iter()
            .filter(|(k, v)| v.is_some() && !live.labels.contains_key(*k))
            .map(|(k, _)| k)
            .collect();
        if missing.is_empty() {
            if self
                .bind_labels
                .compare_exchange(LABELS_UNCHECKED, LABELS_RIDE_BINDING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                tracing::info!("kube-apiserver copies binding labels onto pods: each bind is one write");
            }
            return;
        }
        if self.bind_labels.swap(LABELS_DROPPED, Ordering::AcqRel) != LABELS_DROPPED {
            tracing::warn!(
                pod = %pod.key(),
                labels = ?missing,
                "kube-apiserver dropped the labels of a binding (older than 1.35, or PodTopologyLabelsAdmission \
                 off): patching them on, and patching before every later bind (--bind-writes=patch)"
            );
        }
        let mut repair = MetadataPatch::default().with_uid(pod.uid.clone());
        repair.labels = carried.labels.clone();
        match self.patch(&live, &repair).await {
            Ok(updated) => self.cache.upsert_pod(updated, now),
            Err(e) => {
                tracing::error!(pod = %pod.key(), error = %e, "cannot patch the dropped binding labels on");
            }
        }
    }

    /// The bind's `predicate-time` and, with `SerializedNodeBind`, its place in the node's queue: the
    /// pre-allocation patches of binds to one node run concurrently, but each binding is created only once the
    /// one before it is done, so the bindings of a node land in `predicate-time` order — the order in which
    /// the device plugin matches its Allocate calls to pods (the oldest `allocating` pod first). The time is
    /// strictly increasing per queue.
    fn take_turn(&self, node: &str) -> (Option<BindTurn>, i64) {
        let now = self.clock.now_ns();
        if !self.config.serialize_bind {
            return (None, now);
        }
        let stripe = (fnv32a(node) as usize) % BIND_STRIPES;
        let Some(queue) = self.bind_queues.get(stripe) else { return (None, now) };
        let mut q = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let time = now.max(q.last_time_ns.saturating_add(1));
        q.last_time_ns = time;
        let (done, next) = tokio::sync::oneshot::channel();
        let previous = q.tail.replace(next);
        (Some(BindTurn { previous, _done: done }), time)
    }

    /// Bind of a pod whose placement a filter of this process chose ([`PendingPlacement`]): the whole
    /// pre-allocation (labels `metrics-node` and `assigned-phase=allocating`, annotations `predicate-node`,
    /// `pre-allocated`, an empty `real-allocated` and `predicate-time`) is returned to ride on the binding
    /// ([`BindWrites`]; the reservation is renewed to hold until then), or written now in one patch with the
    /// pod's UID as precondition, the patched pod replacing the reservation in the cache. The pod is read
    /// from the cache (the watch's copy); only a pod the cache does not hold yet is read from the API server.
    async fn bind_pending(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        placement: PendingPlacement,
        now: i64,
    ) -> Result<(Pod, Option<MetadataPatch>), ExtenderError> {
        let d = &self.config.domain;
        let pod = match self.cache.pod(uid).filter(|p| p.namespace == namespace && p.name == name) {
            Some(p) => (*p).clone(),
            None => self.cluster.get_pod(namespace, name).await?,
        };
        let fail = |e: ExtenderError| {
            self.cache.release(&placement.node, uid);
            e
        };
        if pod.uid != uid {
            return Err(fail(ExtenderError::UidMismatch(uid.to_owned())));
        }
        if let Some(bound) = pod.node_name.as_deref().filter(|n| !n.is_empty()) {
            return Err(fail(ExtenderError::AlreadyBound(bound.to_owned())));
        }
        if placement.node != node {
            let e = ExtenderError::NodeMismatch { predicate: placement.node.clone(), node: node.to_owned() };
            return Err(fail(self.refuse(&pod, e).await));
        }
        if !self.holds(uid, &placement.node, placement.expires_ns, now) {
            let e = ExtenderError::PreallocExpired(placement.node.clone());
            return Err(fail(self.refuse(&pod, e).await));
        }
        let patch = MetadataPatch::default()
            .with_uid(uid)
            .label(d.metrics_node(), node)
            .label(d.assigned_phase(), phase::ALLOCATING)
            .annotation(d.predicate_node(), node)
            .annotation(d.pre_allocated(), placement.pre_allocated)
            .annotation(d.real_allocated(), "")
            .annotation(d.predicate_time(), now.to_string());
        if self.binding_carries() {
            // The reservation holds the GPUs until the binding is written: long enough for the node's queue.
            self.cache.renew_reservation(uid, now.saturating_add(self.config.reservation_ttl_ns));
            // Carried on the binding: nothing is written now, so nothing can fail here (and the pod, the
            // cache's copy, is not copied a second time for an error path).
            return Ok((pod, Some(patch)));
        }
        match self.write_or_carry(pod.clone(), patch, now).await {
            Ok(out) => Ok(out),
            Err(e) => {
                self.cache.release(node, uid);
                Err(self.refuse(&pod, e).await)
            }
        }
    }

    /// Marks the pod failed (phase, `BindingFailed` event) with the error's text and returns the error.
    async fn refuse(&self, pod: &Pod, e: ExtenderError) -> ExtenderError {
        self.mark_failed(pod, &e.to_string()).await;
        e
    }

    /// Bind of a pod without a pending placement here: a vGPU pod must carry a valid pre-allocation for this
    /// node in its annotations (written by another replica's or an earlier version's filter, or by
    /// vgpu-manager's extender); it is marked allocating (patched now, or carried on the binding). Returns the
    /// pod, whether it is a vGPU pod, and the metadata the binding carries.
    async fn bind_annotated(
        &self,
        pod: Pod,
        node: &str,
        now: i64,
    ) -> Result<(Pod, bool, Option<MetadataPatch>), ExtenderError> {
        let d = &self.config.domain;
        let is_vgpu = self.request(&pod).map(|r| !r.is_empty()).unwrap_or(true)
            || pod.annotations.contains_key(&d.pre_allocated());
        if !is_vgpu {
            return Ok((pod, false, None));
        }
        let predicate = prealloc::predicate_node(&pod, d).unwrap_or_default().to_owned();
        if predicate != node {
            let e = ExtenderError::NodeMismatch { predicate, node: node.to_owned() };
            return Err(self.refuse(&pod, e).await);
        }
        let valid = prealloc::planned_claim(&pod, d).is_some()
            && prealloc::should_count(&pod, d, self.config.stuck_grace_ns).at(now);
        if !valid {
            return Err(self.refuse(&pod, ExtenderError::PreallocExpired(predicate)).await);
        }
        let patch = MetadataPatch::default()
            .with_uid(pod.uid.clone())
            .label(d.assigned_phase(), phase::ALLOCATING)
            .label(d.metrics_node(), node)
            .annotation(d.predicate_time(), now.to_string());
        match self.write_or_carry(pod.clone(), patch, now).await {
            Ok((pod, carried)) => Ok((pod, true, carried)),
            Err(e) => Err(self.refuse(&pod, e).await),
        }
    }

    /// Creates the binding, carrying the pre-allocation when it was not patched; a vGPU pod whose binding fails
    /// is marked failed (and a carried placement's reservation released).
    async fn create_binding(
        &self,
        mut pod: Pod,
        node: &str,
        is_vgpu: bool,
        carried: Option<MetadataPatch>,
        now: i64,
    ) -> Result<(), ExtenderError> {
        let mut binding = Binding::new(&pod.namespace, &pod.name, &pod.uid, node);
        if let Some(c) = &carried {
            binding = binding.carrying(c);
        }
        // Every binding sent before the labels were seen on a pod is checked, even if another bind's check
        // has meanwhile found them dropped: its labels need the same repair.
        let check = carried.is_some() && self.bind_labels.load(Ordering::Acquire) != LABELS_RIDE_BINDING;
        let t_stage = Instant::now();
        let bound = self.cluster.bind_pod(&binding).await;
        if carried.is_some() {
            self.observe(FilterStage::Patch, t_stage);
        }
        if let Err(e) = bound {
            if carried.is_some() {
                self.cache.release(node, &pod.uid);
            }
            if is_vgpu {
                self.mark_failed(&pod, &e.to_string()).await;
            }
            return Err(e.into());
        }
        if let Some(c) = &carried {
            c.apply_to(&mut pod.labels, &mut pod.annotations);
        }
        pod.node_name = Some(node.to_owned());
        pod.unschedulable_since_ns = None;
        match carried.as_ref().filter(|_| check) {
            Some(c) => {
                self.cache.upsert_pod(pod.clone(), now);
                self.check_carried_labels(&pod, c, now).await;
                self.bound_event(&pod.namespace, &pod.name, node).await;
            }
            None => {
                // The usual bind: the pod moves into the cache (it is not copied); the event needs only its
                // namespace and name.
                let (namespace, name) = (pod.namespace.clone(), pod.name.clone());
                self.cache.upsert_pod(pod, now);
                self.bound_event(&namespace, &name, node).await;
            }
        }
        Ok(())
    }

    /// Preempt (`/scheduler/preempt`, contract §3.4), for a vGPU pod; other pods (and a missing pod) pass
    /// through.
    ///
    /// Per candidate node: the scheduler's victims that are protected (terminating or finished, critical,
    /// DaemonSet-owned, inside the bind window, of the preemptor's own gang) are dropped; if the pod does not
    /// fit once the rest are gone, lower-priority bound vGPU pods of that node are added until it fits, in the
    /// contract's order — on the preemptor's gang-anchor NVLink component first, then pods outside a gang, lower
    /// priority, newer — with every pod whose eviction would violate a PodDisruptionBudget after all the
    /// non-violating ones (kube-scheduler's default preemption). Once the pod fits, added victims it fits
    /// without are given back, violating ones first. A node where the pod never fits is dropped.
    ///
    /// The budgets are listed from the cluster once per call (module [`pdb`](crate::pdb)); the answer's
    /// [`PreemptResult::pdb_violations`] counts the victims that violate one. If the list fails, victims are
    /// ordered without budgets and the count is left to the conservative bound.
    ///
    /// Events on the preemptor: `GangDisruptedByPreemption` (Warning) once per other gang whose members are
    /// among the victims, and `PreemptionFailed` (Warning, `preemption: 0/N nodes are available: …`) when no
    /// candidate node is left.
    pub async fn preempt(&self, pod: Option<&Pod>, victims: &BTreeMap<String, Vec<String>>) -> PreemptResult {
        let passthrough = || PreemptResult { node_victims: victims.clone(), ..PreemptResult::default() };
        let Some(pod) = pod else {
            self.stats.preempt_other.fetch_add(1, Ordering::Relaxed);
            return passthrough();
        };
        let Some(request) = self.request(pod).ok().filter(|r| !r.is_empty()) else {
            self.stats.preempt_other.fetch_add(1, Ordering::Relaxed);
            return passthrough();
        };
        let pdbs = match self.cluster.list_pod_disruption_budgets().await {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(
                    pod = %pod.key(), error = %e,
                    "listing PodDisruptionBudgets failed; preempting without them"
                );
                None
            }
        };
        let gang = self.gang_of(pod, &request);
        let mut memo = ResolveMemo::default();
        let mut out = PreemptResult::default();
        let mut failures: Vec<(&str, ReasonCode)> = Vec::new();
        for (node, uids) in victims {
            let on =
                NodePreemption { pod, request: &request, gang: gang.as_ref(), pdbs: pdbs.as_deref(), node };
            match self.preempt_on(&on, &mut memo, uids) {
                Ok((chosen, violations)) => {
                    if let Some(v) = violations {
                        out.pdb_violations.insert(node.clone(), v);
                    }
                    out.node_victims.insert(node.clone(), chosen);
                }
                Err(code) => failures.push((node, code)),
            }
        }
        let mut gangs: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (node, uids) in &out.node_victims {
            for v in uids.iter().filter_map(|u| self.cache.pod(u)) {
                if let Some(g) = &v.gang {
                    gangs.entry(g.clone()).or_default().push(format!("{} on node {node:?}", v.key()));
                }
            }
        }
        for (g, members) in gangs {
            let more = members.len() > MAX_LISTED_VICTIMS;
            let mut list = members.iter().take(MAX_LISTED_VICTIMS).cloned().collect::<Vec<_>>().join(", ");
            if more {
                list.push_str(", …");
            }
            let text = format!("preemption may evict {} pod(s) of gang {g:?}: {list}", members.len());
            self.event(pod, EventType::Warning, "GangDisruptedByPreemption", text).await;
        }
        if out.node_victims.is_empty() && !victims.is_empty() {
            let text = format!("preemption: {}", render_unavailable(victims.len(), failures));
            self.event(pod, EventType::Warning, "PreemptionFailed", text).await;
        }
        let c =
            if out.node_victims.is_empty() { &self.stats.preempt_other } else { &self.stats.preempt_victims };
        c.fetch_add(1, Ordering::Relaxed);
        out
    }

    /// Victims on one node (see [`preempt`](Self::preempt)): the chosen UIDs (the scheduler's unprotected
    /// victims in their order, then the added ones) and their budget violations (`None` without budgets), or
    /// why the pod does not fit even with every eligible victim gone.
    fn preempt_on(
        &self,
        on: &NodePreemption<'_>,
        memo: &mut ResolveMemo,
        uids: &[String],
    ) -> Result<(Vec<String>, Option<i64>), ReasonCode> {
        let (pod, d) = (on.pod, &self.config.domain);
        let slot = self.cache.node(on.node).ok_or(ReasonCode::NodeCacheMiss)?;
        // Pods are read before the node is locked (the cache's lock order is index, then node).
        let sent: Vec<Arc<Pod>> =
            uids.iter().filter_map(|u| self.cache.pod(u)).filter(|v| !protected(pod, v)).collect();
        let here = self.cache.pods_on(on.node);
        let (decoded, mut usage) = {
            let s = lock(&slot);
            (s.decoded.as_ref().map_err(|f| f.code)?.clone(), s.usage.clone())
        };
        usage.remove_pod(&pod.uid);
        for v in &sent {
            usage.remove_pod(&v.uid);
        }
        let mut fits =
            |usage: &NodeUsage| place_with(on.request, memo, on.node, &decoded, usage, on.gang).map(drop);
        let mut last = fits(&usage).err().map(|f| f.code);
        let mut added: Vec<(Candidate, bool)> = Vec::new();
        if last.is_some() {
            let anchor = on.gang.and_then(|g| g.alignment(on.node, &decoded.domains).anchor_gpus);
            let taken: HashSet<&str> = sent.iter().map(|v| v.uid.as_str()).collect();
            let mut extra: Vec<Candidate> = here
                .into_iter()
                .filter(|v| !taken.contains(v.uid.as_str()) && v.uid != pod.uid)
                .filter(|v| !protected(pod, v) && v.priority < pod.priority)
                .filter_map(|v| {
                    let claim = prealloc::planned_claim(&v, d)?;
                    let on_anchor =
                        anchor.as_ref().is_some_and(|a| claim.devices().any(|c| a.contains(&c.index)));
                    Some(Candidate { footprint: prealloc::footprint(&v, &claim), on_anchor, pod: v })
                })
                .collect();
            extra.sort_by(Candidate::eviction_order);
            // Which candidates would violate a budget, spent by the scheduler's victims first and then in
            // eviction order; the violating ones go after all the others (order kept within each part).
            let mut probe = Budgets::new(on.pdbs.unwrap_or_default());
            for v in &sent {
                probe.evict(v);
            }
            let (clean, violating): (Vec<_>, Vec<_>) =
                extra.into_iter().map(|c| (probe.evict(&c.pod), c)).partition(|(bad, _)| !bad);
            for (bad, c) in clean.into_iter().chain(violating) {
                usage.remove_pod(&c.pod.uid);
                added.push((c, bad));
                last = fits(&usage).err().map(|f| f.code);
                if last.is_none() {
                    break;
                }
            }
            if last.is_none() {
                // Give back what the pod fits without: violating victims first, the most important (the last
                // added) first within each part.
                let part = |violating: bool| {
                    added
                        .iter()
                        .enumerate()
                        .rev()
                        .filter(move |(_, (_, bad))| *bad == violating)
                        .map(|(i, _)| i)
                };
                let back: Vec<usize> = part(true).chain(part(false)).collect();
                let mut keep = vec![true; added.len()];
                for i in back {
                    let (Some((c, _)), Some(k)) = (added.get(i), keep.get_mut(i)) else { continue };
                    usage.insert_pod(c.pod.uid.clone(), c.footprint.clone());
                    if fits(&usage).is_ok() {
                        *k = false;
                    } else {
                        usage.remove_pod(&c.pod.uid);
                    }
                }
                let mut keep = keep.into_iter();
                added.retain(|_| keep.next().unwrap_or(true));
            }
        }
        if let Some(code) = last {
            return Err(code);
        }
        let chosen = sent.iter().map(|v| &**v).chain(added.iter().map(|(c, _)| &*c.pod));
        let violations = on.pdbs.map(|p| Budgets::count_violations(p, chosen.clone()));
        Ok((chosen.map(|v| v.uid.clone()).collect(), violations))
    }
}

/// At most this many victims are named in a `GangDisruptedByPreemption` message.
const MAX_LISTED_VICTIMS: usize = 5;

/// What [`Extender::preempt_on`] evaluates: the preemptor on one candidate node.
struct NodePreemption<'a> {
    pod: &'a Pod,
    request: &'a PodRequest,
    gang: Option<&'a GangPlacement>,
    pdbs: Option<&'a [PodDisruptionBudget]>,
    node: &'a str,
}

/// A pod preempt may add as a victim.
struct Candidate {
    pod: Arc<Pod>,
    footprint: PodFootprint,
    /// Holds a GPU of the preemptor's gang-anchor NVLink component on this node.
    on_anchor: bool,
}

impl Candidate {
    /// The contract's order of extra victims: on the gang-anchor component first, outside a gang first, lower
    /// priority first, newer first (then by UID, for a stable answer).
    fn eviction_order(a: &Self, b: &Self) -> std::cmp::Ordering {
        let (p, q) = (&a.pod, &b.pod);
        b.on_anchor
            .cmp(&a.on_anchor)
            .then(p.gang.is_some().cmp(&q.gang.is_some()))
            .then(p.priority.cmp(&q.priority))
            .then(q.created_ns.cmp(&p.created_ns))
            .then(p.uid.cmp(&q.uid))
    }
}

/// A victim preempt must never take (contract §3.4): terminating or finished, critical (priority ≥ 2·10⁹),
/// DaemonSet-owned, inside the bind window (counted but not bound), or of the preemptor's own gang.
fn protected(preemptor: &Pod, v: &Pod) -> bool {
    v.deleting
        || v.phase.is_terminal()
        || v.priority >= 2_000_000_000
        || v.owner_kind.as_deref() == Some("DaemonSet")
        || v.node_name.is_none()
        || (preemptor.gang.is_some() && v.gang == preemptor.gang)
}

impl<K: Clock + 'static> Extender<MemoryCluster, K> {
    /// Feeds the in-memory cluster's changes into the cache (like informers with no delay).
    pub fn attach(&self) {
        let cache = self.cache.clone();
        let clock = self.clock.clone();
        self.cluster.watch(move |e| cache.apply(e, clock.now_ns()));
    }
}

#[cfg(test)]
mod tests {
    use super::BindWrites;

    #[test]
    fn bind_writes_auto_follows_the_server_version() {
        for (major, minor, want) in [
            ("1", "35", BindWrites::BindingChecked),
            ("1", "37+", BindWrites::BindingChecked),
            ("2", "0", BindWrites::BindingChecked),
            ("1", "34", BindWrites::PatchThenBinding),
            ("1", "30+", BindWrites::PatchThenBinding),
            ("1", "", BindWrites::PatchThenBinding),
            ("x", "40", BindWrites::PatchThenBinding),
        ] {
            assert_eq!(BindWrites::auto_for(major, minor), want, "{major}.{minor}");
        }
    }
}
