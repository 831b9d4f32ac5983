//! The reconcile pass: watches → snapshot → pure plan → writes.
//!
//! | step | what |
//! |---|---|
//! | read | [`ControllerCluster::snapshot`] (GPUClass primary; DeviceClass owned; PhysicalGPU, Node, ResourceClaim, ResourceSlice mapped: any change of any of them triggers a pass) |
//! | plan | [`plan`]: [`desired_classes`] and [`desired_occupancy`], compared with what the snapshot holds; only differences become writes |
//! | write | apply each DeviceClass that differs; delete managed DeviceClasses whose GPUClass is gone (the ownerReference also lets the garbage collector do it); apply GPUClass status; apply PhysicalGPU status (`state`, `occupancy`, `classPassthrough`, condition `PassthroughPolicy`) — field manager `vgpu-controller` for all |
//! | claims | for the generated ResourceClaims without an owner ([`claims::batches`]: one pod list per namespace and up to [`claims::BATCH`] claims): list their pods by admission label, then for each claim set the pod as controller owner, delete the claim past the grace, or ask for a pass when the grace ends ([`PassReport::requeue_after`]) |
//!
//! The pass is level-triggered and idempotent: it works only from the current state (the trigger's reason is
//! not needed), and a second pass over an unchanged cluster writes nothing. A failed write does not stop the
//! others; the pass then counts as an error and is retried with backoff ([`Reconciler::run`]). One pass
//! over 1,000 PhysicalGPUs plans in well under the 1 s goal (`benches/reconcile.rs`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::sync::Notify;
use vgpu_api::{GPUClassStatus, GpuState, PhysicalGPU, PhysicalGPUStatus};

use vgpu_kube::error::CallError;

use crate::claims::{self, ClaimAction};
use crate::cluster::{ControllerCluster, Snapshot, key_of};
use crate::config::ControllerConfig;
use crate::desired::{VALID_CONDITION, desired_classes};
use crate::metrics::Metrics;
use crate::occupancy::{GpuStatus, desired_occupancy};
use crate::passthrough::{CONDITION as PASSTHROUGH_CONDITION, PassthroughPolicy, class_passthrough};

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
    /// PhysicalGPUs of deleted nodes, to delete ([`orphaned_gpus`]).
    pub delete_gpus: Vec<PhysicalGPU>,
}

impl Plan {
    /// Number of writes.
    pub fn writes(&self) -> usize {
        self.delete_gpus.len()
            + self.apply_device_classes.len()
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

fn same_passthrough(current: &PhysicalGPUStatus, desired: &PassthroughPolicy) -> bool {
    let cond = current.conditions.iter().find(|c| c.type_ == PASSTHROUGH_CONDITION).cloned().map(|mut c| {
        c.last_transition_time = None;
        c
    });
    current.class_passthrough == desired.wish && cond == desired.condition
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
    let mut policies = class_passthrough(&snapshot.gpus, &snapshot.classes, &desired);
    for gpu in &snapshot.gpus {
        let name = gpu.name_any();
        let Some(want) = occupancy.get(&name) else { continue };
        let mut want = want.clone();
        want.passthrough = policies.remove(&name).unwrap_or_default();
        let want = &want;
        let status = gpu.status.as_ref();
        let same = status.is_some_and(|s| {
            s.state == Some(want.state)
                && s.occupancy.as_ref() == Some(&want.occupancy)
                && same_passthrough(s, &want.passthrough)
        });
        let orphaned = !snapshot.nodes.is_empty() && !snapshot.nodes.contains_key(&gpu.spec.node_name);
        if !same && !orphaned {
            out.gpu_statuses.push((name.clone(), want.clone()));
        }
        out.gpus.push((name, gpu.spec.node_name.clone(), want.clone()));
    }
    out.delete_gpus = orphaned_gpus(snapshot);
    out
}

/// The PhysicalGPUs of deleted nodes: `spec.nodeName` names no Node. None while no Node is known at all (a
/// cluster has nodes; an empty node list says the cache, not the cluster, is empty).
pub fn orphaned_gpus(snapshot: &Snapshot) -> Vec<PhysicalGPU> {
    if snapshot.nodes.is_empty() {
        return Vec::new();
    }
    snapshot.gpus.iter().filter(|g| !snapshot.nodes.contains_key(&g.spec.node_name)).cloned().collect()
}

/// One pass's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Writes made.
    pub writes: usize,
    /// Writes (and pod lists) that failed.
    pub failures: Vec<CallError>,
    /// Run another pass after this long at the latest: a claim's grace ends then ([`claims::decide`]).
    pub requeue_after: Option<Duration>,
}

/// The wall clock of claim ages.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Runs passes against a [`ControllerCluster`].
pub struct Reconciler<C> {
    config: ControllerConfig,
    cluster: Arc<C>,
    metrics: Metrics,
    clock: Clock,
}

impl<C> std::fmt::Debug for Reconciler<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<C: ControllerCluster> Reconciler<C> {
    /// A reconciler over `cluster`, with the system clock.
    pub fn new(config: ControllerConfig, cluster: Arc<C>, metrics: Metrics) -> Self {
        Self { config, cluster, metrics, clock: Arc::new(Timestamp::now) }
    }

