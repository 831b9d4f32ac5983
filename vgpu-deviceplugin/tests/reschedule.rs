//! The AllocationFailureReschedule controller over the in-memory pod store (`InMemoryPods`), which also
//! serves the vnumber plugin's `Allocate`: a real `Allocate` fails, the test plays the kubelet (marks the pod
//! failed) and the ReplicaSet controller (recreates an evicted pod), and the controller evicts the Deployment
//! pod, deletes and recreates the bare pod through the recovery checkpoint, recovers after a simulated crash
//! between delete and create, never touches critical pods, and runs only with the gate on (through `Daemon`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use vgpu_core::{
    backend::{DeviceBackend, mock::MockBackend},
    domain::ResourceDomain,
};
use vgpu_deviceplugin::{
    cluster::{
        ClusterError, CreateOutcome, DeleteOutcome, EventType, EvictOutcome, InMemoryPods, PodCall, PodEvent,
        RescheduleClient,
    },
    config::PluginConfig,
    daemon::Daemon,
    inventory::{DeviceState, node_devices},
    plugin::PluginHandler,
    reschedule::{
        Disposition, RescheduleConfig, RescheduleController,
        checkpoint::{RecoveryCheckpoint, decode},
        disposition, recreation_pod,
    },
    vnumber::VgpuNumberPlugin,
};
use vgpu_kubelet::api::v1beta1::{AllocateRequest, ContainerAllocateRequest};

const NODE: &str = "node-1";
const WAIT: Duration = Duration::from_secs(10);
const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192 }\n";

fn fast() -> RescheduleConfig {
    RescheduleConfig {
        poll_interval: Duration::from_millis(20),
        max_requeue: Duration::from_millis(50),
        recovery_window: Duration::from_secs(24 * 3600),
        retry_after: Duration::from_millis(20),
    }
}

/// A vGPU pod on [`NODE`] as the scheduler left it (labels and annotations of a pod being admitted).
fn vgpu_pod(name: &str, predicate_time: u64, owner: Option<Value>) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "ns",
            "labels": {
                "app": "web",
                "nvidia.com/assigned-phase": "allocating",
                "nvidia.com/metrics-node": NODE
            },
            "annotations": {
                "team": "ml",
                "nvidia.com/pre-allocated": "main[0_GPU-zz_50_1024]",
                "nvidia.com/real-allocated": "",
                "nvidia.com/predicate-node": NODE,
                "nvidia.com/predicate-time": predicate_time.to_string()
            }
        },
        "spec": {
            "nodeName": NODE,
            "schedulerName": "vgpu-scheduler",
            "terminationGracePeriodSeconds": 17,
            "priority": 0,
            "containers": [{
                "name": "main", "image": "cuda:12",
                "resources": { "limits": { "nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "50" } }
            }]
        },
        "status": { "phase": "Pending" }
    });
    if let Some(owner) = owner {
        pod["metadata"]["ownerReferences"] = json!([owner]);
    }
    serde_json::from_value(pod).unwrap()
}

fn replica_set_owner() -> Value {
    json!({ "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9", "uid": "rs-uid", "controller": true })
}

/// The kubelet's reaction to a failed admission: the pod fails with `UnexpectedAdmissionError`.
fn fail_admission(pods: &InMemoryPods, name: &str, message: &str) {
    let mut pod = pods.pod("ns", name).unwrap();
    let status = pod.status.get_or_insert_with(Default::default);
    status.phase = Some("Failed".into());
    status.reason = Some("UnexpectedAdmissionError".into());
    status.message = Some(format!("Allocate failed due to {message}, which is unexpected"));
    pods.insert(pod);
}

fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap()
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn checkpoint_keys(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    decode(&bytes, Timestamp::now()).unwrap().pods.into_keys().collect()
}

fn start(
    pods: &Arc<InMemoryPods>,
    manager_dir: &Path,
) -> (tokio::task::JoinHandle<()>, CancellationToken, PathBuf) {
    start_with(pods.clone(), manager_dir)
}

