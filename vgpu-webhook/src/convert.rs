//! Device-plugin → DRA conversion (`--default-convert2-dra`): the `vgpu-manager.io/original-resources` record
//! the mutation leaves on the pod, and the `resource.k8s.io/v1` ResourceClaims `/pods/validate` creates from it
//! (and the ResourceClaimTemplates `/volcano-jobs/validate` creates for a Volcano Job's tasks, whose `spec.spec`
//! is what a claim's `spec` would be: [`claim_spec`], [`resource_claim_template`]).
//!
//! # The record
//!
//! JSON array, one entry per converted container, in container order (init containers first):
//! `[{"name":"main","claimName":"web-main-1a2b3c4d","requestName":"vgpu","resources":{"nvidia.com/vgpu-cores":"100","nvidia.com/vgpu-memory":"0","nvidia.com/vgpu-number":"1"}}]`
//! (quantities as strings, keys sorted, as Go's `encoding/json` writes vgpu-manager's `ResourceInfos`).
//!
//! # The claims
//!
//! | field | value |
//! |---|---|
//! | name | the record's `claimName` (per container, or one per pod with `--combined-resource-claim`) |
//! | labels | [`OWNER_KEY_LABEL`] = `<namespace>-<pod>`, [`CREATE_TIMESTAMP_LABEL`] = creation time in ms |
//! | annotations | the pod's `vgpu-compute-policy` annotation, when set |
//! | ownerReferences | the pod (controller), when its UID is known: the garbage collector deletes the claim with the pod, or when the pod is never stored |
//! | `spec.devices.requests[]` | one per container: name = `requestName`, `exactly{deviceClassName, allocationMode: ExactCount, count: number, capacity.requests{cores, memory: MiB × 1Mi}}` (a zero quantity is left out) |
//! | selectors (CEL) | `type == "vgpu"`; include/exclude UUIDs (lower-case `in`); include/exclude product names (upper-case `in`); memory policy `memoryRatio > 100` (virtual) or `<= 100` (physical) |
//! | `spec.devices.constraints` | for a request of more than one device: distinct `manager.nvidia.com/uuid`; with topology mode `link*` also a matching `resource.kubernetes.io/pcieRoot`, with `numa*` a matching `manager.nvidia.com/numaNode` |
//!
//! Values placed in CEL string literals are escaped (`\` and `"`), so an annotation cannot change the
//! expression's meaning.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSpec};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequirements, DeviceClaim, DeviceConstraint, DeviceRequest, DeviceSelector,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};
use vgpu_core::alloc::parse_quantity;
use vgpu_core::codec::device_filter::SubstringList;
use vgpu_core::domain::{CREATE_TIMESTAMP_LABEL, OWNER_KEY_LABEL, ResourceDomain};
use vgpu_core::model::{MemoryPolicy, TopologyMode};

use crate::config::WebhookConfig;
use vgpu_api::cel::cel_string;
use vgpu_api::pod::{containers, owner_key};
use vgpu_serve::admission::Denial;

/// The DRA driver name of vGPU devices ([`vgpu_core::dra::DRIVER_NAME`], the name the kubelet plugin publishes).
pub const DRA_DRIVER_NAME: &str = vgpu_core::dra::DRIVER_NAME;
/// The DRA device type of vGPU devices (attribute `type`), also the request name of per-container claims.
pub const VGPU_DEVICE_TYPE: &str = vgpu_core::dra::DEVICE_TYPE_VGPU;
use vgpu_core::dra::{
    ATTRIBUTE_NUMA_NODE, ATTRIBUTE_PCIE_ROOT, ATTRIBUTE_UUID, CAPACITY_CORES, CAPACITY_MEMORY,
};
/// Longest accepted `original-resources` value (vgpu-manager's pod annotation cap).
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// One converted container in the `original-resources` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInfo {
    /// Container name.
    pub name: String,
    /// ResourceClaim (and pod claim) name.
    pub claim_name: String,
    /// Request name inside the claim.
    pub request_name: String,
    /// Resource name → quantity text (`vgpu-number`, `vgpu-cores`, `vgpu-memory`).
    #[serde(default)]
    pub resources: BTreeMap<String, String>,
}

