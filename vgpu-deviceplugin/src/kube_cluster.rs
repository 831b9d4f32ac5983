//! [`KubeCluster`]: [`ClusterClient`] and [`NodeClient`] over a `kube::Client`.
//!
//! Requests (contract §1.1, §2, §5):
//!
//! | call | request |
//! |---|---|
//! | list pods on node `n` | `GET /api/v1/pods?&fieldSelector=spec.nodeName%3Dn` |
//! | patch a pod | `PATCH /api/v1/namespaces/<ns>/pods/<name>?`, `application/merge-patch+json`, `{"metadata":{"labels":..,"annotations":..}}` |
//! | patch the node | `PATCH /api/v1/nodes/<n>?`, `application/merge-patch+json`, same body shape |
//! | drop stale resources | `GET /api/v1/nodes/<n>`, then only if one is present `PATCH /api/v1/nodes/<n>/status?`, `application/merge-patch+json`, `{"status":{"capacity":{"<r>":null},"allocatable":{"<r>":null}}}` |
//!
//! Upstream removes stale resources with a JSON patch (`remove /status/capacity/<r>`), which fails when the
//! key is absent; a merge patch with `null` values has the same effect on the object and cannot fail that
//! way, and needs no extra kube feature.
//!
//! This crate does not pick a `k8s-openapi` version feature; the binary does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};

use crate::cluster::{ClusterClient, ClusterError, ContainerInfo, NodeClient, NodePatch, PodInfo, PodPatch};

/// Cluster access through the Kubernetes API server.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Wraps a client (from a kubeconfig, the in-cluster config, or a test service).
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

fn cluster_error(operation: String, err: &kube::Error) -> ClusterError {
    ClusterError { operation, message: err.to_string() }
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

/// The merge-patch body removing `resources` from capacity and allocatable.
pub fn remove_resources_body(resources: &[String]) -> serde_json::Value {
    let nulls: serde_json::Map<String, serde_json::Value> =
        resources.iter().map(|r| (r.clone(), serde_json::Value::Null)).collect();
    serde_json::json!({ "status": { "capacity": nulls.clone(), "allocatable": nulls } })
}

#[tonic::async_trait]
impl ClusterClient for KubeCluster {
    async fn list_node_pods(&self, node: &str) -> Result<Vec<PodInfo>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list =
            api.list(&params).await.map_err(|e| cluster_error(format!("list pods on node {node}"), &e))?;
        Ok(list.items.iter().map(pod_info).collect())
    }

    async fn patch_pod(&self, namespace: &str, name: &str, patch: &PodPatch) -> Result<(), ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch.to_json()))
            .await
            .map(drop)
            .map_err(|e| cluster_error(format!("patch pod {namespace}/{name}"), &e))
    }
}

#[tonic::async_trait]
impl NodeClient for KubeCluster {
    async fn patch_node(&self, node: &str, patch: &NodePatch) -> Result<(), ClusterError> {
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch(node, &PatchParams::default(), &Patch::Merge(patch.to_json()))
            .await
            .map(drop)
            .map_err(|e| cluster_error(format!("patch node {node}"), &e))
    }

    async fn remove_node_resources(&self, node: &str, resources: &[String]) -> Result<bool, ClusterError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let current = api.get(node).await.map_err(|e| cluster_error(format!("get node {node}"), &e))?;
        let status = current.status.unwrap_or_default();
        let empty = BTreeMap::new();
        let capacity = status.capacity.as_ref().unwrap_or(&empty);
        let allocatable = status.allocatable.as_ref().unwrap_or(&empty);
        let present: Vec<String> = resources
            .iter()
            .filter(|r| capacity.contains_key(*r) || allocatable.contains_key(*r))
            .cloned()
            .collect();
        if present.is_empty() {
            return Ok(false);
        }
        api.patch_status(node, &PatchParams::default(), &Patch::Merge(remove_resources_body(&present)))
            .await
            .map_err(|e| cluster_error(format!("patch node {node} status"), &e))?;
        Ok(true)
    }
}