fn start_with(
    client: Arc<dyn RescheduleClient>,
    manager_dir: &Path,
) -> (tokio::task::JoinHandle<()>, CancellationToken, PathBuf) {
    let stop = CancellationToken::new();
    let controller =
        RescheduleController::new(NODE, ResourceDomain::default(), manager_dir, client).with_config(fast());
    let path = controller.checkpoint_path().to_path_buf();
    let task = controller.spawn(stop.clone().cancelled_owned());
    (tokio::spawn(async move { task.await.unwrap().unwrap() }), stop, path)
}

/// Wraps the store and checks, at the moment a delete is sent, that the checkpoint on disk already holds
/// the pod (written before the delete, not after as upstream does).
struct CheckpointFirst {
    pods: Arc<InMemoryPods>,
    path: PathBuf,
}

#[tonic::async_trait]
impl RescheduleClient for CheckpointFirst {
    async fn list_node_pod_objects(&self, node: &str) -> Result<Vec<Pod>, ClusterError> {
        self.pods.list_node_pod_objects(node).await
    }
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClusterError> {
        self.pods.get_pod(namespace, name).await
    }
    async fn evict_pod(
        &self,
        ns: &str,
        name: &str,
        grace: Option<i64>,
    ) -> Result<EvictOutcome, ClusterError> {
        self.pods.evict_pod(ns, name, grace).await
    }
    async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<DeleteOutcome, ClusterError> {
        let key = format!("{namespace}/{name}");
        assert!(checkpoint_keys(&self.path).contains(&key), "{key} is in the checkpoint before its delete");
        self.pods.delete_pod(namespace, name, uid).await
    }
    async fn create_pod(&self, pod: &Pod) -> Result<CreateOutcome, ClusterError> {
        self.pods.create_pod(pod).await
    }
    async fn record_event(&self, event: &PodEvent) -> Result<(), ClusterError> {
        self.pods.record_event(event).await
    }
}

