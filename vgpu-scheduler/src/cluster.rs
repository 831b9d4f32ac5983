//! What the extender needs from the API server, in light types of our own, and an in-memory cluster.
//!
//! In: node and pod snapshots ([`Cluster::snapshot`]) and change events ([`WatchEvent`], fed to the
//! [`ClusterCache`](crate::cache::ClusterCache)), and the PodDisruptionBudgets preempt reads
//! ([`Cluster::list_pod_disruption_budgets`]). Out: pod metadata merge patches
//! ([`Cluster::patch_pod_metadata`]), `pods/binding` ([`Cluster::bind_pod`]) and events ([`Cluster::record_event`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use vgpu_core::alloc::{PodRequest, PodSpec, RequestBuildError};
use vgpu_core::domain::ResourceDomain;

use vgpu_kube::error::ClusterError;

use crate::pdb::PodDisruptionBudget;

/// A node as the extender sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Node {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations` (the device plugin's `node-device-register`, `node-config-info`, …).
    pub annotations: BTreeMap<String, String>,
    /// `status.allocatable` of the vGPU resources (full resource name → integer quantity).
    pub allocatable: BTreeMap<String, u64>,
}

/// `status.phase` of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PodPhase {
    /// Pending.
    #[default]
    Pending,
    /// Running.
    Running,
    /// Succeeded (releases its GPUs).
    Succeeded,
    /// Failed (releases its GPUs).
    Failed,
    /// Unknown.
    Unknown,
}

impl PodPhase {
    /// Succeeded or Failed: the pod holds no GPU any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// A pod as the extender sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.nodeName`, once bound.
    pub node_name: Option<String>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// Containers and their limits (`spec.annotations` of this value is ignored; [`Pod::annotations`] counts).
    pub spec: PodSpec,
    /// `spec.priority` (0 when unset).
    pub priority: i32,
    /// `metadata.creationTimestamp`, Unix nanoseconds.
    pub created_ns: i64,
    /// `lastTransitionTime` (Unix ns) of a `PodScheduled=False, reason=Unschedulable` condition, if any.
    pub unschedulable_since_ns: Option<i64>,
    /// Kind of the controlling owner reference (`DaemonSet`, `ReplicaSet`, …).
    pub owner_kind: Option<String>,
    /// UID of the controlling owner reference: without a gang, pods of the same controller are gang siblings
    /// for cross-pod alignment.
    pub owner_uid: Option<String>,
    /// Gang identity (`<namespace>/<group>`), if any.
    pub gang: Option<String>,
    /// `metadata.resourceVersion` as a counter: the cache ignores events older than what it holds.
    pub resource_version: u64,
}

impl Pod {
    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod description the request model reads: containers plus the pod's annotations.
    pub fn request_spec(&self) -> PodSpec {
        PodSpec { containers: self.spec.containers.clone(), annotations: self.annotations.clone() }
    }

    /// The pod's vGPU request ([`PodRequest::from_pod`] of [`request_spec`](Self::request_spec), read in place:
    /// no copy of the containers and annotations).
    pub fn vgpu_request(&self, domain: &ResourceDomain) -> Result<PodRequest, RequestBuildError> {
        PodRequest::from_parts(&self.spec.containers, &self.annotations, domain)
    }
}

/// A JSON merge patch of pod labels and annotations (`None` deletes the key).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataPatch {
    /// Label key → new value, or `None` to delete.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation key → new value, or `None` to delete.
    pub annotations: BTreeMap<String, Option<String>>,
    /// The UID the pod must have (`metadata.uid` in the patch): kube-apiserver refuses to change a UID, so
    /// a patch by name never lands on a pod deleted and re-created under the same name.
    pub uid: Option<String>,
}

