//! Which pods a maintenance evicts ([`EvictionScope`], [`keep_reason`]) and how long the manager waits
//! between passes while evictions are refused ([`retry_delay`]).
//!
//! | scope | evicted | kept |
//! |---|---|---|
//! | [`EvictionScope::GpuPods`] (default) | pods requesting a resource under a GPU resource prefix | every other pod |
//! | [`EvictionScope::Drain`] (`--drain`) | every pod, as `kubectl drain --ignore-daemonsets --delete-emptydir-data --force` | DaemonSet pods (their controller ignores the cordon), mirror pods (the kubelet's static pods) |
//!
//! Finished pods (`Succeeded`, `Failed`) are never evicted. Evictions go through the Eviction API, so the API
//! server enforces PodDisruptionBudgets; a refused eviction (429) is retried on a later pass, the delay
//! doubling from the retry period up to a cap.

use std::time::Duration;

use crate::cluster::PodState;

/// Which pods leave the node for a MIG change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionScope {
    /// Only the pods that use GPUs (requested resources under one of the GPU resource prefixes).
    #[default]
    GpuPods,
    /// The whole node, as `kubectl drain` does: everything but DaemonSet and mirror pods.
    Drain,
}

/// Why a pod stays on the node during maintenance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// It has finished (`Succeeded` or `Failed`).
    Finished,
    /// It uses no GPU (scope [`EvictionScope::GpuPods`]).
    NotGpu,
    /// A DaemonSet controls it (scope [`EvictionScope::Drain`]).
    DaemonSet,
    /// It is a mirror pod (scope [`EvictionScope::Drain`]).
    Mirror,
}

/// Whether the pod requests a resource under one of `prefixes`.
pub fn is_gpu_pod(pod: &PodState, prefixes: &[String]) -> bool {
    pod.resources.iter().any(|r| prefixes.iter().any(|p| r.starts_with(p.as_str())))
}

/// Why `pod` is kept under `scope`; `None`: it is to be evicted.
pub fn keep_reason(pod: &PodState, scope: EvictionScope, gpu_prefixes: &[String]) -> Option<Keep> {
    if matches!(pod.phase.as_str(), "Succeeded" | "Failed") {
        return Some(Keep::Finished);
    }
    match scope {
        EvictionScope::GpuPods => (!is_gpu_pod(pod, gpu_prefixes)).then_some(Keep::NotGpu),
        EvictionScope::Drain if pod.mirror => Some(Keep::Mirror),
        EvictionScope::Drain if pod.controller_kind.as_deref() == Some("DaemonSet") => Some(Keep::DaemonSet),
        EvictionScope::Drain => None,
    }
}

/// The wait before pass `attempt` (0 for the first retry) of a maintenance that is waiting for pods:
/// `base · 2^attempt`, never more than `cap` (nor less than `base`).
pub fn retry_delay(base: Duration, attempt: u32, cap: Duration) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
    base.saturating_mul(factor).min(cap.max(base))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pod(resources: &[&str], phase: &str, owner: Option<&str>, mirror: bool) -> PodState {
        PodState {
            namespace: "ns".to_owned(),
            name: "p".to_owned(),
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
            phase: phase.to_owned(),
            controller_kind: owner.map(str::to_owned),
            mirror,
            ..PodState::default()
        }
    }

    #[test]
    fn scopes_keep_what_kubectl_drain_keeps() {
        let prefixes = vec!["nvidia.com/".to_owned()];
        let cases = [
            (pod(&["nvidia.com/gpu"], "Running", None, false), None, None),
            (pod(&["cpu"], "Running", Some("ReplicaSet"), false), Some(Keep::NotGpu), None),
            (pod(&[], "Running", Some("DaemonSet"), false), Some(Keep::NotGpu), Some(Keep::DaemonSet)),
            (pod(&["nvidia.com/gpu"], "Running", Some("DaemonSet"), false), None, Some(Keep::DaemonSet)),
            (pod(&[], "Running", None, true), Some(Keep::NotGpu), Some(Keep::Mirror)),
            (pod(&["nvidia.com/gpu"], "Succeeded", None, false), Some(Keep::Finished), Some(Keep::Finished)),
            (pod(&[], "Pending", Some("StatefulSet"), false), Some(Keep::NotGpu), None),
        ];
        for (p, gpu_pods, drain) in cases {
            assert_eq!(keep_reason(&p, EvictionScope::GpuPods, &prefixes), gpu_pods, "{p:?}");
            assert_eq!(keep_reason(&p, EvictionScope::Drain, &prefixes), drain, "{p:?}");
        }
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let s = Duration::from_secs;
        let delays: Vec<_> = (0..7).map(|a| retry_delay(s(2), a, s(60))).collect();
        assert_eq!(delays, [s(2), s(4), s(8), s(16), s(32), s(60), s(60)]);
        assert_eq!(retry_delay(s(10), 3, s(5)), s(10), "a cap below the base is the base");
        assert_eq!(retry_delay(Duration::MAX, 40, Duration::MAX), Duration::MAX);
    }

    proptest::proptest! {
        /// The delay stays within [base, max(base, cap)] and never shrinks as attempts grow.
        #[test]
        fn delays_are_bounded_and_monotone(base_ms in 1u64..100_000, cap_ms in 0u64..1_000_000, attempt in 0u32..80) {
            let (base, cap) = (Duration::from_millis(base_ms), Duration::from_millis(cap_ms));
            let d = retry_delay(base, attempt, cap);
            proptest::prop_assert!(d >= base && d <= cap.max(base));
            proptest::prop_assert!(retry_delay(base, attempt + 1, cap) >= d);
        }

        /// Drain evicts a superset of the GPU-pods scope, except for DaemonSet and mirror pods.
        #[test]
        fn drain_covers_the_gpu_pods(gpu in proptest::prelude::any::<bool>(), ds in proptest::prelude::any::<bool>(),
                                     mirror in proptest::prelude::any::<bool>(), done in proptest::prelude::any::<bool>()) {
            let prefixes = vec!["nvidia.com/".to_owned()];
            let p = pod(if gpu { &["nvidia.com/gpu"] } else { &[] }, if done { "Failed" } else { "Running" },
                        ds.then_some("DaemonSet"), mirror);
            let by_gpu = keep_reason(&p, EvictionScope::GpuPods, &prefixes).is_none();
            let by_drain = keep_reason(&p, EvictionScope::Drain, &prefixes).is_none();
            proptest::prop_assert_eq!(by_drain, !done && !ds && !mirror);
            if by_gpu && !ds && !mirror {
                proptest::prop_assert!(by_drain);
            }
        }
    }
}
