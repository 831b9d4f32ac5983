//! Scheduler metrics (contract §3.6): the `vgpu_scheduler_*` families in a prometheus-client registry,
//! exposed by the server's `GET /metrics` in the OpenMetrics text format, followed by the standard `process_*` families
//! ([`process_metrics`](vgpu_serve::process_metrics)).
//!
//! | family | labels | filled by |
//! |---|---|---|
//! | `vgpu_scheduler_verb_total` | `verb`, `result` | every verb call, at the HTTP layer (see [`Verb`] and the `*_result_label` functions) |
//! | `vgpu_scheduler_verb_duration_seconds` | `verb`, `stage` | `stage="total"` for every verb call; `node`, `device`, `lock_wait` for live filters (through [`ExtenderObserver`]) |
//! | `vgpu_scheduler_node_reject_total` | `verb`, `code` | every `FailedNodes` entry of filter and filter-dryrun, by reason code (e.g. `InsufficientVGPUSlot`) |
//! | `vgpu_scheduler_pod_policy_total` | `node_policy`, `device_policy`, `topology_mode` | every live filter of a vGPU pod; values outside the contract's forms → `other` |
//! | `vgpu_scheduler_topology_strict_reject_total` | `mode` | every node a `link-strict`/`numa-strict` pod was rejected on for topology |
//! | `vgpu_scheduler_topology_placement_total` | `mode`, `result` | every successful live filter of a `link`/`numa` pod, from the chosen GPUs and the node's topology |
//! | `vgpu_scheduler_preempt_victims_added` | – | per node answered by a preempt call: victims added beyond the scheduler's |
//! | `vgpu_scheduler_preempt_protected_total` | `reason` | every victim the scheduler proposed that preempt keeps (protected) |
//! | `vgpu_scheduler_link_search_total` | `algo` | every GPU subset search of link placement while a live filter tries a node (`exhaustive` up to `MAX_COMBINATIONS` subsets, `greedy` above), through [`ExtenderObserver`] |
//! | `vgpu_scheduler_link_search_candidates` | `algo` | the same searches: GPUs searched among (the policy run that overflowed the need) |
//! | `vgpu_scheduler_http_connections_total` | `protocol`, `tls` | every connection the server accepted, by the protocol served (`http/1.1`, or `h2` when kube-scheduler negotiated it over TLS); with `vgpu_scheduler_http_connections_open` and `vgpu_scheduler_tls_handshake_failures_total` ([`ConnectionStats`]) |
//! | `vgpu_scheduler_crosspod_alignment_total` | `result` | every live filter placing a `link` + `cross-pod-topology` pod whose gang siblings were already placed: the window the placement came from (`rail`, `component`, `none`; the loosest over its containers), through [`ExtenderObserver`] |
//!
//! Series whose labels are known in advance (every verb/result pair, strict modes, search algorithms,
//! protection reasons, alignment results) are created at zero, so they are exposed before the first event;
//! the others appear once seen, as with client_golang.
//!
//! Verb results: filter and filter-dryrun `fit`/`no_fit`/`error`; bind `success`/`no_node`/`pod_not_found`/
//! `uid_mismatch`/`node_mismatch`/`prealloc_expired`/`patch_failed`/`bind_failed`; preempt `victims`/
//! `no_victims`/`passthrough`; prioritize (new) `success`. A request refused before the verb runs (malformed or
//! oversized body, caches not synced, server busy: see [`crate::work`]) counts as `result="error"` for every verb.

use std::fmt;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use vgpu_core::alloc::{AlignmentWindow, LinkSearch, LinkSearchAlgo, LinkTier, ReasonCode};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{PodDeviceClaim, SchedulingPolicy, TopologyMode};
use vgpu_serve::http::ConnectionStats;

use crate::cluster::Pod;
use crate::decoded::DecodedNode;
use crate::extender::{ExtenderObserver, FilterResult, FilterStage};

