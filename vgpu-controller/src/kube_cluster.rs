//! [`ControllerCluster`] over the API server. Reads come from caches that kube-runtime watchers keep
//! ([`Watches::run`] drives them and signals every change on a [`Notify`]); writes are server-side applies
//! with field manager [`FIELD_MANAGER`] (forced: the controller is the only writer of these fields).
//! PhysicalGPU and GPUClass go through `Api<DynamicObject>` with the configured group
//! ([`vgpu_api::api_resource_for_group`]).
//!
//! | call | request |
//! |---|---|
//! | caches | watches (list + watch, bookmarks) of `<group>/v1alpha1` `gpuclasses` and `physicalgpus`, `v1` nodes (metadata only), `resource.k8s.io/v1` `resourceclaims` (all namespaces), `resourceslices`, and `deviceclasses?labelSelector=<group>/gpuclass` |
//! | DeviceClass | `PATCH /apis/resource.k8s.io/v1/deviceclasses/<name>?&force=true&fieldManager=vgpu-controller`, `application/apply-patch+yaml`, the whole object |
//! | delete | `DELETE /apis/resource.k8s.io/v1/deviceclasses/<name>` (404 is success) |
//! | GPUClass status | `PATCH /apis/<group>/v1alpha1/gpuclasses/<name>/status?&force=true&fieldManager=vgpu-controller`, apply, `{apiVersion, kind, metadata: {name}, status: {valid, message, deviceClassName, conditions}}` |
//! | PhysicalGPU status | `PATCH /apis/<group>/v1alpha1/physicalgpus/<name>/status?…`, apply, `{apiVersion, kind, metadata: {name}, status: {state, occupancy}}` |
//! | pods | `GET /api/v1/namespaces/<ns>/pods?&labelSelector=<group>/admission-id in (<id>,…)` (live, only for claims without an owner; one list per namespace and batch) |
//! | claim owners | `PATCH /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>?`, `application/json-patch+json`, `[{op: test, path: /metadata/uid, value: <uid>}, {op: add, path: /metadata/ownerReferences, value: [...]}]` (404 is success) |
//! | claim delete | `DELETE /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>?`, body `DeleteOptions{preconditions: {uid, resourceVersion}}` (404 is success) |

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::Notify;
use tokio_stream::StreamExt;
use vgpu_api::{GPUClass, GPUClassStatus, PhysicalGPU, api_resource_for_group};

use vgpu_kube::error::CallError;

use crate::FIELD_MANAGER;
use crate::cluster::{ControllerCluster, Snapshot, key_of};
use crate::config::{ConfigError, ControllerConfig};
use crate::occupancy::GpuStatus;

/// The caches' readers and the writers' client.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
    config: ControllerConfig,
    class_ar: ApiResource,
    gpu_ar: ApiResource,
    classes: Store<DynamicObject>,
    gpus: Store<DynamicObject>,
    nodes: Store<PartialObjectMeta<Node>>,
    claims: Store<ResourceClaim>,
    slices: Store<ResourceSlice>,
    device_classes: Store<DeviceClass>,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").field("group", &self.config.group).finish_non_exhaustive()
    }
}

/// The cache writers, to be driven by [`Watches::run`].
pub struct Watches {
    client: Client,
    class_label: String,
    class_ar: ApiResource,
    gpu_ar: ApiResource,
    classes: Writer<DynamicObject>,
    gpus: Writer<DynamicObject>,
    nodes: Writer<PartialObjectMeta<Node>>,
    claims: Writer<ResourceClaim>,
    slices: Writer<ResourceSlice>,
    device_classes: Writer<DeviceClass>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches").field("class_label", &self.class_label).finish_non_exhaustive()
    }
}

async fn drive<K>(
    writer: Writer<K>,
    api: Api<K>,
    config: watcher::Config,
    changes: Arc<Notify>,
    what: &'static str,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(_) => changes.notify_one(),
            Err(e) => tracing::warn!(watch = what, error = %e, "watch failed; retrying"),
        }
    }
}

