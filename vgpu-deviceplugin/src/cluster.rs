//! The device plugin's view of the cluster: list the pods on this node and patch pod metadata
//! ([`ClusterClient`]), publish the node's annotations/labels and drop stale extended resources from its
//! status ([`NodeClient`]). [`crate::kube_cluster::KubeCluster`] talks to the API server;
//! [`InMemoryCluster`] serves tests and simulations.
//!
//! The AllocationFailureReschedule controller ([`crate::reschedule`]) needs whole pod objects, eviction,
//! delete with a UID precondition, create and events: [`RescheduleClient`], served by the same
//! [`KubeCluster`](crate::kube_cluster::KubeCluster) and in memory by [`InMemoryPods`] (which also serves
//! [`ClusterClient`], so one store can play a node for Allocate and the controller together).

use std::{
    collections::BTreeMap,
    sync::{Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::{Container, Pod};

/// `status.phase` values the plugin cares about.
pub const PHASE_SUCCEEDED: &str = "Succeeded";
/// See [`PHASE_SUCCEEDED`].
pub const PHASE_FAILED: &str = "Failed";

/// The parts of a pod the device plugin reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.phase` (`Pending`, `Running`, ...).
    pub phase: String,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Containers (init containers first, then app containers) with their literal env values.
    pub containers: Vec<ContainerInfo>,
}

/// A container's name and literal environment (`env[].value`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerInfo {
    /// Name.
    pub name: String,
    /// Literal env values.
    pub env: BTreeMap<String, String>,
}

/// A JSON-merge-patch of labels and annotations: `Some` sets, `None` removes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodPatch {
    /// Label changes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes.
    pub annotations: BTreeMap<String, Option<String>>,
    /// Precondition: the object's `metadata.uid`. Sent in the body, so the API server refuses the patch when the
    /// name now belongs to another object (a pod deleted and re-created under the same name, as a StatefulSet
    /// does, after it was read).
    pub uid: Option<String>,
}

/// The same merge-patch shape applied to a Node's metadata.
pub type NodePatch = PodPatch;

impl PodPatch {
    /// `true` when the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }

    /// The merge-patch body (`{"metadata":{"labels":{..},"annotations":{..}}}`).
    pub fn to_json(&self) -> serde_json::Value {
        let map = |m: &BTreeMap<String, Option<String>>| {
            serde_json::Value::Object(
                m.iter()
                    .map(|(k, v)| {
                        (k.clone(), v.clone().map_or(serde_json::Value::Null, serde_json::Value::String))
                    })
                    .collect(),
            )
        };
        let mut metadata =
            serde_json::json!({ "labels": map(&self.labels), "annotations": map(&self.annotations) });
        if let (Some(uid), Some(m)) = (&self.uid, metadata.as_object_mut()) {
            m.insert("uid".to_owned(), serde_json::Value::String(uid.clone()));
        }
        serde_json::json!({ "metadata": metadata })
    }

