//! Admission for the GPU module: validating rules for GPUClass, DeviceClass, ResourceClaim and Pod, the pod
//! mutation that turns a GPUClass request into a ResourceClaim, and the pod mutation on UPDATE. Decoding and
//! answers are [`vgpu_serve::admission`]'s, claim creation goes through the admission cluster seam
//! ([`vgpu_kube::claims::ClusterApi`]), claim names are the shared safe names ([`vgpu_api::names`]), and the pod
//! patch is the diff of the [`vgpu_api::pod::comparable`] sides; only the GPU-module rules live here.
//!
//! # Routes
//!
//! | route | operations | denies (message names the field) | patches / side effects |
//! |---|---|---|---|
//! | `POST /gpuclasses/validate` | CREATE, UPDATE | a vendor without a DRA driver; a `deviceType` that is not a lower-case model slug; a `minComputeCapability` that is not `<major>.<minor>`; a capability that is not an identifier; a name whose DeviceClass name (`<name>.<group>`) passes 253 characters | — |
//! | `POST /deviceclasses/validate` | CREATE, UPDATE | a DeviceClass that names a GPUClass (label `<group>/gpuclass`, or a name ending in `.<group>`) that does not exist | — |
//! | `POST /resourceclaims/validate` | CREATE | a request whose `deviceClassName` is a GPUClass's (`<class>.<group>`) while that GPUClass does not exist; one that asks more devices than matching GPUs sit on any one node, more `memory` than any matching GPU has, or more than 100 `cores` | — |
//! | `POST /pods/mutate` | CREATE | a GPUClass resource whose class does not exist, whose count is not a positive integer, or whose `nodeSelector` conflicts with the pod's | removes the `<group>/<class>` limit and request; adds a pod claim `<container>-<class>` (`spec.resourceClaims`, container `resources.claims`), the class's `nodeSelector` and the label `<group>/admission-id`; creates the ResourceClaim (dry run on a dry-run request) |
//! | `POST /pods/mutate` | UPDATE | — | puts back the label `<group>/admission-id` when the update drops or changes it on a pod with claims ([`crate::pod_update`]); nothing else |
//! | `POST /pods/validate` | CREATE, UPDATE (not subresources) | a `<group>/<class>` resource left unconverted (count, class, GPUs per node named first); a `resourceClaimName` whose claim asks for a GPUClass that does not exist, or that the pod mutation made for another pod ([`crate::pod_validation`]); on UPDATE only a violation the update brings in | — |
//!
//! # The GPUClass request
//!
//! A container asks for GPUs of a class with the extended resource `<group>/<class>` (`gpu.deckhouse.io/a100-shared: 1`)
//! in `limits` (or `requests`); the count is the number of devices. A resource name was chosen over an
//! annotation because it is per container, reads like the device-plugin request it replaces, and a pod that
//! reaches the scheduler unmutated stays pending (no node offers the resource) instead of running without a GPU.
//!
//! The ResourceClaim: name `safe_resource_name([<pod or generateName + uid hash>, <container>, <class>, <id>])`,
//! labels `<group>/gpuclass: <class>`, `vgpu-manager.io/owner-key: <namespace>-<pod>`,
//! `app.kubernetes.io/managed-by: vgpu-controller` and `<group>/admission-id: <id>`, one request `gpu`
//! with `exactly {deviceClassName: <class>.<group>, allocationMode: ExactCount, count}`. `<id>` is the first
//! [`ADMISSION_ID_LENGTH`] hex digits of the SHA-256 of the AdmissionRequest UID; the pod gets the same
//! label `<group>/admission-id: <id>`. A claim that already exists (the API server may call the webhook
//! again for the same request) counts as created; since the id is in the name, a later pod of the same
//! name never inherits a claim of an earlier one.
//!
//! # Who deletes the claim
//!
//! At mutating admission the pod has no UID (and, with `generateName`, no name), so the claim cannot carry
//! an ownerReference yet, and the pod may still be refused by a later admission step or by validation. The
//! reconcile loop closes the gap ([`crate::claims`]): it finds the pod by the `<group>/admission-id` label,
//! sets the controller ownerReference to it (the garbage collector then deletes the claim with the pod), and
//! deletes a claim whose pod does not exist once it is older than [`ControllerConfig::orphan_grace`].

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
use vgpu_api::names::{safe_resource_name, short_hash};
use vgpu_api::pod::{ContainerSlot, comparable, containers};
use vgpu_api::{GPUClass, PhysicalGPU};
use vgpu_core::domain::OWNER_KEY_LABEL;
use vgpu_kube::claims::ClusterApi;
use vgpu_serve::admission::{Denial, ReviewError, decode, respond};

