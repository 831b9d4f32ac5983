//! The pure rules of `/pods/validate` and `/resourceclaims/validate` (contract §10), on objects the caller
//! has already fetched ([`crate::admit`] does the fetching).
//!
//! # Which requests are vGPU
//!
//! [`classify`]: an `exactly` request is vGPU when its DeviceClass is `--vgpu-device-class-name`, or the
//! class's or the request's CEL selectors mention both the driver `manager.nvidia.com` and `vgpu`. A
//! `firstAvailable` request is vGPU when all its sub-requests are, not vGPU when none is, and *mixed* otherwise
//! (left to the claim webhook, as upstream does).
//!
//! # Sharing rules inside one pod ([`check_pod_sharing`])
//!
//! A request is keyed `<pod claim>/<request>`; a container's claim reference without `request` uses every vGPU
//! request of the claim. Denials, in the order they are checked:
//!
//! | rule | message |
//! |---|---|
//! | claim reference to a missing pod claim | `<kind> container "<c>" claim "<claim>" validation failed: pod resourceClaim "<claim>" not found` |
//! | request not in the claim | `<kind> container "<c>" claim "<claim>" validation failed: request "<r>" not found in pod resourceClaim "<claim>"` |
//! | one container, two vGPU claims | `<kind> container "<c>" references multiple vgpu claims [a b]; one container can use at most one vgpu claim` |
//! | two app containers, one request | `vgpu request "<key>" is referenced by multiple app containers [a b]; concurrent app containers cannot share a vgpu request` |
//! | two sidecars, one request | `vgpu request "<key>" is referenced by multiple sidecar containers [a b]; concurrent sidecar containers cannot share a vgpu request` |
//! | sidecar plus any other container | `vgpu request "<key>" is referenced by sidecar [s] together with other containers; a sidecar runs concurrently with the app phase and must be the sole user of a vgpu request` |
//! | init container sharing with two app containers | `init container "<i>" overlaps vgpu requests with multiple app containers [a b]; an init container may only share vgpu requests with at most one app container` |
//!
//! `<kind>` is `init` or `app`; a sidecar is an init container with `restartPolicy: Always`.
//!
//! # Across pods ([`check_cross_pod`])
//!
//! `pod "<new>" and pod <ns>/<other> both use vgpu requests [r] from claim "<claim>"; cross-pod sharing of the same vgpu request is not allowed`
//! for a named claim already reserved for another pod using the same vGPU request.
//!
//! # Allocated claims ([`check_allocated_sharing`])
//!
//! On a ResourceClaim status update that carries an allocation, the same rules hold for the allocated vGPU
//! requests of the claim across every pod it is reserved for (containers resolved to actual claims, template
//! claims through `status.resourceClaimStatuses`), and no allocated vGPU request may serve two pods.
//!
//! # Opaque configurations ([`check_opaque_configs`])
//!
//! Configs for driver `manager.nvidia.com` must be JSON objects of `apiVersion: resource.nvidia.com/v1beta1`
//! and a known kind (`GpuConfig`, `MigDeviceConfig`, `VfioDeviceConfig`, `ComputeDomainChannelConfig`,
//! `ComputeDomainDaemonConfig`): `<n> configs failed to validate: error decoding object at
//! spec.devices.config[0].opaque.parameters: …; expected a recognized configuration type at … but got: <apiVersion>/<kind>`.
//! The fields inside a known kind are not checked here (the kubelet plugin checks them at prepare time).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClaimConfiguration, DeviceClass, DeviceRequest, DeviceSelector, ResourceClaim,
};

use crate::convert::{DRA_DRIVER_NAME, ResourceInfo, VGPU_DEVICE_TYPE};
use vgpu_api::pod::{ContainerSlot, containers};
use vgpu_serve::admission::Denial;

