//! Reading the scheduler's own pod metadata back: the pre-allocation, `ShouldCountPodDeviceAllocation`
//! (contract §3.3) and the stuck grace period. Every value here is untrusted input: nothing panics.

use vgpu_core::alloc::{ContainerRole, PodFootprint};
use vgpu_core::codec::pod_devices;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{ContainerKind, PodDeviceClaim};

use crate::cluster::Pod;

/// `assigned-phase` values.
pub mod phase {
    /// Filter chose a node.
    pub const FILTERING: &str = "filtering";
    /// Bind is under way.
    pub const ALLOCATING: &str = "allocating";
    /// The device plugin allocated.
    pub const SUCCEED: &str = "succeed";
    /// Allocation failed.
    pub const FAILED: &str = "failed";
}

/// `predicate-time` value written on success/failure (Go `math.MaxInt64`).
pub const PREDICATE_TIME_DONE: i64 = i64::MAX;

/// Whether (and until when) a pod's device allocation counts against its planned node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Not counted.
    No,
    /// Counted with no time limit.
    Yes,
    /// Counted until this Unix-nanosecond instant (stuck grace period of an unschedulable pod).
    Until(i64),
}

impl Counting {
    /// Counted at `now`.
    pub fn at(self, now_ns: i64) -> bool {
        match self {
            Counting::No => false,
            Counting::Yes => true,
            Counting::Until(t) => now_ns <= t,
        }
    }
}

/// Parses a Go duration (`300ms`, `1.5s`, `2m30s`, `1h`) into nanoseconds; `None` when malformed, negative or
/// overflowing ([`vgpu_core::codec::go_duration::parse_nanos`] of the trimmed text).
pub fn parse_go_duration(text: &str) -> Option<i64> {
    vgpu_core::codec::go_duration::parse_nanos(text.trim())
}

/// The stuck grace period of a pod: its `stuck-grace-period` annotation when it parses and is ≥ 1 s, else
/// `default_ns`.
pub fn grace_period_ns(pod: &Pod, domain: &ResourceDomain, default_ns: i64) -> i64 {
    pod.annotations
        .get(&domain.stuck_grace_period())
        .and_then(|v| parse_go_duration(v))
        .filter(|&ns| ns >= 1_000_000_000)
        .unwrap_or(default_ns)
}

/// The pod's `predicate-node`, when set and non-empty.
pub fn predicate_node<'a>(pod: &'a Pod, domain: &ResourceDomain) -> Option<&'a str> {
    pod.annotations.get(&domain.predicate_node()).map(String::as_str).filter(|s| !s.trim().is_empty())
}

/// The pod's `predicate-time`, when it parses.
pub fn predicate_time(pod: &Pod, domain: &ResourceDomain) -> Option<i64> {
    pod.annotations.get(&domain.predicate_time()).and_then(|v| v.trim().parse().ok())
}

/// The pod's device claim: `pre-allocated` when it decodes to a non-empty claim, else `real-allocated`.
pub fn planned_claim(pod: &Pod, domain: &ResourceDomain) -> Option<PodDeviceClaim> {
    let pre = pod
        .annotations
        .get(&domain.pre_allocated())
        .and_then(|v| pod_devices::decode_pre_allocated(v).ok())
        .filter(|c| !c.is_empty());
    pre.or_else(|| {
        pod.annotations
            .get(&domain.real_allocated())
            .and_then(|v| pod_devices::decode_real_allocated(v).ok())
            .filter(|c| !c.is_empty())
    })
}

/// The pod's planned node: `spec.nodeName`, else `predicate-node`.
pub fn planned_node<'a>(pod: &'a Pod, domain: &ResourceDomain) -> Option<&'a str> {
    pod.node_name.as_deref().filter(|n| !n.is_empty()).or_else(|| predicate_node(pod, domain))
}

/// `ShouldCountPodDeviceAllocation` (contract §3.3) as a time-bounded answer.
///
/// Bound pods count; `assigned-phase=failed` does not; a pod not marked unschedulable counts; an
/// unschedulable one counts only if its predicate time is after the condition's transition (second
/// precision, as upstream) and until `predicate-time + grace`.
pub fn should_count(pod: &Pod, domain: &ResourceDomain, default_grace_ns: i64) -> Counting {
    if pod.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Counting::Yes;
    }
    if pod.labels.get(&domain.assigned_phase()).is_some_and(|p| p == phase::FAILED) {
        return Counting::No;
    }
    let Some(since) = pod.unschedulable_since_ns else { return Counting::Yes };
    let Some(t) = predicate_time(pod, domain) else { return Counting::No };
    if t.div_euclid(1_000_000_000) <= since.div_euclid(1_000_000_000) {
        return Counting::No;
    }
    Counting::Until(t.saturating_add(grace_period_ns(pod, domain, default_grace_ns)))
}

/// The role of each container of the pod, by name (sequential init, sidecar, app).
pub fn role_of(pod: &Pod, name: &str) -> ContainerRole {
    match pod.spec.containers.iter().find(|c| c.name == name) {
        Some(c) if c.kind == ContainerKind::Init && c.restartable => ContainerRole::Sidecar,
        Some(c) if c.kind == ContainerKind::Init => ContainerRole::SequentialInit,
        _ => ContainerRole::App,
    }
}

/// What the pod takes on its node (`ReducePodFootprint`: sequential init containers do not add up).
pub fn footprint(pod: &Pod, claim: &PodDeviceClaim) -> PodFootprint {
    PodFootprint::from_claim_with_roles(claim, |n| role_of(pod, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_go_duration("30s"), Some(30_000_000_000));
        assert_eq!(parse_go_duration("1m30s"), Some(90_000_000_000));
        assert_eq!(parse_go_duration("1.5s"), Some(1_500_000_000));
        assert_eq!(parse_go_duration("250ms"), Some(250_000_000));
        assert_eq!(parse_go_duration("1h"), Some(3_600_000_000_000));
        for bad in ["", "s", "10", "-1s", "1x", "9999999999h"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn counting_rules() {
        let d = ResourceDomain::default();
        let mut pod = Pod::default();
        assert_eq!(should_count(&pod, &d, 30), Counting::Yes);
        pod.unschedulable_since_ns = Some(10_000_000_000);
        assert_eq!(should_count(&pod, &d, 30), Counting::No, "no predicate time");
        pod.annotations.insert(d.predicate_time(), "10500000000".into());
        assert_eq!(should_count(&pod, &d, 30), Counting::No, "same second as the transition");
        pod.annotations.insert(d.predicate_time(), "12000000000".into());
        assert_eq!(should_count(&pod, &d, 1_000_000_000), Counting::Until(13_000_000_000));
        pod.annotations.insert(d.stuck_grace_period(), "5s".into());
        assert_eq!(should_count(&pod, &d, 1_000_000_000), Counting::Until(17_000_000_000));
        pod.annotations.insert(d.stuck_grace_period(), "10ms".into());
        assert_eq!(should_count(&pod, &d, 1_000_000_000), Counting::Until(13_000_000_000), "< 1s ignored");
        pod.labels.insert(d.assigned_phase(), "failed".into());
        assert_eq!(should_count(&pod, &d, 30), Counting::No);
        pod.node_name = Some("n".into());
        assert_eq!(should_count(&pod, &d, 30), Counting::Yes);
        assert!(Counting::Until(5).at(5) && !Counting::Until(5).at(6));
    }
}