use crate::cel::{is_cel_identifier, parse_compute_capability};
use crate::cluster::{InMemoryCluster, Snapshot};
use crate::config::ControllerConfig;
use crate::desired::{MANAGED_BY, MANAGED_BY_LABEL, NodeLabels, gpu_matches, most_on_one_node};
use crate::metrics::Metrics;
use crate::pod_validation::{PodContext, claim_names, validate_pod, validate_pod_update};

/// GPUClass validation route.
pub const VALIDATE_CLASSES_PATH: &str = "/gpuclasses/validate";
/// DeviceClass validation route.
pub const VALIDATE_DEVICE_CLASSES_PATH: &str = "/deviceclasses/validate";
/// ResourceClaim validation route.
pub const VALIDATE_CLAIMS_PATH: &str = "/resourceclaims/validate";
/// Pod mutation route.
pub const MUTATE_PODS_PATH: &str = "/pods/mutate";
/// Pod validation route.
pub const VALIDATE_PODS_PATH: &str = "/pods/validate";
/// The request name inside generated claims.
pub const REQUEST_NAME: &str = "gpu";
/// Most `cores` one device offers (percent of a GPU).
pub const MAX_CORES: u64 = 100;
/// Hex digits of the admission id ([`ControllerConfig::admission_label`]): a hash of the AdmissionRequest UID.
pub const ADMISSION_ID_LENGTH: usize = 10;

/// The denial of a pod that does not encode to JSON (a patch side, [`comparable`]).
fn cannot_encode(e: serde_json::Error) -> Denial {
    Denial::new(format!("cannot encode the pod: {e}"))
}

/// What admission reads: the GPUClasses and PhysicalGPUs (from the controller's caches).
pub trait Inventory: Send + Sync + 'static {
    /// GPUClasses now.
    fn classes(&self) -> Vec<GPUClass>;
    /// PhysicalGPUs now.
    fn gpus(&self) -> Vec<PhysicalGPU>;
    /// ResourceClaim `<namespace>/<name>` now (`None` when not known).
    fn claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim>;
}

fn find_claim(claims: &[ResourceClaim], namespace: &str, name: &str) -> Option<ResourceClaim> {
    claims
        .iter()
        .find(|c| {
            c.metadata.namespace.as_deref() == Some(namespace) && c.metadata.name.as_deref() == Some(name)
        })
        .cloned()
}

impl Inventory for InMemoryCluster {
    fn classes(&self) -> Vec<GPUClass> {
        self.state().classes
    }
    fn gpus(&self) -> Vec<PhysicalGPU> {
        self.state().gpus
    }
    fn claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        find_claim(&self.state().claims, namespace, name)
    }
}

impl Inventory for crate::kube_cluster::KubeCluster {
    fn classes(&self) -> Vec<GPUClass> {
        crate::kube_cluster::KubeCluster::classes(self)
    }
    fn gpus(&self) -> Vec<PhysicalGPU> {
        crate::kube_cluster::KubeCluster::gpus(self)
    }
    fn claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        crate::kube_cluster::KubeCluster::claim(self, namespace, name)
    }
}

impl Inventory for Snapshot {
    fn classes(&self) -> Vec<GPUClass> {
        self.classes.clone()
    }
    fn gpus(&self) -> Vec<PhysicalGPU> {
        self.gpus.clone()
    }
    fn claim(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        find_claim(&self.claims, namespace, name)
    }
}

// === rules ===