/// API version of the opaque configs of driver `manager.nvidia.com`.
pub const OPAQUE_API_VERSION: &str = "resource.nvidia.com/v1beta1";
/// Kinds of opaque config accepted for driver `manager.nvidia.com`.
pub const OPAQUE_KINDS: &[&str] = &[
    "GpuConfig",
    "MigDeviceConfig",
    "VfioDeviceConfig",
    "ComputeDomainChannelConfig",
    "ComputeDomainDaemonConfig",
];

/// How a claim's request is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// Not a vGPU request.
    NonVgpu,
    /// Certainly a vGPU request.
    Vgpu,
    /// A `firstAvailable` request with vGPU and other alternatives.
    Mixed,
}

fn selectors_look_like_vgpu<'a>(
    selectors: impl Iterator<Item = &'a DeviceSelector>,
    driver: &mut bool,
    device: &mut bool,
) {
    for s in selectors {
        if let Some(cel) = &s.cel {
            *driver |= cel.expression.contains(DRA_DRIVER_NAME);
            *device |= cel.expression.contains(VGPU_DEVICE_TYPE);
        }
    }
}

fn looks_like_vgpu(
    class_name: &str,
    selectors: Option<&Vec<DeviceSelector>>,
    vgpu_class: &str,
    classes: &BTreeMap<String, DeviceClass>,
) -> bool {
    if class_name == vgpu_class {
        return true;
    }
    let (mut driver, mut device) = (false, false);
    if let Some(class) = classes.get(class_name) {
        selectors_look_like_vgpu(
            class.spec.iter().flat_map(|s| s.selectors.iter().flatten()),
            &mut driver,
            &mut device,
        );
    }
    selectors_look_like_vgpu(selectors.into_iter().flatten(), &mut driver, &mut device);
    driver && device
}

/// Classifies each request of a claim by name (module docs). `classes` holds the DeviceClasses the requests
/// name (missing ones count as unknown).
pub fn classify(
    requests: &[DeviceRequest],
    vgpu_class: &str,
    classes: &BTreeMap<String, DeviceClass>,
) -> BTreeMap<String, RequestClass> {
    let mut out = BTreeMap::new();
    for r in requests {
        let class = if let Some(e) = &r.exactly {
            if looks_like_vgpu(&e.device_class_name, e.selectors.as_ref(), vgpu_class, classes) {
                RequestClass::Vgpu
            } else {
                RequestClass::NonVgpu
            }
        } else if let Some(subs) = r.first_available.as_ref().filter(|s| !s.is_empty()) {
            let n = subs
                .iter()
                .filter(|s| looks_like_vgpu(&s.device_class_name, s.selectors.as_ref(), vgpu_class, classes))
                .count();
            match n {
                0 => RequestClass::NonVgpu,
                n if n == subs.len() => RequestClass::Vgpu,
                _ => RequestClass::Mixed,
            }
        } else {
            continue;
        };
        out.insert(r.name.clone(), class);
    }
    out
}

/// What a pod claim resolves to, for [`check_pod_sharing`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodClaimRequests {
    /// The claim (or template) exists; its requests by name.
    Found(BTreeMap<String, RequestClass>),
    /// The claim (or template) does not exist yet: nothing to check.
    Missing,
}

/// `init` or `app` (upstream's container kind names).
fn kind(slot: ContainerSlot) -> &'static str {
    match slot {
        ContainerSlot::Init(_) => "init",
        ContainerSlot::App(_) => "app",
    }
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Go's `%v` of a sorted string list: `[a b]`.
fn go_list<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    let v: Vec<&str> = items.into_iter().map(String::as_str).collect();
    format!("[{}]", v.join(" "))
}

#[derive(Debug, Default)]
struct Usage {
    init: BTreeSet<String>,
    app: BTreeSet<String>,
    sidecar: BTreeSet<String>,
}