/// `Content-Type` of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Buckets of `vgpu_scheduler_link_search_candidates`.
pub const LINK_SEARCH_CANDIDATE_BUCKETS: [f64; 9] = [2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0];
/// Buckets of `vgpu_scheduler_preempt_victims_added`.
pub const PREEMPT_VICTIMS_ADDED_BUCKETS: [f64; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0];

/// Every `result` of each verb, pre-created at zero in `verb_total`.
pub const VERB_RESULTS: &[(Verb, &[&str])] = &[
    (Verb::Filter, &["fit", "no_fit", "error"]),
    (Verb::FilterDryRun, &["fit", "no_fit", "error"]),
    (Verb::Prioritize, &["success", "error"]),
    (
        Verb::Bind,
        &[
            "success",
            "no_node",
            "pod_not_found",
            "uid_mismatch",
            "node_mismatch",
            "prealloc_expired",
            "patch_failed",
            "bind_failed",
            "error",
        ],
    ),
    (Verb::Preempt, &["victims", "no_victims", "passthrough", "error"]),
];

/// The `reason` values of `preempt_protected_total`.
pub const PROTECTION_REASONS: [&str; 5] = ["terminating", "critical", "daemonset", "binding", "gang_sibling"];

/// An extender verb (the `verb` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// `/scheduler/filter`.
    Filter,
    /// `/scheduler/filter-dryrun`.
    FilterDryRun,
    /// `/scheduler/prioritize`.
    Prioritize,
    /// `/scheduler/bind`.
    Bind,
    /// `/scheduler/preempt`.
    Preempt,
}

impl Verb {
    /// The label value (`filter`, `filter_dryrun`, `prioritize`, `bind`, `preempt`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Filter => "filter",
            Verb::FilterDryRun => "filter_dryrun",
            Verb::Prioritize => "prioritize",
            Verb::Bind => "bind",
            Verb::Preempt => "preempt",
        }
    }
}

/// A timed stage (the `stage` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The whole call, body decoding included.
    Total,
    /// Node gates and ranking.
    Node,
    /// Allocation until a node fits.
    Device,
    /// Waiting for the serialized-filter lock.
    LockWait,
}

impl Stage {
    /// The label value (`total`, `node`, `device`, `lock_wait`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Total => "total",
            Stage::Node => "node",
            Stage::Device => "device",
            Stage::LockWait => "lock_wait",
        }
    }
}