/// A record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Not the JSON array of entries.
    #[error(
        "invalid {annotation} annotation: {reason}; expected a JSON array of {{name, claimName, requestName, resources}}"
    )]
    Json {
        /// The annotation key.
        annotation: &'static str,
        /// The decoder's message.
        reason: String,
    },
    /// A Volcano Job's record that is not the JSON object of task records ([`crate::volcano`]).
    #[error(
        "invalid {annotation} annotation of a Volcano Job: {reason}; expected a JSON object of task name to an array of {{name, claimName, requestName, resources}}"
    )]
    JobJson {
        /// The annotation key.
        annotation: &'static str,
        /// The decoder's message.
        reason: String,
    },
    /// Longer than [`MAX_RECORD_BYTES`].
    #[error("invalid {annotation} annotation: {len} bytes, more than the {MAX_RECORD_BYTES} allowed")]
    TooLong {
        /// The annotation key.
        annotation: &'static str,
        /// The value's length.
        len: usize,
    },
}

/// Decodes the `original-resources` record.
pub fn decode_record(value: &str) -> Result<Vec<ResourceInfo>, RecordError> {
    let annotation = vgpu_core::domain::ORIGINAL_RESOURCES_ANNOTATION;
    if value.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLong { annotation, len: value.len() });
    }
    serde_json::from_str(value).map_err(|e| RecordError::Json { annotation, reason: e.to_string() })
}

/// Encodes the `original-resources` record.
pub fn encode_record(infos: &[ResourceInfo]) -> String {
    // Plain strings and maps of strings: serialisation cannot fail; fall back to an empty array regardless.
    serde_json::to_string(infos).unwrap_or_else(|_| "[]".to_owned())
}

/// Whether every entry of a record names the same claim (one combined claim for the pod).
pub fn is_combined(infos: &[ResourceInfo]) -> bool {
    infos.first().is_some_and(|first| infos.iter().all(|i| i.claim_name == first.claim_name))
}

/// The quantities of one record entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordedRequest {
    /// vGPUs.
    pub number: u64,
    /// Cores per vGPU.
    pub cores: u64,
    /// Memory per vGPU in MiB.
    pub memory: u64,
}

impl ResourceInfo {
    /// The entry's quantities (a missing or unreadable quantity counts as 0).
    pub fn request(&self, domain: &ResourceDomain) -> RecordedRequest {
        let q = |key: String| self.resources.get(&key).and_then(|v| parse_quantity(v)).unwrap_or(0);
        RecordedRequest {
            number: q(domain.vgpu_number()),
            cores: q(domain.vgpu_cores()),
            memory: q(domain.vgpu_memory()),
        }
    }
}

fn cel_list(values: &[String]) -> String {
    let items: Vec<String> = values.iter().map(|v| cel_string(v)).collect();
    format!("[{}]", items.join(","))
}

fn attribute(name: &str) -> String {
    format!("device.attributes[{}].{name}", cel_string(DRA_DRIVER_NAME))
}

fn selector(expression: String) -> DeviceSelector {
    DeviceSelector { cel: Some(CELDeviceSelector { expression }) }
}