fn is_model_slug(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The GPUClass rules (module docs).
pub fn validate_gpu_class(config: &ControllerConfig, class: &GPUClass) -> Result<(), Denial> {
    let name = class.name_any();
    let deny = |field: &str, value: &str, why: String| {
        Err(Denial::new(format!("GPUClass {name:?}: {field}: Invalid value: {value:?}: {why}")))
    };
    if config.driver(&class.spec.vendor).is_none() {
        let known: Vec<String> = config.drivers.keys().map(|v| format!("{v:?}")).collect();
        return Err(Denial::new(format!(
            "GPUClass {name:?}: spec.vendor: Unsupported value: {:?}: supported values: {}",
            class.spec.vendor,
            known.join(", ")
        )));
    }
    let dc = config.device_class_name(&name);
    if dc.len() > 253 {
        return deny(
            "metadata.name",
            &name,
            format!("the DeviceClass name {dc:?} would be longer than 253 characters"),
        );
    }
    if let Some(model) = class.spec.device_type.as_deref()
        && !is_model_slug(model)
    {
        return deny(
            "spec.deviceType",
            model,
            "expected a PhysicalGPU model: lower-case letters, digits and '-', such as a100-sxm4-40gb".into(),
        );
    }
    if let Some(req) = &class.spec.requirements {
        if let Some(cc) = req.min_compute_capability.as_deref()
            && parse_compute_capability(cc).is_none()
        {
            return deny(
                "spec.requirements.minComputeCapability",
                cc,
                "expected <major>.<minor>, such as 8.0".into(),
            );
        }
        for (i, cap) in req.capabilities.iter().enumerate() {
            if !is_cel_identifier(cap) {
                return deny(
                    &format!("spec.requirements.capabilities[{i}]"),
                    cap,
                    "expected a device attribute name: a letter or '_', then letters, digits or '_'".into(),
                );
            }
        }
    }
    Ok(())
}

/// The DeviceClass rule (module docs).
pub fn validate_device_class(
    config: &ControllerConfig,
    device_class: &DeviceClass,
    classes: &[GPUClass],
) -> Result<(), Denial> {
    let name = device_class.name_any();
    let label = config.class_label();
    let (field, class) = match device_class.labels().get(&label) {
        Some(c) => (format!("metadata.labels[{label}]"), c.as_str()),
        None => match config.class_of_device_class(&name) {
            Some(c) => ("metadata.name".to_owned(), c),
            None => return Ok(()),
        },
    };
    if classes.iter().any(|c| c.name_any() == class) {
        Ok(())
    } else {
        Err(Denial::new(format!(
            "DeviceClass {name:?}: {field}: Not found: GPUClass {class:?} does not exist"
        )))
    }
}

fn quantity_bytes(q: &str) -> Option<u64> {
    vgpu_core::alloc::parse_quantity(q).or_else(|| {
        let split = q.find(|c: char| !c.is_ascii_digit())?;
        let (n, unit) = q.split_at(split);
        let n: u64 = n.parse().ok()?;
        let mult: u64 = match unit {
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "Ti" => 1 << 40,
            "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            _ => return None,
        };
        n.checked_mul(mult)
    })
}

/// The ResourceClaim rules (module docs), for one claim against the classes and GPUs.
pub fn validate_claim(
    config: &ControllerConfig,
    claim: &ResourceClaim,
    classes: &[GPUClass],
    gpus: &[PhysicalGPU],
) -> Result<(), Denial> {
    let claim_name = claim.name_any();
    let mut checks: Vec<(String, ExactDeviceRequest)> = Vec::new();
    let requests = claim.spec.iter().flat_map(|s| s.devices.iter()).flat_map(|d| d.requests.iter().flatten());
    for (i, r) in requests.enumerate() {
        if let Some(e) = &r.exactly {
            checks.push((format!("spec.devices.requests[{i}].exactly"), e.clone()));
        }
        for (j, s) in r.first_available.iter().flatten().enumerate() {
            // A subrequest has the same fields that matter here.
            let e = ExactDeviceRequest {
                device_class_name: s.device_class_name.clone(),
                count: s.count,
                allocation_mode: s.allocation_mode.clone(),
                capacity: s.capacity.clone(),
                ..ExactDeviceRequest::default()
            };
            checks.push((format!("spec.devices.requests[{i}].firstAvailable[{j}]"), e));
        }
    }
    for (field, req) in &checks {
        let Some(class_name) = config.class_of_device_class(&req.device_class_name) else { continue };
        let deny = |why: String| Err(Denial::new(format!("ResourceClaim {claim_name:?}: {field}: {why}")));
        let Some(class) = classes.iter().find(|c| c.name_any() == class_name) else {
            return deny(format!(
                "deviceClassName: Invalid value: {:?}: GPUClass {class_name:?} does not exist",
                req.device_class_name
            ));
        };
        let matched: Vec<&PhysicalGPU> =
            gpus.iter().filter(|g| gpu_matches(&class.spec, g, &NodeLabels::new()).is_ok()).collect();
        // Nothing to compare with yet: the class's status says why; the claim stays pending.
        let Some(most) = most_on_one_node(class, gpus) else { continue };
        if req.allocation_mode.as_deref().unwrap_or("ExactCount") == "ExactCount" {
            let count = req.count.unwrap_or(1);
            if u64::try_from(count).is_ok_and(|c| c > most) {
                return deny(format!(
                    "count: Invalid value: {count}: GPUClass {class_name:?} has at most {most} matching GPU{} on one node",
                    if most == 1 { "" } else { "s" }
                ));
            }
        }
        let requests = req.capacity.as_ref().and_then(|c| c.requests.as_ref());
        if let Some(mem) = requests.and_then(|r| r.get(vgpu_core::dra::CAPACITY_MEMORY)) {
            let most_mib = matched.iter().filter_map(|g| g.status.as_ref()?.memory_mib).max().unwrap_or(0);
            match quantity_bytes(&mem.0) {
                Some(bytes) if most_mib > 0 && bytes > most_mib.saturating_mul(1 << 20) => {
                    return deny(format!(
                        "capacity.requests[memory]: Invalid value: {:?}: more than the {most_mib}Mi of the largest GPU of GPUClass {class_name:?}",
                        mem.0
                    ));
                }
                None => {
                    return deny(format!(
                        "capacity.requests[memory]: Invalid value: {:?}: expected a quantity such as 1Gi",
                        mem.0
                    ));
                }
                _ => {}
            }
        }
        if let Some(cores) = requests.and_then(|r| r.get(vgpu_core::dra::CAPACITY_CORES))
            && vgpu_core::alloc::parse_quantity(&cores.0).is_none_or(|c| c > MAX_CORES)
        {
            return deny(format!(
                "capacity.requests[cores]: Invalid value: {:?}: expected an integer from 0 to {MAX_CORES}",
                cores.0
            ));
        }
    }
    Ok(())
}

/// What the pod mutation decided: the mutated pod and the claims to create.
#[derive(Debug, Clone, PartialEq)]
pub struct PodMutation {
    /// The pod after the mutation.
    pub pod: Pod,
    /// The ResourceClaims to create.
    pub claims: Vec<ResourceClaim>,
}

fn container_mut(pod: &mut Pod, slot: ContainerSlot) -> Option<&mut k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_mut()?;
    match slot {
        ContainerSlot::Init(i) => spec.init_containers.as_mut()?.get_mut(i),
        ContainerSlot::App(i) => spec.containers.get_mut(i),
    }
}

