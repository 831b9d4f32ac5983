//! The reconcile pass: watches → snapshot → pure plan → writes.
//!
//! | step | what |
//! |---|---|
//! | read | [`ControllerCluster::snapshot`] (GPUClass primary; DeviceClass owned; PhysicalGPU, Node, ResourceClaim, ResourceSlice mapped: any change of any of them triggers a pass) |
//! | plan | [`plan`]: [`desired_classes`] and [`desired_occupancy`], compared with what the snapshot holds; only differences become writes |
//! | write | apply each DeviceClass that differs; delete managed DeviceClasses whose GPUClass is gone (the ownerReference also lets the garbage collector do it); apply GPUClass status; apply PhysicalGPU status (`state`, `occupancy`) — field manager `vgpu-controller` for all |
//!
//! The pass is level-triggered and idempotent: it works only from the current state (the trigger's reason is
//! not needed), and a second pass over an unchanged cluster writes nothing. A failed write does not stop the
//! others; the pass then counts as an error and is retried with backoff ([`Reconciler::run`]). One pass
//! over 1,000 PhysicalGPUs plans in well under the 1 s goal (`benches/reconcile.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceClass;
use kube::ResourceExt;
use tokio::sync::Notify;
use vgpu_api::{GPUClassStatus, GpuState};

use crate::cluster::{ClusterError, ControllerCluster, Snapshot};
use crate::config::ControllerConfig;
use crate::desired::{VALID_CONDITION, desired_classes};
use crate::metrics::Metrics;
use crate::occupancy::{GpuStatus, desired_occupancy};

/// Re-run a pass at least this often, even without a change.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(300);
/// Changes arriving within this window after the first are folded into one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// First retry delay after a failed pass (doubling up to [`MAX_BACKOFF`]).
pub const MIN_BACKOFF: Duration = Duration::from_millis(500);
/// Longest retry delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The writes one pass should make.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// DeviceClasses to apply.
    pub apply_device_classes: Vec<DeviceClass>,
    /// Managed DeviceClasses whose GPUClass is gone.
    pub delete_device_classes: Vec<String>,
    /// GPUClass statuses to apply.
    pub class_statuses: Vec<(String, GPUClassStatus)>,
    /// PhysicalGPU statuses to apply.
    pub gpu_statuses: Vec<(String, GpuStatus)>,
    /// Classes by validity, for the gauges: (valid, invalid).
    pub classes_valid: (usize, usize),
    /// Every GPU's desired status (for the gauges), by name.
    pub gpus: Vec<(String, String, GpuStatus)>,
}

impl Plan {
    /// Number of writes.
    pub fn writes(&self) -> usize {
        self.apply_device_classes.len()
            + self.delete_device_classes.len()
            + self.class_statuses.len()
            + self.gpu_statuses.len()
    }
}

fn same_device_class(current: &DeviceClass, desired: &DeviceClass) -> bool {
    let labels_kept = desired.labels().iter().all(|(k, v)| current.labels().get(k) == Some(v));
    labels_kept
        && current.spec.as_ref().map(|s| &s.selectors) == desired.spec.as_ref().map(|s| &s.selectors)
        && current.owner_references() == desired.owner_references()
}

fn same_class_status(current: Option<&GPUClassStatus>, desired: &GPUClassStatus) -> bool {
    let Some(c) = current else { return false };
    let cond = |s: &GPUClassStatus| s.conditions.iter().find(|c| c.type_ == VALID_CONDITION).cloned();
    c.valid == desired.valid
        && c.message == desired.message
        && c.device_class_name == desired.device_class_name
        && cond(c).map(|mut c| {
            c.last_transition_time = None;
            c
        }) == cond(desired)
}

/// The pure plan of one pass over `snapshot`.
pub fn plan(config: &ControllerConfig, snapshot: &Snapshot) -> Plan {
    let desired = desired_classes(config, &snapshot.classes, &snapshot.gpus, &snapshot.nodes);
    let mut out = Plan::default();
    for d in &desired {
        if let Some(dc) = &d.device_class {
            let current = snapshot.device_classes.iter().find(|c| c.metadata.name == dc.metadata.name);
            if !current.is_some_and(|c| same_device_class(c, dc)) {
                out.apply_device_classes.push(dc.clone());
            }
        }
        let current =
            snapshot.classes.iter().find(|c| c.name_any() == d.class).and_then(|c| c.status.as_ref());
        if !same_class_status(current, &d.status) {
            out.class_statuses.push((d.class.clone(), d.status.clone()));
        }
        if d.status.valid == Some(true) {
            out.classes_valid.0 += 1;
        } else {
            out.classes_valid.1 += 1;
        }
    }
    let label = config.class_label();
    for dc in &snapshot.device_classes {
        let owner = dc.labels().get(&label);
        let wanted = desired
            .iter()
            .any(|d| d.device_class.as_ref().is_some_and(|w| w.metadata.name == dc.metadata.name));
        if owner.is_some() && !wanted {
            out.delete_device_classes.push(dc.name_any());
        }
    }
    let occupancy = desired_occupancy(
        config,
        &snapshot.gpus,
        &snapshot.classes,
        &desired,
        &snapshot.claims,
        &snapshot.slices,
    );
    for gpu in &snapshot.gpus {
        let name = gpu.name_any();
        let Some(want) = occupancy.get(&name) else { continue };
        let status = gpu.status.as_ref();
        let same = status
            .is_some_and(|s| s.state == Some(want.state) && s.occupancy.as_ref() == Some(&want.occupancy));
        if !same {
            out.gpu_statuses.push((name.clone(), want.clone()));
        }
        out.gpus.push((name, gpu.spec.node_name.clone(), want.clone()));
    }
    out
}

