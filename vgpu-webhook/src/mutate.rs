//! `/pods/mutate` (CREATE): the pure decision. [`mutate_pod`] returns the pod as it should be stored;
//! [`pod_patch`] the RFC 6902 patch from the pod as received to that.
//!
//! Rules, in order (contract §10):
//!
//! | # | when | what |
//! |---|---|---|
//! | 1 | always | stale scheduling metadata removed: annotations `pre-allocated`, `real-allocated`, `predicate-node`, `predicate-time`; labels `assigned-phase`, `metrics-node` (vgpu-manager meant to, but deleted the annotation keys from the labels) |
//! | 2 | per container (init, then app) | `vgpu-number` 0 with cores or memory > 0 → number 1; number > 0 with cores 0 and memory 0 → cores 100 ([`VgpuRequest::with_defaults`]); the limit is mirrored into `requests` when the container has requests |
//! | 3 | per container | denied: a vGPU limit that is not a non-negative integer, `vgpu-number` > 16, `vgpu-cores` > 100 |
//! | 4 | vGPU pod | `schedulerName` set when empty or `default-scheduler`; `node-scheduler-policy` / `device-scheduler-policy` set when absent; `runtimeClassName` set when empty |
//! | 5 | not a vGPU pod | `node-scheduler-policy`, `device-scheduler-policy`, `memory-scheduler-policy` removed |
//! | 6 | a container with number > 1 | `device-topology-mode` set when absent |
//! | 7 | vGPU pod, pod with `resourceClaims`, or any extended-resource limit > 0, with `spec.nodeName` | `nodeSelector[kubernetes.io/hostname]` = nodeName, nodeName cleared (so the scheduler and the extender account for it); not for mirror pods (annotation `kubernetes.io/config.mirror`), which the kubelet must create bound to itself (NodeRestriction refuses them otherwise; vgpu-manager moves them too) |
//! | 8 | `--default-convert2-dra`, vGPU pod | vGPU limits (and requests) removed; container `resources.claims` and pod `resourceClaims` added; `vgpu-manager.io/original-resources` written ([`crate::convert`]) |
//!
//! Rules 2-3 and 8 work on a pod spec ([`default_requests`], [`convert_containers`]); the Volcano Job routes
//! apply the same code to each task's pod template ([`crate::volcano`]).
//!
//! A pod already converted (its `original-resources` record matches its claims) counts as a vGPU pod with the
//! recorded numbers and is not converted again, so mutating a mutated pod changes nothing.
//!
//! Claim names: `<pod>-<container>-<hash>` per container ([`vgpu_api::names::safe_resource_name`]). For a pod
//! named by `generateName` (no name yet at admission) and for combined claims the base is
//! `<generateName or name>-<5 hex digits of SHA-256 of the admission request UID>`: unique per request, and the
//! same on a retry of the same request (vgpu-manager uses 5 random characters).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceClaim, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use vgpu_core::alloc::parse_quantity;
use vgpu_core::domain::{ORIGINAL_RESOURCES_ANNOTATION, ResourceDomain};
use vgpu_core::model::{MAX_VGPU_NUMBER, VgpuRequest};

use crate::config::WebhookConfig;
use crate::convert::{self, ClaimSource, ResourceInfo, VGPU_DEVICE_TYPE};
use vgpu_api::names::{safe_resource_name, short_hash};
use vgpu_api::pod::{ContainerSlot, comparable, containers, spec_containers};
use vgpu_serve::admission::Denial;

/// The scheduler name Kubernetes fills in when a pod names none.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// Well-known node label holding the node name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Annotation of the mirror pods the kubelet creates for static pods.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

fn container_mut(spec: &mut PodSpec, slot: ContainerSlot) -> Option<&mut Container> {
    match slot {
        ContainerSlot::Init(i) => spec.init_containers.as_mut()?.get_mut(i),
        ContainerSlot::App(i) => spec.containers.get_mut(i),
    }
}

fn limit<'a>(c: &'a Container, key: &str) -> Option<&'a str> {
    c.resources.as_ref()?.limits.as_ref()?.get(key).map(|q| q.0.as_str())
}

/// Reads one vGPU limit: absent → 0; denied when not a non-negative integer.
fn read_limit(c: &Container, slot: ContainerSlot, key: &str) -> Result<u64, Denial> {
    match limit(c, key) {
        None => Ok(0),
        Some(v) => parse_quantity(v).ok_or_else(|| {
            Denial::new(format!(
                "container {:?}: {}.resources.limits[{key}]: Invalid value: {v:?}: must be a non-negative integer",
                c.name,
                slot.path()
            ))
        }),
    }
}