/// The CEL selectors of a converted pod's requests (module docs), from its annotations.
pub fn device_selectors(pod: &Pod, domain: &ResourceDomain) -> Vec<DeviceSelector> {
    let annotations = pod.metadata.annotations.as_ref();
    let get = |key: String| annotations.and_then(|a| a.get(&key)).map(String::as_str);
    let mut out = vec![selector(format!("{} == {}", attribute("type"), cel_string(VGPU_DEVICE_TYPE)))];
    let lower = |list: SubstringList| list.entries().iter().map(|e| e.to_lowercase()).collect::<Vec<_>>();
    if let Some(list) = get(domain.include_gpu_uuid()).and_then(SubstringList::decode) {
        out.push(selector(format!("{} in {}", attribute("uuid"), cel_list(&lower(list)))));
    }
    if let Some(list) = get(domain.exclude_gpu_uuid()).and_then(SubstringList::decode) {
        out.push(selector(format!("!({} in {})", attribute("uuid"), cel_list(&lower(list)))));
    }
    if let Some(list) = get(domain.include_gpu_type()).and_then(SubstringList::decode) {
        out.push(selector(format!("{} in {}", attribute("productName"), cel_list(list.entries()))));
    }
    if let Some(list) = get(domain.exclude_gpu_type()).and_then(SubstringList::decode) {
        out.push(selector(format!("!({} in {})", attribute("productName"), cel_list(list.entries()))));
    }
    match get(domain.memory_scheduler_policy()).and_then(|v| v.parse::<MemoryPolicy>().ok()) {
        Some(MemoryPolicy::Virtual) => out.push(selector(format!("{} > 100", attribute("memoryRatio")))),
        Some(MemoryPolicy::Physical) => out.push(selector(format!("{} <= 100", attribute("memoryRatio")))),
        None => {}
    }
    out
}

/// The device request of one record entry (module docs).
pub fn device_request(
    pod: &Pod,
    domain: &ResourceDomain,
    device_class: &str,
    info: &ResourceInfo,
) -> DeviceRequest {
    let r = info.request(domain);
    let mut capacity = BTreeMap::new();
    if r.cores > 0 {
        capacity.insert(CAPACITY_CORES.to_owned(), Quantity(r.cores.to_string()));
    }
    if r.memory > 0 {
        capacity.insert(CAPACITY_MEMORY.to_owned(), Quantity(format!("{}Mi", r.memory)));
    }
    DeviceRequest {
        name: info.request_name.clone(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: device_class.to_owned(),
            allocation_mode: Some("ExactCount".to_owned()),
            count: Some(i64::try_from(r.number).unwrap_or(i64::MAX)),
            capacity: Some(CapacityRequirements { requests: Some(capacity) }),
            selectors: Some(device_selectors(pod, domain)),
            ..ExactDeviceRequest::default()
        }),
        first_available: None,
    }
}

/// The spec of a generated claim holding `requests` for `pod` (module docs): the requests, and the constraints
/// of multi-device requests after the pod's topology mode. Shared by ResourceClaims and ResourceClaimTemplates.
pub fn claim_spec(pod: &Pod, domain: &ResourceDomain, requests: Vec<DeviceRequest>) -> ResourceClaimSpec {
    let mode = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&domain.device_topology_mode()))
        .and_then(|v| v.parse::<TopologyMode>().ok())
        .unwrap_or_default()
        .base();
    let mut constraints = Vec::new();
    for request in &requests {
        let many = request.exactly.as_ref().is_some_and(|e| e.count.unwrap_or(1) > 1);
        if !many {
            continue;
        }
        constraints.push(DeviceConstraint {
            requests: Some(vec![request.name.clone()]),
            distinct_attribute: Some(vgpu_core::dra::qualified(DRA_DRIVER_NAME, ATTRIBUTE_UUID)),
            match_attribute: None,
        });
        let matching = match mode {
            TopologyMode::Link => Some(ATTRIBUTE_PCIE_ROOT),
            TopologyMode::Numa => Some(ATTRIBUTE_NUMA_NODE),
            _ => None,
        };
        if let Some(attr) = matching {
            constraints.push(DeviceConstraint {
                requests: Some(vec![request.name.clone()]),
                distinct_attribute: None,
                match_attribute: Some(vgpu_core::dra::qualified(DRA_DRIVER_NAME, attr)),
            });
        }
    }
    ResourceClaimSpec {
        devices: Some(DeviceClaim {
            config: None,
            constraints: (!constraints.is_empty()).then_some(constraints),
            requests: Some(requests),
        }),
    }
}

/// The annotations of a generated claim: the pod's `vgpu-compute-policy`, when set.
fn claim_annotations(pod: &Pod, domain: &ResourceDomain) -> Option<BTreeMap<String, String>> {
    let policy_key = domain.vgpu_compute_policy();
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&policy_key))
        .map(|v| BTreeMap::from([(policy_key.clone(), v.clone())]))
}