impl MetadataPatch {
    /// Requires the pod to have this UID (builder style; see [`uid`](Self::uid)).
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// Sets a label (builder style).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), Some(value.into()));
        self
    }

    /// Deletes a label (builder style).
    pub fn remove_label(mut self, key: impl Into<String>) -> Self {
        self.labels.insert(key.into(), None);
        self
    }

    /// Sets an annotation (builder style).
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), Some(value.into()));
        self
    }

    /// Applies the patch to label and annotation maps.
    pub fn apply_to(
        &self,
        labels: &mut BTreeMap<String, String>,
        annotations: &mut BTreeMap<String, String>,
    ) {
        for (map, patch) in [(labels, &self.labels), (annotations, &self.annotations)] {
            for (k, v) in patch {
                match v {
                    Some(v) => map.insert(k.clone(), v.clone()),
                    None => map.remove(k),
                };
            }
        }
    }

    /// The JSON merge patch body: `{"metadata":{"labels":{…},"annotations":{…}}}` (deletions as `null`).
    pub fn to_json(&self) -> String {
        let mut meta = serde_json::Map::new();
        for (name, patch) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if !patch.is_empty() {
                let m: serde_json::Map<String, serde_json::Value> = patch
                    .iter()
                    .map(|(k, v)| {
                        (k.clone(), v.clone().map_or(serde_json::Value::Null, serde_json::Value::String))
                    })
                    .collect();
                meta.insert(name.to_owned(), serde_json::Value::Object(m));
            }
        }
        if let Some(uid) = &self.uid {
            meta.insert("uid".to_owned(), serde_json::Value::String(uid.clone()));
        }
        serde_json::json!({ "metadata": meta }).to_string()
    }
}

/// A `pods/binding` request.
///
/// kube-apiserver copies the binding's annotations onto the pod in the same write that sets `spec.nodeName`,
/// and its labels too where the `PodTopologyLabelsAdmission` feature is on (beta and on by default since
/// Kubernetes 1.35; older servers, or the feature off, drop them silently — see
/// [`BindWrites`](crate::extender::BindWrites)).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Binding {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID (precondition).
    pub uid: String,
    /// Target node.
    pub node: String,
    /// Labels to set on the pod with the binding (`metadata.labels`).
    pub labels: BTreeMap<String, String>,
    /// Annotations to set on the pod with the binding (`metadata.annotations`).
    pub annotations: BTreeMap<String, String>,
}

impl Binding {
    /// A binding of a pod (by name, with its UID as precondition) to a node, carrying no metadata.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
        node: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            node: node.into(),
            ..Self::default()
        }
    }

    /// Carries the values a [`MetadataPatch`] sets (a binding cannot delete a key: deletions are left out).
    pub fn carrying(mut self, patch: &MetadataPatch) -> Self {
        for (map, from) in [(&mut self.labels, &patch.labels), (&mut self.annotations, &patch.annotations)] {
            map.extend(from.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))));
        }
        self
    }
}

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Normal event.
    Normal,
    /// Warning event.
    Warning,
}

/// An event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Normal or Warning.
    pub kind: EventType,
    /// Reason, e.g. `FilteringSucceed`.
    pub reason: &'static str,
    /// Message.
    pub message: String,
    /// When it happened (ns since the Unix epoch): the event's timestamps, even when it is sent later
    /// ([`event_queue`](crate::event_queue)).
    pub at_ns: i64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A node was added or changed.
    NodeUpserted(Node),
    /// A node was deleted.
    NodeDeleted(String),
    /// A pod was added or changed.
    PodUpserted(Pod),
    /// A pod was deleted (its last known state).
    PodDeleted(Pod),
}

/// The API-server operations of the extender.
pub trait Cluster: Send + Sync + 'static {
    /// All nodes and pods now (initial sync of the cache).
    fn snapshot(&self) -> impl Future<Output = Result<(Vec<Node>, Vec<Pod>), ClusterError>> + Send;
    /// Reads one pod.
    fn get_pod(&self, namespace: &str, name: &str) -> impl Future<Output = Result<Pod, ClusterError>> + Send;
    /// Merge-patches a pod's labels and annotations; returns the updated pod.
    fn patch_pod_metadata(
        &self,
        namespace: &str,
        name: &str,
        patch: &MetadataPatch,
    ) -> impl Future<Output = Result<Pod, ClusterError>> + Send;
    /// Creates `pods/binding`.
    fn bind_pod(&self, binding: &Binding) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Records an event (best effort).
    fn record_event(&self, event: Event) -> impl Future<Output = ()> + Send;
    /// Every PodDisruptionBudget (all namespaces), read by preempt once per call (module [`pdb`](crate::pdb)).
    /// The default has none, for clusters without budgets; [`MemoryCluster`] and
    /// [`KubeCluster`](crate::KubeCluster) list theirs.
    fn list_pod_disruption_budgets(
        &self,
    ) -> impl Future<Output = Result<Vec<PodDisruptionBudget>, ClusterError>> + Send {
        async { Ok(Vec::new()) }
    }
}

