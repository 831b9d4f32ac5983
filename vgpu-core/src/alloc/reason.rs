//! Why a node cannot take a pod: the contract's reason codes and phrases (§3.1) and the
//! `0/N nodes are available: …` summary.

use std::collections::BTreeMap;
use std::fmt;

macro_rules! reasons {
    ($( $(#[$m:meta])* $v:ident => $code:literal, $phrase:literal; )+) => {
        /// A reason code of `pkg/scheduler/reason`, with its short phrase.
        ///
        /// Phrases the contract does not spell out (memory, core, cards, resources, topology, internal) are ours
        /// and follow the style of the others.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ReasonCode {
            $( $(#[$m])* $v, )+
        }

        impl ReasonCode {
            /// Every code, in the contract's order.
            pub const ALL: &'static [ReasonCode] = &[$(ReasonCode::$v),+];

            /// The upstream identifier, e.g. `InsufficientVGPUSlot`.
            pub fn as_str(self) -> &'static str {
                match self { $( ReasonCode::$v => $code, )+ }
            }

            /// The short phrase shown to users, e.g. `Insufficient vGPU slots`.
            pub fn phrase(self) -> &'static str {
                match self { $( ReasonCode::$v => $phrase, )+ }
            }
        }
    };
}

reasons! {
    /// The node has no allocatable `vgpu-number`.
    NodeNotVgpuEnabled => "NodeNotVGPUEnabled", "node not vGPU-enabled";
    /// `node-device-register` is missing.
    NodeNoVgpuRegister => "NodeNoVGPURegister", "node has no vGPU registered";
    /// `node-config-info` is missing.
    NodeNoVgpuConfig => "NodeNoVGPUConfig", "node has no vGPU configuration";
    /// `node-device-register` does not decode.
    NodeBadVgpuRegister => "NodeBadVGPURegister", "node vGPU registry invalid";
    /// `node-config-info` does not decode or has `deviceSplit == 0`.
    NodeBadVgpuConfig => "NodeBadVGPUConfig", "node vGPU configuration invalid";
    /// `memoryFactor == 0`.
    NodeBadMemoryFactor => "NodeBadMemoryFactor", "node memory factor invalid";
    /// The pod's memory policy does not admit the node's memory scaling.
    NodeMemoryTypeMismatch => "NodeMemoryTypeMismatch", "node memory type mismatch";
    /// The node is not in the scheduler's cache.
    NodeCacheMiss => "NodeCacheMiss", "node missing from cache";
    /// The node's usage could not be built.
    NodeInfoBuildFailed => "NodeInfoBuildFailed", "node info build failed";
    /// GPU unhealthy.
    DeviceUnhealthy => "DeviceUnhealthy", "GPU unhealthy";
    /// GPU in MIG mode.
    DeviceMigEnabled => "DeviceMIGEnabled", "GPU has MIG enabled";
    /// No free vGPU slot.
    InsufficientVgpuSlot => "InsufficientVGPUSlot", "Insufficient vGPU slots";
    /// Not enough free memory.
    InsufficientVgpuMemory => "InsufficientVGPUMemory", "Insufficient vGPU memory";
    /// Not enough free cores.
    InsufficientVgpuCore => "InsufficientVGPUCore", "Insufficient vGPU cores";
    /// GPU type excluded or not included.
    DeviceTypeMismatch => "DeviceTypeMismatch", "GPU type mismatch";
    /// GPU UUID excluded or not included.
    DeviceUuidMismatch => "DeviceUUIDMismatch", "GPU UUID mismatch";
    /// Fewer schedulable GPUs than vGPUs requested by one container.
    InsufficientGpuCards => "InsufficientGPUCards", "Insufficient GPU cards";
    /// Not enough GPUs fit, without a dominant per-GPU reason.
    InsufficientGpuResources => "InsufficientGPUResources", "Insufficient GPU resources";
    /// `link-strict`: no NVLink-connected set.
    LinkTopologyUnsatisfied => "LinkTopologyUnsatisfied", "GPU link topology unsatisfied";
    /// `numa-strict`: no NUMA node holds enough GPUs.
    NumaTopologyUnsatisfied => "NUMATopologyUnsatisfied", "GPU NUMA topology unsatisfied";
    /// The pod was already placed on another node.
    AlreadyScheduledElsewhere => "AlreadyScheduledElsewhere", "pod already scheduled to another node";
    /// An internal inconsistency (never expected).
    AllocatorInternalError => "AllocatorInternalError", "allocator internal error";
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.phrase())
    }
}

/// Per-GPU rejection counts of one allocation attempt.
pub type ReasonCounts = BTreeMap<ReasonCode, u32>;

/// Why a node cannot take the pod: a code, per-GPU rejection counts and an optional detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.detailed())]
pub struct NodeFailure {
    /// The reason code.
    pub code: ReasonCode,
    /// How many GPUs were rejected for which reason (may be empty).
    pub counts: ReasonCounts,
    /// Free text detail (e.g. `no NUMA node has 4 GPUs (max single-NUMA capacity 2)`).
    pub detail: Option<String>,
}

impl NodeFailure {
    /// A failure with just a code.
    pub fn new(code: ReasonCode) -> Self {
        Self { code, counts: ReasonCounts::new(), detail: None }
    }