/// One pass's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Writes made.
    pub writes: usize,
    /// Writes that failed.
    pub failures: Vec<ClusterError>,
}

/// Runs passes against a [`ControllerCluster`].
#[derive(Debug)]
pub struct Reconciler<C> {
    config: ControllerConfig,
    cluster: Arc<C>,
    metrics: Metrics,
}

impl<C: ControllerCluster> Reconciler<C> {
    /// A reconciler over `cluster`.
    pub fn new(config: ControllerConfig, cluster: Arc<C>, metrics: Metrics) -> Self {
        Self { config, cluster, metrics }
    }

    /// One pass: snapshot, plan, writes. `Err` when the snapshot cannot be read; failed writes are in the report.
    pub async fn reconcile_once(&self) -> Result<PassReport, ClusterError> {
        let snapshot = match self.cluster.snapshot().await {
            Ok(s) => s,
            Err(e) => {
                self.count("error");
                return Err(e);
            }
        };
        let plan = plan(&self.config, &snapshot);
        let mut report = PassReport::default();
        let mut record = |kind: &'static str, result: Result<(), ClusterError>| match result {
            Ok(()) => {
                report.writes += 1;
                self.metrics.writes.get_or_create(&vec![("kind", kind.to_owned())]).inc();
            }
            Err(e) => {
                tracing::warn!(error = %e, "write failed");
                report.failures.push(e);
            }
        };
        for dc in &plan.apply_device_classes {
            record("DeviceClass", self.cluster.apply_device_class(dc).await);
        }
        for name in &plan.delete_device_classes {
            record("DeviceClassDelete", self.cluster.delete_device_class(name).await);
        }
        for (class, status) in &plan.class_statuses {
            record("GPUClassStatus", self.cluster.apply_class_status(class, status).await);
        }
        for (gpu, status) in &plan.gpu_statuses {
            record("PhysicalGPUStatus", self.cluster.apply_gpu_status(gpu, status).await);
        }
        self.gauges(&plan);
        self.count(if report.failures.is_empty() { "success" } else { "error" });
        Ok(report)
    }

    fn count(&self, result: &str) {
        self.metrics.reconciles.get_or_create(&vec![("result", result.to_owned())]).inc();
    }

    fn gauges(&self, plan: &Plan) {
        let m = &self.metrics;
        m.classes.get_or_create(&vec![("valid", "true".to_owned())]).set(gauge(plan.classes_valid.0));
        m.classes.get_or_create(&vec![("valid", "false".to_owned())]).set(gauge(plan.classes_valid.1));
        for state in [GpuState::Available, GpuState::Allocated, GpuState::Unavailable] {
            let n = plan.gpus.iter().filter(|(_, _, s)| s.state == state).count();
            m.gpus.get_or_create(&vec![("state", format!("{state:?}"))]).set(gauge(n));
        }
        m.used_shares.clear();
        m.total_shares.clear();
        for (gpu, node, s) in &plan.gpus {
            let labels = vec![("gpu", gpu.clone()), ("node", node.clone())];
            m.used_shares.get_or_create(&labels).set(i64::from(s.occupancy.used_shares));
            m.total_shares.get_or_create(&labels).set(i64::from(s.occupancy.total_shares));
        }
    }

    /// Runs passes until `shutdown`: one at start, one after each `changes` notification (changes within
    /// [`DEBOUNCE`] folded together), one every [`RESYNC_PERIOD`], and retries with backoff after a failed pass.
    /// Passes run only while `leading()` holds (followers re-check every 2 s).
    pub async fn run(
        &self,
        changes: Arc<Notify>,
        leading: impl Fn() -> bool + Send + Sync,
        shutdown: impl Future<Output = ()> + Send,
    ) {
        tokio::pin!(shutdown);
        let mut backoff = MIN_BACKOFF;
        let mut retry: Option<Duration> = None;
        loop {
            if leading() {
                let ok = match self.reconcile_once().await {
                    Ok(r) if r.failures.is_empty() => true,
                    Ok(r) => {
                        tracing::warn!(failures = r.failures.len(), "reconcile pass had failed writes");
                        false
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reconcile pass could not read the cluster");
                        false
                    }
                };
                if ok {
                    backoff = MIN_BACKOFF;
                    retry = None;
                } else {
                    retry = Some(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
            let wait = if leading() { retry.unwrap_or(RESYNC_PERIOD) } else { Duration::from_secs(2) };
            tokio::select! {
                () = &mut shutdown => return,
                () = changes.notified() => {
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(DEBOUNCE) => {}
                    }
                }
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cluster::InMemoryCluster;
    use crate::fixture;

    #[tokio::test]
    async fn passes_write_only_differences_and_release() {
        let cluster = Arc::new(InMemoryCluster::new());
        cluster.put_gpu(fixture::gpu("w1", 0, "nvidia", "a100-sxm4-40gb", Some(40960)));
        cluster.put_class(fixture::class("a100-shared", "nvidia", Some("a100-sxm4-40gb"), Some(4)));
        let r = Reconciler::new(ControllerConfig::default(), cluster.clone(), Metrics::default());
        let report = r.reconcile_once().await.unwrap();
        assert_eq!(
            cluster.writes(),
            [
                "apply DeviceClass a100-shared.gpu.deckhouse.io",
                "status GPUClass a100-shared",
                "status PhysicalGPU w1-0-nvidia"
            ]
        );
        assert_eq!(report.writes, 3);
        // Nothing changed: nothing written.
        assert_eq!(r.reconcile_once().await.unwrap().writes, 0);

        cluster.put_claim(fixture::allocated_claim("ml", "job", &[("manager.nvidia.com", "w1", "vgpu-0")]));
        assert_eq!(r.reconcile_once().await.unwrap().writes, 1);
        let gpu = cluster.state().gpus[0].status.clone().unwrap();
        assert_eq!(gpu.state, Some(GpuState::Allocated));
        assert_eq!(gpu.occupancy.unwrap().claims, ["ml/job"]);

        cluster.remove_claim("ml", "job");
        r.reconcile_once().await.unwrap();
        let gpu = cluster.state().gpus[0].status.clone().unwrap();
        assert_eq!((gpu.state, gpu.occupancy.unwrap().used_shares), (Some(GpuState::Available), 0));

        cluster.remove_class("a100-shared");
        r.reconcile_once().await.unwrap();
        assert!(cluster.state().device_classes.is_empty());
        // The DeviceClass goes, and the GPU offers 1 share again (no Shared class matches it).
        let writes = cluster.writes();
        assert_eq!(
            writes[writes.len() - 2..],
            ["delete DeviceClass a100-shared.gpu.deckhouse.io", "status PhysicalGPU w1-0-nvidia"]
        );
        assert_eq!(
            cluster.state().gpus[0].status.as_ref().unwrap().occupancy.as_ref().unwrap().total_shares,
            1
        );
    }

    /// The loop under a paused clock: nothing while following, a pass once leading (re-checked every 2 s), a
    /// pass after a change (after the debounce), a retry after a failed pass (after the backoff), and a stop.
    #[tokio::test(start_paused = true)]
    async fn run_follows_leadership_changes_and_failures() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cluster = Arc::new(InMemoryCluster::new());
        cluster.put_gpu(fixture::gpu("w1", 0, "nvidia", "a100", Some(40960)));
        cluster.put_class(fixture::class("a100", "nvidia", Some("a100"), Some(2)));
        let r = Arc::new(Reconciler::new(ControllerConfig::default(), cluster.clone(), Metrics::default()));
        let changes = Arc::new(Notify::new());
        let leading = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let (r, changes, leading) = (r.clone(), changes.clone(), leading.clone());
            async move {
                r.run(changes, move || leading.load(Ordering::SeqCst), async {
                    let _ = stopped.await;
                })
                .await;
            }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(cluster.writes().is_empty(), "a follower writes nothing");
        leading.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(cluster.writes().len(), 3);

        cluster.put_claim(fixture::allocated_claim("ml", "a", &[("manager.nvidia.com", "w1", "vgpu-0")]));
        cluster.fail_next(1);
        changes.notify_one();
        tokio::time::sleep(DEBOUNCE + Duration::from_millis(50)).await;
        assert_eq!(cluster.writes().len(), 3, "the write failed");
        tokio::time::sleep(MIN_BACKOFF).await;
        assert_eq!(cluster.writes().len(), 4, "retried after the backoff");
        assert_eq!(cluster.writes()[3], "status PhysicalGPU w1-0-nvidia");

        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn failed_writes_are_reported_and_retried() {
        let cluster = Arc::new(InMemoryCluster::new());
        cluster.put_class(fixture::class("t4", "nvidia", Some("t4"), None));
        let r = Reconciler::new(ControllerConfig::default(), cluster.clone(), Metrics::default());
        cluster.fail_next(1);
        let report = r.reconcile_once().await.unwrap();
        assert_eq!(report.failures.len(), 1);
        assert_eq!(report.failures[0].to_string(), "apply DeviceClass t4.gpu.deckhouse.io: injected failure");
        // The next pass makes the write that failed.
        let report = r.reconcile_once().await.unwrap();
        assert_eq!((report.writes, report.failures.len()), (1, 0));
        let status = cluster.state().classes[0].status.clone().unwrap();
        assert_eq!(status.valid, Some(false));
    }
}