/// The pure pod mutation (module docs); `namespace` and `request_uid` come from the AdmissionRequest.
pub fn mutate_pod(
    config: &ControllerConfig,
    classes: &[GPUClass],
    original: &Pod,
    namespace: &str,
    request_uid: &str,
) -> Result<PodMutation, Denial> {
    let prefix = format!("{}/", config.group);
    let mut pod = original.clone();
    let mut claims = Vec::new();
    let pod_name = match (&original.metadata.name, &original.metadata.generate_name) {
        (Some(n), _) if !n.is_empty() => n.clone(),
        (_, Some(g)) => format!("{g}{}", short_hash(request_uid, 5)),
        _ => short_hash(request_uid, 8),
    };
    let mut owner_pod = original.clone();
    owner_pod.metadata.namespace = Some(namespace.to_owned());
    owner_pod.metadata.name = Some(pod_name.clone());
    let owner_key = vgpu_api::pod::owner_key(&owner_pod);
    let admission_id = short_hash(request_uid, ADMISSION_ID_LENGTH);
    for (slot, c) in containers(original) {
        let resources = c.resources.as_ref();
        let mut asked: BTreeMap<String, String> = BTreeMap::new();
        for map in [resources.and_then(|r| r.requests.as_ref()), resources.and_then(|r| r.limits.as_ref())]
            .into_iter()
            .flatten()
        {
            for (k, q) in map {
                if let Some(class) = k.strip_prefix(&prefix) {
                    asked.insert(class.to_owned(), q.0.clone());
                }
            }
        }
        for (class_name, quantity) in asked {
            let field = format!("{}.resources.limits[{prefix}{class_name}]", slot.path());
            let deny = |why: String| Denial::new(format!("container {:?}: {field}: {why}", c.name));
            let count = vgpu_core::alloc::parse_quantity(&quantity)
                .filter(|n| *n >= 1)
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| deny(format!("Invalid value: {quantity:?}: must be a positive integer")))?;
            let class = classes
                .iter()
                .find(|k| k.name_any() == class_name)
                .ok_or_else(|| deny(format!("Not found: GPUClass {class_name:?} does not exist")))?;
            let pod_claim = safe_resource_name(&[&c.name, &class_name]);
            let claim_name = safe_resource_name(&[&pod_name, &c.name, &class_name, &admission_id]);
            let key = format!("{prefix}{class_name}");
            let Some(target) = container_mut(&mut pod, slot) else { continue };
            let res = target.resources.get_or_insert_with(Default::default);
            for map in [res.limits.as_mut(), res.requests.as_mut()].into_iter().flatten() {
                map.remove(&key);
            }
            if res.limits.as_ref().is_some_and(BTreeMap::is_empty) {
                res.limits = None;
            }
            if res.requests.as_ref().is_some_and(BTreeMap::is_empty) {
                res.requests = None;
            }
            res.claims
                .get_or_insert_with(Vec::new)
                .push(ContainerClaim { name: pod_claim.clone(), request: None });
            let spec = pod.spec.get_or_insert_with(Default::default);
            spec.resource_claims.get_or_insert_with(Vec::new).push(PodResourceClaim {
                name: pod_claim,
                resource_claim_name: Some(claim_name.clone()),
                resource_claim_template_name: None,
            });
            for (k, v) in class.spec.node_selector.iter().flatten() {
                let selector = spec.node_selector.get_or_insert_with(BTreeMap::new);
                match selector.get(k) {
                    Some(existing) if existing != v => {
                        return Err(Denial::new(format!(
                            "container {:?}: spec.nodeSelector[{k}]: Invalid value: {existing:?}: GPUClass {class_name:?} needs {v:?}",
                            c.name
                        )));
                    }
                    _ => {
                        selector.insert(k.clone(), v.clone());
                    }
                }
            }
            claims.push(ResourceClaim {
                metadata: ObjectMeta {
                    name: Some(claim_name),
                    namespace: Some(namespace.to_owned()),
                    labels: Some(BTreeMap::from([
                        (config.class_label(), class_name.clone()),
                        (OWNER_KEY_LABEL.to_owned(), owner_key.clone()),
                        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
                        (config.admission_label(), admission_id.clone()),
                    ])),
                    ..ObjectMeta::default()
                },
                spec: Some(ResourceClaimSpec {
                    devices: Some(DeviceClaim {
                        requests: Some(vec![DeviceRequest {
                            name: REQUEST_NAME.to_owned(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: config.device_class_name(&class_name),
                                allocation_mode: Some("ExactCount".to_owned()),
                                count: Some(count),
                                ..ExactDeviceRequest::default()
                            }),
                            first_available: None,
                        }]),
                        ..DeviceClaim::default()
                    }),
                }),
                status: None,
            });
        }
    }
    if !claims.is_empty() {
        pod.metadata.labels.get_or_insert_with(BTreeMap::new).insert(config.admission_label(), admission_id);
    }
    Ok(PodMutation { pod, claims })
}