    /// This patch with the UID precondition [`uid`](Self::uid) (an empty `uid` sets none).
    pub fn with_uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_owned()).filter(|u| !u.is_empty());
        self
    }

    /// The error an object with `actual` UID gives a patch whose precondition it fails (as kube-apiserver
    /// answers it), for the in-memory clusters.
    fn refuses(&self, operation: impl FnOnce() -> String, actual: &str) -> Result<(), ClusterError> {
        match &self.uid {
            Some(want) if want != actual => Err(ClusterError {
                operation: operation(),
                message: format!(
                    "metadata.uid: Invalid value: {want:?}: field is immutable (object has {actual:?})"
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// A cluster call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct ClusterError {
    /// What was attempted (`list pods on node n1`, `patch pod ns/name`).
    pub operation: String,
    /// Why it failed.
    pub message: String,
}

/// Cluster access of the device plugin.
#[tonic::async_trait]
pub trait ClusterClient: Send + Sync + 'static {
    /// Pods with `spec.nodeName == node` (a live list, not a cache).
    async fn list_node_pods(&self, node: &str) -> Result<Vec<PodInfo>, ClusterError>;
    /// Pods with `spec.nodeName == node` and label `key == value` (a live list, not a cache). The API
    /// server filters: the answer holds only those pods, which is what makes `Allocate` cheap on a node
    /// running many pods. The default filters [`list_node_pods`](Self::list_node_pods).
    async fn list_node_pods_labelled(
        &self,
        node: &str,
        key: &str,
        value: &str,
    ) -> Result<Vec<PodInfo>, ClusterError> {
        let pods = self.list_node_pods(node).await?;
        Ok(pods.into_iter().filter(|p| p.labels.get(key).map(String::as_str) == Some(value)).collect())
    }
    /// Merge-patches a pod's labels and annotations.
    async fn patch_pod(&self, namespace: &str, name: &str, patch: &PodPatch) -> Result<(), ClusterError>;
}

/// Node access of the device plugin's node publisher.
#[tonic::async_trait]
pub trait NodeClient: Send + Sync + 'static {
    /// Merge-patches the node's labels and annotations (`None` removes a key; absent keys are fine).
    async fn patch_node(&self, node: &str, patch: &NodePatch) -> Result<(), ClusterError>;
    /// Removes `resources` from the node's `status.capacity` and `status.allocatable`. Returns whether any
    /// of them was present (and so removed).
    async fn remove_node_resources(&self, node: &str, resources: &[String]) -> Result<bool, ClusterError>;
}

/// The parts of a Node the publisher writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// `status.capacity` (quantities as text).
    pub capacity: BTreeMap<String, String>,
    /// `status.allocatable`.
    pub allocatable: BTreeMap<String, String>,
}

/// Pods and nodes held in memory; patches apply immediately. Node calls can be made to fail
/// ([`InMemoryCluster::fail_node_calls`]) to exercise retries.
#[derive(Debug, Default)]
pub struct InMemoryCluster {
    pods: Mutex<Vec<PodInfo>>,
    nodes: Mutex<BTreeMap<String, NodeInfo>>,
    node_failures: Mutex<usize>,
    node_calls: Mutex<usize>,
    refuse_pod_lists: Mutex<bool>,
}

impl InMemoryCluster {
    /// A cluster holding `pods`.
    pub fn new(pods: Vec<PodInfo>) -> Self {
        Self { pods: Mutex::new(pods), ..Self::default() }
    }

    /// Adds or replaces a node.
    pub fn upsert_node(&self, name: &str, node: NodeInfo) {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner).insert(name.to_owned(), node);
    }

    /// A copy of a node.
    pub fn node(&self, name: &str) -> Option<NodeInfo> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    /// The next `count` node calls fail with a conflict-like error.
    pub fn fail_node_calls(&self, count: usize) {
        *self.node_failures.lock().unwrap_or_else(PoisonError::into_inner) = count;
    }

    /// Node calls made so far (failed ones included).
    pub fn node_calls(&self) -> usize {
        *self.node_calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn node_call(&self, operation: String) -> Result<(), ClusterError> {
        *self.node_calls.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        let mut failures = self.node_failures.lock().unwrap_or_else(PoisonError::into_inner);
        if *failures > 0 {
            *failures -= 1;
            return Err(ClusterError { operation, message: "injected failure (409 Conflict)".to_owned() });
        }
        Ok(())
    }

    /// From now on pod lists fail (`true`) with a 403, as for a plugin whose RBAC was deleted, or answer
    /// again (`false`).
    pub fn refuse_pod_lists(&self, refuse: bool) {
        *self.refuse_pod_lists.lock().unwrap_or_else(PoisonError::into_inner) = refuse;
    }

    /// Adds or replaces (by namespace/name) a pod.
    pub fn upsert(&self, pod: PodInfo) {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.retain(|p| !(p.namespace == pod.namespace && p.name == pod.name));
        pods.push(pod);
    }

    /// A copy of a pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.iter().find(|p| p.namespace == namespace && p.name == name).cloned()
    }

    /// Removes a pod (as the API server does once it is deleted); whether it was there.
    pub fn remove(&self, namespace: &str, name: &str) -> bool {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let before = pods.len();
        pods.retain(|p| !(p.namespace == namespace && p.name == name));
        pods.len() != before
    }
}