/// The owner labels of a generated object: [`OWNER_KEY_LABEL`] = [`owner_key`], [`CREATE_TIMESTAMP_LABEL`].
fn owner_labels(pod: &Pod, created_ms: u128) -> BTreeMap<String, String> {
    BTreeMap::from([
        (OWNER_KEY_LABEL.to_owned(), owner_key(pod)),
        (CREATE_TIMESTAMP_LABEL.to_owned(), created_ms.to_string()),
    ])
}

/// Builds the ResourceClaim `name` holding `requests` for `pod` (module docs). `created_ms` is the
/// creation-timestamp label value.
pub fn resource_claim(
    pod: &Pod,
    domain: &ResourceDomain,
    name: &str,
    requests: Vec<DeviceRequest>,
    created_ms: u128,
) -> ResourceClaim {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    // Owned by the pod when its UID is known (validating admission of a CREATE sees it): the garbage collector
    // then deletes the claim with the pod, and also when the pod is never stored (a later admission step
    // refused it), which the DELETE hook cannot see.
    let owner_references = pod.metadata.uid.as_ref().filter(|u| !u.is_empty()).map(|uid| {
        vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace),
            labels: Some(owner_labels(pod, created_ms)),
            annotations: claim_annotations(pod, domain),
            owner_references,
            ..ObjectMeta::default()
        },
        spec: Some(claim_spec(pod, domain, requests)),
        status: None,
    }
}

/// Builds the ResourceClaimTemplate `name` holding `requests` for the pods of a pod template. `pod` is the
/// template as a pod named after its owner (a Volcano Job, [`crate::volcano::task_pod`]): the owner-key label
/// is `<namespace>-<owner>`, the claims made from the template carry the `vgpu-compute-policy` annotation, and
/// `spec.spec` is what [`resource_claim`] would make. No owner reference: the Job's is set once it is stored.
pub fn resource_claim_template(
    pod: &Pod,
    domain: &ResourceDomain,
    name: &str,
    requests: Vec<DeviceRequest>,
    created_ms: u128,
) -> ResourceClaimTemplate {
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(pod.metadata.namespace.clone().unwrap_or_default()),
            labels: Some(owner_labels(pod, created_ms)),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimTemplateSpec {
            metadata: claim_annotations(pod, domain)
                .map(|annotations| ObjectMeta { annotations: Some(annotations), ..ObjectMeta::default() }),
            spec: Some(claim_spec(pod, domain, requests)),
        }),
    }
}

/// Where [`planned_requests`] checks a record: the names its denials use and how the pod spec refers to the
/// generated claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordScope {
    /// The object, as the messages name it: `Pod "web"`, `Job "train"`.
    pub subject: String,
    /// The record's field: `metadata.annotations[vgpu-manager.io/original-resources]` (a task's record adds
    /// `[<task>]`).
    pub record_field: String,
    /// Prefix of the pod spec's field paths: empty for a pod, `spec.tasks[0].template.` for a Job's task.
    pub spec_prefix: String,
    /// How the pod spec refers to the generated claims.
    pub source: ClaimSource,
}

