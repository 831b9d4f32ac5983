//! [`KubeCluster`]: [`ClusterClient`] and [`NodeClient`] over a `kube::Client`.
//!
//! Requests (contract §1.1, §2, §5):
//!
//! | call | request |
//! |---|---|
//! | list pods on node `n` | `GET /api/v1/pods?&fieldSelector=spec.nodeName%3Dn` |
//! | list pods on node `n` labelled `k=v` | `GET /api/v1/pods?&fieldSelector=spec.nodeName%3Dn&labelSelector=k%3Dv` |
//! | patch a pod | `PATCH /api/v1/namespaces/<ns>/pods/<name>?`, `application/merge-patch+json`, `{"metadata":{"labels":..,"annotations":..}}` |
//! | patch the node | `PATCH /api/v1/nodes/<n>?`, `application/merge-patch+json`, same body shape |
//! | drop stale resources | `GET /api/v1/nodes/<n>`, then only if one is present `PATCH /api/v1/nodes/<n>/status?`, `application/merge-patch+json`, `{"status":{"capacity":{"<r>":null},"allocatable":{"<r>":null}}}` |
//!
//! [`RescheduleClient`] (the AllocationFailureReschedule controller, contract §5.6):
//!
//! | call | request | outcome mapping |
//! |---|---|---|
//! | list pod objects on node `n` | `GET /api/v1/pods?&fieldSelector=spec.nodeName%3Dn&resourceVersion=0&resourceVersionMatch=NotOlderThan` | the watch cache answers |
//! | get a pod | `GET /api/v1/namespaces/<ns>/pods/<name>` | 404 → `None` |
//! | evict | `POST /api/v1/namespaces/<ns>/pods/<name>/eviction?`, `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name","namespace"},"deleteOptions":{"gracePeriodSeconds":g}}` | 404 → `NotFound`, 429 → `Refused` |
//! | delete with UID precondition | `DELETE /api/v1/namespaces/<ns>/pods/<name>?`, `{"preconditions":{"uid":"<uid>"}}` | 404 → `NotFound`, 409 → `UidMismatch` |
//! | create | `POST /api/v1/namespaces/<ns>/pods?`, the pod | 409 → `AlreadyExists` |
//! | event | `POST /apis/events.k8s.io/v1/namespaces/<ns>/events?`, an events.k8s.io/v1 Event `regarding` the pod, `reportingController` [`RESCHEDULE_REPORTING_CONTROLLER`] | |
//!
//! RBAC for these: `pods` get, list, create, delete; `pods/eviction` create; `events.k8s.io` `events` create.
//!
//! Upstream removes stale resources with a JSON patch (`remove /status/capacity/<r>`), which fails when the
//! key is absent; a merge patch with `null` values has the same effect on the object and cannot fail that
//! way, and needs no extra kube feature.
//!
//! This crate does not pick a `k8s-openapi` version feature; the binary does.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{Node, ObjectReference, Pod},
        events::v1 as events,
        policy::v1::Eviction,
    },
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, MicroTime, ObjectMeta},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions},
};

use crate::cluster::{
    ClusterClient, ClusterError, CreateOutcome, DeleteOutcome, EvictOutcome, NodeClient, NodePatch, PodEvent,
    PodInfo, PodPatch, RescheduleClient, pod_info,
};

/// Cluster access through the Kubernetes API server.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
    instance: String,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Wraps a client (from a kubeconfig, the in-cluster config, or a test service).
    pub fn new(client: Client) -> Self {
        Self { client, instance: "vgpu-device-plugin".to_owned() }
    }

    /// Names this process in the events it writes (`reportingInstance`, e.g. `vgpu-device-plugin-<node>`).
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