#[tonic::async_trait]
impl ClusterClient for InMemoryCluster {
    async fn list_node_pods(&self, node: &str) -> Result<Vec<PodInfo>, ClusterError> {
        if *self.refuse_pod_lists.lock().unwrap_or_else(PoisonError::into_inner) {
            return Err(ClusterError {
                operation: format!("list pods of node {node}"),
                message: "injected failure (403 Forbidden)".to_owned(),
            });
        }
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(pods.iter().filter(|p| p.node_name == node).cloned().collect())
    }

    async fn patch_pod(&self, namespace: &str, name: &str, patch: &PodPatch) -> Result<(), ClusterError> {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let pod = pods.iter_mut().find(|p| p.namespace == namespace && p.name == name).ok_or_else(|| {
            ClusterError {
                operation: format!("patch pod {namespace}/{name}"),
                message: "not found".to_owned(),
            }
        })?;
        patch.refuses(|| format!("patch pod {namespace}/{name}"), &pod.uid)?;
        for (target, changes) in
            [(&mut pod.labels, &patch.labels), (&mut pod.annotations, &patch.annotations)]
        {
            for (k, v) in changes {
                match v {
                    Some(v) => target.insert(k.clone(), v.clone()),
                    None => target.remove(k),
                };
            }
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl NodeClient for InMemoryCluster {
    async fn patch_node(&self, node: &str, patch: &NodePatch) -> Result<(), ClusterError> {
        self.node_call(format!("patch node {node}"))?;
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let info = nodes.get_mut(node).ok_or_else(|| ClusterError {
            operation: format!("patch node {node}"),
            message: "not found".to_owned(),
        })?;
        for (target, changes) in
            [(&mut info.labels, &patch.labels), (&mut info.annotations, &patch.annotations)]
        {
            for (k, v) in changes {
                match v {
                    Some(v) => target.insert(k.clone(), v.clone()),
                    None => target.remove(k),
                };
            }
        }
        Ok(())
    }

    async fn remove_node_resources(&self, node: &str, resources: &[String]) -> Result<bool, ClusterError> {
        self.node_call(format!("patch node {node} status"))?;
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let info = nodes.get_mut(node).ok_or_else(|| ClusterError {
            operation: format!("patch node {node} status"),
            message: "not found".to_owned(),
        })?;
        let mut removed = false;
        for r in resources {
            removed |= info.capacity.remove(r).is_some();
            removed |= info.allocatable.remove(r).is_some();
        }
        Ok(removed)
    }
}

// === Reschedule seam (contract §5.6) ===

/// How an eviction request ended (`POST .../pods/<name>/eviction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// Accepted: the pod is now being deleted.
    Evicted,
    /// The pod is already gone (404).
    NotFound,
    /// Refused for now (429, a PodDisruptionBudget forbids it): try again later. Carries the server's message.
    Refused(String),
}

/// How a delete with a UID precondition ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Accepted: the pod is gone or being deleted.
    Deleted,
    /// No pod of that name (404).
    NotFound,
    /// A pod of that name exists with another UID (409 on the precondition): ours is already gone.
    UidMismatch,
}

/// How a create ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// Created; the new pod's UID.
    Created {
        /// `metadata.uid` the server gave the new pod.
        uid: String,
    },
    /// A pod of that name already exists (409 AlreadyExists).
    AlreadyExists,
}

/// `type` of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl EventType {
    /// The wire value (`Normal`, `Warning`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// An event about a pod (events.k8s.io/v1 `regarding` the pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// The pod's namespace (the event is written there).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// Normal or Warning.
    pub type_: EventType,
    /// Short machine-readable reason (`Evict`, `Recovery`).
    pub reason: String,
    /// What was done (`Evicted`, `Deleted`, `Recovered`, `Skipped`).
    pub action: String,
    /// Human-readable text.
    pub note: String,
}