impl Watches {
    /// Drives every watch until the returned future is dropped; each event notifies `changes`.
    pub async fn run(self, changes: Arc<Notify>) {
        let c = &self.client;
        let node_stream = reflector::reflector(
            self.nodes,
            watcher(Api::<PartialObjectMeta<Node>>::all(c.clone()), watcher::Config::default())
                .default_backoff(),
        );
        let node_changes = changes.clone();
        let nodes = async move {
            let mut s = std::pin::pin!(node_stream);
            while let Some(event) = s.next().await {
                match event {
                    Ok(_) => node_changes.notify_one(),
                    Err(e) => tracing::warn!(watch = "nodes", error = %e, "watch failed; retrying"),
                }
            }
        };
        tokio::join!(
            drive(
                self.classes,
                Api::all_with(c.clone(), &self.class_ar),
                watcher::Config::default(),
                changes.clone(),
                "gpuclasses"
            ),
            drive(
                self.gpus,
                Api::all_with(c.clone(), &self.gpu_ar),
                watcher::Config::default(),
                changes.clone(),
                "physicalgpus"
            ),
            drive(
                self.claims,
                Api::all(c.clone()),
                watcher::Config::default(),
                changes.clone(),
                "resourceclaims"
            ),
            drive(
                self.slices,
                Api::all(c.clone()),
                watcher::Config::default(),
                changes.clone(),
                "resourceslices"
            ),
            drive(
                self.device_classes,
                Api::all(c.clone()),
                watcher::Config::default().labels(&self.class_label),
                changes.clone(),
                "deviceclasses"
            ),
            nodes,
        );
    }
}

impl KubeCluster {
    /// Caches and writers for `config`; drive the returned [`Watches`] for the caches to fill.
    pub fn new(client: Client, config: ControllerConfig) -> Result<(Self, Watches), ConfigError> {
        let class_ar = api_resource_for_group::<GPUClass>(&config.group)?;
        let gpu_ar = api_resource_for_group::<PhysicalGPU>(&config.group)?;
        let classes = Writer::new(class_ar.clone());
        let gpus = Writer::new(gpu_ar.clone());
        let nodes = Writer::default();
        let claims = Writer::default();
        let slices = Writer::default();
        let device_classes = Writer::default();
        let me = Self {
            client: client.clone(),
            config: config.clone(),
            class_ar: class_ar.clone(),
            gpu_ar: gpu_ar.clone(),
            classes: classes.as_reader(),
            gpus: gpus.as_reader(),
            nodes: nodes.as_reader(),
            claims: claims.as_reader(),
            slices: slices.as_reader(),
            device_classes: device_classes.as_reader(),
        };
        let watches = Watches {
            client,
            class_label: config.class_label(),
            class_ar,
            gpu_ar,
            classes,
            gpus,
            nodes,
            claims,
            slices,
            device_classes,
        };
        Ok((me, watches))
    }

    /// Waits until every cache has its first full list.
    pub async fn wait_synced(&self) -> Result<(), reflector::store::WriterDropped> {
        self.classes.wait_until_ready().await?;
        self.gpus.wait_until_ready().await?;
        self.nodes.wait_until_ready().await?;
        self.claims.wait_until_ready().await?;
        self.slices.wait_until_ready().await?;
        self.device_classes.wait_until_ready().await
    }

    /// The GPUClasses in the cache (for admission).
    pub fn classes(&self) -> Vec<GPUClass> {
        parse_all(&self.classes)
    }

    /// The PhysicalGPUs in the cache (for admission).
    pub fn gpus(&self) -> Vec<PhysicalGPU> {
        parse_all(&self.gpus)
    }

    /// ResourceClaim `<namespace>/<name>` in the cache (for admission; `None` when the cache does not hold it).
    pub fn claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        let key = reflector::ObjectRef::<ResourceClaim>::new(name).within(namespace);
        self.claims.get(&key).map(|c| c.as_ref().clone())
    }

    fn apply_params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }
}

fn parse_all<K: Resource + DeserializeOwned>(store: &Store<DynamicObject>) -> Vec<K> {
    store
        .state()
        .iter()
        .filter_map(|o| match o.as_ref().clone().try_parse::<K>() {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(name = %o.name_any(), error = %e, "skipping an object that does not decode");
                None
            }
        })
        .collect()
}