type Watcher = Arc<dyn Fn(&WatchEvent) + Send + Sync>;

#[derive(Default)]
struct MemoryState {
    nodes: BTreeMap<String, Node>,
    pods: HashMap<String, Pod>,
    events: Vec<Event>,
    pdbs: BTreeMap<String, PodDisruptionBudget>,
    fail_patches: u32,
    fail_binds: u32,
    fail_pdb_lists: u32,
    version: u64,
    /// Bindings drop their labels (a kube-apiserver older than 1.35, or `PodTopologyLabelsAdmission` off).
    binding_drops_labels: bool,
}

/// A thread-safe in-memory cluster for tests and the simulator, with failure injection.
///
/// Every change is delivered synchronously to the registered watchers (after the state lock is released),
/// like an informer with no delay.
#[derive(Default, Clone)]
pub struct MemoryCluster {
    state: Arc<Mutex<MemoryState>>,
    watchers: Arc<Mutex<Vec<Watcher>>>,
    record_events: bool,
}

impl std::fmt::Debug for MemoryCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCluster").finish_non_exhaustive()
    }
}

impl MemoryCluster {
    /// An empty cluster that keeps the events it is sent.
    pub fn new() -> Self {
        Self { record_events: true, ..Self::default() }
    }

    /// Drops events instead of keeping them (long simulations).
    pub fn without_event_log(mut self) -> Self {
        self.record_events = false;
        self
    }

    /// Makes bindings drop their labels, as kube-apiserver does before 1.35 or with the
    /// `PodTopologyLabelsAdmission` feature off (annotations are still copied).
    pub fn drop_binding_labels(&self, drop: bool) {
        self.lock().binding_drops_labels = drop;
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self, event: WatchEvent) {
        let watchers: Vec<Watcher> =
            self.watchers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for w in watchers {
            w(&event);
        }
    }

    /// Registers a watcher for every later change.
    pub fn watch(&self, watcher: impl Fn(&WatchEvent) + Send + Sync + 'static) {
        self.watchers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Arc::new(watcher));
    }

    /// Adds or replaces a node.
    pub fn upsert_node(&self, node: Node) {
        self.lock().nodes.insert(node.name.clone(), node.clone());
        self.notify(WatchEvent::NodeUpserted(node));
    }

    /// Adds or replaces a pod (its resource version is bumped).
    pub fn upsert_pod(&self, mut pod: Pod) -> Pod {
        {
            let mut s = self.lock();
            s.version += 1;
            pod.resource_version = s.version;
            s.pods.insert(pod.key(), pod.clone());
        }
        self.notify(WatchEvent::PodUpserted(pod.clone()));
        pod
    }

    /// Deletes a pod.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let pod = self.lock().pods.remove(&format!("{namespace}/{name}"))?;
        self.notify(WatchEvent::PodDeleted(pod.clone()));
        Some(pod)
    }

    /// Sets a pod's phase (e.g. to release its GPUs).
    pub fn set_phase(&self, namespace: &str, name: &str, phase: PodPhase) -> Option<Pod> {
        let mut pod = self.pod(namespace, name)?;
        pod.phase = phase;
        Some(self.upsert_pod(pod))
    }

    /// One pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.lock().pods.get(&format!("{namespace}/{name}")).cloned()
    }

    /// Every pod.
    pub fn pods(&self) -> Vec<Pod> {
        self.lock().pods.values().cloned().collect()
    }

    /// Events recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// The next `n` metadata patches fail with a conflict (before retries).
    pub fn fail_next_patches(&self, n: u32) {
        self.lock().fail_patches = n;
    }

    /// The next `n` bindings fail.
    pub fn fail_next_binds(&self, n: u32) {
        self.lock().fail_binds = n;
    }

    /// Adds or replaces a PodDisruptionBudget (keyed by namespace and name; budgets are not watched).
    pub fn upsert_pdb(&self, pdb: PodDisruptionBudget) {
        self.lock().pdbs.insert(format!("{}/{}", pdb.namespace, pdb.name), pdb);
    }

    /// Deletes a PodDisruptionBudget.
    pub fn delete_pdb(&self, namespace: &str, name: &str) -> Option<PodDisruptionBudget> {
        self.lock().pdbs.remove(&format!("{namespace}/{name}"))
    }

    /// The next `n` budget lists fail (unavailable).
    pub fn fail_next_pdb_lists(&self, n: u32) {
        self.lock().fail_pdb_lists = n;
    }
}