/// The vGPU request keys (`<claim>/<request>`) one container reference uses.
fn reference_keys(
    pod: &Pod,
    container: &Container,
    slot: ContainerSlot,
    claim: &str,
    request: Option<&str>,
    converted: &[ResourceInfo],
    claims: &BTreeMap<String, PodClaimRequests>,
) -> Result<Vec<String>, Denial> {
    let fail = |why: String| {
        Denial::new(format!(
            "{} container {:?} claim {claim:?} validation failed: {why}",
            kind(slot),
            container.name
        ))
    };
    let recorded: Vec<&ResourceInfo> =
        converted.iter().filter(|i| i.name == container.name && i.claim_name == claim).collect();
    if !recorded.is_empty() {
        let mut keys: Vec<String> = match request.filter(|r| !r.is_empty()) {
            Some(r) => vec![format!("{claim}/{r}")],
            None => recorded.iter().map(|i| format!("{claim}/{}", i.request_name)).collect(),
        };
        keys.sort();
        keys.dedup();
        return Ok(keys);
    }
    let in_pod = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|pc| pc.iter().any(|p| p.name == claim));
    if !in_pod {
        return Err(fail(format!("pod resourceClaim {claim:?} not found")));
    }
    let index = match claims.get(claim) {
        Some(PodClaimRequests::Found(index)) => index,
        Some(PodClaimRequests::Missing) | None => return Ok(Vec::new()),
    };
    match request.filter(|r| !r.is_empty()) {
        Some(r) => match index.get(r) {
            None => Err(fail(format!("request {r:?} not found in pod resourceClaim {claim:?}"))),
            Some(RequestClass::Vgpu) => Ok(vec![format!("{claim}/{r}")]),
            Some(_) => Ok(Vec::new()),
        },
        None => Ok(index
            .iter()
            .filter(|(_, c)| **c == RequestClass::Vgpu)
            .map(|(r, _)| format!("{claim}/{r}"))
            .collect()),
    }
}

/// The sharing rules inside one pod (module docs). `converted` is the pod's `original-resources` record (its
/// claims may not exist yet: they count as vGPU); `claims` the other pod claims, resolved.
pub fn check_pod_sharing(
    pod: &Pod,
    converted: &[ResourceInfo],
    claims: &BTreeMap<String, PodClaimRequests>,
) -> Result<(), Denial> {
    let mut usages: BTreeMap<String, Usage> = BTreeMap::new();
    for (slot, c) in containers(pod) {
        let mut vgpu_claims = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for r in c.resources.as_ref().and_then(|r| r.claims.as_ref()).into_iter().flatten() {
            let k = reference_keys(pod, c, slot, &r.name, r.request.as_deref(), converted, claims)?;
            if !k.is_empty() {
                vgpu_claims.insert(r.name.clone());
            }
            keys.extend(k);
        }
        if vgpu_claims.len() > 1 {
            return Err(Denial::new(format!(
                "{} container {:?} references multiple vgpu claims {}; one container can use at most one vgpu claim",
                kind(slot),
                c.name,
                go_list(&vgpu_claims)
            )));
        }
        for key in keys {
            let usage = usages.entry(key.clone()).or_default();
            if is_sidecar(c) && matches!(slot, ContainerSlot::Init(_)) {
                usage.sidecar.insert(c.name.clone());
            } else if matches!(slot, ContainerSlot::Init(_)) {
                usage.init.insert(c.name.clone());
            } else {
                usage.app.insert(c.name.clone());
            }
            if usage.app.len() > 1 {
                return Err(Denial::new(format!(
                    "vgpu request {key:?} is referenced by multiple app containers {}; concurrent app containers cannot share a vgpu request",
                    go_list(&usage.app)
                )));
            }
            if usage.sidecar.len() > 1 {
                return Err(Denial::new(format!(
                    "vgpu request {key:?} is referenced by multiple sidecar containers {}; concurrent sidecar containers cannot share a vgpu request",
                    go_list(&usage.sidecar)
                )));
            }
            if usage.sidecar.len() == 1 && (!usage.init.is_empty() || !usage.app.is_empty()) {
                return Err(Denial::new(format!(
                    "vgpu request {key:?} is referenced by sidecar {} together with other containers; a sidecar runs concurrently with the app phase and must be the sole user of a vgpu request",
                    go_list(&usage.sidecar)
                )));
            }
        }
    }
    let mut overlap: BTreeMap<&String, BTreeSet<&String>> = BTreeMap::new();
    for usage in usages.values() {
        if usage.init.is_empty() || usage.app.is_empty() {
            continue;
        }
        for init in &usage.init {
            overlap.entry(init).or_default().extend(usage.app.iter());
        }
    }
    for (init, apps) in overlap {
        if apps.len() > 1 {
            return Err(Denial::new(format!(
                "init container {init:?} overlaps vgpu requests with multiple app containers {}; an init container may only share vgpu requests with at most one app container",
                go_list(apps.into_iter())
            )));
        }
    }
    Ok(())
}