#[tokio::test]
async fn failed_allocate_evicts_the_deployment_pod_and_recreates_the_bare_pod() {
    let dir = tempfile::tempdir().unwrap();
    let pods = Arc::new(InMemoryPods::new(vec![
        vgpu_pod("web-abc", 100, Some(replica_set_owner())),
        vgpu_pod("solo", 200, None),
    ]));
    let solo_before = pods.pod("ns", "solo").unwrap();

    // Allocate fails for both pods (their pre-allocation names a GPU this node does not have).
    let backend = MockBackend::from_yaml_str(MOCK).unwrap();
    let mut config = PluginConfig::new(NODE);
    config.manager_dir = dir.path().to_path_buf();
    let config = Arc::new(config);
    let state =
        DeviceState::new(node_devices(&backend.devices().unwrap(), &config.settings), &config.settings);
    let plugin = VgpuNumberPlugin::new(Arc::clone(&config), state, Some(pods.clone()));
    for name in ["web-abc", "solo"] {
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec!["GPU-a::0".into()] }],
        };
        let err = plugin.allocate(request).await.unwrap_err().to_string();
        assert!(err.starts_with("Allocate check failed"), "{err}");
        assert_eq!(
            pods.pod("ns", name).unwrap().metadata.labels.unwrap()["nvidia.com/assigned-phase"],
            "failed",
            "Allocate marked {name} failed"
        );
        fail_admission(&pods, name, &err);
    }

    let (task, stop, path) = start_with(
        Arc::new(CheckpointFirst { pods: pods.clone(), path: RecoveryCheckpoint::path_in(dir.path()) }),
        dir.path(),
    );

    // The Deployment pod is evicted with its own grace period, the bare pod deleted (UID precondition) and
    // recreated under the same name.
    wait_for("the eviction", || pods.pod("ns", "web-abc").is_none()).await;
    wait_for("the bare pod's re-creation", || {
        pods.pod("ns", "solo").is_some_and(|p| p.metadata.uid != solo_before.metadata.uid)
    })
    .await;
    assert!(pods.calls().contains(&PodCall::Evict("ns".into(), "web-abc".into(), Some(17))));
    assert!(pods.calls().contains(&PodCall::Delete("ns".into(), "solo".into(), uid(&solo_before).into())));

    // The ReplicaSet controller (the test) creates the replacement: a fresh pending pod, left alone.
    let mut replacement = vgpu_pod("web-xyz", 300, Some(replica_set_owner()));
    replacement.metadata.labels = None;
    replacement.metadata.annotations = None;
    replacement.spec.as_mut().unwrap().node_name = None;
    pods.insert(replacement);

    // The recreated bare pod: same spec except what the scheduler must set again, metadata cleaned.
    let solo = pods.pod("ns", "solo").unwrap();
    let (old_spec, new_spec) = (solo_before.spec.clone().unwrap(), solo.spec.clone().unwrap());
    assert_eq!(new_spec.node_name, None);
    assert_eq!(new_spec.priority, None);
    assert_eq!(new_spec.containers, old_spec.containers);
    assert_eq!(new_spec.scheduler_name, old_spec.scheduler_name);
    assert_eq!(new_spec.termination_grace_period_seconds, Some(17));
    assert_eq!(solo.status, None);
    let labels = solo.metadata.labels.clone().unwrap();
    assert_eq!(labels.keys().collect::<Vec<_>>(), ["app"]);
    let annotations = solo.metadata.annotations.clone().unwrap();
    assert_eq!(annotations.keys().collect::<Vec<_>>(), ["team"]);

    // The checkpoint entry is gone once the pod exists again.
    wait_for("the checkpoint entry's removal", || checkpoint_keys(&path).is_empty()).await;

    // Events: eviction and deletion on the old pods, recovery on the new one (pods are listed by name).
    let events = pods.events();
    let summary: Vec<(&str, &str, &str, EventType)> =
        events.iter().map(|e| (e.name.as_str(), e.reason.as_str(), e.action.as_str(), e.type_)).collect();
    assert_eq!(
        summary,
        [
            ("solo", "Recovery", "Deleted", EventType::Warning),
            ("web-abc", "Evict", "Evicted", EventType::Warning),
            ("solo", "Recovery", "Recovered", EventType::Normal),
        ]
    );
    assert_eq!(events[0].uid, uid(&solo_before));
    assert_eq!(events[2].uid, uid(&solo));

    // A few more polls: nothing else happens to the replacement or the recreated pod (both Pending, no
    // failure).
    let calls = pods.calls().len();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pods.calls().len(), calls);
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_refused_eviction_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let pods = Arc::new(InMemoryPods::new(vec![vgpu_pod("web-abc", 100, Some(replica_set_owner()))]));
    fail_admission(&pods, "web-abc", "Allocate check failed: x");
    pods.refuse_evictions(2);
    let (task, stop, _) = start(&pods, dir.path());
    wait_for("the eviction", || pods.pod("ns", "web-abc").is_none()).await;
    let evictions = pods.calls().iter().filter(|c| matches!(c, PodCall::Evict(..))).count();
    assert_eq!(evictions, 3, "two refusals (429), then accepted");
    assert_eq!(pods.events().len(), 1, "one event, for the accepted eviction");
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn bare_pod_waits_for_the_old_pod_to_terminate() {
    let dir = tempfile::tempdir().unwrap();
    let pods = Arc::new(InMemoryPods::new(vec![vgpu_pod("solo", 100, None)]));
    fail_admission(&pods, "solo", "PreStartContainer check failed: y");
    pods.hold_deletions(true);
    let old_uid = uid(&pods.pod("ns", "solo").unwrap()).to_owned();
    let (task, stop, path) = start(&pods, dir.path());
    wait_for("the delete", || {
        pods.pod("ns", "solo").is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    assert_eq!(checkpoint_keys(&path), ["ns/solo"]);
    // Terminating: no create yet, however long the grace period (17 s here) runs.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!pods.calls().iter().any(|c| matches!(c, PodCall::Create(..))));
    assert_eq!(uid(&pods.pod("ns", "solo").unwrap()), old_uid);
    // The kubelet confirms termination; the pod comes back within one requeue.
    assert!(pods.finalize("ns", "solo"));
    wait_for("the re-creation", || pods.pod("ns", "solo").is_some()).await;
    assert_ne!(uid(&pods.pod("ns", "solo").unwrap()), old_uid);
    wait_for("the checkpoint entry's removal", || checkpoint_keys(&path).is_empty()).await;
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn crash_between_delete_and_create_recovers_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = RecoveryCheckpoint::path_in(dir.path());
    let pods = Arc::new(InMemoryPods::default());
    // The state a crash leaves: entries in the checkpoint for pods already deleted.
    let mut deleted = vgpu_pod("gone", 100, None);
    deleted.metadata.uid = Some("uid-old".into());
    let mut terminating = vgpu_pod("terminating", 100, None);
    terminating.metadata.uid = Some("uid-term".into());
    let mut stale = vgpu_pod("stale", 100, None);
    stale.metadata.uid = Some("uid-stale".into());
    let mut replaced = vgpu_pod("replaced", 100, None);
    replaced.metadata.uid = Some("uid-replaced-old".into());
    {
        let mut checkpoint = RecoveryCheckpoint::open(path.clone()).unwrap().checkpoint;
        checkpoint.record(&deleted, Timestamp::now()).unwrap();
        checkpoint.record(&terminating, Timestamp::now()).unwrap();
        let two_days_ago = Timestamp::from_second(Timestamp::now().as_second() - 48 * 3600).unwrap();
        checkpoint.record(&stale, two_days_ago).unwrap();
        checkpoint.record(&replaced, Timestamp::now()).unwrap();
    }
    // "terminating" is still shutting down; "replaced" was already recreated by someone else.
    pods.hold_deletions(true);
    pods.insert(terminating.clone());
    pods.delete_pod("ns", "terminating", "uid-term").await.unwrap();
    let mut other = vgpu_pod("replaced", 100, None);
    other.metadata.uid = Some("uid-replaced-new".into());
    pods.insert(other);

    let (task, stop, _) = start(&pods, dir.path());
    wait_for("the deleted pod's re-creation", || pods.pod("ns", "gone").is_some()).await;
    let gone = pods.pod("ns", "gone").unwrap();
    assert_eq!(gone.spec.as_ref().unwrap().node_name, None);
    assert!(!gone.metadata.annotations.unwrap().contains_key("nvidia.com/pre-allocated"));
    wait_for("stale and replaced entries dropped", || checkpoint_keys(&path) == ["ns/terminating"]).await;
    assert!(pods.pod("ns", "stale").is_none(), "entries older than 24 h are not recreated");
    assert_eq!(uid(&pods.pod("ns", "replaced").unwrap()), "uid-replaced-new", "the existing pod is kept");
    // The terminating one once it is gone.
    assert!(pods.finalize("ns", "terminating"));
    wait_for("the terminating pod's re-creation", || pods.pod("ns", "terminating").is_some()).await;
    wait_for("an empty checkpoint", || checkpoint_keys(&path).is_empty()).await;
    let creates: Vec<PodCall> =
        pods.calls().into_iter().filter(|c| matches!(c, PodCall::Create(..))).collect();
    assert_eq!(
        creates,
        [PodCall::Create("ns".into(), "gone".into()), PodCall::Create("ns".into(), "terminating".into())]
    );
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_crash_before_the_delete_deletes_and_recreates_on_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = RecoveryCheckpoint::path_in(dir.path());
    let pods = Arc::new(InMemoryPods::new(vec![vgpu_pod("solo", 100, None)]));
    fail_admission(&pods, "solo", "Allocate check failed: z");
    let old = pods.pod("ns", "solo").unwrap();
    // Entry written, crash before the delete request.
    RecoveryCheckpoint::open(path.clone()).unwrap().checkpoint.record(&old, Timestamp::now()).unwrap();
    let (task, stop, _) = start(&pods, dir.path());
    wait_for("the re-creation", || {
        pods.pod("ns", "solo").is_some_and(|p| p.metadata.uid != old.metadata.uid)
    })
    .await;
    wait_for("an empty checkpoint", || checkpoint_keys(&path).is_empty()).await;
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn critical_pods_get_one_event_and_are_never_touched() {
    let dir = tempfile::tempdir().unwrap();
    let mut by_class = vgpu_pod("by-class", 100, Some(replica_set_owner()));
    by_class.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
    let mut by_priority = vgpu_pod("by-priority", 100, None);
    by_priority.spec.as_mut().unwrap().priority = Some(2_000_000_000);
    let mut static_pod = vgpu_pod("static", 100, None);
    static_pod
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/config.source".into(), "file".into());
    let mut legacy = vgpu_pod("legacy", 100, None);
    legacy.metadata.namespace = Some("kube-system".into());
    legacy
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("scheduler.alpha.kubernetes.io/critical-pod".into(), "".into());
    let pods = Arc::new(InMemoryPods::new(vec![by_class, by_priority, static_pod, legacy]));
    for name in ["by-class", "by-priority", "static"] {
        fail_admission(&pods, name, "Allocate check failed: nope");
    }
    let mut legacy = pods.pod("kube-system", "legacy").unwrap();
    legacy.status.as_mut().unwrap().reason = Some("UnexpectedAdmissionError".into());
    pods.insert(legacy);
    let before = pods.pods();
    let (task, stop, path) = start(&pods, dir.path());
    wait_for("four events", || pods.events().len() == 4).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let events = pods.events();
    assert_eq!(events.len(), 4, "one event per pod, not one per poll");
    assert!(events.iter().all(|e| e.reason == "CriticalPod" && e.type_ == EventType::Warning));
    assert!(pods.calls().is_empty(), "no eviction, delete or create");
    assert_eq!(pods.pods(), before);
    assert!(!path.exists(), "nothing recorded for recovery");
    stop.cancel();
    task.await.unwrap();
}

#[test]
fn disposition_follows_the_contract() {
    let d = ResourceDomain::default();
    let failed = |mut pod: Pod| {
        let status = pod.status.get_or_insert_with(Default::default);
        status.phase = Some("Failed".into());
        status.reason = Some("UnexpectedAdmissionError".into());
        pod
    };
    let bare = failed(vgpu_pod("p", 1, None));
    assert_eq!(disposition(&bare, NODE, &d), Disposition::Recreate);
    assert_eq!(disposition(&bare, "other-node", &d), Disposition::Ignore);
    assert_eq!(
        disposition(&failed(vgpu_pod("p", 1, Some(replica_set_owner()))), NODE, &d),
        Disposition::Evict { grace_period_seconds: Some(17) }
    );
    let no_controller = json!({ "apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c" });
    assert_eq!(disposition(&failed(vgpu_pod("p", 1, Some(no_controller))), NODE, &d), Disposition::Unmanaged);
    let by_pod = json!({ "apiVersion": "v1", "kind": "Pod", "name": "q", "uid": "q", "controller": true });
    assert_eq!(disposition(&failed(vgpu_pod("p", 1, Some(by_pod))), NODE, &d), Disposition::Unmanaged);

    // Pending with a PreStartContainer failure in a container's waiting message.
    let mut pending = vgpu_pod("p", 1, None);
    pending.status = Some(
        serde_json::from_value(json!({
            "phase": "Pending",
            "containerStatuses": [{
                "name": "main", "image": "cuda:12", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "waiting": { "reason": "CreateContainerError",
                    "message": "rpc error: code = Unknown desc = PreStartContainer check failed: inconsistent" } }
            }]
        }))
        .unwrap(),
    );
    assert_eq!(disposition(&pending, NODE, &d), Disposition::Recreate);

    // Not acted on: running, terminating, no failure, no vGPU (limit 0), another domain.
    let mut running = bare.clone();
    running.status.as_mut().unwrap().phase = Some("Running".into());
    assert_eq!(disposition(&running, NODE, &d), Disposition::Ignore);
    let mut terminating = bare.clone();
    terminating.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
    assert_eq!(disposition(&terminating, NODE, &d), Disposition::Ignore);
    assert_eq!(disposition(&vgpu_pod("p", 1, None), NODE, &d), Disposition::Ignore);
    let mut zero = bare.clone();
    let limits =
        zero.spec.as_mut().unwrap().containers[0].resources.as_mut().unwrap().limits.as_mut().unwrap();
    limits.insert(
        "nvidia.com/vgpu-number".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into()),
    );
    assert_eq!(disposition(&zero, NODE, &d), Disposition::Ignore);
    assert_eq!(disposition(&bare, NODE, &ResourceDomain::new("example.com").unwrap()), Disposition::Ignore);

    // A vGPU request in an init container counts.
    let mut init_only = bare.clone();
    let spec = init_only.spec.as_mut().unwrap();
    let mut init = spec.containers[0].clone();
    init.name = "init".into();
    spec.init_containers = Some(vec![init]);
    spec.containers[0].resources = None;
    assert_eq!(disposition(&init_only, NODE, &d), Disposition::Recreate);
}

#[test]
fn recreation_cleans_labels_and_annotations_from_their_own_maps() {
    let mut pod = vgpu_pod("p", 1, None);
    pod.metadata.uid = Some("u".into());
    pod.metadata.resource_version = Some("42".into());
    pod.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
    pod.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    pod.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("vgpu-manager.io/original-resources".into(), "[]".into());
    // A label that happens to share an annotation key stays: only annotations lose the annotation keys
    // (upstream deletes the annotation keys from the labels map, keeping the annotations and dropping this).
    pod.metadata.labels.as_mut().unwrap().insert("nvidia.com/predicate-node".into(), "x".into());
    let new = recreation_pod(&pod, &ResourceDomain::default());
    let labels = new.metadata.labels.clone().unwrap();
    assert_eq!(labels.keys().collect::<Vec<_>>(), ["app", "nvidia.com/predicate-node"]);
    let annotations = new.metadata.annotations.clone().unwrap();
    assert_eq!(annotations.keys().collect::<Vec<_>>(), ["team"]);
    assert_eq!(new.metadata.uid, None);
    assert_eq!(new.metadata.resource_version, None);
    assert_eq!(new.metadata.creation_timestamp, None);
    assert_eq!(new.metadata.finalizers, Some(vec!["example.com/keep".to_owned()]));
    assert_eq!((new.metadata.namespace.as_deref(), new.metadata.name.as_deref()), (Some("ns"), Some("p")));
    assert_eq!(new.spec.as_ref().unwrap().node_name, None);
    assert_eq!(new.status, None);

    // Another domain: its keys go, nvidia.com keys are someone else's and stay.
    let example = ResourceDomain::new("example.com").unwrap();
    let mut pod = vgpu_pod("p", 1, None);
    pod.metadata.labels.as_mut().unwrap().insert("example.com/assigned-phase".into(), "failed".into());
    pod.metadata.annotations.as_mut().unwrap().insert("example.com/predicate-time".into(), "1".into());
    let new = recreation_pod(&pod, &example);
    assert!(!new.metadata.labels.as_ref().unwrap().contains_key("example.com/assigned-phase"));
    assert!(new.metadata.labels.as_ref().unwrap().contains_key("nvidia.com/assigned-phase"));
    assert!(!new.metadata.annotations.as_ref().unwrap().contains_key("example.com/predicate-time"));
    assert!(new.metadata.annotations.as_ref().unwrap().contains_key("nvidia.com/predicate-time"));
}

// === checkpoint format ===

const GOLDEN: &str = include_str!("fixtures/recovery-checkpoint-v1.json");

fn golden_pod() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "solo", "namespace": "ns", "uid": "3f0c6e1a-0b7d-4c52-9d55-2a4b1e8f7c01",
            "labels": { "nvidia.com/assigned-phase": "failed" },
            "annotations": { "nvidia.com/pre-allocated": "main[0_GPU-a_50_1024]" }
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{ "name": "main", "image": "cuda:12",
                "resources": { "limits": { "nvidia.com/vgpu-number": "1" } } }]
        },
        "status": { "phase": "Failed", "reason": "UnexpectedAdmissionError" }
    }))
    .unwrap()
}

