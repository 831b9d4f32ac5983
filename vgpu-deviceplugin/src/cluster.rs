//! The device plugin's view of the cluster: list the pods on this node and patch pod metadata
//! ([`ClusterClient`]), publish the node's annotations/labels and drop stale extended resources from its
//! status ([`NodeClient`]). [`crate::kube_cluster::KubeCluster`] talks to the API server;
//! [`InMemoryCluster`] serves tests and simulations.

use std::{
    collections::BTreeMap,
    sync::{Mutex, PoisonError},
};

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
        serde_json::json!({ "metadata": { "labels": map(&self.labels), "annotations": map(&self.annotations) } })
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
}

#[tonic::async_trait]
impl ClusterClient for InMemoryCluster {
    async fn list_node_pods(&self, node: &str) -> Result<Vec<PodInfo>, ClusterError> {
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