/// The vGPU requests `pod` uses from its pod claim `pod_claim` (by request name).
pub fn pod_claim_vgpu_requests(
    pod: &Pod,
    pod_claim: &str,
    index: &BTreeMap<String, RequestClass>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, c) in containers(pod) {
        for r in c.resources.as_ref().and_then(|r| r.claims.as_ref()).into_iter().flatten() {
            if r.name != pod_claim {
                continue;
            }
            match r.request.as_deref().filter(|r| !r.is_empty()) {
                Some(req) => {
                    if index.get(req) == Some(&RequestClass::Vgpu) {
                        out.insert(req.to_owned());
                    }
                }
                None => out
                    .extend(index.iter().filter(|(_, c)| **c == RequestClass::Vgpu).map(|(n, _)| n.clone())),
            }
        }
    }
    out
}

/// The pod claim name under which `pod` uses the ResourceClaim `actual` (by `resourceClaimName`, or a
/// template's generated claim in `status.resourceClaimStatuses`).
pub fn pod_claim_for_actual(pod: &Pod, actual: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    for pc in spec.resource_claims.iter().flatten() {
        if pc.resource_claim_name.as_deref() == Some(actual) {
            return Some(pc.name.clone());
        }
        if pc.resource_claim_template_name.is_some() {
            let generated = pod
                .status
                .as_ref()
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .and_then(|st| st.iter().find(|s| s.name == pc.name))
                .and_then(|s| s.resource_claim_name.as_deref());
            if generated == Some(actual) {
                return Some(pc.name.clone());
            }
        }
    }
    None
}

/// The cross-pod rule for one named claim (module docs): `pod` uses `claim` as pod claim `pod_claim`;
/// `reserved` are the pods the claim is reserved for (already fetched; stale references filtered by UID).
pub fn check_cross_pod(
    pod: &Pod,
    pod_claim: &str,
    claim: &ResourceClaim,
    index: &BTreeMap<String, RequestClass>,
    reserved: &[Pod],
) -> Result<(), Denial> {
    let mine = pod_claim_vgpu_requests(pod, pod_claim, index);
    if mine.is_empty() {
        return Ok(());
    }
    let actual = claim.metadata.name.as_deref().unwrap_or_default();
    for other in reserved {
        if other.metadata.name == pod.metadata.name && other.metadata.namespace == pod.metadata.namespace {
            continue;
        }
        let Some(other_claim) = pod_claim_for_actual(other, actual) else { continue };
        let theirs = pod_claim_vgpu_requests(other, &other_claim, index);
        let shared: Vec<&String> = mine.intersection(&theirs).collect();
        if !shared.is_empty() {
            return Err(Denial::new(format!(
                "pod {:?} and pod {}/{} both use vgpu requests {} from claim {actual:?}; cross-pod sharing of the same vgpu request is not allowed",
                pod.metadata.name.as_deref().unwrap_or_default(),
                other.metadata.namespace.as_deref().unwrap_or_default(),
                other.metadata.name.as_deref().unwrap_or_default(),
                go_list(shared)
            )));
        }
    }
    Ok(())
}

