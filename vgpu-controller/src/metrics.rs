//! The controller's Prometheus families (served on `/metrics` by [`crate::server`], behind
//! `vgpu_serve::authz` when RBAC is on), plus the `process_*` collector.
//!
//! | family | type | labels | filled by |
//! |---|---|---|---|
//! | `vgpu_controller_reconciles_total` | counter | `result` (`success`, `error`) | each reconcile pass |
//! | `vgpu_controller_writes_total` | counter | `kind` (`DeviceClass`, `DeviceClassDelete`, `GPUClassStatus`, `PhysicalGPUStatus`, `ResourceClaimOwner`, `ResourceClaimDelete`) | each write of a pass |
//! | `vgpu_controller_gpu_classes` | gauge | `valid` (`true`, `false`) | each successful pass |
//! | `vgpu_controller_physical_gpus` | gauge | `state` (`Available`, `Allocated`, `Unavailable`) | each successful pass |
//! | `vgpu_controller_gpu_used_shares` | gauge | `gpu`, `node` | each successful pass (GPUs that left are dropped) |
//! | `vgpu_controller_gpu_total_shares` | gauge | `gpu`, `node` | each successful pass |
//! | `vgpu_controller_admission_total` | counter | `route`, `allowed` (`true`, `false`) | each admission review answered |

use std::fmt;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The families; cheap to clone (each is an `Arc` inside).
#[derive(Clone, Default)]
pub struct Metrics {
    /// Reconcile passes by result.
    pub reconciles: Family<Labels, Counter>,
    /// Writes by kind.
    pub writes: Family<Labels, Counter>,
    /// GPUClasses by validity.
    pub classes: Family<Labels, Gauge>,
    /// PhysicalGPUs by state.
    pub gpus: Family<Labels, Gauge>,
    /// Used shares per GPU.
    pub used_shares: Family<Labels, Gauge>,
    /// Total shares per GPU.
    pub total_shares: Family<Labels, Gauge>,
    /// Admission answers by route and outcome.
    pub admission: Family<Labels, Counter>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// New families, registered in `registry` (names prefixed `vgpu_controller_`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("vgpu_controller");
        r.register("reconciles", "Reconcile passes by result", m.reconciles.clone());
        r.register("writes", "Writes to the API server by kind", m.writes.clone());
        r.register("gpu_classes", "GPUClasses by validity", m.classes.clone());
        r.register("physical_gpus", "PhysicalGPUs by state", m.gpus.clone());
        r.register("gpu_used_shares", "Allocated shares of each PhysicalGPU", m.used_shares.clone());
        r.register("gpu_total_shares", "Shares each PhysicalGPU offers", m.total_shares.clone());
        r.register("admission", "Admission reviews answered by route and outcome", m.admission.clone());
        m
    }

    /// A registry holding these families and the `process_*` collector, and the families.
    pub fn with_registry() -> (Registry, Self) {
        let mut registry = Registry::default();
        let m = Self::register(&mut registry);
        registry.register_collector(Box::new(vgpu_serve::process_metrics::ProcessCollector));
        (registry, m)
    }

    /// Counts one admission answer.
    pub fn admitted(&self, route: &str, allowed: bool) {
        self.admission
            .get_or_create(&vec![("route", route.to_owned()), ("allowed", allowed.to_string())])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn families_are_named() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.reconciles.get_or_create(&vec![("result", "success".to_owned())]).inc();
        m.admitted("/gpuclasses/validate", false);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("vgpu_controller_reconciles_total{result=\"success\"} 1"), "{text}");
        assert!(
            text.contains(
                "vgpu_controller_admission_total{route=\"/gpuclasses/validate\",allowed=\"false\"} 1"
            ),
            "{text}"
        );
    }
}