#[test]
fn checkpoint_golden_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = RecoveryCheckpoint::path_in(dir.path());
    let mut checkpoint = RecoveryCheckpoint::open(path.clone()).unwrap().checkpoint;
    let at: Timestamp = "2026-03-01T10:00:00Z".parse().unwrap();
    assert_eq!(checkpoint.record(&golden_pod(), at).unwrap(), "ns/solo");
    let written = std::fs::read_to_string(&path).unwrap();
    if std::env::var_os("VGPU_REGEN").is_some() {
        std::fs::write(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recovery-checkpoint-v1.json"),
            &written,
        )
        .unwrap();
    }
    assert_eq!(written, GOLDEN, "the checkpoint format changed (VGPU_REGEN=1 rewrites the golden file)");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

    // Read back: the same entry.
    let reopened = RecoveryCheckpoint::open(path.clone()).unwrap();
    assert!(reopened.set_aside.is_none());
    let entries = reopened.checkpoint.entries();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries["ns/solo"].pod, golden_pod());
    assert_eq!(entries["ns/solo"].recorded_at.0, at);

    // Recording the same pod again keeps its date; removing writes an empty checkpoint.
    let mut checkpoint = reopened.checkpoint;
    checkpoint.record(&golden_pod(), Timestamp::now()).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), GOLDEN);
    assert!(checkpoint.remove("ns/solo").unwrap());
    assert!(!checkpoint.remove("ns/solo").unwrap());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\n  \"version\": 1,\n  \"pods\": {}\n}\n");
}