    /// Adds a detail (builder style).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// The dominant reason of a set of per-GPU counts (highest count; ties → the contract's order);
    /// [`ReasonCode::InsufficientGpuResources`] when nothing was counted (`reason.FromCounts`).
    pub fn from_counts(counts: ReasonCounts) -> Self {
        let mut code = ReasonCode::InsufficientGpuResources;
        let mut best = 0;
        for (&c, &n) in &counts {
            if n > best {
                best = n;
                code = c;
            }
        }
        Self { code, counts, detail: None }
    }

    /// The short phrase (live filter `FailedNodes` value).
    pub fn short(&self) -> &'static str {
        self.code.phrase()
    }

    /// `phrase (counts) [detail]` (dry-run filter form); counts as `Code=n` in code order.
    pub fn detailed(&self) -> String {
        let mut s = self.code.phrase().to_owned();
        if !self.counts.is_empty() {
            let parts: Vec<String> = self.counts.iter().map(|(c, n)| format!("{}={n}", c.as_str())).collect();
            s.push_str(&format!(" ({})", parts.join(", ")));
        }
        if let Some(d) = &self.detail {
            s.push_str(&format!(" [{d}]"));
        }
        s
    }
}

/// Most node names listed per reason in [`render_unavailable`].
pub const MAX_NODES_PER_REASON: usize = 5;

/// Renders `0/N nodes are available: <phrase> (n1, n2, …), ….` from per-node reasons.
///
/// Nodes are bucketed by phrase; buckets are sorted by node count descending, then phrase ascending; within a
/// bucket names are sorted and at most [`MAX_NODES_PER_REASON`] are listed, followed by `…` when more.
///
/// ```
/// use vgpu_core::alloc::{ReasonCode, render_unavailable};
/// let text = render_unavailable(3, [
///     ("b", ReasonCode::InsufficientVgpuSlot),
///     ("a", ReasonCode::InsufficientVgpuSlot),
///     ("c", ReasonCode::DeviceUnhealthy),
/// ]);
/// assert_eq!(text, "0/3 nodes are available: Insufficient vGPU slots (a, b), GPU unhealthy (c).");
/// ```
pub fn render_unavailable<'a>(
    total_nodes: usize,
    reasons: impl IntoIterator<Item = (&'a str, ReasonCode)>,
) -> String {
    let mut buckets: BTreeMap<&'static str, Vec<&'a str>> = BTreeMap::new();
    for (node, code) in reasons {
        buckets.entry(code.phrase()).or_default().push(node);
    }
    let mut buckets: Vec<(&'static str, Vec<&'a str>)> = buckets.into_iter().collect();
    buckets.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(b.0)));
    let parts: Vec<String> = buckets
        .into_iter()
        .map(|(phrase, mut nodes)| {
            nodes.sort_unstable();
            let more = nodes.len() > MAX_NODES_PER_REASON;
            nodes.truncate(MAX_NODES_PER_REASON);
            let mut list = nodes.join(", ");
            if more {
                list.push_str(", …");
            }
            format!("{phrase} ({list})")
        })
        .collect();
    format!("0/{total_nodes} nodes are available: {}.", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_phrases() {
        assert_eq!(ReasonCode::ALL.len(), 22);
        assert_eq!(ReasonCode::InsufficientVgpuSlot.as_str(), "InsufficientVGPUSlot");
        assert_eq!(ReasonCode::DeviceMigEnabled.phrase(), "GPU has MIG enabled");
        assert_eq!(
            ReasonCode::AlreadyScheduledElsewhere.to_string(),
            "pod already scheduled to another node"
        );
        let mut seen = std::collections::BTreeSet::new();
        for c in ReasonCode::ALL {
            assert!(seen.insert(c.phrase()), "duplicate phrase {c:?}");
        }
    }

    #[test]
    fn dominant_and_detailed() {
        let counts = ReasonCounts::from([
            (ReasonCode::DeviceUnhealthy, 1),
            (ReasonCode::InsufficientVgpuMemory, 3),
            (ReasonCode::InsufficientVgpuCore, 3),
        ]);
        let f = NodeFailure::from_counts(counts).with_detail("x");
        assert_eq!(f.code, ReasonCode::InsufficientVgpuMemory);
        assert_eq!(
            f.detailed(),
            "Insufficient vGPU memory (DeviceUnhealthy=1, InsufficientVGPUMemory=3, InsufficientVGPUCore=3) [x]"
        );
        assert_eq!(f.to_string(), f.detailed());
        assert_eq!(NodeFailure::from_counts(ReasonCounts::new()).code, ReasonCode::InsufficientGpuResources);
    }

    #[test]
    fn summary_truncates_and_sorts() {
        let names: Vec<String> = (0..7).map(|i| format!("n{i}")).collect();
        let mut input: Vec<(&str, ReasonCode)> =
            names.iter().map(|n| (n.as_str(), ReasonCode::InsufficientGpuCards)).collect();
        input.push(("z", ReasonCode::NodeCacheMiss));
        input.push(("y", ReasonCode::AlreadyScheduledElsewhere));
        assert_eq!(
            render_unavailable(9, input),
            "0/9 nodes are available: Insufficient GPU cards (n0, n1, n2, n3, n4, …), \
             node missing from cache (z), pod already scheduled to another node (y)."
        );
    }
}
