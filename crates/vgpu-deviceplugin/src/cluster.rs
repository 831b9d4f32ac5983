//! The device plugin's view of the cluster: list the pods on this node and patch pod metadata. A kube-backed
//! implementation lives with the binary; [`InMemoryCluster`] serves tests and simulations.

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

impl PodPatch {
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

/// Pods held in memory; patches apply immediately.
#[derive(Debug, Default)]
pub struct InMemoryCluster {
    pods: Mutex<Vec<PodInfo>>,
}

impl InMemoryCluster {
    /// A cluster holding `pods`.
    pub fn new(pods: Vec<PodInfo>) -> Self {
        Self { pods: Mutex::new(pods) }
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