// === impl Admission ===

/// The admission routes from body to answer.
pub struct Admission<I, A> {
    config: ControllerConfig,
    inventory: std::sync::Arc<I>,
    api: A,
    metrics: Metrics,
}

impl<I, A> fmt::Debug for Admission<I, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission").field("config", &self.config).finish_non_exhaustive()
    }
}

fn is_write(op: &Operation) -> bool {
    matches!(op, Operation::Create | Operation::Update)
}

impl<I: Inventory, A: ClusterApi> Admission<I, A> {
    /// Admission over `inventory` (reads) and `api` (claim creation).
    pub fn new(config: ControllerConfig, inventory: std::sync::Arc<I>, api: A, metrics: Metrics) -> Self {
        Self { config, inventory, api, metrics }
    }

    /// The claim-creation seam.
    pub fn api(&self) -> &A {
        &self.api
    }

    fn answer<K: kube::Resource>(
        &self,
        route: &str,
        req: &AdmissionRequest<K>,
        outcome: Result<Option<json_patch::Patch>, Denial>,
    ) -> AdmissionReview<DynamicObject> {
        self.metrics.admitted(route, outcome.is_ok());
        if let Err(d) = &outcome {
            tracing::info!(route, uid = %req.uid, message = %d.message, "denied");
        }
        respond(req, outcome)
    }

    /// `/gpuclasses/validate`.
    pub fn validate_gpu_classes(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = decode::<GPUClass>(body)?;
        let outcome = match (&req.object, is_write(&req.operation)) {
            (Some(class), true) => validate_gpu_class(&self.config, class).map(|()| None),
            _ => Ok(None),
        };
        Ok(self.answer(VALIDATE_CLASSES_PATH, &req, outcome))
    }