/// The container's vGPU request as written (before defaults); denied on a malformed quantity.
pub fn read_request(
    c: &Container,
    slot: ContainerSlot,
    domain: &ResourceDomain,
) -> Result<VgpuRequest, Denial> {
    let number = read_limit(c, slot, &domain.vgpu_number())?;
    let cores = read_limit(c, slot, &domain.vgpu_cores())?;
    let memory = read_limit(c, slot, &domain.vgpu_memory())?;
    let exceeds = |key: String, value: u64, max: u64| {
        Denial::new(format!(
            "container {:?}: {}.resources.limits[{key}]: Invalid value: \"{value}\": request exceeds limit, maximum: {max}",
            c.name,
            slot.path()
        ))
    };
    let number = u32::try_from(number)
        .ok()
        .filter(|n| *n <= MAX_VGPU_NUMBER)
        .ok_or_else(|| exceeds(domain.vgpu_number(), number, u64::from(MAX_VGPU_NUMBER)))?;
    let cores = u32::try_from(cores)
        .ok()
        .filter(|c| *c <= 100)
        .ok_or_else(|| exceeds(domain.vgpu_cores(), cores, 100))?;
    Ok(VgpuRequest { number, cores, memory })
}

fn set_resource(c: &mut Container, key: &str, value: u64) {
    let resources = c.resources.get_or_insert_with(ResourceRequirements::default);
    resources.limits.get_or_insert_with(BTreeMap::new).insert(key.to_owned(), Quantity(value.to_string()));
    if let Some(requests) = resources.requests.as_mut() {
        requests.insert(key.to_owned(), Quantity(value.to_string()));
    }
}

fn remove_resource(c: &mut Container, key: &str) {
    if let Some(resources) = c.resources.as_mut() {
        if let Some(limits) = resources.limits.as_mut() {
            limits.remove(key);
        }
        if let Some(requests) = resources.requests.as_mut() {
            requests.remove(key);
        }
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn set_annotation_if_absent(pod: &mut Pod, key: String, value: &str) {
    pod.metadata.annotations.get_or_insert_with(BTreeMap::new).entry(key).or_insert_with(|| value.to_owned());
}

fn remove_annotation(pod: &mut Pod, key: &str) {
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(key);
    }
}

fn remove_label(pod: &mut Pod, key: &str) {
    if let Some(l) = pod.metadata.labels.as_mut() {
        l.remove(key);
    }
}

/// Whether a resource name is an extended resource (a qualified name outside `*kubernetes.io/`).
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

fn has_extended_resource(pod: &Pod) -> bool {
    containers(pod).iter().any(|(_, c)| {
        c.resources.as_ref().and_then(|r| r.limits.as_ref()).is_some_and(|limits| {
            limits.iter().any(|(k, v)| is_extended_resource(k) && parse_quantity(&v.0).is_some_and(|n| n > 0))
        })
    })
}

fn has_pod_claims(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).is_some_and(|c| !c.is_empty())
}

/// The pod's `original-resources` record when it matches the pod: every entry names an existing container that
/// references the entry's claim and request, and a pod claim of that name exists. `None` otherwise.
pub fn recorded_conversion(pod: &Pod) -> Option<Vec<ResourceInfo>> {
    let infos = convert::decode_record(annotation(pod, ORIGINAL_RESOURCES_ANNOTATION)?).ok()?;
    if infos.is_empty() {
        return None;
    }
    let all = containers(pod);
    let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let consistent = infos.iter().all(|info| {
        let referenced = all.iter().any(|(_, c)| {
            c.name == info.name
                && c.resources.as_ref().and_then(|r| r.claims.as_ref()).is_some_and(|claims| {
                    claims.iter().any(|r| {
                        r.name == info.claim_name && r.request.as_deref() == Some(&info.request_name)
                    })
                })
        });
        referenced && pod_claims.is_some_and(|pc| pc.iter().any(|p| p.name == info.claim_name))
    });
    consistent.then_some(infos)
}

