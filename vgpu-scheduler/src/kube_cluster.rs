//! [`KubeCluster`]: the [`Cluster`] trait over a `kube::Client`.
//!
//! Requests (contract §3.1 step 7, §3.3):
//!
//! | call | request |
//! |---|---|
//! | [`snapshot`](Cluster::snapshot) | `GET /api/v1/nodes?&limit=500`, then `…&limit=500&continue=<token>` while the list has a continue token; the same for `GET /api/v1/pods?&limit=500` (all namespaces) |
//! | [`get_pod`](Cluster::get_pod) | `GET /api/v1/namespaces/<ns>/pods/<name>` |
//! | [`patch_pod_metadata`](Cluster::patch_pod_metadata) | `PATCH /api/v1/namespaces/<ns>/pods/<name>?`, `application/merge-patch+json`, exactly [`MetadataPatch::to_json`] |
//! | [`bind_pod`](Cluster::bind_pod) | `POST /api/v1/namespaces/<ns>/pods/<name>/binding?`, `application/json`, `{"apiVersion":"v1","kind":"Binding","metadata":{"name","namespace","uid"},"target":{"apiVersion":"v1","kind":"Node","name":<node>}}` |
//! | [`list_pod_disruption_budgets`](Cluster::list_pod_disruption_budgets) | `GET /apis/policy/v1/poddisruptionbudgets?&limit=500`, then `…&limit=500&continue=<token>` (once per preempt call of a vGPU pod; RBAC `policy/poddisruptionbudgets` `list`) |
//! | [`record_event`](Cluster::record_event) | `POST /api/v1/namespaces/<ns>/events?`, `application/json`, a core/v1 `Event` named `<pod>.<unix-ns in hex>` (as client-go names them): `involvedObject` the pod, `source.component` and `reportingComponent` = the scheduler name, reason, message, type, `firstTimestamp` = `lastTimestamp` = now, `count` 1 |
//!
//! The binding carries the pod's UID in its metadata: the API server refuses (409) to bind a pod of that name
//! with another UID, so a pod deleted and recreated between filter and bind is never bound by mistake.
//! Events are best effort and sent from a background task (a verb never waits for them): a failure is logged
//! and dropped.
//!
//! Errors map to [`ClusterError`] by HTTP status: 404 → `NotFound`, 409 → `Conflict`, 408, 429 and 5xx (and
//! connection errors, timeouts, broken streams) → `Unavailable`, anything else → `Other`; the message names
//! the operation and the object.
//!
//! This crate does not pick a `k8s-openapi` version feature; the binary does.
//!
//! # Wiring the extender binary
//!
//! The extender runs over a [`KubeCluster`]; its cache is fed by a [`CacheDriver`](crate::watch::CacheDriver)
//! (not by [`Extender::sync`](crate::Extender::sync), which would list everything a second time), and
//! [`leader::run`](vgpu_lease::leader::run) sets the role in the shared [`Readiness`](vgpu_lease::Readiness).
//!
//! ```no_run
//! use std::sync::Arc;
//! use vgpu_lease::{LeaderConfig, LeaderMode, Readiness, leader};
//! use vgpu_core::clock::SystemClock;
//! use vgpu_scheduler::{CacheDriver, Extender, ExtenderConfig, KubeCluster};
//! # async fn main_() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let clock = Arc::new(SystemClock);
//! let cluster = KubeCluster::new(client.clone(), vgpu_scheduler::DEFAULT_SCHEDULER_NAME);
//! let extender = Arc::new(Extender::new(cluster, clock.clone(), ExtenderConfig::default()));
//!
//! let leader_config = LeaderConfig::new(LeaderMode::from_flags(true, false)?, "kube-system", "vgpu-scheduler");
//! leader_config.validate()?;
//! let readiness = Readiness::new(leader_config.initial_role());
//!
//! let stop = tokio_util::sync::CancellationToken::new();
//! let cache = CacheDriver::new(client.clone(), extender.cache().clone(), readiness.clone())
//!     .with_clock(clock.clone())
//!     .spawn(stop.clone().cancelled_owned());
//! let stopped = stop.clone().cancelled_owned();
//! let elector = tokio::spawn(leader::run(client, leader_config, readiness.clone(), stopped));
//! // … serve the verbs with `extender`, `/readyz` with `readiness`, until SIGTERM …
//! stop.cancel();
//! cache.await?;
//! elector.await??;
//! # Ok(())
//! # }
//! ```

use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use vgpu_core::domain::ResourceDomain;

use vgpu_kube::error::{ClusterError, cluster_error};

use crate::cluster::{Binding, Cluster, Event, EventType, MetadataPatch, Node, Pod};
use crate::convert::{node_from_k8s, pdb_from_k8s, pod_from_k8s};
use crate::pdb::PodDisruptionBudget;

/// Page size of the snapshot lists (client-go's pager default).
pub const LIST_PAGE_SIZE: u32 = 500;