/// The device requests of the claims a record asks for, grouped by claim name in record order, checked against
/// the pod (or pod template as a pod): each entry's container exists, its numbers are within the limits, and its
/// claim is one of the pod's `resourceClaims` (by `resourceClaimName`, or `resourceClaimTemplateName` for a
/// template). The requests are [`device_request`]s.
pub fn planned_requests(
    config: &WebhookConfig,
    pod: &Pod,
    infos: &[ResourceInfo],
    scope: &RecordScope,
) -> Result<Vec<(String, Vec<DeviceRequest>)>, Denial> {
    let d = &config.domain;
    let RecordScope { subject, record_field, spec_prefix, source } = scope;
    let all = containers(pod);
    let mut requests_by_claim: Vec<(String, Vec<DeviceRequest>)> = Vec::new();
    for (i, info) in infos.iter().enumerate() {
        let Some((slot, _)) = all.iter().find(|(_, c)| c.name == info.name) else {
            return Err(Denial::new(format!(
                "{subject} is invalid: {record_field}[{i}].containerName: Invalid value: {:?}: container not found",
                info.name
            )));
        };
        let r = info.request(d);
        let path = format!("{spec_prefix}{}", slot.path());
        if r.cores > 100 {
            return Err(Denial::new(format!(
                "{subject} is invalid: {path}.resources.limits[{}]: Invalid value: {}: request exceeds limit, maximum: 100",
                d.vgpu_cores(),
                r.cores
            )));
        }
        if r.number > u64::from(vgpu_core::model::MAX_VGPU_NUMBER) {
            return Err(Denial::new(format!(
                "{subject} is invalid: {path}.resources.limits[{}]: Invalid value: {}: request exceeds limit, maximum: {}",
                d.vgpu_number(),
                r.number,
                vgpu_core::model::MAX_VGPU_NUMBER
            )));
        }
        if !source.listed(pod.spec.as_ref(), &info.claim_name) {
            return Err(Denial::new(format!(
                "{subject} is invalid: {spec_prefix}spec.resourceClaims: Invalid value: {} {:?} not found",
                source.field_name(),
                info.claim_name
            )));
        }
        let request = device_request(pod, d, &config.device_class_name, info);
        match requests_by_claim.iter_mut().find(|(n, _)| *n == info.claim_name) {
            Some((_, list)) => list.push(request),
            None => requests_by_claim.push((info.claim_name.clone(), vec![request])),
        }
    }
    Ok(requests_by_claim)
}

/// How a converted pod spec refers to its generated claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimSource {
    /// `spec.resourceClaims[].resourceClaimName`: a ResourceClaim per pod (`/pods/validate` creates it).
    Claim,
    /// `spec.resourceClaims[].resourceClaimTemplateName`: a ResourceClaimTemplate, one claim per pod made from
    /// the template (pod templates of Volcano Jobs, [`crate::volcano`]).
    Template,
}

impl ClaimSource {
    /// The generated object a `resourceClaims` entry refers to this way, if any.
    pub fn reference(self, entry: &PodResourceClaim) -> Option<&str> {
        match self {
            Self::Claim => entry.resource_claim_name.as_deref(),
            Self::Template => entry.resource_claim_template_name.as_deref(),
        }
    }

