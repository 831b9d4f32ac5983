//! The MIG manager's view of the cluster ([`MigCluster`]): read and patch its node (metadata, spec, a status
//! condition), read the configuration ConfigMap, list, evict and delete the node's pods. [`crate::kube_cluster::KubeCluster`] talks to the API
//! server; [`InMemoryCluster`] serves unit tests (evictions can be refused as a PodDisruptionBudget would).

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    sync::{Mutex, PoisonError},
};

/// A cluster call failed (the manager retries on its next pass).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct ClusterError {
    /// What was being done, e.g. `patch node n1`.
    pub operation: String,
    /// The server's or client's message.
    pub message: String,
}

impl ClusterError {
    /// An error of `operation`.
    pub fn new(operation: impl Into<String>, message: impl Into<String>) -> Self {
        Self { operation: operation.into(), message: message.into() }
    }
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeTaint {
    /// Key.
    pub key: String,
    /// Value (`None`: no value).
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// The parts of a Node the manager reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeState {
    /// `metadata.resourceVersion` (the maintenance patch is conditional on it).
    pub resource_version: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.taints`.
    pub taints: Vec<NodeTaint>,
    /// `status.nodeInfo.bootID` (empty when the node reports none): it changes when the node reboots.
    pub boot_id: String,
    /// `status.conditions`: type → status (`True`, `False`, `Unknown`).
    pub conditions: BTreeMap<String, String>,
}

/// A node status condition the manager sets (`status.conditions[]`, merged by `type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCondition {
    /// `type`, e.g. [`crate::REBOOT_CONDITION`].
    pub type_: String,
    /// `status`: `true` is `True`, `false` is `False`.
    pub status: bool,
    /// `reason`, CamelCase.
    pub reason: String,
    /// `message`, for people.
    pub message: String,
}

/// The parts of a pod the manager reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodState {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Extended resource names the pod's containers (init ones included) request or limit.
    pub resources: BTreeSet<String>,
    /// `status.phase`.
    pub phase: String,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The kind of the controlling owner (`ownerReferences[]` with `controller: true`), e.g. `DaemonSet`.
    pub controller_kind: Option<String>,
    /// A mirror pod: the API server's copy of a kubelet static pod (annotation `kubernetes.io/config.mirror`);
    /// it cannot be evicted.
    pub mirror: bool,
}

/// How an eviction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// Accepted: the pod is being deleted.
    Evicted,
    /// The pod is already gone (404).
    NotFound,
    /// Refused for now (429: a PodDisruptionBudget forbids it); the server's message.
    Refused(String),
}

/// Label and annotation changes: `Some` sets, `None` removes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataPatch {
    /// Label changes.
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotation changes.
    pub annotations: BTreeMap<String, Option<String>>,
}