/// Cluster access through the Kubernetes API server.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
    scheduler_name: String,
    domain: ResourceDomain,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").field("scheduler_name", &self.scheduler_name).finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Wraps a client (from a kubeconfig, the in-cluster config, or a test service); `scheduler_name` is the
    /// event source (`--scheduler-name`). Default resource domain.
    pub fn new(client: Client, scheduler_name: impl Into<String>) -> Self {
        Self { client, scheduler_name: scheduler_name.into(), domain: ResourceDomain::default() }
    }

    /// Uses another resource domain (`--domain`) to read node allocatable quantities.
    pub fn with_domain(mut self, domain: ResourceDomain) -> Self {
        self.domain = domain;
        self
    }

    /// The underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The scheduler name (event source).
    pub fn scheduler_name(&self) -> &str {
        &self.scheduler_name
    }
}

/// The `v1 Binding` of a pod to a node, with the pod's UID as precondition and the labels and annotations it
/// carries onto the pod.
pub fn binding_object(binding: &Binding) -> corev1::Binding {
    corev1::Binding {
        metadata: ObjectMeta {
            name: Some(binding.name.clone()),
            namespace: Some(binding.namespace.clone()),
            uid: Some(binding.uid.clone()).filter(|u| !u.is_empty()),
            labels: Some(binding.labels.clone()).filter(|m| !m.is_empty()),
            annotations: Some(binding.annotations.clone()).filter(|m| !m.is_empty()),
            ..ObjectMeta::default()
        },
        target: corev1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(binding.node.clone()),
            ..corev1::ObjectReference::default()
        },
    }
}

fn timestamp(ns: i64) -> Timestamp {
    Timestamp::from_second(ns.div_euclid(1_000_000_000)).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The core/v1 `Event` recorded for `event` by `component`, stamped with the time it happened
/// ([`Event::at_ns`]; see the module docs).
pub fn event_object(event: &Event, component: &str) -> corev1::Event {
    let now_ns = event.at_ns;
    let now = Time(timestamp(now_ns));
    corev1::Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", event.pod, now_ns)),
            namespace: Some(event.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: corev1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(event.pod.clone()),
            namespace: Some(event.namespace.clone()),
            ..corev1::ObjectReference::default()
        },
        reason: Some(event.reason.to_owned()),
        message: Some(event.message.clone()),
        type_: Some(
            match event.kind {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        source: Some(corev1::EventSource { component: Some(component.to_owned()), host: None }),
        reporting_component: Some(component.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..corev1::Event::default()
    }
}

async fn list_pages<K>(api: &Api<K>, what: &str) -> Result<Vec<K>, ClusterError>
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(LIST_PAGE_SIZE);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = api.list(&params).await.map_err(|e| cluster_error("list", what, &e))?;
        items.extend(page.items);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(items);
        }
    }
}

impl Cluster for KubeCluster {
    async fn snapshot(&self) -> Result<(Vec<Node>, Vec<Pod>), ClusterError> {
        let nodes: Api<corev1::Node> = Api::all(self.client.clone());
        let pods: Api<corev1::Pod> = Api::all(self.client.clone());
        let nodes = list_pages(&nodes, "nodes").await?;
        let pods = list_pages(&pods, "pods").await?;
        Ok((
            nodes.iter().map(|n| node_from_k8s(n, &self.domain)).collect(),
            pods.iter().map(pod_from_k8s).collect(),
        ))
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClusterError> {
        let api: Api<corev1::Pod> = Api::namespaced(self.client.clone(), namespace);
        api.get(name)
            .await
            .map(|p| pod_from_k8s(&p))
            .map_err(|e| cluster_error("get", &format!("pod {namespace}/{name}"), &e))
    }

    async fn patch_pod_metadata(
        &self,
        namespace: &str,
        name: &str,
        patch: &MetadataPatch,
    ) -> Result<Pod, ClusterError> {
        let object = format!("pod {namespace}/{name}");
        // `to_json` builds sorted maps, so the value serializes back to exactly the same bytes.
        let body: serde_json::Value = serde_json::from_str(&patch.to_json())
            .map_err(|e| ClusterError::Other(format!("patch {object}: {e}")))?;
        let api: Api<corev1::Pod> = Api::namespaced(self.client.clone(), namespace);
        api.patch(name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map(|p| pod_from_k8s(&p))
            .map_err(|e| cluster_error("patch", &object, &e))
    }

    async fn bind_pod(&self, binding: &Binding) -> Result<(), ClusterError> {
        let api: Api<corev1::Pod> = Api::namespaced(self.client.clone(), &binding.namespace);
        api.create_subresource::<_, serde_json::Value>(
            "binding",
            &binding.name,
            &PostParams::default(),
            &binding_object(binding),
        )
        .await
        .map(drop)
        .map_err(|e| {
            cluster_error(
                "bind",
                &format!("pod {}/{} to node {}", binding.namespace, binding.name, binding.node),
                &e,
            )
        })
    }

    async fn list_pod_disruption_budgets(&self) -> Result<Vec<PodDisruptionBudget>, ClusterError> {
        let api: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> = Api::all(self.client.clone());
        Ok(list_pages(&api, "poddisruptionbudgets").await?.iter().map(pdb_from_k8s).collect())
    }

    /// Sends the event from a background task, so the verb that records it never waits for the API server.
    async fn record_event(&self, event: Event) {
        let api: Api<corev1::Event> = Api::namespaced(self.client.clone(), &event.namespace);
        let object = event_object(&event, &self.scheduler_name);
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &object).await {
                tracing::warn!(
                    namespace = %event.namespace, pod = %event.pod, reason = event.reason,
                    error = %cluster_error("create", "event", &e), "recording an event failed"
                );
            }
        });
    }
}