/// The base of generated claim names of the object with this metadata (module docs): a pod's, or a Volcano
/// Job's ([`crate::volcano`] adds the task name).
pub fn claim_base(metadata: &ObjectMeta, config: &WebhookConfig, request_uid: &str) -> String {
    let suffix = short_hash(request_uid, 5);
    match (metadata.generate_name.as_deref(), metadata.name.as_deref()) {
        (Some(g), _) if !g.is_empty() => format!("{}-{suffix}", g.trim_end_matches('-')),
        (_, Some(n)) if config.combined_claim => format!("{n}-{suffix}"),
        (_, Some(n)) => n.to_owned(),
        _ => suffix,
    }
}

/// The pod as `/pods/mutate` stores it (module docs). `request_uid` is the admission request's UID (claim names
/// of `generateName` pods and combined claims).
pub fn mutate_pod(config: &WebhookConfig, request_uid: &str, original: &Pod) -> Result<Pod, Denial> {
    let d = &config.domain;
    let mut pod = original.clone();

    // 1. Stale scheduling metadata (a pod re-created from an old one must be scheduled afresh).
    for key in [d.pre_allocated(), d.real_allocated(), d.predicate_node(), d.predicate_time()] {
        remove_annotation(&mut pod, &key);
    }
    for key in [d.assigned_phase(), d.metrics_node()] {
        remove_label(&mut pod, &key);
    }

    // 2-3. Per-container defaults and limits.
    let recorded = recorded_conversion(&pod);
    let mut vgpu_pod = false;
    let mut multi_gpu = false;
    let mut vgpu_slots = Vec::new();
    let defaulted = match pod.spec.as_mut() {
        Some(spec) => default_requests(spec, d)?,
        None => Vec::new(),
    };
    for (slot, name, req) in defaulted {
        let mut number = u64::from(req.number);
        if let Some(info) = recorded.as_ref().and_then(|infos| infos.iter().find(|i| i.name == name)) {
            number = number.max(info.request(d).number);
        }
        if number > 0 {
            vgpu_pod = true;
        }
        if number > 1 {
            multi_gpu = true;
        }
        if req.number > 0 {
            vgpu_slots.push(slot);
        }
    }

    // 4-5. Scheduler, policies, runtime class.
    if vgpu_pod {
        let spec = pod.spec.get_or_insert_with(Default::default);
        if let Some(name) = &config.scheduler_name
            && spec.scheduler_name.as_deref().is_none_or(|s| s.is_empty() || s == DEFAULT_SCHEDULER_NAME)
        {
            spec.scheduler_name = Some(name.clone());
        }
        if let Some(rc) = &config.default_runtime_class
            && spec.runtime_class_name.as_deref().is_none_or(str::is_empty)
        {
            spec.runtime_class_name = Some(rc.clone());
        }
        if let Some(p) = config.default_node_policy {
            set_annotation_if_absent(&mut pod, d.node_scheduler_policy(), p.as_str());
        }
        if let Some(p) = config.default_device_policy {
            set_annotation_if_absent(&mut pod, d.device_scheduler_policy(), p.as_str());
        }
    } else {
        for key in [d.node_scheduler_policy(), d.device_scheduler_policy(), d.memory_scheduler_policy()] {
            remove_annotation(&mut pod, &key);
        }
    }

    // 6. Topology mode for multi-GPU containers.
    if multi_gpu && let Some(mode) = config.default_topology_mode {
        set_annotation_if_absent(&mut pod, d.device_topology_mode(), mode.as_str());
    }

    // 7. spec.nodeName → hostname nodeSelector (not for mirror pods: the kubelet must create those bound).
    if (vgpu_pod || has_pod_claims(&pod) || has_extended_resource(&pod))
        && annotation(&pod, MIRROR_POD_ANNOTATION).is_none()
        && let Some(spec) = pod.spec.as_mut()
        && let Some(node) = spec.node_name.take().filter(|n| !n.is_empty())
    {
        spec.node_selector.get_or_insert_with(BTreeMap::new).insert(HOSTNAME_LABEL.to_owned(), node);
    }

    // 8. Device-plugin → DRA conversion.
    if config.convert_to_dra && !vgpu_slots.is_empty() && recorded.is_none() {
        convert_pod(config, request_uid, &mut pod, &vgpu_slots);
    }
    Ok(pod)
}