/// Pod access of the AllocationFailureReschedule controller ([`crate::reschedule`]): the full pod objects
/// (a bare pod is recreated from what was read), eviction, delete with a UID precondition, create, events.
#[tonic::async_trait]
pub trait RescheduleClient: Send + Sync + 'static {
    /// Pods with `spec.nodeName == node`, complete.
    async fn list_node_pod_objects(&self, node: &str) -> Result<Vec<Pod>, ClusterError>;
    /// One pod; `None` when it does not exist.
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClusterError>;
    /// Evicts a pod through the Eviction subresource (policy/v1) with `grace_period_seconds` (`None`: the
    /// pod's own default).
    async fn evict_pod(
        &self,
        namespace: &str,
        name: &str,
        grace_period_seconds: Option<i64>,
    ) -> Result<EvictOutcome, ClusterError>;
    /// Deletes a pod only if its UID is still `uid`.
    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str)
    -> Result<DeleteOutcome, ClusterError>;
    /// Creates a pod in `pod.metadata.namespace`.
    async fn create_pod(&self, pod: &Pod) -> Result<CreateOutcome, ClusterError>;
    /// Records an event about a pod.
    async fn record_event(&self, event: &PodEvent) -> Result<(), ClusterError>;
}

/// One call an [`InMemoryPods`] received, in order (tests assert on the sequence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodCall {
    /// `evict_pod(namespace, name, grace)`.
    Evict(String, String, Option<i64>),
    /// `delete_pod(namespace, name, uid)`.
    Delete(String, String, String),
    /// `create_pod` of `namespace/name`.
    Create(String, String),
}

#[derive(Debug, Default)]
struct PodStore {
    pods: BTreeMap<(String, String), Pod>,
    events: Vec<PodEvent>,
    calls: Vec<PodCall>,
    graceful: bool,
    refuse_evictions: usize,
    fail_calls: usize,
    next_uid: u64,
    next_version: u64,
}

/// Full pod objects held in memory: serves the reschedule controller ([`RescheduleClient`]) and, through
/// [`pod_info`], Allocate ([`ClusterClient`]), so one store can play a whole node.
///
/// Evictions and deletions remove the pod at once, or, after [`InMemoryPods::hold_deletions`], only mark
/// it terminating (`deletionTimestamp`) until the test "plays the kubelet" with [`InMemoryPods::finalize`].
/// Nothing recreates evicted pods: a test plays the ReplicaSet controller by inserting the replacement.
#[derive(Debug, Default)]
pub struct InMemoryPods {
    store: Mutex<PodStore>,
}