    /// The entry's field, as denials name it: `ResourceClaimName` or `ResourceClaimTemplateName`.
    pub fn field_name(self) -> &'static str {
        match self {
            Self::Claim => "ResourceClaimName",
            Self::Template => "ResourceClaimTemplateName",
        }
    }

    /// Whether `spec` has a `resourceClaims` entry referring to `name` this way.
    pub fn listed(self, spec: Option<&PodSpec>, name: &str) -> bool {
        spec.and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|entries| entries.iter().any(|e| self.reference(e) == Some(name)))
    }

    /// The `resourceClaims` entry named `name` referring to the generated object `name` this way.
    pub(crate) fn entry(self, name: &str) -> PodResourceClaim {
        let reference = Some(name.to_owned());
        let (resource_claim_name, resource_claim_template_name) = match self {
            Self::Claim => (reference, None),
            Self::Template => (None, reference),
        };
        PodResourceClaim { name: name.to_owned(), resource_claim_name, resource_claim_template_name }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("ml".into());
        p.metadata.annotations =
            Some(annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        p
    }

    #[test]
    fn record_round_trip_and_errors() {
        let text = r#"[{"name":"main","claimName":"web-main-1","requestName":"vgpu","resources":{"nvidia.com/vgpu-cores":"100","nvidia.com/vgpu-memory":"0","nvidia.com/vgpu-number":"2"}}]"#;
        let infos = decode_record(text).unwrap();
        assert_eq!(encode_record(&infos), text);
        assert_eq!(
            infos[0].request(&ResourceDomain::default()),
            RecordedRequest { number: 2, cores: 100, memory: 0 }
        );
        assert!(is_combined(&infos));
        let err = decode_record("[").unwrap_err().to_string();
        assert!(err.starts_with("invalid vgpu-manager.io/original-resources annotation: EOF"), "{err}");
        assert!(matches!(decode_record(&" ".repeat(MAX_RECORD_BYTES + 1)), Err(RecordError::TooLong { .. })));
    }

    #[test]
    fn selectors_follow_the_annotations() {
        let d = ResourceDomain::default();
        let p = pod(&[
            ("nvidia.com/include-gpu-uuid", "GPU-AAA, ,gpu-bbb"),
            ("nvidia.com/exclude-gpu-uuid", "GPU-CCC"),
            ("nvidia.com/include-gpu-type", "a100,h\"100"),
            ("nvidia.com/exclude-gpu-type", "t4"),
            ("nvidia.com/memory-scheduler-policy", "Virtualized"),
        ]);
        let exprs: Vec<String> =
            device_selectors(&p, &d).into_iter().map(|s| s.cel.unwrap().expression).collect();
        assert_eq!(
            exprs,
            [
                r#"device.attributes["manager.nvidia.com"].type == "vgpu""#,
                r#"device.attributes["manager.nvidia.com"].uuid in ["gpu-aaa","gpu-bbb"]"#,
                r#"!(device.attributes["manager.nvidia.com"].uuid in ["gpu-ccc"])"#,
                r#"device.attributes["manager.nvidia.com"].productName in ["A100","H\"100"]"#,
                r#"!(device.attributes["manager.nvidia.com"].productName in ["T4"])"#,
                r#"device.attributes["manager.nvidia.com"].memoryRatio > 100"#,
            ]
        );
        let p = pod(&[("nvidia.com/memory-scheduler-policy", "physical")]);
        let last = device_selectors(&p, &d).pop().unwrap().cel.unwrap().expression;
        assert_eq!(last, r#"device.attributes["manager.nvidia.com"].memoryRatio <= 100"#);
    }

    #[test]
    fn claim_of_a_multi_gpu_container() {
        let d = ResourceDomain::default();
        let p = pod(&[
            ("nvidia.com/device-topology-mode", "link-strict"),
            ("nvidia.com/vgpu-compute-policy", "balance"),
        ]);
        let info = ResourceInfo {
            name: "main".into(),
            claim_name: "web-main-x".into(),
            request_name: "vgpu".into(),
            resources: BTreeMap::from([
                ("nvidia.com/vgpu-number".into(), "2".into()),
                ("nvidia.com/vgpu-cores".into(), "50".into()),
                ("nvidia.com/vgpu-memory".into(), "4096".into()),
            ]),
        };
        let req = device_request(&p, &d, "vgpu-manager", &info);
        let claim = resource_claim(&p, &d, "web-main-x", vec![req], 1_700_000_000_000);
        let json = serde_json::to_value(&claim).unwrap();
        assert!(json["metadata"].get("ownerReferences").is_none(), "no UID, no owner");
        let mut owned = p.clone();
        owned.metadata.uid = Some("uid-web".into());
        let with_owner = resource_claim(&owned, &d, "web-main-x", vec![], 1);
        assert_eq!(
            serde_json::to_value(&with_owner.metadata.owner_references).unwrap(),
            serde_json::json!([{"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "uid-web", "controller": true}])
        );
        assert_eq!(json["metadata"]["labels"]["vgpu-manager.io/owner-key"], "ml-web");
        assert_eq!(json["metadata"]["labels"]["vgpu-manager.io/create-timestamp"], "1700000000000");
        assert_eq!(json["metadata"]["annotations"]["nvidia.com/vgpu-compute-policy"], "balance");
        let exactly = &json["spec"]["devices"]["requests"][0]["exactly"];
        assert_eq!(exactly["deviceClassName"], "vgpu-manager");
        assert_eq!(exactly["allocationMode"], "ExactCount");
        assert_eq!(exactly["count"], 2);
        assert_eq!(exactly["capacity"]["requests"], serde_json::json!({"cores": "50", "memory": "4096Mi"}));
        assert_eq!(
            json["spec"]["devices"]["constraints"],
            serde_json::json!([
                {"requests": ["vgpu"], "distinctAttribute": "manager.nvidia.com/uuid"},
                {"requests": ["vgpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
            ])
        );
    }
}