/// Rules 2-3 on one pod spec (a pod's or a pod template's): reads every container's vGPU limits (denied when
/// malformed or over the limits) and writes the defaults ([`VgpuRequest::with_defaults`]). Returns each
/// container's slot, name and defaulted request, init containers first.
pub fn default_requests(
    spec: &mut PodSpec,
    domain: &ResourceDomain,
) -> Result<Vec<(ContainerSlot, String, VgpuRequest)>, Denial> {
    let slots: Vec<ContainerSlot> = spec_containers(spec).into_iter().map(|(s, _)| s).collect();
    let mut out = Vec::with_capacity(slots.len());
    for slot in slots {
        let Some(c) = container_mut(spec, slot) else { continue };
        let raw = read_request(c, slot, domain)?;
        let req = raw.with_defaults();
        if req.number != raw.number {
            set_resource(c, &domain.vgpu_number(), u64::from(req.number));
        }
        if req.cores != raw.cores {
            set_resource(c, &domain.vgpu_cores(), u64::from(req.cores));
        }
        out.push((slot, c.name.clone(), req));
    }
    Ok(out)
}

/// The claim names of a record without repeats, in record order, each with whether `spec` refers to it as
/// `source` says: what a DELETE (or a Job's UPDATE) may touch.
pub fn recorded_claims(
    spec: Option<&PodSpec>,
    infos: &[ResourceInfo],
    source: ClaimSource,
) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    for info in infos {
        if !out.iter().any(|(n, _)| *n == info.claim_name) {
            out.push((info.claim_name.clone(), source.listed(spec, &info.claim_name)));
        }
    }
    out
}

/// Rule 8 on one pod spec: the vGPU containers at `slots` (their limits already defaulted by
/// [`default_requests`]) lose their vGPU limits and requests and get a `resources.claims` entry; the spec gets a
/// `resourceClaims` entry per generated claim, referring to it as `source` says. Claim names are
/// `<base>-<container>-<hash>`, or one `<base>-<hash>` for all with `--combined-resource-claim`
/// ([`safe_resource_name`]). Returns the record entries, in container order.
pub fn convert_containers(
    config: &WebhookConfig,
    spec: &mut PodSpec,
    slots: &[ContainerSlot],
    base: &str,
    source: ClaimSource,
) -> Vec<ResourceInfo> {
    let d = &config.domain;
    let mut infos = Vec::new();
    for &slot in slots {
        let Some(c) = container_mut(spec, slot) else { continue };
        let (claim_name, request_name) = if config.combined_claim {
            (safe_resource_name(&[base]), safe_resource_name(&[&c.name, VGPU_DEVICE_TYPE]))
        } else {
            (safe_resource_name(&[base, &c.name]), VGPU_DEVICE_TYPE.to_owned())
        };
        let mut resources = BTreeMap::new();
        for key in [d.vgpu_number(), d.vgpu_cores(), d.vgpu_memory()] {
            let value = limit(c, &key).and_then(parse_quantity).unwrap_or(0);
            resources.insert(key.clone(), value.to_string());
            remove_resource(c, &key);
        }
        let reqs = c.resources.get_or_insert_with(ResourceRequirements::default);
        reqs.claims
            .get_or_insert_with(Vec::new)
            .push(ResourceClaim { name: claim_name.clone(), request: Some(request_name.clone()) });
        infos.push(ResourceInfo { name: c.name.clone(), claim_name, request_name, resources });
    }
    let pod_claims = spec.resource_claims.get_or_insert_with(Vec::new);
    for info in &infos {
        if !pod_claims.iter().any(|p| p.name == info.claim_name) {
            pod_claims.push(source.entry(&info.claim_name));
        }
    }
    infos
}

fn convert_pod(config: &WebhookConfig, request_uid: &str, pod: &mut Pod, slots: &[ContainerSlot]) {
    let base = claim_base(&pod.metadata, config, request_uid);
    let spec = pod.spec.get_or_insert_with(Default::default);
    let infos = convert_containers(config, spec, slots, &base, ClaimSource::Claim);
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ORIGINAL_RESOURCES_ANNOTATION.to_owned(), convert::encode_record(&infos));
}

/// The JSON patch from `original` to [`mutate_pod`]'s result (empty when nothing changes).
///
/// Only `metadata` (without `managedFields`, which the mutation never touches and which is most of a
/// kubectl-made pod's bytes) and `spec` are compared; the paths are those of the whole pod.
pub fn pod_patch(
    config: &WebhookConfig,
    request_uid: &str,
    original: &Pod,
) -> Result<json_patch::Patch, Denial> {
    let mutated = mutate_pod(config, request_uid, original)?;
    let encode = |e: serde_json::Error| Denial::new(format!("cannot encode the pod: {e}"));
    let before = comparable(original).map_err(encode)?;
    let after = comparable(&mutated).map_err(encode)?;
    Ok(json_patch::diff(&before, &after))
}