impl InMemoryPods {
    /// A store holding `pods` (each given a UID when it has none).
    pub fn new(pods: Vec<Pod>) -> Self {
        let this = Self::default();
        for pod in pods {
            this.insert(pod);
        }
        this
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PodStore> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a pod (by namespace/name); gives it a UID when it has none and a new
    /// `resourceVersion`.
    pub fn insert(&self, mut pod: Pod) {
        let mut store = self.lock();
        if pod.metadata.uid.as_deref().unwrap_or_default().is_empty() {
            store.next_uid += 1;
            pod.metadata.uid = Some(format!("uid-{}", store.next_uid));
        }
        store.next_version += 1;
        pod.metadata.resource_version = Some(store.next_version.to_string());
        store.pods.insert(key_of(&pod), pod);
    }

    /// A copy of a pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.lock().pods.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// Every pod, ordered by namespace/name.
    pub fn pods(&self) -> Vec<Pod> {
        self.lock().pods.values().cloned().collect()
    }

    /// From now on deletions and evictions only set `deletionTimestamp` (as the API server does for a pod
    /// with a grace period); [`InMemoryPods::finalize`] removes the pod.
    pub fn hold_deletions(&self, hold: bool) {
        self.lock().graceful = hold;
    }

    /// Removes a pod for good (the kubelet confirmed termination). Returns whether it existed.
    pub fn finalize(&self, namespace: &str, name: &str) -> bool {
        self.lock().pods.remove(&(namespace.to_owned(), name.to_owned())).is_some()
    }

    /// The next `count` evictions are refused as a PodDisruptionBudget would (429).
    pub fn refuse_evictions(&self, count: usize) {
        self.lock().refuse_evictions = count;
    }

    /// The next `count` reschedule calls fail with an injected server error.
    pub fn fail_calls(&self, count: usize) {
        self.lock().fail_calls = count;
    }

    /// Events recorded so far.
    pub fn events(&self) -> Vec<PodEvent> {
        self.lock().events.clone()
    }

    /// Evict, delete and create calls received so far.
    pub fn calls(&self) -> Vec<PodCall> {
        self.lock().calls.clone()
    }

    fn injected(store: &mut PodStore, operation: String) -> Result<(), ClusterError> {
        if store.fail_calls > 0 {
            store.fail_calls -= 1;
            return Err(ClusterError {
                operation,
                message: "injected failure (500 Internal Server Error)".into(),
            });
        }
        Ok(())
    }

    fn remove_or_terminate(store: &mut PodStore, key: &(String, String), grace: Option<i64>) {
        if !store.graceful {
            store.pods.remove(key);
            return;
        }
        store.next_version += 1;
        let version = store.next_version.to_string();
        if let Some(pod) = store.pods.get_mut(key)
            && pod.metadata.deletion_timestamp.is_none()
        {
            let grace = grace
                .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
                .unwrap_or(30)
                .max(0);
            pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
            pod.metadata.deletion_grace_period_seconds = Some(grace);
            pod.metadata.resource_version = Some(version);
        }
    }
}

fn container_info(c: &Container) -> ContainerInfo {
    let env = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.as_ref().map(|v| (e.name.clone(), v.clone())))
        .collect();
    ContainerInfo { name: c.name.clone(), env }
}

/// The parts of a pod the plugin reads: init containers first, then app containers.
pub fn pod_info(pod: &Pod) -> PodInfo {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let containers = spec
        .map(|s| s.init_containers.iter().flatten().chain(&s.containers).map(container_info).collect())
        .unwrap_or_default();
    PodInfo {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        node_name: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        containers,
    }
}