impl Cluster for MemoryCluster {
    async fn snapshot(&self) -> Result<(Vec<Node>, Vec<Pod>), ClusterError> {
        let s = self.lock();
        Ok((s.nodes.values().cloned().collect(), s.pods.values().cloned().collect()))
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClusterError> {
        self.pod(namespace, name).ok_or_else(|| ClusterError::NotFound(format!("pod {namespace}/{name}")))
    }

    async fn patch_pod_metadata(
        &self,
        namespace: &str,
        name: &str,
        patch: &MetadataPatch,
    ) -> Result<Pod, ClusterError> {
        let pod = {
            let mut s = self.lock();
            if s.fail_patches > 0 {
                s.fail_patches -= 1;
                return Err(ClusterError::Conflict("injected patch conflict".into()));
            }
            s.version += 1;
            let version = s.version;
            let pod = s
                .pods
                .get_mut(&format!("{namespace}/{name}"))
                .ok_or_else(|| ClusterError::NotFound(format!("pod {namespace}/{name}")))?;
            if let Some(uid) = patch.uid.as_ref().filter(|u| **u != pod.uid) {
                return Err(ClusterError::Conflict(format!(
                    "pod {namespace}/{name}: metadata.uid: field is immutable (patch has {uid}, pod has {})",
                    pod.uid
                )));
            }
            patch.apply_to(&mut pod.labels, &mut pod.annotations);
            pod.resource_version = version;
            pod.clone()
        };
        self.notify(WatchEvent::PodUpserted(pod.clone()));
        Ok(pod)
    }

    async fn bind_pod(&self, binding: &Binding) -> Result<(), ClusterError> {
        let pod = {
            let mut s = self.lock();
            if s.fail_binds > 0 {
                s.fail_binds -= 1;
                return Err(ClusterError::Other("injected binding failure".into()));
            }
            if !s.nodes.contains_key(&binding.node) {
                return Err(ClusterError::NotFound(format!("node {}", binding.node)));
            }
            s.version += 1;
            let version = s.version;
            let s_drops_labels = s.binding_drops_labels;
            let key = format!("{}/{}", binding.namespace, binding.name);
            let pod = s.pods.get_mut(&key).ok_or_else(|| ClusterError::NotFound(format!("pod {key}")))?;
            if pod.uid != binding.uid {
                return Err(ClusterError::Conflict(format!("pod {key} has another uid")));
            }
            if let Some(n) = &pod.node_name {
                return Err(ClusterError::Conflict(format!("pod {key} is already bound to {n}")));
            }
            pod.node_name = Some(binding.node.clone());
            pod.unschedulable_since_ns = None;
            pod.annotations.extend(binding.annotations.clone());
            if !s_drops_labels {
                pod.labels.extend(binding.labels.clone());
            }
            pod.resource_version = version;
            pod.clone()
        };
        self.notify(WatchEvent::PodUpserted(pod));
        Ok(())
    }

    async fn record_event(&self, event: Event) {
        if self.record_events {
            self.lock().events.push(event);
        }
    }

    async fn list_pod_disruption_budgets(&self) -> Result<Vec<PodDisruptionBudget>, ClusterError> {
        let mut s = self.lock();
        if s.fail_pdb_lists > 0 {
            s.fail_pdb_lists -= 1;
            return Err(ClusterError::Unavailable("injected poddisruptionbudgets list failure".into()));
        }
        Ok(s.pdbs.values().cloned().collect())
    }
}