fn cluster_error(operation: String, err: &kube::Error) -> ClusterError {
    ClusterError { operation, message: err.to_string() }
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

    async fn list_node_pods_labelled(
        &self,
        node: &str,
        key: &str,
        value: &str,
    ) -> Result<Vec<PodInfo>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params =
            ListParams::default().fields(&format!("spec.nodeName={node}")).labels(&format!("{key}={value}"));
        let list = api
            .list(&params)
            .await
            .map_err(|e| cluster_error(format!("list pods on node {node} labelled {key}={value}"), &e))?;
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

// === impl RescheduleClient ===

/// `reportingController` of the events the reschedule controller writes.
pub const RESCHEDULE_REPORTING_CONTROLLER: &str = "vgpu-manager.io/reschedule";

/// The API status code of a failed call, if the server answered.
fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// The policy/v1 Eviction body for a pod (upstream's form: name, namespace and the grace period; a
/// negative grace is sent as 0, as upstream does).
pub fn eviction_body(namespace: &str, name: &str, grace_period_seconds: Option<i64>) -> Eviction {
    Eviction {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        delete_options: grace_period_seconds
            .map(|g| DeleteOptions { grace_period_seconds: Some(g.max(0)), ..DeleteOptions::default() }),
    }
}

/// The events.k8s.io/v1 Event for `event`, reported by `instance` at `now`.
pub fn event_object(event: &PodEvent, instance: &str, now: k8s_openapi::jiff::Timestamp) -> events::Event {
    let mut note = event.note.clone();
    if note.len() > 1024 {
        let mut cut = 1024;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    events::Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", event.name, now.as_nanosecond())),
            namespace: Some(event.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        reporting_controller: Some(RESCHEDULE_REPORTING_CONTROLLER.to_owned()),
        reporting_instance: Some(instance.to_owned()),
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(event.namespace.clone()),
            name: Some(event.name.clone()),
            uid: Some(event.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        }),
        note: Some(note),
        type_: Some(event.type_.as_str().to_owned()),
        ..events::Event::default()
    }
}

#[tonic::async_trait]
impl RescheduleClient for KubeCluster {
    async fn list_node_pod_objects(&self, node: &str) -> Result<Vec<Pod>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        // resourceVersion=0: served from the API server's watch cache (indexed by spec.nodeName), not etcd;
        // a slightly stale answer only delays a reschedule by one poll.
        let params = ListParams::default().fields(&format!("spec.nodeName={node}")).match_any();
        let list =
            api.list(&params).await.map_err(|e| cluster_error(format!("list pods on node {node}"), &e))?;
        Ok(list.items)
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| cluster_error(format!("get pod {namespace}/{name}"), &e))
    }

    async fn evict_pod(
        &self,
        namespace: &str,
        name: &str,
        grace_period_seconds: Option<i64>,
    ) -> Result<EvictOutcome, ClusterError> {
        // Not `Api::evict`: kube 5 sends `delete_options` (snake case), which the server drops, so the
        // grace period would be lost.
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let body = eviction_body(namespace, name, grace_period_seconds);
        match api
            .create_subresource::<_, serde_json::Value>("eviction", name, &PostParams::default(), &body)
            .await
        {
            Ok(_) => Ok(EvictOutcome::Evicted),
            Err(e) if api_code(&e) == Some(404) => Ok(EvictOutcome::NotFound),
            Err(kube::Error::Api(status)) if status.code == 429 => Ok(EvictOutcome::Refused(status.message)),
            Err(e) => Err(cluster_error(format!("evict pod {namespace}/{name}"), &e)),
        }
    }

    async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<DeleteOutcome, ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: Some(uid.to_owned()), resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => Ok(DeleteOutcome::Deleted),
            Err(e) if api_code(&e) == Some(404) => Ok(DeleteOutcome::NotFound),
            Err(e) if api_code(&e) == Some(409) => Ok(DeleteOutcome::UidMismatch),
            Err(e) => Err(cluster_error(format!("delete pod {namespace}/{name}"), &e)),
        }
    }

    async fn create_pod(&self, pod: &Pod) -> Result<CreateOutcome, ClusterError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), pod).await {
            Ok(created) => Ok(CreateOutcome::Created { uid: created.metadata.uid.unwrap_or_default() }),
            Err(e) if api_code(&e) == Some(409) => Ok(CreateOutcome::AlreadyExists),
            Err(e) => Err(cluster_error(format!("create pod {namespace}/{name}"), &e)),
        }
    }

    async fn record_event(&self, event: &PodEvent) -> Result<(), ClusterError> {
        let api: Api<events::Event> = Api::namespaced(self.client.clone(), &event.namespace);
        let object = event_object(event, &self.instance, k8s_openapi::jiff::Timestamp::now());
        api.create(&PostParams::default(), &object).await.map(drop).map_err(|e| {
            cluster_error(format!("create event for pod {}/{}", event.namespace, event.name), &e)
        })
    }
}