fn key_of(pod: &Pod) -> (String, String) {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

#[tonic::async_trait]
impl ClusterClient for InMemoryPods {
    async fn list_node_pods(&self, node: &str) -> Result<Vec<PodInfo>, ClusterError> {
        let store = self.lock();
        Ok(store
            .pods
            .values()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(pod_info)
            .collect())
    }

    async fn patch_pod(&self, namespace: &str, name: &str, patch: &PodPatch) -> Result<(), ClusterError> {
        let mut store = self.lock();
        let pod =
            store.pods.get_mut(&(namespace.to_owned(), name.to_owned())).ok_or_else(|| ClusterError {
                operation: format!("patch pod {namespace}/{name}"),
                message: "not found".to_owned(),
            })?;
        patch.refuses(
            || format!("patch pod {namespace}/{name}"),
            pod.metadata.uid.as_deref().unwrap_or_default(),
        )?;
        let meta = &mut pod.metadata;
        for (target, changes) in
            [(&mut meta.labels, &patch.labels), (&mut meta.annotations, &patch.annotations)]
        {
            let map = target.get_or_insert_with(BTreeMap::new);
            for (k, v) in changes {
                match v {
                    Some(v) => map.insert(k.clone(), v.clone()),
                    None => map.remove(k),
                };
            }
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl RescheduleClient for InMemoryPods {
    async fn list_node_pod_objects(&self, node: &str) -> Result<Vec<Pod>, ClusterError> {
        let mut store = self.lock();
        Self::injected(&mut store, format!("list pods on node {node}"))?;
        Ok(store
            .pods
            .values()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .cloned()
            .collect())
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClusterError> {
        let mut store = self.lock();
        Self::injected(&mut store, format!("get pod {namespace}/{name}"))?;
        Ok(store.pods.get(&(namespace.to_owned(), name.to_owned())).cloned())
    }

    async fn evict_pod(
        &self,
        namespace: &str,
        name: &str,
        grace_period_seconds: Option<i64>,
    ) -> Result<EvictOutcome, ClusterError> {
        let mut store = self.lock();
        store.calls.push(PodCall::Evict(namespace.to_owned(), name.to_owned(), grace_period_seconds));
        Self::injected(&mut store, format!("evict pod {namespace}/{name}"))?;
        let key = (namespace.to_owned(), name.to_owned());
        if !store.pods.contains_key(&key) {
            return Ok(EvictOutcome::NotFound);
        }
        if store.refuse_evictions > 0 {
            store.refuse_evictions -= 1;
            return Ok(EvictOutcome::Refused(
                "Cannot evict pod as it would violate the pod's disruption budget.".to_owned(),
            ));
        }
        Self::remove_or_terminate(&mut store, &key, grace_period_seconds);
        Ok(EvictOutcome::Evicted)
    }

    async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<DeleteOutcome, ClusterError> {
        let mut store = self.lock();
        store.calls.push(PodCall::Delete(namespace.to_owned(), name.to_owned(), uid.to_owned()));
        Self::injected(&mut store, format!("delete pod {namespace}/{name}"))?;
        let key = (namespace.to_owned(), name.to_owned());
        match store.pods.get(&key) {
            None => Ok(DeleteOutcome::NotFound),
            Some(p) if p.metadata.uid.as_deref() != Some(uid) => Ok(DeleteOutcome::UidMismatch),
            Some(_) => {
                Self::remove_or_terminate(&mut store, &key, None);
                Ok(DeleteOutcome::Deleted)
            }
        }
    }

    async fn create_pod(&self, pod: &Pod) -> Result<CreateOutcome, ClusterError> {
        let mut store = self.lock();
        let key = key_of(pod);
        store.calls.push(PodCall::Create(key.0.clone(), key.1.clone()));
        Self::injected(&mut store, format!("create pod {}/{}", key.0, key.1))?;
        if store.pods.contains_key(&key) {
            return Ok(CreateOutcome::AlreadyExists);
        }
        let mut pod = pod.clone();
        store.next_uid += 1;
        store.next_version += 1;
        let uid = format!("uid-{}", store.next_uid);
        pod.metadata.uid = Some(uid.clone());
        pod.metadata.resource_version = Some(store.next_version.to_string());
        pod.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        store.pods.insert(key, pod);
        Ok(CreateOutcome::Created { uid })
    }

    async fn record_event(&self, event: &PodEvent) -> Result<(), ClusterError> {
        self.lock().events.push(event.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_with_a_uid_sends_it_as_a_precondition() {
        let mut patch = PodPatch::default().with_uid("u1");
        patch.labels.insert("a".into(), Some("b".into()));
        assert_eq!(
            patch.to_json(),
            serde_json::json!({"metadata": {"labels": {"a": "b"}, "annotations": {}, "uid": "u1"}})
        );
        assert_eq!(PodPatch::default().with_uid("").uid, None);
        assert!(PodPatch::default().to_json()["metadata"].get("uid").is_none());
    }

    #[tokio::test]
    async fn in_memory_clusters_refuse_a_patch_for_another_uid() {
        let cluster = InMemoryCluster::default();
        cluster.upsert(PodInfo {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u2".into(),
            ..PodInfo::default()
        });
        let mut patch = PodPatch::default().with_uid("u1");
        patch.labels.insert("a".into(), Some("b".into()));
        let err = cluster.patch_pod("ns", "p", &patch).await.unwrap_err();
        assert_eq!(err.operation, "patch pod ns/p");
        assert!(err.message.contains("field is immutable"), "{err}");
        assert!(cluster.pod("ns", "p").unwrap().labels.is_empty());
        cluster.patch_pod("ns", "p", &patch.with_uid("u2")).await.unwrap();
        assert_eq!(cluster.pod("ns", "p").unwrap().labels["a"], "b");
    }
}