/// Checks the opaque configs of driver `manager.nvidia.com` (module docs); `spec_path` is `spec` for a claim,
/// `spec.spec` for a template.
pub fn check_opaque_configs(configs: &[DeviceClaimConfiguration], spec_path: &str) -> Result<(), Denial> {
    let mut errors = Vec::new();
    for (i, config) in configs.iter().enumerate() {
        let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == DRA_DRIVER_NAME) else { continue };
        let path = format!("{spec_path}.devices.config[{i}].opaque.parameters");
        let value = &opaque.parameters.0;
        let Some(object) = value.as_object() else {
            errors.push(format!(
                "error decoding object at {path}: expected a JSON object with apiVersion and kind"
            ));
            continue;
        };
        let api_version = object.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
        let kind = object.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
        if api_version.is_empty() || kind.is_empty() {
            errors.push(format!("error decoding object at {path}: apiVersion and kind must be set"));
        } else if api_version != OPAQUE_API_VERSION || !OPAQUE_KINDS.contains(&kind) {
            errors.push(format!(
                "expected a recognized configuration type at {path} but got: {api_version}/{kind}"
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Denial::new(format!("{} configs failed to validate: {}", errors.len(), errors.join("; "))))
    }
}

// === allocated claims (`/resourceclaims/validate`, status updates) ===

/// The vGPU requests (main request names) allocated to `claim` from driver `manager.nvidia.com`: the results
/// of `status.allocation` whose request (`main` or `main/sub` for `firstAvailable`) classifies as vGPU.
pub fn allocated_vgpu_requests(
    claim: &ResourceClaim,
    vgpu_class: &str,
    classes: &BTreeMap<String, DeviceClass>,
) -> BTreeSet<String> {
    let requests = claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref());
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    let mut out = BTreeSet::new();
    for result in results.into_iter().flatten().filter(|r| r.driver == DRA_DRIVER_NAME) {
        let (main, sub) = match result.request.split_once('/') {
            Some((m, s)) => (m, Some(s)),
            None => (result.request.as_str(), None),
        };
        let Some(request) = requests.into_iter().flatten().find(|r| r.name == main) else { continue };
        // The driver matched already: the class or a selector naming the vgpu type is enough.
        let vgpu = |class: &str, selectors: Option<&Vec<DeviceSelector>>| {
            looks_like_vgpu(class, selectors, vgpu_class, classes) || {
                let (mut driver, mut device) = (true, false);
                if let Some(c) = classes.get(class) {
                    selectors_look_like_vgpu(
                        c.spec.iter().flat_map(|s| s.selectors.iter().flatten()),
                        &mut driver,
                        &mut device,
                    );
                }
                selectors_look_like_vgpu(selectors.into_iter().flatten(), &mut driver, &mut device);
                device
            }
        };
        let is_vgpu = match (&request.exactly, sub) {
            (Some(e), _) => vgpu(&e.device_class_name, e.selectors.as_ref()),
            (None, Some(sub)) => request
                .first_available
                .iter()
                .flatten()
                .find(|s| s.name == sub)
                .is_some_and(|s| vgpu(&s.device_class_name, s.selectors.as_ref())),
            (None, None) => false,
        };
        if is_vgpu {
            out.insert(main.to_owned());
        }
    }
    out
}

/// One pod the claim is reserved for, with the ResourceClaims its containers reference (by name; `None` when
/// the claim does not exist).
#[derive(Debug, Clone)]
pub struct ReservedPod {
    /// The pod.
    pub pod: Pod,
    /// Actual claim name → claim.
    pub claims: BTreeMap<String, Option<ResourceClaim>>,
}

