//! [`KubeCluster`]: [`MigCluster`] over a `kube::Client`.
//!
//! | call | request | outcome mapping |
//! |---|---|---|
//! | get node | `GET /api/v1/nodes/<n>` | |
//! | patch labels/annotations | `PATCH /api/v1/nodes/<n>`, `application/merge-patch+json`, `{"metadata":{"labels":..,"annotations":..}}` (`null` removes) | |
//! | cordon/taint | `PATCH /api/v1/nodes/<n>`, merge patch `{"metadata":{"resourceVersion":rv},"spec":{"unschedulable":b,"taints":[..]}}` | 409 when the node changed since it was read |
//! | condition | `PATCH /api/v1/nodes/<n>/status`, `application/strategic-merge-patch+json`, `{"status":{"conditions":[{"type",..}]}}` (merged by `type`: the kubelet's conditions are kept) | |
//! | get ConfigMap | `GET /api/v1/namespaces/<ns>/configmaps/<name>` | 404 → `None` |
//! | list pods on the node | `GET /api/v1/pods?fieldSelector=spec.nodeName%3D<n>` | |
//! | evict | `POST /api/v1/namespaces/<ns>/pods/<name>/eviction`, `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name","namespace"}}` | 404 → `NotFound`, 429 → `Refused`; no answer in [`EVICTION_TIMEOUT`] → error (retried) |
//! | delete | `DELETE /api/v1/namespaces/<ns>/pods/<name>` | 404 → done |
//!
//! RBAC: `nodes` get, patch; `nodes/status` patch; `configmaps` get (the configuration's namespace); `pods` list, delete;
//! `pods/eviction` create (see `deploy/mig-manager/`).
//!
//! This crate does not pick a `k8s-openapi` version feature; the binary does.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};

use crate::cluster::{
    ClusterError, EvictOutcome, MetadataPatch, MigCluster, NodeCondition, NodeState, NodeTaint, PodState,
};

/// The annotation the kubelet puts on mirror pods (the API server's copies of static pods).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// How long one eviction call may take before the pass gives up (and retries on the next).
pub const EVICTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

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
    /// Wraps a client.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

fn err(operation: String) -> impl FnOnce(kube::Error) -> ClusterError {
    move |e| ClusterError::new(operation, e.to_string())
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn map_patch(m: &BTreeMap<String, Option<String>>) -> serde_json::Value {
    serde_json::Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), v.clone().map_or(serde_json::Value::Null, serde_json::Value::String)))
            .collect(),
    )
}

fn pod_state(pod: &Pod) -> PodState {
    let mut resources = BTreeSet::new();
    if let Some(spec) = &pod.spec {
        let containers = spec.init_containers.iter().flatten().chain(spec.containers.iter());
        for c in containers {
            if let Some(r) = &c.resources {
                for map in [&r.limits, &r.requests].into_iter().flatten() {
                    resources.extend(map.keys().cloned());
                }
            }
        }
    }
    PodState {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        resources,
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        controller_kind: pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.kind.clone()),
        mirror: pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
    }
}

impl MigCluster for KubeCluster {
    async fn get_node(&self, node: &str) -> Result<NodeState, ClusterError> {
        let n =
            Api::<Node>::all(self.client.clone()).get(node).await.map_err(err(format!("get node {node}")))?;
        let spec = n.spec.unwrap_or_default();
        let status = n.status.unwrap_or_default();
        Ok(NodeState {
            boot_id: status.node_info.map(|i| i.boot_id).unwrap_or_default(),
            conditions: status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.type_, c.status))
                .collect(),
            resource_version: n.metadata.resource_version.unwrap_or_default(),
            labels: n.metadata.labels.unwrap_or_default(),
            annotations: n.metadata.annotations.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            taints: spec
                .taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| NodeTaint { key: t.key, value: t.value, effect: t.effect })
                .collect(),
        })
    }

    async fn patch_node_metadata(&self, node: &str, patch: &MetadataPatch) -> Result<(), ClusterError> {
        let mut metadata = serde_json::Map::new();
        if !patch.labels.is_empty() {
            metadata.insert("labels".to_owned(), map_patch(&patch.labels));
        }
        if !patch.annotations.is_empty() {
            metadata.insert("annotations".to_owned(), map_patch(&patch.annotations));
        }
        let body = serde_json::json!({ "metadata": metadata });
        Api::<Node>::all(self.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map_err(err(format!("patch node {node}")))?;
        Ok(())
    }

    async fn set_node_spec(
        &self,
        node: &str,
        resource_version: &str,
        unschedulable: bool,
        taints: &[NodeTaint],
    ) -> Result<(), ClusterError> {
        let taints: Vec<serde_json::Value> = taints
            .iter()
            .map(|t| {
                let mut v = serde_json::json!({ "key": t.key, "effect": t.effect });
                if let (Some(value), Some(obj)) = (&t.value, v.as_object_mut()) {
                    obj.insert("value".to_owned(), serde_json::Value::String(value.clone()));
                }
                v
            })
            .collect();
        let body = serde_json::json!({
            "metadata": { "resourceVersion": resource_version },
            "spec": { "unschedulable": unschedulable, "taints": taints },
        });
        Api::<Node>::all(self.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map_err(err(format!("cordon/taint node {node}")))?;
        Ok(())
    }

    async fn get_config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ClusterError> {
        let cm = Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(err(format!("get ConfigMap {namespace}/{name}")))?;
        Ok(cm.map(|cm| cm.data.unwrap_or_default()))
    }

    async fn list_node_pods(&self, node: &str) -> Result<Vec<PodState>, ClusterError> {
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = Api::<Pod>::all(self.client.clone())
            .list(&params)
            .await
            .map_err(err(format!("list pods on node {node}")))?;
        Ok(list.items.iter().map(pod_state).collect())
    }

    async fn evict_pod(&self, namespace: &str, name: &str) -> Result<EvictOutcome, ClusterError> {
        // Not `Api::evict`: kube 5 writes `delete_options` (snake case) in the body.
        let body = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": { "name": name, "namespace": namespace },
        });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = PostParams::default();
        let call = api.create_subresource::<_, serde_json::Value>("eviction", name, &params, &body);
        let operation = format!("evict pod {namespace}/{name}");
        match tokio::time::timeout(EVICTION_TIMEOUT, call).await {
            Err(_) => Err(ClusterError::new(operation, format!("no answer within {EVICTION_TIMEOUT:?}"))),
            Ok(Ok(_)) => Ok(EvictOutcome::Evicted),
            Ok(Err(e)) if status_code(&e) == Some(404) => Ok(EvictOutcome::NotFound),
            Ok(Err(kube::Error::Api(status))) if status.code == 429 => {
                Ok(EvictOutcome::Refused(status.message.clone()))
            }
            Ok(Err(e)) => Err(err(operation)(e)),
        }
    }

    async fn set_node_condition(&self, node: &str, condition: &NodeCondition) -> Result<(), ClusterError> {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
        let body = serde_json::json!({
            "status": { "conditions": [ {
                "type": condition.type_,
                "status": if condition.status { "True" } else { "False" },
                "reason": condition.reason,
                "message": condition.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            } ] }
        });
        Api::<Node>::all(self.client.clone())
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(&body))
            .await
            .map_err(err(format!("set condition {} of node {node}", condition.type_)))?;
        Ok(())
    }

    async fn delete_pod(&self, namespace: &str, name: &str) -> Result<(), ClusterError> {
        match Api::<Pod>::namespaced(self.client.clone(), namespace)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(err(format!("delete pod {namespace}/{name}"))(e)),
        }
    }
}