impl MetadataPatch {
    /// Whether the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// Cluster access of the MIG manager.
pub trait MigCluster: Send + Sync + 'static {
    /// The node.
    fn get_node(&self, node: &str) -> impl Future<Output = Result<NodeState, ClusterError>> + Send;
    /// Merge-patches the node's labels and annotations.
    fn patch_node_metadata(
        &self,
        node: &str,
        patch: &MetadataPatch,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Sets `spec.unschedulable` and `spec.taints`, only if the node is still at `resource_version`.
    fn set_node_spec(
        &self,
        node: &str,
        resource_version: &str,
        unschedulable: bool,
        taints: &[NodeTaint],
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// The data of a ConfigMap; `None` when it does not exist.
    fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, ClusterError>> + Send;
    /// The pods bound to the node.
    fn list_node_pods(&self, node: &str) -> impl Future<Output = Result<Vec<PodState>, ClusterError>> + Send;
    /// Evicts a pod through the Eviction API.
    fn evict_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<EvictOutcome, ClusterError>> + Send;
    /// Sets one condition of the node's status (the other conditions are kept); the transition time
    /// changes only when the status does.
    fn set_node_condition(
        &self,
        node: &str,
        condition: &NodeCondition,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Deletes a pod (absent is fine).
    fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
}

/// One mutating call an [`InMemoryCluster`] received, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `patch_node_metadata`.
    PatchNode(MetadataPatch),
    /// `set_node_spec(unschedulable, taint keys)`.
    SetSpec(bool, Vec<String>),
    /// `evict_pod(namespace/name)`.
    Evict(String),
    /// `delete_pod(namespace/name)`.
    Delete(String),
    /// `set_node_condition(type, status)`.
    Condition(String, bool),
}

#[derive(Debug, Default)]
struct Store {
    nodes: BTreeMap<String, NodeState>,
    config_maps: BTreeMap<(String, String), BTreeMap<String, String>>,
    pods: BTreeMap<String, (String, PodState)>,
    refused: BTreeSet<String>,
    calls: Vec<Call>,
    version: u64,
}

/// A cluster in memory: one store of nodes, ConfigMaps and pods (keyed `namespace/name`, each bound to a
/// node); evictions remove the pod at once unless [`InMemoryCluster::refuse_eviction`] named it.
#[derive(Debug, Default)]
pub struct InMemoryCluster {
    store: Mutex<Store>,
}

impl InMemoryCluster {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a node.
    pub fn put_node(&self, name: &str, mut node: NodeState) {
        let mut store = self.store();
        store.version += 1;
        node.resource_version = store.version.to_string();
        store.nodes.insert(name.to_owned(), node);
    }

    /// The node as stored.
    pub fn node(&self, name: &str) -> Option<NodeState> {
        self.store().nodes.get(name).cloned()
    }

    /// Sets one node label.
    pub fn set_node_label(&self, name: &str, key: &str, value: &str) {
        let mut store = self.store();
        store.version += 1;
        let version = store.version.to_string();
        if let Some(node) = store.nodes.get_mut(name) {
            node.labels.insert(key.to_owned(), value.to_owned());
            node.resource_version = version;
        }
    }

    /// Sets the node's boot ID (as the kubelet does after a reboot).
    pub fn set_boot_id(&self, name: &str, boot_id: &str) {
        let mut store = self.store();
        store.version += 1;
        let version = store.version.to_string();
        if let Some(node) = store.nodes.get_mut(name) {
            node.boot_id = boot_id.to_owned();
            node.resource_version = version;
        }
    }

    /// Adds or replaces a ConfigMap's data.
    pub fn put_config_map(&self, namespace: &str, name: &str, data: BTreeMap<String, String>) {
        self.store().config_maps.insert((namespace.to_owned(), name.to_owned()), data);
    }

    /// Adds a pod bound to `node`.
    pub fn put_pod(&self, node: &str, pod: PodState) {
        let key = format!("{}/{}", pod.namespace, pod.name);
        self.store().pods.insert(key, (node.to_owned(), pod));
    }

    /// Whether pod `namespace/name` exists.
    pub fn has_pod(&self, key: &str) -> bool {
        self.store().pods.contains_key(key)
    }

    /// Evictions of pod `namespace/name` answer 429 while `refuse` holds.
    pub fn refuse_eviction(&self, key: &str, refuse: bool) {
        let mut store = self.store();
        if refuse {
            store.refused.insert(key.to_owned());
        } else {
            store.refused.remove(key);
        }
    }

    /// The mutating calls so far.
    pub fn calls(&self) -> Vec<Call> {
        self.store().calls.clone()
    }
}

fn missing(operation: String) -> ClusterError {
    ClusterError::new(operation, "not found")
}

impl MigCluster for InMemoryCluster {
    async fn get_node(&self, node: &str) -> Result<NodeState, ClusterError> {
        self.store().nodes.get(node).cloned().ok_or_else(|| missing(format!("get node {node}")))
    }

    async fn patch_node_metadata(&self, node: &str, patch: &MetadataPatch) -> Result<(), ClusterError> {
        let mut store = self.store();
        store.version += 1;
        let version = store.version.to_string();
        let stored = store.nodes.get_mut(node).ok_or_else(|| missing(format!("patch node {node}")))?;
        for (target, changes) in
            [(&mut stored.labels, &patch.labels), (&mut stored.annotations, &patch.annotations)]
        {
            for (k, v) in changes {
                match v {
                    Some(v) => target.insert(k.clone(), v.clone()),
                    None => target.remove(k),
                };
            }
        }
        stored.resource_version = version;
        store.calls.push(Call::PatchNode(patch.clone()));
        Ok(())
    }

    async fn set_node_spec(
        &self,
        node: &str,
        resource_version: &str,
        unschedulable: bool,
        taints: &[NodeTaint],
    ) -> Result<(), ClusterError> {
        let mut store = self.store();
        store.version += 1;
        let version = store.version.to_string();
        let stored = store.nodes.get_mut(node).ok_or_else(|| missing(format!("patch node {node}")))?;
        if stored.resource_version != resource_version {
            return Err(ClusterError::new(format!("patch node {node}"), "409 Conflict: the node changed"));
        }
        stored.unschedulable = unschedulable;
        stored.taints = taints.to_vec();
        stored.resource_version = version;
        store.calls.push(Call::SetSpec(unschedulable, taints.iter().map(|t| t.key.clone()).collect()));
        Ok(())
    }

    async fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ClusterError> {
        Ok(self.store().config_maps.get(&(namespace.to_owned(), name.to_owned())).cloned())
    }

    async fn list_node_pods(&self, node: &str) -> Result<Vec<PodState>, ClusterError> {
        Ok(self.store().pods.values().filter(|(n, _)| n == node).map(|(_, p)| p.clone()).collect())
    }

    async fn evict_pod(&self, namespace: &str, name: &str) -> Result<EvictOutcome, ClusterError> {
        let key = format!("{namespace}/{name}");
        let mut store = self.store();
        store.calls.push(Call::Evict(key.clone()));
        if store.refused.contains(&key) {
            return Ok(EvictOutcome::Refused(
                "Cannot evict pod as it would violate the pod's disruption budget.".to_owned(),
            ));
        }
        Ok(match store.pods.remove(&key) {
            Some(_) => EvictOutcome::Evicted,
            None => EvictOutcome::NotFound,
        })
    }

    async fn set_node_condition(&self, node: &str, condition: &NodeCondition) -> Result<(), ClusterError> {
        let mut store = self.store();
        store.version += 1;
        let version = store.version.to_string();
        let stored =
            store.nodes.get_mut(node).ok_or_else(|| missing(format!("set condition of node {node}")))?;
        let status = if condition.status { "True" } else { "False" };
        stored.conditions.insert(condition.type_.clone(), status.to_owned());
        stored.resource_version = version;
        store.calls.push(Call::Condition(condition.type_.clone(), condition.status));
        Ok(())
    }

    async fn delete_pod(&self, namespace: &str, name: &str) -> Result<(), ClusterError> {
        let key = format!("{namespace}/{name}");
        let mut store = self.store();
        store.pods.remove(&key);
        store.calls.push(Call::Delete(key));
        Ok(())
    }
}