    /// `/deviceclasses/validate`.
    pub fn validate_device_classes(
        &self,
        body: &[u8],
    ) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = decode::<DeviceClass>(body)?;
        let outcome = match (&req.object, is_write(&req.operation)) {
            (Some(dc), true) => {
                validate_device_class(&self.config, dc, &self.inventory.classes()).map(|()| None)
            }
            _ => Ok(None),
        };
        Ok(self.answer(VALIDATE_DEVICE_CLASSES_PATH, &req, outcome))
    }

    /// `/resourceclaims/validate`.
    pub fn validate_claims(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = decode::<ResourceClaim>(body)?;
        let outcome = match (&req.object, &req.operation) {
            (Some(claim), Operation::Create) if req.sub_resource.is_none() => {
                validate_claim(&self.config, claim, &self.inventory.classes(), &self.inventory.gpus())
                    .map(|()| None)
            }
            _ => Ok(None),
        };
        Ok(self.answer(VALIDATE_CLAIMS_PATH, &req, outcome))
    }

    /// `/pods/mutate`: on CREATE the patch, after the claims are created (all or none); on UPDATE the
    /// admission-id label put back when the update dropped it ([`crate::pod_update`]).
    pub async fn mutate_pods(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = decode::<Pod>(body)?;
        let outcome = match (&req.object, &req.old_object, &req.operation) {
            (Some(pod), _, Operation::Create) => self.mutate(pod, &req).await,
            (Some(pod), Some(old), Operation::Update) => {
                match crate::pod_update::restore_admission_label(&self.config, old, pod) {
                    None => Ok(None),
                    Some(restored) => comparable(pod)
                        .and_then(|before| Ok(json_patch::diff(&before, &comparable(&restored)?)))
                        .map(Some)
                        .map_err(cannot_encode),
                }
            }
            _ => Ok(None),
        };
        Ok(self.answer(MUTATE_PODS_PATH, &req, outcome))
    }

    /// `/pods/validate` ([`crate::pod_validation`]): CREATE and UPDATE (an update is refused only for a
    /// violation it brings in); other operations are allowed.
    pub fn validate_pods(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = decode::<Pod>(body)?;
        let namespace = req.namespace.clone().unwrap_or_default();
        let outcome = match (&req.object, &req.old_object, &req.operation) {
            (Some(pod), _, Operation::Create) if req.sub_resource.is_none() => {
                let claims = self.pod_claims(&namespace, [pod]);
                let (classes, gpus) = (self.inventory.classes(), self.inventory.gpus());
                let ctx = PodContext { classes: &classes, gpus: &gpus, claims: &claims };
                validate_pod(&self.config, ctx, pod).map(|()| None)
            }
            (Some(pod), Some(old), Operation::Update) if req.sub_resource.is_none() => {
                let claims = self.pod_claims(&namespace, [pod, old]);
                let (classes, gpus) = (self.inventory.classes(), self.inventory.gpus());
                let ctx = PodContext { classes: &classes, gpus: &gpus, claims: &claims };
                validate_pod_update(&self.config, ctx, old, pod).map(|()| None)
            }
            _ => Ok(None),
        };
        Ok(self.answer(VALIDATE_PODS_PATH, &req, outcome))
    }

    /// The cached ResourceClaims `pods` name by `resourceClaimName` in `namespace`.
    fn pod_claims<'p>(
        &self,
        namespace: &str,
        pods: impl IntoIterator<Item = &'p Pod>,
    ) -> BTreeMap<String, ResourceClaim> {
        pods.into_iter()
            .flat_map(claim_names)
            .filter_map(|name| Some((name.clone(), self.inventory.claim(namespace, &name)?)))
            .collect()
    }

    async fn mutate(
        &self,
        pod: &Pod,
        req: &AdmissionRequest<Pod>,
    ) -> Result<Option<json_patch::Patch>, Denial> {
        let namespace =
            req.namespace.clone().or_else(|| pod.namespace()).unwrap_or_else(|| "default".to_owned());
        let m = mutate_pod(&self.config, &self.inventory.classes(), pod, &namespace, &req.uid)?;
        if m.claims.is_empty() {
            return Ok(None);
        }
        let mut created: Vec<&ResourceClaim> = Vec::new();
        for claim in &m.claims {
            match self.api.create_claim(claim, req.dry_run).await {
                Ok(()) => created.push(claim),
                Err(e) if e.already_exists => {}
                Err(e) => {
                    for c in created {
                        if !req.dry_run
                            && let Err(e) = self.api.delete_claim(&namespace, &c.name_any()).await
                        {
                            tracing::warn!(error = %e, "rolling back a created claim failed");
                        }
                    }
                    return Err(Denial::new(e.to_string()));
                }
            }
        }
        let before = comparable(pod).map_err(cannot_encode)?;
        let after = comparable(&m.pod).map_err(cannot_encode)?;
        Ok(Some(json_patch::diff(&before, &after)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::resource::v1::CapacityRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::fixture;

    fn claim(device_class: &str, count: i64, memory: Option<&str>) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ml".into()),
                ..Default::default()
            },
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: "gpu".into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: device_class.into(),
                            count: Some(count),
                            capacity: memory.map(|m| CapacityRequirements {
                                requests: Some(BTreeMap::from([("memory".to_owned(), Quantity(m.into()))])),
                            }),
                            ..Default::default()
                        }),
                        first_available: None,
                    }]),
                    ..Default::default()
                }),
            }),
            status: None,
        }
    }

    #[test]
    fn gpu_class_rules_name_the_field() {
        let config = ControllerConfig::default();
        assert_eq!(
            validate_gpu_class(&config, &fixture::class("ok", "nvidia", Some("a100-sxm4-40gb"), Some(4))),
            Ok(())
        );
        let amd = fixture::class("x", "amd", None, None);
        assert_eq!(
            validate_gpu_class(&config, &amd).unwrap_err().message,
            "GPUClass \"x\": spec.vendor: Unsupported value: \"amd\": supported values: \"metax\", \"nvidia\""
        );
        let quoted = fixture::class("q", "nvidia", Some("A100 \"SXM\""), None);
        assert_eq!(
            validate_gpu_class(&config, &quoted).unwrap_err().message,
            "GPUClass \"q\": spec.deviceType: Invalid value: \"A100 \\\"SXM\\\"\": expected a PhysicalGPU model: lower-case letters, digits and '-', such as a100-sxm4-40gb"
        );
        let mut cc = fixture::class("cc", "nvidia", None, None);
        cc.spec.requirements = Some(vgpu_api::Requirements {
            min_compute_capability: Some("eight".into()),
            ..Default::default()
        });
        assert!(
            validate_gpu_class(&config, &cc)
                .unwrap_err()
                .message
                .contains("minComputeCapability: Invalid value: \"eight\"")
        );
        let long = fixture::class(&"a".repeat(240), "nvidia", None, None);
        assert!(validate_gpu_class(&config, &long).unwrap_err().message.contains("longer than 253"));
    }

    #[test]
    fn device_classes_need_their_gpu_class() {
        let config = ControllerConfig::default();
        let classes = vec![fixture::class("a100-shared", "nvidia", None, Some(4))];
        let dc = |name: &str| DeviceClass {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: None,
        };
        assert_eq!(validate_device_class(&config, &dc("a100-shared.gpu.deckhouse.io"), &classes), Ok(()));
        assert_eq!(validate_device_class(&config, &dc("vgpu-manager"), &classes), Ok(()));
        assert_eq!(
            validate_device_class(&config, &dc("h100.gpu.deckhouse.io"), &classes).unwrap_err().message,
            "DeviceClass \"h100.gpu.deckhouse.io\": metadata.name: Not found: GPUClass \"h100\" does not exist"
        );
        let mut labelled = dc("mine");
        labelled.metadata.labels =
            Some(BTreeMap::from([("gpu.deckhouse.io/gpuclass".to_owned(), "gone".to_owned())]));
        assert_eq!(
            validate_device_class(&config, &labelled, &classes).unwrap_err().message,
            "DeviceClass \"mine\": metadata.labels[gpu.deckhouse.io/gpuclass]: Not found: GPUClass \"gone\" does not exist"
        );
    }

    #[test]
    fn claims_are_checked_against_the_class() {
        let config = ControllerConfig::default();
        let classes = vec![fixture::class("a100-shared", "nvidia", Some("a100"), Some(4))];
        let gpus = vec![
            fixture::gpu("w1", 0, "nvidia", "a100", Some(40960)),
            fixture::gpu("w1", 1, "nvidia", "a100", Some(40960)),
            fixture::gpu("w2", 0, "nvidia", "a100", Some(40960)),
        ];
        let dc = "a100-shared.gpu.deckhouse.io";
        assert_eq!(validate_claim(&config, &claim(dc, 2, Some("40Gi")), &classes, &gpus), Ok(()));
        assert_eq!(validate_claim(&config, &claim("vgpu-manager", 9, None), &classes, &gpus), Ok(()));
        assert_eq!(
            validate_claim(&config, &claim("h100.gpu.deckhouse.io", 1, None), &classes, &gpus)
                .unwrap_err()
                .message,
            "ResourceClaim \"c\": spec.devices.requests[0].exactly: deviceClassName: Invalid value: \"h100.gpu.deckhouse.io\": GPUClass \"h100\" does not exist"
        );
        assert_eq!(
            validate_claim(&config, &claim(dc, 3, None), &classes, &gpus).unwrap_err().message,
            "ResourceClaim \"c\": spec.devices.requests[0].exactly: count: Invalid value: 3: GPUClass \"a100-shared\" has at most 2 matching GPUs on one node"
        );
        // The same rules for a firstAvailable subrequest.
        let mut alternatives = claim(dc, 1, None);
        let request =
            &mut alternatives.spec.as_mut().unwrap().devices.as_mut().unwrap().requests.as_mut().unwrap()[0];
        request.exactly = None;
        request.first_available = Some(vec![k8s_openapi::api::resource::v1::DeviceSubRequest {
            name: "big".into(),
            device_class_name: "gone.gpu.deckhouse.io".into(),
            count: Some(1),
            ..Default::default()
        }]);
        assert_eq!(
            validate_claim(&config, &alternatives, &classes, &gpus).unwrap_err().message,
            "ResourceClaim \"c\": spec.devices.requests[0].firstAvailable[0]: deviceClassName: Invalid value: \"gone.gpu.deckhouse.io\": GPUClass \"gone\" does not exist"
        );
        assert_eq!(
            validate_claim(&config, &claim(dc, 1, Some("80Gi")), &classes, &gpus).unwrap_err().message,
            "ResourceClaim \"c\": spec.devices.requests[0].exactly: capacity.requests[memory]: Invalid value: \"80Gi\": more than the 40960Mi of the largest GPU of GPUClass \"a100-shared\""
        );
    }

    #[test]
    fn pods_get_claims_for_their_class() {
        let config = ControllerConfig::default();
        let mut class = fixture::class("a100-shared", "nvidia", None, Some(4));
        class.spec.node_selector = Some(BTreeMap::from([("pool".to_owned(), "ml".to_owned())]));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [
                {"name": "main", "resources": {"limits": {"gpu.deckhouse.io/a100-shared": "2", "cpu": "1"}}},
                {"name": "side"}
            ]}
        }))
        .unwrap();
        let m = mutate_pod(&config, &[class.clone()], &pod, "ml", "uid-1").unwrap();
        assert_eq!(m.claims.len(), 1);
        let claim = serde_json::to_value(&m.claims[0]).unwrap();
        let id = short_hash("uid-1", ADMISSION_ID_LENGTH);
        let claim_name = safe_resource_name(&["web", "main", "a100-shared", &id]);
        assert_eq!(claim["metadata"]["name"], claim_name.as_str());
        assert_eq!(
            claim["metadata"]["labels"],
            serde_json::json!({"gpu.deckhouse.io/gpuclass": "a100-shared", "vgpu-manager.io/owner-key": "ml-web",
                "app.kubernetes.io/managed-by": "vgpu-controller", "gpu.deckhouse.io/admission-id": id})
        );
        assert!(claim["metadata"].get("ownerReferences").is_none(), "no pod UID at mutation time");
        // Another admission of a pod of the same name gets other claims.
        let again = mutate_pod(&config, &[class.clone()], &pod, "ml", "uid-2").unwrap();
        assert_ne!(again.claims[0].metadata.name, m.claims[0].metadata.name);
        assert_eq!(
            claim["spec"]["devices"]["requests"][0],
            serde_json::json!({"name": "gpu", "exactly": {"deviceClassName": "a100-shared.gpu.deckhouse.io", "allocationMode": "ExactCount", "count": 2}})
        );
        let patch =
            serde_json::to_value(json_patch::diff(&comparable(&pod).unwrap(), &comparable(&m.pod).unwrap()))
                .unwrap();
        let pod_claim = safe_resource_name(&["main", "a100-shared"]);
        let ops = patch.as_array().unwrap();
        assert!(ops.contains(&serde_json::json!({"op": "remove", "path": "/spec/containers/0/resources/limits/gpu.deckhouse.io~1a100-shared"})), "{patch}");
        assert!(ops.contains(&serde_json::json!({"op": "add", "path": "/spec/containers/0/resources/claims", "value": [{"name": pod_claim}]})), "{patch}");
        assert!(ops.contains(&serde_json::json!({"op": "add", "path": "/spec/resourceClaims", "value": [{"name": pod_claim, "resourceClaimName": claim_name}]})), "{patch}");
        assert!(
            ops.contains(
                &serde_json::json!({"op": "add", "path": "/spec/nodeSelector", "value": {"pool": "ml"}})
            ),
            "{patch}"
        );
        assert!(
            ops.contains(&serde_json::json!({"op": "add", "path": "/metadata/labels", "value": {"gpu.deckhouse.io/admission-id": id}})),
            "{patch}"
        );

        let missing: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"gpu.deckhouse.io/h100": "1"}}}]}
        }))
        .unwrap();
        assert_eq!(
            mutate_pod(&config, &[class.clone()], &missing, "ml", "u").unwrap_err().message,
            "container \"main\": spec.containers[0].resources.limits[gpu.deckhouse.io/h100]: Not found: GPUClass \"h100\" does not exist"
        );
        let zero: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"gpu.deckhouse.io/a100-shared": "0"}}}]}
        }))
        .unwrap();
        assert!(
            mutate_pod(&config, &[class.clone()], &zero, "ml", "u")
                .unwrap_err()
                .message
                .ends_with("Invalid value: \"0\": must be a positive integer")
        );
        let plain: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": [{"name": "main"}]}})).unwrap();
        let untouched = mutate_pod(&config, &[class], &plain, "ml", "u").unwrap();
        assert!(untouched.claims.is_empty());
        assert_eq!(untouched.pod, plain, "a pod without a GPUClass request gets no label");
    }
}