/// The sharing rules on an allocated claim's status update: for every pod the claim is reserved for, no
/// container uses two allocated vGPU claims, and no allocated vGPU request of `claim` is used by two app
/// containers, two sidecars, a sidecar and another container, or two pods.
///
/// Messages: `pod <ns>/<pod> <kind> container "<c>" uses multiple allocated vgpu claims [uid uid]; one container
/// can use at most one vgpu claim`; `allocated vgpu request "<r>" in claim <ns>/<claim> is referenced by
/// multiple app containers [<ns>/<pod>/<c> …]` (or `multiple sidecar containers`, or `sidecar [...] together
/// with other containers; a sidecar must be the sole user of a vgpu request`), or `is shared by multiple pods
/// [<ns>/<pod> …]`.
pub fn check_allocated_sharing(
    claim: &ResourceClaim,
    reserved: &[ReservedPod],
    vgpu_class: &str,
    classes: &BTreeMap<String, DeviceClass>,
) -> Result<(), Denial> {
    let current = allocated_vgpu_requests(claim, vgpu_class, classes);
    if current.is_empty() {
        return Ok(());
    }
    let claim_ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    let claim_uid = claim.metadata.uid.as_deref().unwrap_or(claim_name);
    #[derive(Debug, Default)]
    struct AllocatedUsage {
        pods: BTreeSet<String>,
        init: BTreeSet<String>,
        app: BTreeSet<String>,
        sidecar: BTreeSet<String>,
    }
    let mut usages: BTreeMap<String, AllocatedUsage> = BTreeMap::new();
    for r in reserved {
        let pod = &r.pod;
        let pod_ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let pod_id = format!("{pod_ns}/{pod_name}");
        for (slot, c) in containers(pod) {
            let mut vgpu_claims = BTreeSet::new();
            let mut current_reqs = BTreeSet::new();
            for reference in c.resources.as_ref().and_then(|r| r.claims.as_ref()).into_iter().flatten() {
                let Some(actual) = vgpu_api::pod::actual_claim_name(pod, &reference.name).map(str::to_owned)
                else {
                    continue;
                };
                let (uid, allocated) = if actual == claim_name {
                    (claim_uid.to_owned(), current.clone())
                } else {
                    let Some(Some(other)) = r.claims.get(&actual) else { continue };
                    let uid = other.metadata.uid.clone().unwrap_or_else(|| actual.clone());
                    (uid, allocated_vgpu_requests(other, vgpu_class, classes))
                };
                let hit: Vec<String> = match reference.request.as_deref().filter(|q| !q.is_empty()) {
                    Some(q) => allocated.iter().filter(|a| a.as_str() == q).cloned().collect(),
                    None => allocated.iter().cloned().collect(),
                };
                if hit.is_empty() {
                    continue;
                }
                vgpu_claims.insert(uid);
                if actual == claim_name {
                    current_reqs.extend(hit);
                }
            }
            if vgpu_claims.len() > 1 {
                return Err(Denial::new(format!(
                    "pod {pod_id} {} container {:?} uses multiple allocated vgpu claims {}; one container can use at most one vgpu claim",
                    kind(slot),
                    c.name,
                    go_list(&vgpu_claims)
                )));
            }
            for req in current_reqs {
                let usage = usages.entry(req.clone()).or_default();
                let id = format!("{pod_id}/{}", c.name);
                usage.pods.insert(pod_id.clone());
                match slot {
                    ContainerSlot::Init(_) if is_sidecar(c) => usage.sidecar.insert(id),
                    ContainerSlot::Init(_) => usage.init.insert(id),
                    ContainerSlot::App(_) => usage.app.insert(id),
                };
                let prefix = format!("allocated vgpu request {req:?} in claim {claim_ns}/{claim_name}");
                if usage.app.len() > 1 {
                    return Err(Denial::new(format!(
                        "{prefix} is referenced by multiple app containers {}",
                        go_list(&usage.app)
                    )));
                }
                if usage.sidecar.len() > 1 {
                    return Err(Denial::new(format!(
                        "{prefix} is referenced by multiple sidecar containers {}",
                        go_list(&usage.sidecar)
                    )));
                }
                if usage.sidecar.len() == 1 && (!usage.init.is_empty() || !usage.app.is_empty()) {
                    return Err(Denial::new(format!(
                        "{prefix} is referenced by sidecar {} together with other containers; a sidecar must be the sole user of a vgpu request",
                        go_list(&usage.sidecar)
                    )));
                }
                if usage.pods.len() > 1 {
                    return Err(Denial::new(format!(
                        "{prefix} is shared by multiple pods {}",
                        go_list(&usage.pods)
                    )));
                }
            }
        }
    }
    Ok(())
}