    /// The same with `clock` for claim ages (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// One pass: snapshot, plan, writes. `Err` when the snapshot cannot be read; failed writes are in the report.
    pub async fn reconcile_once(&self) -> Result<PassReport, CallError> {
        let snapshot = match self.cluster.snapshot().await {
            Ok(s) => s,
            Err(e) => {
                self.count("error");
                return Err(e);
            }
        };
        let plan = plan(&self.config, &snapshot);
        let mut report = PassReport::default();
        let mut record = |kind: &'static str, result: Result<(), CallError>| match result {
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
        for gpu in &plan.delete_gpus {
            tracing::info!(gpu = %gpu.name_any(), node = %gpu.spec.node_name, "deleting the PhysicalGPU of a deleted node");
            record("PhysicalGPUDelete", self.cluster.delete_gpu(gpu).await);
        }
        let now = (self.clock)();
        let mut requeue_after: Option<Duration> = None;
        for (namespace, group) in claims::batches(&self.config, &snapshot.claims) {
            let selector = claims::pod_selector(&self.config, group.iter().map(|(_, id)| *id));
            let pods = match self.cluster.list_pods(&namespace, &selector).await {
                Ok(p) => p,
                Err(e) => {
                    record("PodList", Err(e));
                    continue;
                }
            };
            for (claim, _) in group {
                match claims::decide(claim, &pods, now, self.config.orphan_grace) {
                    ClaimAction::Adopt { pod, owners } => {
                        tracing::info!(claim = %key_of(claim), pod, "claim owned by its pod");
                        record("ResourceClaimOwner", self.cluster.set_claim_owners(claim, &owners).await);
                    }
                    ClaimAction::Delete => {
                        tracing::info!(claim = %key_of(claim), "deleting a claim whose pod does not exist");
                        record("ResourceClaimDelete", self.cluster.delete_claim(claim).await);
                    }
                    ClaimAction::Wait(d) => requeue_after = Some(requeue_after.map_or(d, |r| r.min(d))),
                }
            }
        }
        report.requeue_after = requeue_after;
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
    /// [`DEBOUNCE`] folded together), one every [`RESYNC_PERIOD`], one when a pass's
    /// [`PassReport::requeue_after`] ends, and retries with backoff after a failed pass.
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
        let mut requeue: Option<Duration> = None;
        loop {
            if leading() {
                let ok = match self.reconcile_once().await {
                    Ok(r) if r.failures.is_empty() => {
                        requeue = r.requeue_after;
                        true
                    }
                    Ok(r) => {
                        tracing::warn!(failures = r.failures.len(), "reconcile pass had failed writes");
                        requeue = r.requeue_after;
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
            let wait = if leading() {
                let base = retry.unwrap_or(RESYNC_PERIOD);
                requeue.map_or(base, |r| base.min(r))
            } else {
                Duration::from_secs(2)
            };
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
    async fn the_gpus_of_deleted_nodes_are_deleted() {
        let cluster = Arc::new(InMemoryCluster::new());
        let mut replaced = fixture::gpu("gone", 1, "nvidia", "t4", Some(15360));
        replaced.metadata.uid = Some("uid-old".into());
        for gpu in [
            fixture::gpu("w1", 0, "nvidia", "t4", Some(15360)),
            fixture::gpu("gone", 0, "nvidia", "t4", None),
        ] {
            cluster.put_gpu(gpu);
        }
        let r = Reconciler::new(ControllerConfig::default(), cluster.clone(), Metrics::default());
        // No Node known at all: nothing is deleted (an empty node cache is not an empty cluster).
        r.reconcile_once().await.unwrap();
        assert_eq!(cluster.state().gpus.len(), 2);
        assert!(!cluster.writes().iter().any(|w| w.starts_with("delete")), "{:?}", cluster.writes());

        cluster.put_node("w1", std::collections::BTreeMap::new());
        // A claim on the gone node's GPU would change its status: it gets none, only the delete.
        cluster.put_claim(fixture::allocated_claim("ml", "job", &[("manager.nvidia.com", "gone", "vgpu-0")]));
        let before = cluster.writes().len();
        let report = r.reconcile_once().await.unwrap();
        let names: Vec<String> = cluster.state().gpus.iter().map(|g| g.name_any()).collect();
        assert_eq!(names, ["w1-0-nvidia"]);
        assert!(report.failures.is_empty(), "{report:?}");
        assert_eq!(cluster.writes()[before..], ["delete PhysicalGPU gone-0-nvidia".to_owned()]);

        // Only the object that was read: one replaced since (another UID) stays, and the pass reports it.
        cluster.put_gpu(replaced.clone());
        let mut stale = replaced;
        stale.metadata.uid = Some("uid-new".into());
        let err = cluster.delete_gpu(&stale).await.unwrap_err().to_string();
        assert!(err.contains("another UID"), "{err}");
        assert_eq!(cluster.state().gpus.len(), 2);
    }

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

    #[tokio::test]
    async fn class_passthrough_is_written_conflicts_are_reported_and_both_released() {
        let cluster = Arc::new(InMemoryCluster::new());
        cluster.put_gpu(fixture::gpu("w1", 0, "nvidia", "h100", Some(81920)));
        let mut vm = fixture::class("vm", "nvidia", Some("h100"), None);
        vm.spec.passthrough = Some(true);
        cluster.put_class(vm);
        let r = Reconciler::new(ControllerConfig::default(), cluster.clone(), Metrics::default());
        r.reconcile_once().await.unwrap();
        let status = || cluster.state().gpus[0].status.clone().unwrap();
        let policy = |s: &PhysicalGPUStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == PASSTHROUGH_CONDITION)
                .map(|c| (c.status, c.reason.clone().unwrap()))
        };
        assert_eq!(status().class_passthrough, Some(true));
        assert_eq!(policy(&status()), Some((vgpu_api::ConditionStatus::True, "ClassesAgree".into())));
        assert_eq!(r.reconcile_once().await.unwrap().writes, 0, "unchanged: nothing written");

        // Another matching class says no: no wish, a False condition.
        let mut shared = fixture::class("shared", "nvidia", None, Some(4));
        shared.spec.passthrough = Some(false);
        cluster.put_class(shared);
        r.reconcile_once().await.unwrap();
        assert_eq!(status().class_passthrough, None);
        assert_eq!(policy(&status()), Some((vgpu_api::ConditionStatus::False, "ConflictingClasses".into())));
        assert_eq!(r.reconcile_once().await.unwrap().writes, 0);

        // No class with a wish: field and condition released; other conditions stay.
        cluster.remove_class("vm");
        cluster.remove_class("shared");
        r.reconcile_once().await.unwrap();
        assert_eq!((status().class_passthrough, policy(&status())), (None, None));
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
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        let task = tokio::spawn({
            let (r, changes, leading) = (r.clone(), changes.clone(), leading.clone());
            async move {
                r.run(changes, move || leading.load(Ordering::SeqCst), stopped).await;
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

        stop.cancel();
        task.await.unwrap();
    }

    /// Generated claims: the referencing pod becomes the owner; an orphan is kept within the grace (and a
    /// pass is asked for when it ends), deleted after it; claims of others and owned claims are not touched
    /// (and need no pod list).
    #[tokio::test]
    async fn generated_claims_get_their_pod_as_owner_or_go() {
        use std::sync::atomic::{AtomicI64, Ordering};
        let cluster = Arc::new(InMemoryCluster::new());
        let now = Arc::new(AtomicI64::new(10));
        let clock: Clock = {
            let now = now.clone();
            Arc::new(move || fixture::time(now.load(Ordering::SeqCst)))
        };
        let r = Reconciler::new(ControllerConfig::default(), cluster.clone(), Metrics::default())
            .with_clock(clock);
        // web's claim; an orphan (its pod was refused); a user's claim with the same labels but no admission
        // id; a claim of the pod mutation that someone else already owns.
        cluster.put_claim(fixture::generated_claim("ml", "web-main-a", "id1", fixture::time(0)));
        cluster.put_claim(fixture::generated_claim("ml", "gone-main-b", "id2", fixture::time(0)));
        let mut foreign = fixture::generated_claim("ml", "mine", "id3", fixture::time(-1000));
        foreign.metadata.labels.as_mut().unwrap().remove("app.kubernetes.io/managed-by");
        cluster.put_claim(foreign.clone());
        let mut owned = fixture::generated_claim("ml", "old-main-c", "id4", fixture::time(-1000));
        let old_pod = fixture::pod("ml", "old", "uid-old", "id4", &["old-main-c"]);
        owned.metadata.owner_references = Some(vec![claims::owner_reference(&old_pod).unwrap()]);
        cluster.put_claim(owned.clone());
        // web is stored; a pod with id2 that names another claim does not save gone-main-b.
        cluster.put_pod(fixture::pod("ml", "web", "uid-web", "id1", &["web-main-a"]));
        cluster.put_pod(fixture::pod("ml", "unrelated", "uid-u", "id2", &["other"]));
        // The same name in another namespace is not the pod.
        cluster.put_pod(fixture::pod("other", "web2", "uid-w2", "id2", &["gone-main-b"]));

        let report = r.reconcile_once().await.unwrap();
        assert_eq!(report.failures, []);
        assert_eq!(cluster.writes(), ["owners ResourceClaim ml/web-main-a: Pod web"]);
        assert_eq!(report.requeue_after, Some(Duration::from_secs(50)), "gone-main-b's grace ends at 60 s");
        assert_eq!(cluster.pod_lists(), 1, "one list for the namespace's two claims without an owner");
        let state = cluster.state();
        let web_claim = state.claims.iter().find(|c| c.name_any() == "web-main-a").unwrap();
        let owner = &web_claim.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str(), owner.controller),
            ("Pod", "web", "uid-web", Some(true))
        );

        // Within the grace: still kept; no writes.
        now.store(59, Ordering::SeqCst);
        let report = r.reconcile_once().await.unwrap();
        assert_eq!((report.writes, report.requeue_after), (0, Some(Duration::from_secs(1))));
        // Past it: deleted; the owned claim, the foreign one and web's stay.
        now.store(60, Ordering::SeqCst);
        let report = r.reconcile_once().await.unwrap();
        assert_eq!((report.writes, report.requeue_after), (1, None));
        assert_eq!(cluster.writes().last().unwrap(), "delete ResourceClaim ml/gone-main-b");
        let mut left: Vec<String> = cluster.state().claims.iter().map(|c| c.name_any()).collect();
        left.sort();
        assert_eq!(left, ["mine", "old-main-c", "web-main-a"]);
        assert_eq!(cluster.state().claims.iter().find(|c| c.name_any() == "mine"), Some(&foreign));
        assert_eq!(cluster.state().claims.iter().find(|c| c.name_any() == "old-main-c"), Some(&owned));
        // Settled: nothing more to do, and no pod list (every generated claim left has an owner).
        let lists = cluster.pod_lists();
        assert_eq!(r.reconcile_once().await.unwrap().writes, 0);
        assert_eq!(cluster.pod_lists(), lists);
    }

    /// A delete refused by its precondition (the claim changed since the cache saw it) is a failed write,
    /// retried on the next pass with what the cluster holds then.
    #[tokio::test]
    async fn a_claim_changed_since_it_was_read_is_not_deleted() {
        let cluster = Arc::new(InMemoryCluster::new());
        let clock: Clock = Arc::new(|| fixture::time(1000));
        let r = Reconciler::new(ControllerConfig::default(), cluster.clone(), Metrics::default())
            .with_clock(clock);
        let claim = fixture::generated_claim("ml", "late-main-a", "id9", fixture::time(0));
        cluster.put_claim(claim.clone());
        // The cluster's copy moved on (another resourceVersion): the delete of the read copy must fail.
        let mut newer = claim.clone();
        newer.metadata.resource_version = Some("2".into());
        assert!(cluster.delete_claim(&newer).await.is_err());
        assert_eq!(cluster.state().claims.len(), 1);
        // Its pod shows up now (stored late): the next pass makes it the owner instead.
        cluster.put_pod(fixture::pod("ml", "late", "uid-late", "id9", &["late-main-a"]));
        let report = r.reconcile_once().await.unwrap();
        assert_eq!((report.writes, report.failures.len()), (1, 0));
        assert_eq!(cluster.state().claims[0].metadata.owner_references.as_ref().unwrap()[0].name, "late");
    }

    /// Under a paused clock: the loop runs a pass when a claim's grace ends, without any change.
    #[tokio::test(start_paused = true)]
    async fn run_wakes_up_when_a_grace_ends() {
        let cluster = Arc::new(InMemoryCluster::new());
        let started = tokio::time::Instant::now();
        let clock: Clock = Arc::new(move || {
            let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap();
            fixture::time(elapsed)
        });
        let config =
            ControllerConfig { orphan_grace: Duration::from_secs(30), ..ControllerConfig::default() };
        let r = Arc::new(Reconciler::new(config, cluster.clone(), Metrics::default()).with_clock(clock));
        cluster.put_claim(fixture::generated_claim("ml", "orphan", "id1", fixture::time(0)));
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        let task = tokio::spawn({
            let r = r.clone();
            async move {
                r.run(Arc::new(Notify::new()), || true, stopped).await;
            }
        });
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(cluster.state().claims.len(), 1, "kept within the grace");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(cluster.state().claims.is_empty(), "deleted when the grace ended, long before the resync");
        assert_eq!(cluster.writes(), ["delete ResourceClaim ml/orphan"]);
        stop.cancel();
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