impl Stage {
    /// The contract stage of a filter stage; `None` for the diagnosis-only steps (patch, cache update),
    /// which have no `stage` label value.
    pub fn of_filter(s: FilterStage) -> Option<Self> {
        match s {
            FilterStage::LockWait => Some(Stage::LockWait),
            FilterStage::Node => Some(Stage::Node),
            FilterStage::Device => Some(Stage::Device),
            FilterStage::Patch | FilterStage::CacheUpdate => None,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbResult {
    verb: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbStage {
    verb: &'static str,
    stage: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbCode {
    verb: &'static str,
    code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeResult {
    mode: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabel {
    mode: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlgoLabel {
    algo: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// The `pod_policy_total` labels of a pod: each value is one of the contract's forms, `other` for anything
/// else; an absent annotation counts as its default (`none`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    /// `node-scheduler-policy`: `binpack`, `spread`, `none` or `other`.
    pub node_policy: &'static str,
    /// `device-scheduler-policy`: `binpack`, `spread`, `none` or `other`.
    pub device_policy: &'static str,
    /// `device-topology-mode`: `none`, `numa`, `numa-strict`, `link`, `link-strict` or `other`.
    pub topology_mode: &'static str,
}

fn whitelisted<T: std::str::FromStr + Default>(
    value: Option<&String>,
    name: fn(T) -> &'static str,
) -> &'static str {
    match value.map(|v| v.trim()).filter(|v| !v.is_empty()) {
        None => name(T::default()),
        Some(v) => v.parse::<T>().map_or("other", name),
    }
}

impl PolicyLabels {
    /// The labels of a pod's policy annotations.
    pub fn from_pod(pod: &Pod, domain: &ResourceDomain) -> Self {
        let a = &pod.annotations;
        Self {
            node_policy: whitelisted::<SchedulingPolicy>(
                a.get(&domain.node_scheduler_policy()),
                SchedulingPolicy::as_str,
            ),
            device_policy: whitelisted::<SchedulingPolicy>(
                a.get(&domain.device_scheduler_policy()),
                SchedulingPolicy::as_str,
            ),
            topology_mode: whitelisted::<TopologyMode>(
                a.get(&domain.device_topology_mode()),
                TopologyMode::as_str,
            ),
        }
    }
}

/// The `result` label of a filter or dry-run answer: `error`, `fit` or `no_fit`.
pub fn filter_result_label(result: &FilterResult) -> &'static str {
    if !result.error.is_empty() {
        "error"
    } else if result.passed().len() == 0 {
        "no_fit"
    } else {
        "fit"
    }
}

/// The `result` label of a bind answer, from its `Error` text (the messages of
/// [`ExtenderError`](crate::ExtenderError)).
pub fn bind_result_label(error: &str) -> &'static str {
    if error.is_empty() {
        "success"
    } else if error.starts_with("ExtenderBindingArgs.Node cannot be empty") {
        "no_node"
    } else if error.starts_with("different uid") {
        "uid_mismatch"
    } else if error.starts_with("predicate node") {
        "node_mismatch"
    } else if error.starts_with("device pre allocation check failed") {
        "prealloc_expired"
    } else if error.starts_with("failed to patch pod") {
        "patch_failed"
    } else if error.starts_with("pod ") && error.ends_with(" not found") {
        "pod_not_found"
    } else {
        "bind_failed"
    }
}

/// Why preempt keeps a proposed victim (the `reason` label of `preempt_protected_total`), with the rules of
/// [`Extender::preempt`](crate::Extender::preempt): `terminating` (deleting or finished), `critical`
/// (priority ≥ 2,000,000,000), `daemonset`, `binding` (not bound yet), `gang_sibling` (same gang as the
/// preemptor); `None` when it may be evicted.
pub fn protection_reason(victim: &Pod, preemptor: &Pod) -> Option<&'static str> {
    if victim.deleting || victim.phase.is_terminal() {
        Some("terminating")
    } else if victim.priority >= 2_000_000_000 {
        Some("critical")
    } else if victim.owner_kind.as_deref() == Some("DaemonSet") {
        Some("daemonset")
    } else if victim.node_name.is_none() {
        Some("binding")
    } else if preemptor.gang.is_some() && victim.gang == preemptor.gang {
        Some("gang_sibling")
    } else {
        None
    }
}

/// The `result` label of `topology_placement_total` for a placed pod: the weakest outcome over its
/// multi-GPU containers. `link` modes: the tightest tier joining each container's GPUs (`nvlink`, `switch`,
/// `numa`, `any`), `spanned` when no tier joins them, `none` when the node publishes no topology. `numa`
/// modes: `numa` when each container's GPUs share a NUMA node, `cross-numa` otherwise, `none` when a GPU has
/// no NUMA node. `None` for other modes and for pods without a multi-GPU container.
pub fn placement_result(
    mode: TopologyMode,
    claim: &PodDeviceClaim,
    node: &DecodedNode,
) -> Option<&'static str> {
    let groups: Vec<Vec<u32>> = claim
        .containers
        .iter()
        .map(|c| c.devices.iter().map(|d| d.index).collect::<Vec<u32>>())
        .filter(|g| g.len() > 1)
        .collect();
    if groups.is_empty() {
        return None;
    }
    match mode.base() {
        TopologyMode::Link => {
            let Some(links) = node.links.as_ref() else { return Some("none") };
            // Rank 0..=3 for the ladder, 4 for spanned; the weakest container decides.
            let worst = groups
                .iter()
                .map(|g| {
                    LinkTier::LADDER.iter().position(|&t| links.components(g, t).len() == 1).unwrap_or(4)
                })
                .max()
                .unwrap_or(4);
            Some(LinkTier::LADDER.get(worst).map_or("spanned", |t| t.as_str()))
        }
        TopologyMode::Numa => {
            let mut out = "numa";
            for g in &groups {
                let numa: Vec<Option<u32>> =
                    g.iter().map(|i| node.inventory.get(*i).and_then(|d| d.numa_node)).collect();
                if numa.iter().any(Option::is_none) {
                    return Some("none");
                }
                if numa.windows(2).any(|w| w[0] != w[1]) {
                    out = "cross-numa";
                }
            }
            Some(out)
        }
        _ => None,
    }
}

/// Upper bounds of `vgpu_scheduler_verb_duration_seconds`: `ExponentialBuckets(0.0001, 3, 12)`, i.e.
/// 0.0001·3^i s for i in 0..12, computed as 3^i/10⁴ so the `le` labels print as the exact decimals
/// (`0.0003`, not `0.00030000000000000003`).
pub fn verb_duration_buckets() -> [f64; 12] {
    let mut b = [0.0; 12];
    for (i, v) in b.iter_mut().enumerate() {
        *v = 3f64.powi(i as i32) / 10_000.0;
    }
    b
}

fn verb_duration_histogram() -> Histogram {
    Histogram::new(verb_duration_buckets())
}

fn link_search_histogram() -> Histogram {
    Histogram::new(LINK_SEARCH_CANDIDATE_BUCKETS)
}

/// The scheduler's metric families and their registry. Cheap to share behind an `Arc`; every method takes
/// `&self`.
pub struct Metrics {
    registry: Registry,
    /// The `process_*` families (no prefix).
    process: Registry,
    verb_total: Family<VerbResult, Counter>,
    verb_duration: Family<VerbStage, Histogram, fn() -> Histogram>,
    node_reject: Family<VerbCode, Counter>,
    topology_placement: Family<ModeResult, Counter>,
    pod_policy: Family<PolicyLabels, Counter>,
    topology_strict_reject: Family<ModeLabel, Counter>,
    link_search: Family<AlgoLabel, Counter>,
    link_search_candidates: Family<AlgoLabel, Histogram, fn() -> Histogram>,
    preempt_victims_added: Histogram,
    preempt_protected: Family<ReasonLabel, Counter>,
    crosspod_alignment: Family<ResultLabel, Counter>,
    success_events: Family<ResultLabel, Counter>,
    events_deferred: Gauge,
    connections: ConnectionStats,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every family registered under the `vgpu_scheduler` prefix, all at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("vgpu_scheduler");
        let verb_total = Family::<VerbResult, Counter>::default();
        let verb_duration =
            Family::<VerbStage, Histogram, fn() -> Histogram>::new_with_constructor(verb_duration_histogram);
        let node_reject = Family::<VerbCode, Counter>::default();
        let topology_placement = Family::<ModeResult, Counter>::default();
        let pod_policy = Family::<PolicyLabels, Counter>::default();
        let topology_strict_reject = Family::<ModeLabel, Counter>::default();
        let link_search = Family::<AlgoLabel, Counter>::default();
        let link_search_candidates =
            Family::<AlgoLabel, Histogram, fn() -> Histogram>::new_with_constructor(link_search_histogram);
        let preempt_victims_added = Histogram::new(PREEMPT_VICTIMS_ADDED_BUCKETS);
        let preempt_protected = Family::<ReasonLabel, Counter>::default();
        let crosspod_alignment = Family::<ResultLabel, Counter>::default();
        let success_events = Family::<ResultLabel, Counter>::default();
        let events_deferred = Gauge::default();
        // Counter names get their `_total` suffix from the encoder.
        registry.register("verb", "Extender verb calls by result", verb_total.clone());
        registry.register(
            "verb_duration_seconds",
            "Extender verb latency by stage (total, node, device, lock_wait)",
            verb_duration.clone(),
        );
        registry.register("node_reject", "Nodes rejected by filter, by reason code", node_reject.clone());
        registry.register(
            "topology_placement",
            "Topology-aware placements by mode and achieved tier",
            topology_placement.clone(),
        );
        registry.register("pod_policy", "Filtered vGPU pods by policy annotations", pod_policy.clone());
        registry.register(
            "topology_strict_reject",
            "Nodes rejected for a strict topology mode",
            topology_strict_reject.clone(),
        );
        registry.register("link_search", "Link-topology subset searches by algorithm", link_search.clone());
        registry.register(
            "link_search_candidates",
            "Candidate GPUs of a link-topology subset search",
            link_search_candidates.clone(),
        );
        registry.register(
            "preempt_victims_added",
            "Victims added by preempt beyond the scheduler's proposal, per node",
            preempt_victims_added.clone(),
        );
        registry.register(
            "preempt_protected",
            "Proposed victims kept by preempt, by protection reason",
            preempt_protected.clone(),
        );
        registry.register(
            "crosspod_alignment",
            "Cross-pod (gang) topology alignment outcomes",
            crosspod_alignment.clone(),
        );
        registry.register(
            "success_events",
            "Normal events of pods scheduled without trouble (FilteringSucceed, BindingSucceed): sent, or dropped \
             (over the rate limit, a full deferral queue, or waiting at shutdown)",
            success_events.clone(),
        );
        registry.register(
            "events_deferred",
            "Success events waiting for a quiet moment (--event-quiet-period)",
            events_deferred.clone(),
        );
        // Series known in advance start at zero, so they are exposed before the first event.
        for (verb, results) in VERB_RESULTS {
            for result in *results {
                let _ = verb_total.get_or_create(&VerbResult { verb: verb.as_str(), result });
            }
        }
        for mode in ["link-strict", "numa-strict"] {
            let _ = topology_strict_reject.get_or_create(&ModeLabel { mode });
        }
        for algo in LinkSearchAlgo::ALL.map(LinkSearchAlgo::as_str) {
            let _ = link_search.get_or_create(&AlgoLabel { algo });
            let _ = link_search_candidates.get_or_create(&AlgoLabel { algo });
        }
        for reason in PROTECTION_REASONS {
            let _ = preempt_protected.get_or_create(&ReasonLabel { reason });
        }
        for result in ["rail", "component", "none"] {
            let _ = crosspod_alignment.get_or_create(&ResultLabel { result });
        }
        for result in ["sent", "dropped"] {
            let _ = success_events.get_or_create(&ResultLabel { result });
        }
        let connections = ConnectionStats::new();
        connections.register(&mut registry);
        let mut process = Registry::default();
        process.register_collector(Box::new(vgpu_serve::process_metrics::ProcessCollector));
        Self {
            registry,
            process,
            verb_total,
            verb_duration,
            node_reject,
            topology_placement,
            pod_policy,
            topology_strict_reject,
            link_search,
            link_search_candidates,
            preempt_victims_added,
            preempt_protected,
            crosspod_alignment,
            success_events,
            events_deferred,
            connections,
        }
    }

    /// The server's connection counts (`vgpu_scheduler_http_connections_total` and the rest), which
    /// [`crate::server::run`] fills.
    pub fn connections(&self) -> &ConnectionStats {
        &self.connections
    }

    /// The registry (to encode it together with other registries).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The OpenMetrics text exposition (served with [`CONTENT_TYPE`]): the `vgpu_scheduler_*` families, then
    /// the `process_*` ones ([`process_metrics`](vgpu_serve::process_metrics)).
    pub fn encode(&self) -> Result<String, fmt::Error> {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        text::encode_registry(&mut out, &self.registry)?;
        text::encode_registry(&mut out, &self.process)?;
        text::encode_eof(&mut out)?;
        Ok(out)
    }

    /// One verb call: `verb_total{verb,result}` and `verb_duration_seconds{verb,stage="total"}`.
    pub fn verb(&self, verb: Verb, result: &'static str, elapsed: Duration) {
        self.verb_total.get_or_create(&VerbResult { verb: verb.as_str(), result }).inc();
        self.stage(verb, Stage::Total, elapsed);
    }

    /// One stage timing.
    pub fn stage(&self, verb: Verb, stage: Stage, elapsed: Duration) {
        self.verb_duration
            .get_or_create(&VerbStage { verb: verb.as_str(), stage: stage.as_str() })
            .observe(elapsed.as_secs_f64());
    }

    /// Node rejections of a filter or dry-run answer: one `node_reject_total{verb,code}` per `FailedNodes`
    /// entry, and `topology_strict_reject_total{mode}` per node rejected for topology when the pod's mode is
    /// strict. Counts are summed per code first (a live filter rejects every candidate but one).
    pub fn filter_rejects(&self, verb: Verb, result: &FilterResult, topology_mode: &'static str) {
        let mut per_code: Vec<(ReasonCode, u64)> = Vec::new();
        for f in result.failed_nodes() {
            match per_code.iter_mut().find(|(c, _)| *c == f.code) {
                Some((_, n)) => *n += 1,
                None => per_code.push((f.code, 1)),
            }
        }
        for (code, n) in per_code {
            self.node_reject.get_or_create(&VerbCode { verb: verb.as_str(), code: code.as_str() }).inc_by(n);
            if verb == Verb::Filter
                && matches!(code, ReasonCode::LinkTopologyUnsatisfied | ReasonCode::NumaTopologyUnsatisfied)
            {
                self.topology_strict_reject.get_or_create(&ModeLabel { mode: topology_mode }).inc_by(n);
            }
        }
    }

    /// One live filter of a vGPU pod: `pod_policy_total`.
    pub fn pod_policy(&self, labels: PolicyLabels) {
        self.pod_policy.get_or_create(&labels).inc();
    }

    /// One topology-aware placement: `topology_placement_total{mode,result}`.
    pub fn topology_placement(&self, mode: &'static str, result: &'static str) {
        self.topology_placement.get_or_create(&ModeResult { mode, result }).inc();
    }

    /// Victims added by preempt on one node: `preempt_victims_added`.
    pub fn preempt_victims_added(&self, added: usize) {
        self.preempt_victims_added.observe(added as f64);
    }

    /// One protected victim: `preempt_protected_total{reason}` (`terminating`, `critical`, `daemonset`,
    /// `binding`, `gang_sibling`).
    pub fn preempt_protected(&self, reason: &'static str) {
        self.preempt_protected.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// One link-topology subset search: `link_search_total{algo}` and `link_search_candidates{algo}` (GPUs
    /// searched among).
    pub fn link_search(&self, algo: &'static str, candidates: usize) {
        self.link_search.get_or_create(&AlgoLabel { algo }).inc();
        self.link_search_candidates.get_or_create(&AlgoLabel { algo }).observe(candidates as f64);
    }

    /// One cross-pod alignment outcome: `crosspod_alignment_total{result}` (`rail`, `component`, `none`).
    pub fn crosspod_alignment(&self, result: &'static str) {
        self.crosspod_alignment.get_or_create(&ResultLabel { result }).inc();
    }
}

impl ExtenderObserver for Metrics {
    fn filter_stage(&self, stage: FilterStage, elapsed: Duration) {
        if let Some(stage) = Stage::of_filter(stage) {
            self.stage(Verb::Filter, stage, elapsed);
        }
    }

    fn crosspod_window(&self, window: AlignmentWindow) {
        self.crosspod_alignment(window.as_str());
    }

    fn link_subset_search(&self, search: LinkSearch) {
        self.link_search(search.algo.as_str(), search.candidates);
    }

    fn success_events(&self, sent: u64, dropped: u64) {
        for (result, n) in [("sent", sent), ("dropped", dropped)] {
            if n > 0 {
                self.success_events.get_or_create(&ResultLabel { result }).inc_by(n);
            }
        }
    }

    fn events_deferred(&self, waiting: usize) {
        self.events_deferred.set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extender::ExtenderError;
    use vgpu_kube::error::ClusterError;

    #[test]
    fn every_family_is_exposed_with_contract_names() {
        let m = Metrics::new();
        // Families whose series are only known once seen are not exposed before (as in client_golang).
        let text = m.encode().unwrap();
        assert!(!text.contains("vgpu_scheduler_node_reject"));
        assert!(text.contains("vgpu_scheduler_success_events_total{result=\"dropped\"} 0\n"), "{text}");
        assert!(text.contains("vgpu_scheduler_events_deferred 0\n"), "{text}");
        assert!(text.contains(r#"vgpu_scheduler_verb_total{verb="filter",result="fit"} 0"#), "{text}");
        m.verb(Verb::Bind, "success", Duration::ZERO);
        m.filter_rejects(Verb::Filter, &FilterResult::default(), "none");
        let mut unhealthy = FilterResult::default();
        unhealthy.push_short("n", ReasonCode::DeviceUnhealthy);
        m.filter_rejects(Verb::Filter, &unhealthy, "none");
        m.topology_placement("link", "nvlink");
        m.pod_policy(PolicyLabels { node_policy: "none", device_policy: "none", topology_mode: "none" });
        let text = m.encode().unwrap();
        for family in [
            "vgpu_scheduler_verb",
            "vgpu_scheduler_verb_duration_seconds",
            "vgpu_scheduler_node_reject",
            "vgpu_scheduler_topology_placement",
            "vgpu_scheduler_pod_policy",
            "vgpu_scheduler_topology_strict_reject",
            "vgpu_scheduler_link_search",
            "vgpu_scheduler_link_search_candidates",
            "vgpu_scheduler_preempt_victims_added",
            "vgpu_scheduler_preempt_protected",
            "vgpu_scheduler_crosspod_alignment",
        ] {
            assert!(text.contains(&format!("# TYPE {family} ")), "{family} missing in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn samples_and_buckets() {
        let m = Metrics::new();
        m.verb(Verb::Filter, "fit", Duration::from_micros(150));
        m.filter_stage(FilterStage::LockWait, Duration::from_millis(2));
        let mut r = FilterResult::default();
        r.push_short("a", ReasonCode::InsufficientVgpuSlot);
        r.push_short("b", ReasonCode::LinkTopologyUnsatisfied);
        r.push_short("c", ReasonCode::InsufficientVgpuSlot);
        m.filter_rejects(Verb::Filter, &r, "link-strict");
        m.preempt_victims_added(3);
        let text = m.encode().unwrap();
        assert!(text.contains(r#"vgpu_scheduler_verb_total{verb="filter",result="fit"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"vgpu_scheduler_verb_duration_seconds_bucket{le="0.0003",verb="filter",stage="total"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"vgpu_scheduler_verb_duration_seconds_bucket{le="0.0001",verb="filter",stage="total"} 0"#
        ));
        assert!(
            text.contains(r#"vgpu_scheduler_verb_duration_seconds_count{verb="filter",stage="lock_wait"} 1"#)
        );
        assert!(text.contains(r#"le="17.7147""#), "12 buckets up to 0.0001*3^11");
        assert!(text.contains(r#"le="0.0243""#));
        assert!(text.contains(r#"vgpu_scheduler_verb_total{verb="bind",result="prealloc_expired"} 0"#));
        assert!(text.contains(r#"vgpu_scheduler_crosspod_alignment_total{result="rail"} 0"#));
        assert!(
            text.contains(r#"vgpu_scheduler_node_reject_total{verb="filter",code="InsufficientVGPUSlot"} 2"#)
        );
        assert!(text.contains(r#"vgpu_scheduler_topology_strict_reject_total{mode="link-strict"} 1"#));
        assert!(text.contains(r#"vgpu_scheduler_preempt_victims_added_bucket{le="3.0"} 1"#), "{text}");
    }

    #[test]
    fn bind_labels_follow_extender_error_texts() {
        let cases = [
            (ExtenderError::NoBindNode, "no_node"),
            (ExtenderError::UidMismatch("u".into()), "uid_mismatch"),
            (ExtenderError::NodeMismatch { predicate: "a".into(), node: "b".into() }, "node_mismatch"),
            (ExtenderError::PreallocExpired("a".into()), "prealloc_expired"),
            (
                ExtenderError::Patch { pod: "ns/p".into(), source: ClusterError::Conflict("x".into()) },
                "patch_failed",
            ),
            (ExtenderError::Cluster(ClusterError::NotFound("pod ns/p".into())), "pod_not_found"),
            (ExtenderError::Cluster(ClusterError::NotFound("node n".into())), "bind_failed"),
            (ExtenderError::Cluster(ClusterError::Other("boom".into())), "bind_failed"),
        ];
        for (e, label) in cases {
            assert_eq!(bind_result_label(&e.to_string()), label, "{e}");
        }
        assert_eq!(bind_result_label(""), "success");
    }

    #[test]
    fn placement_results_from_claims_and_topology() {
        use vgpu_core::model::{ContainerDeviceClaim, DeviceClaim, NodeDeviceInventory, NodeVgpuConfig};
        use vgpu_core::topology::{DeviceTopology, GpuLinks, P2PLinkType};
        let d = ResourceDomain::default();
        let inv = NodeDeviceInventory::uniform(4, 1024, 2);
        // 0-1 and 2-3 joined by one NVLink (code 7), everything else through the host bridge (PHB, 3).
        let code = |a: usize, b: usize| if a / 2 == b / 2 { 7 } else { 3 };
        let topo = DeviceTopology {
            gpus: (0..4)
                .map(|i| GpuLinks {
                    index: i,
                    links: (0..4)
                        .filter(|j| *j != i)
                        .map(|j| (j, vec![P2PLinkType::from_code(code(i, j)).unwrap()]))
                        .collect(),
                })
                .collect(),
        };
        let cache = crate::cache::ClusterCache::new(d.clone(), 1);
        for (name, t) in [("linked", Some(&topo)), ("plain", None)] {
            cache.upsert_node(
                &crate::fixture::vgpu_node(name, &inv, &NodeVgpuConfig::default(), t, &d).unwrap(),
            );
        }
        let decoded = |n: &str| cache.node(n).unwrap().lock().unwrap().decoded.clone().unwrap();
        let (linked, plain) = (decoded("linked"), decoded("plain"));
        let claim = |groups: &[&[u32]]| PodDeviceClaim {
            containers: groups
                .iter()
                .enumerate()
                .map(|(c, g)| ContainerDeviceClaim {
                    name: format!("c{c}"),
                    devices: g.iter().map(|&index| DeviceClaim { index, ..Default::default() }).collect(),
                })
                .collect(),
        };
        let link = TopologyMode::Link;
        assert_eq!(placement_result(link, &claim(&[&[0, 1]]), &linked), Some("nvlink"));
        assert_eq!(placement_result(TopologyMode::LinkStrict, &claim(&[&[2, 3]]), &linked), Some("nvlink"));
        assert_eq!(
            placement_result(link, &claim(&[&[0, 1], &[1, 2]]), &linked),
            Some("numa"),
            "weakest wins"
        );
        assert_eq!(placement_result(link, &claim(&[&[0, 1]]), &plain), Some("none"));
        assert_eq!(placement_result(link, &claim(&[&[0], &[3]]), &linked), None, "single-GPU containers");
        let numa = TopologyMode::Numa;
        assert_eq!(placement_result(numa, &claim(&[&[0, 1]]), &plain), Some("numa"));
        assert_eq!(placement_result(numa, &claim(&[&[1, 2]]), &plain), Some("cross-numa"));
        assert_eq!(placement_result(TopologyMode::None, &claim(&[&[0, 1]]), &plain), None);
    }

    #[test]
    fn policy_labels_are_whitelisted() {
        let d = ResourceDomain::default();
        let mut pod = Pod::default();
        assert_eq!(
            PolicyLabels::from_pod(&pod, &d),
            PolicyLabels { node_policy: "none", device_policy: "none", topology_mode: "none" }
        );
        pod.annotations.insert(d.node_scheduler_policy(), " Binpack ".into());
        pod.annotations.insert(d.device_scheduler_policy(), "weird".into());
        pod.annotations.insert(d.device_topology_mode(), "link-strict".into());
        assert_eq!(
            PolicyLabels::from_pod(&pod, &d),
            PolicyLabels { node_policy: "binpack", device_policy: "other", topology_mode: "link-strict" }
        );
    }
}