impl ControllerCluster for KubeCluster {
    async fn snapshot(&self) -> Result<Snapshot, CallError> {
        Ok(Snapshot {
            classes: self.classes(),
            gpus: self.gpus(),
            nodes: self.nodes.state().iter().map(|n| (n.name_any(), n.labels().clone())).collect(),
            claims: self.claims.state().iter().map(|c| c.as_ref().clone()).collect(),
            slices: self.slices.state().iter().map(|s| s.as_ref().clone()).collect(),
            device_classes: self.device_classes.state().iter().map(|d| d.as_ref().clone()).collect(),
        })
    }

    async fn apply_device_class(&self, class: &DeviceClass) -> Result<(), CallError> {
        let name = class.name_any();
        let api: Api<DeviceClass> = Api::all(self.client.clone());
        let mut body = serde_json::to_value(class).map_err(|e| CallError::Api {
            operation: format!("encode DeviceClass {name}"),
            message: e.to_string(),
        })?;
        body["apiVersion"] = json!("resource.k8s.io/v1");
        body["kind"] = json!("DeviceClass");
        api.patch(&name, &Self::apply_params(), &Patch::Apply(&body))
            .await
            .map(drop)
            .map_err(|e| CallError::from_kube(format!("apply DeviceClass {name}"), &e))
    }

    async fn delete_device_class(&self, name: &str) -> Result<(), CallError> {
        let api: Api<DeviceClass> = Api::all(self.client.clone());
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(CallError::from_kube(format!("delete DeviceClass {name}"), &e)),
        }
    }

    async fn apply_class_status(&self, class: &str, status: &GPUClassStatus) -> Result<(), CallError> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.class_ar);
        let body = json!({
            "apiVersion": self.class_ar.api_version,
            "kind": "GPUClass",
            "metadata": {"name": class},
            "status": status,
        });
        api.patch_status(class, &Self::apply_params(), &Patch::Apply(&body))
            .await
            .map(drop)
            .map_err(|e| CallError::from_kube(format!("apply status of GPUClass {class}"), &e))
    }

    async fn apply_gpu_status(&self, gpu: &str, status: &GpuStatus) -> Result<(), CallError> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.gpu_ar);
        // Fields left out are released: server-side apply removes what this manager applied before.
        let mut fields = json!({"state": status.state, "occupancy": status.occupancy});
        if let Some(wish) = status.passthrough.wish {
            fields["classPassthrough"] = json!(wish);
        }
        if let Some(condition) = &status.passthrough.condition {
            fields["conditions"] = json!([condition]);
        }
        let body = json!({
            "apiVersion": self.gpu_ar.api_version,
            "kind": "PhysicalGPU",
            "metadata": {"name": gpu},
            "status": fields,
        });
        api.patch_status(gpu, &Self::apply_params(), &Patch::Apply(&body))
            .await
            .map(drop)
            .map_err(|e| CallError::from_kube(format!("apply status of PhysicalGPU {gpu}"), &e))
    }
    async fn list_pods(&self, namespace: &str, label_selector: &str) -> Result<Vec<Pod>, CallError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        api.list(&ListParams::default().labels(label_selector))
            .await
            .map(|l| l.items)
            .map_err(|e| CallError::from_kube(format!("list pods in {namespace} with {label_selector}"), &e))
    }

    async fn set_claim_owners(
        &self,
        claim: &ResourceClaim,
        owners: &[OwnerReference],
    ) -> Result<(), CallError> {
        let operation = || format!("set the owner of ResourceClaim {}", key_of(claim));
        let namespace = claim.namespace().unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/uid", "value": claim.metadata.uid},
            {"op": "add", "path": "/metadata/ownerReferences", "value": owners},
        ]))
        .map_err(|e| CallError::Api { operation: operation(), message: e.to_string() })?;
        match api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Json::<()>(patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(CallError::from_kube(operation(), &e)),
        }
    }

    async fn delete_claim(&self, claim: &ResourceClaim) -> Result<(), CallError> {
        let namespace = claim.namespace().unwrap_or_default();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&claim.name_any(), &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(CallError::from_kube(format!("delete ResourceClaim {}", key_of(claim)), &e)),
        }
    }

    async fn delete_gpu(&self, gpu: &PhysicalGPU) -> Result<(), CallError> {
        let name = gpu.name_any();
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.gpu_ar);
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: gpu.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(CallError::from_kube(format!("delete PhysicalGPU {name}"), &e)),
        }
    }
}