#[test]
fn upstream_checkpoint_form_is_read() {
    let mut pod = serde_json::to_value(golden_pod()).unwrap();
    pod["metadata"]["deletionTimestamp"] = json!("2026-02-01T00:00:00Z");
    let upstream = json!({ "checksum": 123456, "v1": { "recoveryPods": { "ns/solo": pod } } });
    let data = decode(&serde_json::to_vec(&upstream).unwrap(), Timestamp::now()).unwrap();
    assert_eq!(data.version, 1);
    assert_eq!(data.pods["ns/solo"].recorded_at.0, "2026-02-01T00:00:00Z".parse::<Timestamp>().unwrap());
    // An empty upstream checkpoint.
    assert!(decode(br#"{"checksum":0,"v1":{}}"#, Timestamp::now()).unwrap().pods.is_empty());
}

#[test]
fn bad_checkpoints_are_refused_with_a_reason() {
    let now = Timestamp::now();
    let reason = |bytes: &[u8]| decode(bytes, now).unwrap_err().to_string();
    assert!(reason(b"").starts_with("not JSON"), "{}", reason(b""));
    assert!(reason(b"[1]").contains("expected a JSON object"));
    assert!(reason(br#"{"version":2,"pods":{}}"#).contains("version 2 is not supported"));
    assert!(
        reason(br#"{"version":1,"pods":{"ns/a":{"recordedAt":"yesterday","pod":{}}}}"#).contains("version-1")
    );
    let mismatched = json!({ "version": 1, "pods": { "ns/other": { "recordedAt": "2026-03-01T10:00:00Z", "pod": golden_pod() } } });
    assert!(
        reason(&serde_json::to_vec(&mismatched).unwrap())
            .contains("entry \"ns/other\" holds pod \"ns/solo\"")
    );
    assert!(reason(br#"{"hello":1}"#).contains("neither"));
}

#[tokio::test]
async fn a_garbage_checkpoint_is_moved_aside_and_the_controller_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = RecoveryCheckpoint::path_in(dir.path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"\x00\x01 definitely not json").unwrap();
    let opened = RecoveryCheckpoint::open(path.clone()).unwrap();
    let (aside, err) = opened.set_aside.unwrap();
    assert!(err.to_string().contains("recovery checkpoint") && err.to_string().contains("not JSON"), "{err}");
    assert!(aside.file_name().unwrap().to_str().unwrap().starts_with("recovery-checkpoint.json.corrupt-"));
    assert_eq!(std::fs::read(&aside).unwrap(), b"\x00\x01 definitely not json");
    assert!(!path.exists());
    assert!(opened.checkpoint.entries().is_empty());

    // The controller starts over a garbage file too, and works.
    std::fs::write(&path, b"{").unwrap();
    let pods = Arc::new(InMemoryPods::new(vec![vgpu_pod("solo", 100, None)]));
    fail_admission(&pods, "solo", "Allocate check failed: z");
    let old = uid(&pods.pod("ns", "solo").unwrap()).to_owned();
    let (task, stop, _) = start(&pods, dir.path());
    wait_for("the re-creation", || pods.pod("ns", "solo").is_some_and(|p| uid(&p) != old)).await;
    let moved = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_str().unwrap().contains(".corrupt-"));
    assert!(moved.count() >= 1);
    stop.cancel();
    task.await.unwrap();
}

#[test]
fn an_unwritable_checkpoint_prevents_the_delete() {
    // The checkpoint path is a directory: the write fails, the entry is not kept.
    let dir = tempfile::tempdir().unwrap();
    let path = RecoveryCheckpoint::path_in(dir.path());
    let mut checkpoint = RecoveryCheckpoint::open(path.clone()).unwrap().checkpoint;
    std::fs::create_dir_all(&path).unwrap();
    let err = checkpoint.record(&golden_pod(), Timestamp::now()).unwrap_err();
    assert!(err.to_string().contains("writing the recovery checkpoint"), "{err}");
    assert!(checkpoint.entries().is_empty());
}

#[tokio::test]
async fn an_unwritable_checkpoint_means_no_delete() {
    let dir = tempfile::tempdir().unwrap();
    let path = RecoveryCheckpoint::path_in(dir.path());
    let pods = Arc::new(InMemoryPods::default());
    let (task, stop, _) = start(&pods, dir.path());
    // Once the controller has opened its (missing) checkpoint, the path turns into a directory: every
    // write fails from now on.
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::fs::create_dir_all(&path).unwrap();
    pods.insert(vgpu_pod("solo", 100, None));
    fail_admission(&pods, "solo", "Allocate check failed: z");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(pods.calls().is_empty(), "a pod that could not be recorded is not deleted");
    stop.cancel();
    task.await.unwrap();
}

proptest::proptest! {
    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = decode(&bytes, Timestamp::now());
    }
}

// === wiring: the gate decides ===

async fn run_daemon(gates: &[&str]) -> Arc<InMemoryPods> {
    let dir = tempfile::tempdir().unwrap();
    let pods = Arc::new(InMemoryPods::new(vec![vgpu_pod("web-abc", 100, Some(replica_set_owner()))]));
    fail_admission(&pods, "web-abc", "Allocate check failed: x");
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let mut config = PluginConfig::new(NODE);
    config.device_plugin_path = dir.path().to_path_buf();
    config.manager_dir = dir.path().join("manager");
    config.watch_interval = Duration::from_millis(20);
    config.gates = vgpu_deviceplugin::feature_gates().configure(gates.iter().copied()).unwrap();
    let nodes = Arc::new(vgpu_deviceplugin::cluster::InMemoryCluster::default());
    nodes.upsert_node(NODE, Default::default());
    let daemon =
        Daemon::new(config, backend, pods.clone(), nodes).unwrap().with_reschedule_client(pods.clone());
    let (_restart_tx, restart_rx) = tokio::sync::mpsc::channel(1);
    let watched = pods.clone();
    let shutdown = async move {
        // The controller (default timing) lists the node's pods as soon as it starts.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while tokio::time::Instant::now() < deadline && watched.pod("ns", "web-abc").is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    daemon.run(shutdown, restart_rx).await.unwrap();
    pods
}

#[tokio::test]
async fn the_daemon_runs_the_controller_only_with_the_gate_on() {
    let on = run_daemon(&["AllocationFailureReschedule=true"]).await;
    assert_eq!(on.calls(), [PodCall::Evict("ns".into(), "web-abc".into(), Some(17))]);
    let off = run_daemon(&["AllocationFailureReschedule=false"]).await;
    assert!(off.calls().is_empty(), "gate off: no controller");
    assert!(off.pod("ns", "web-abc").is_some());
}
