//! The pure rules of `POST /pods/validate` (CREATE, UPDATE): a pod's GPU requests must be consistent with the
//! GPUClasses, the PhysicalGPUs and the ResourceClaims it names. The route ([`crate::admission::Admission`])
//! runs after every mutating webhook, so a pod the mutation converted reaches these rules with ResourceClaims,
//! not with `<group>/<class>` resources.
//!
//! # Rules
//!
//! Checked in this order; the first violation is the answer. `<c>` is the container, `<path>` its field
//! (`spec.containers[0]`, `spec.initContainers[1]`).
//!
//! | # | what is checked | message |
//! |---|---|---|
//! | 1 | a `<group>/<class>` resource in a container's `limits` or `requests` has a positive integer count | `container "<c>": <path>.resources.<limits\|requests>[<group>/<class>]: Invalid value: "<q>": must be a positive integer` |
//! | 2 | … names a GPUClass that exists | `…: Not found: GPUClass "<class>" does not exist` |
//! | 3 | … asks at most as many devices as the class's matching PhysicalGPUs on one node (skipped while no GPU matches: the class's status says why, as for claims) | `…: Invalid value: <n>: GPUClass "<class>" has at most <m> matching GPU(s) on one node` |
//! | 4 | … was turned into a ResourceClaim: a valid request left in the pod means the pod mutation did not run, and no node offers `<group>/<class>`, so the pod would stay pending for ever | `…: Forbidden: a GPUClass request must be turned into a ResourceClaim by the mutating webhook pods.<group>, which did not run for this pod` |
//! | 5 | every request of a ResourceClaim the pod names (`spec.resourceClaims[i].resourceClaimName`) whose `deviceClassName` is a GPUClass's (`<class>.<group>`) names a GPUClass that exists | `spec.resourceClaims[<i>].resourceClaimName: Invalid value: "<claim>": ResourceClaim "<claim>" asks for GPUClass "<class>" (spec.devices.requests[<j>]…deviceClassName), which does not exist` |
//! | 6 | a ResourceClaim the pod mutation made (labels `app.kubernetes.io/managed-by: vgpu-controller` and `<group>/admission-id: <id>`) is used only by the pod of the same admission id: it is that pod's private claim, deleted with it | `spec.resourceClaims[<i>].resourceClaimName: Invalid value: "<claim>": ResourceClaim "<claim>" was made by the pod mutation for another pod (label <group>/admission-id "<id>"; this pod has "<own>")` (or `has none`) |
//!
//! Rules 1-3 are the pod mutation's own checks (and the claim webhook's count rule), repeated because rule 4
//! must not hide a more precise message. Where the architecture is silent, the choices an operator expects:
//!
//! * A claim that is not in the controller's cache (not created yet, or created a moment ago) is allowed:
//!   DRA lets a pod name a claim before it exists, and the pod waits for it.
//! * ResourceClaimTemplates are not read: the claims made from them pass `/resourceclaims/validate` (the
//!   class must exist there) when the resourceclaim controller creates them.
//! * A request's count against the GPUs of its class is the claim webhook's rule, checked when the claim is
//!   created; the pod is not refused later because a node went away.
//!
//! # UPDATE
//!
//! Pods are mostly immutable, so on UPDATE a rule refuses only a violation the update brings in: when the
//! old object breaks the same rule with the same message, the update is allowed ([`validate_pod_update`]).
//! Deleting a GPUClass therefore never blocks the label, finalizer or deletion updates of the pods that
//! already use it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use vgpu_api::pod::containers;
use vgpu_api::{GPUClass, PhysicalGPU};
use vgpu_serve::admission::Denial;

use crate::config::ControllerConfig;
use crate::desired::MANAGED_BY;
use crate::desired::{MANAGED_BY_LABEL, most_on_one_node};

/// What the rules read besides the pod: the classes and GPUs (from the caches), and the ResourceClaims of the
/// pod's namespace that its `resourceClaimName`s name (missing ones left out).
#[derive(Debug, Clone, Copy)]
pub struct PodContext<'a> {
    /// GPUClasses now.
    pub classes: &'a [GPUClass],
    /// PhysicalGPUs now.
    pub gpus: &'a [PhysicalGPU],
    /// ResourceClaim name → claim, in the pod's namespace.
    pub claims: &'a BTreeMap<String, ResourceClaim>,
}

/// The rules of the module docs for one pod.
pub fn validate_pod(config: &ControllerConfig, ctx: PodContext<'_>, pod: &Pod) -> Result<(), Denial> {
    check_class_requests(config, ctx, pod)?;
    check_claims(config, ctx, pod)
}

/// UPDATE: [`validate_pod`] on `new`, except that a violation `old` has too (same message) is allowed.
pub fn validate_pod_update(
    config: &ControllerConfig,
    ctx: PodContext<'_>,
    old: &Pod,
    new: &Pod,
) -> Result<(), Denial> {
    match validate_pod(config, ctx, new) {
        Ok(()) => Ok(()),
        Err(d) if validate_pod(config, ctx, old).as_ref().err() == Some(&d) => {
            tracing::debug!(message = %d.message, "pod update keeps an existing violation; allowed");
            Ok(())
        }
        Err(d) => Err(d),
    }
}

/// The `resourceClaimName`s of the pod's claims, for the caller to look up.
pub fn claim_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|pc| pc.resource_claim_name.clone().filter(|n| !n.is_empty()))
        .collect()
}

/// Rules 1-4.
fn check_class_requests(config: &ControllerConfig, ctx: PodContext<'_>, pod: &Pod) -> Result<(), Denial> {
    let prefix = format!("{}/", config.group);
    for (slot, c) in containers(pod) {
        let resources = c.resources.as_ref();
        let maps = [
            ("limits", resources.and_then(|r| r.limits.as_ref())),
            ("requests", resources.and_then(|r| r.requests.as_ref())),
        ];
        for (map_name, map) in maps {
            for (key, quantity) in map.into_iter().flatten() {
                let Some(class_name) = key.strip_prefix(&prefix) else { continue };
                let deny = |why: String| {
                    Denial::new(format!(
                        "container {:?}: {}.resources.{map_name}[{key}]: {why}",
                        c.name,
                        slot.path()
                    ))
                };
                let q = &quantity.0;
                let count = vgpu_core::alloc::parse_quantity(q)
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| deny(format!("Invalid value: {q:?}: must be a positive integer")))?;
                let class = ctx
                    .classes
                    .iter()
                    .find(|k| k.name_any() == class_name)
                    .ok_or_else(|| deny(format!("Not found: GPUClass {class_name:?} does not exist")))?;
                if let Some(most) = most_on_one_node(class, ctx.gpus)
                    && count > most
                {
                    return Err(deny(format!(
                        "Invalid value: {count}: GPUClass {class_name:?} has at most {most} matching GPU{} on one node",
                        if most == 1 { "" } else { "s" }
                    )));
                }
                return Err(deny(format!(
                    "Forbidden: a GPUClass request must be turned into a ResourceClaim by the mutating webhook pods.{}, which did not run for this pod",
                    config.group
                )));
            }
        }
    }
    Ok(())
}

/// Rules 5-6.
fn check_claims(config: &ControllerConfig, ctx: PodContext<'_>, pod: &Pod) -> Result<(), Denial> {
    let admission_label = config.admission_label();
    let own_id = pod.labels().get(&admission_label);
    let pod_claims = pod.spec.iter().flat_map(|s| s.resource_claims.iter().flatten());
    for (i, pc) in pod_claims.enumerate() {
        let Some(name) = pc.resource_claim_name.as_deref().filter(|n| !n.is_empty()) else { continue };
        let Some(claim) = ctx.claims.get(name) else { continue };
        let deny = |why: String| {
            Denial::new(format!("spec.resourceClaims[{i}].resourceClaimName: Invalid value: {name:?}: {why}"))
        };
        for (field, device_class) in device_class_names(claim) {
            let Some(class_name) = config.class_of_device_class(device_class) else { continue };
            if !ctx.classes.iter().any(|k| k.name_any() == class_name) {
                return Err(deny(format!(
                    "ResourceClaim {name:?} asks for GPUClass {class_name:?} ({field}), which does not exist"
                )));
            }
        }
        let labels = claim.labels();
        let generated = labels.get(MANAGED_BY_LABEL).is_some_and(|v| v == MANAGED_BY);
        if let (true, Some(claim_id)) = (generated, labels.get(&admission_label))
            && own_id != Some(claim_id)
        {
            let own = own_id.map_or_else(|| "has none".to_owned(), |id| format!("has {id:?}"));
            return Err(deny(format!(
                "ResourceClaim {name:?} was made by the pod mutation for another pod (label {admission_label} {claim_id:?}; this pod {own})"
            )));
        }
    }
    Ok(())
}

/// Every `deviceClassName` of a claim's requests, with its field path.
fn device_class_names(claim: &ResourceClaim) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    let requests = claim.spec.iter().flat_map(|s| s.devices.iter()).flat_map(|d| d.requests.iter().flatten());
    for (j, r) in requests.enumerate() {
        if let Some(e) = &r.exactly {
            out.push((
                format!("spec.devices.requests[{j}].exactly.deviceClassName"),
                e.device_class_name.as_str(),
            ));
        }
        for (k, s) in r.first_available.iter().flatten().enumerate() {
            out.push((
                format!("spec.devices.requests[{j}].firstAvailable[{k}].deviceClassName"),
                s.device_class_name.as_str(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixture;

    fn ctx<'a>(
        classes: &'a [GPUClass],
        gpus: &'a [PhysicalGPU],
        claims: &'a BTreeMap<String, ResourceClaim>,
    ) -> PodContext<'a> {
        PodContext { classes, gpus, claims }
    }

    fn asking(class: &str, quantity: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {format!("gpu.deckhouse.io/{class}"): quantity}}}]}
        }))
        .unwrap()
    }

    fn class_claim(name: &str, device_class: &str) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 1}}]}}
        }))
        .unwrap()
    }

    #[test]
    fn class_requests_name_the_field() {
        let config = ControllerConfig::default();
        let classes = [fixture::class("a100-shared", "nvidia", Some("a100"), Some(4))];
        let gpus = [
            fixture::gpu("w1", 0, "nvidia", "a100", Some(40960)),
            fixture::gpu("w1", 1, "nvidia", "a100", Some(40960)),
        ];
        let claims = BTreeMap::new();
        let c = ctx(&classes, &gpus, &claims);
        let prefix = "container \"main\": spec.containers[0].resources.limits";
        assert_eq!(
            validate_pod(&config, c, &asking("a100-shared", "0")).unwrap_err().message,
            format!(
                "{prefix}[gpu.deckhouse.io/a100-shared]: Invalid value: \"0\": must be a positive integer"
            )
        );
        assert_eq!(
            validate_pod(&config, c, &asking("a100-shared", "1.5")).unwrap_err().message,
            format!(
                "{prefix}[gpu.deckhouse.io/a100-shared]: Invalid value: \"1.5\": must be a positive integer"
            )
        );
        assert_eq!(
            validate_pod(&config, c, &asking("h100", "1")).unwrap_err().message,
            format!("{prefix}[gpu.deckhouse.io/h100]: Not found: GPUClass \"h100\" does not exist")
        );
        assert_eq!(
            validate_pod(&config, c, &asking("a100-shared", "3")).unwrap_err().message,
            format!(
                "{prefix}[gpu.deckhouse.io/a100-shared]: Invalid value: 3: GPUClass \"a100-shared\" has at most 2 matching GPUs on one node"
            )
        );
        assert_eq!(
            validate_pod(&config, c, &asking("a100-shared", "2")).unwrap_err().message,
            format!(
                "{prefix}[gpu.deckhouse.io/a100-shared]: Forbidden: a GPUClass request must be turned into a ResourceClaim by the mutating webhook pods.gpu.deckhouse.io, which did not run for this pod"
            )
        );
        // No matching GPU yet: the count is not compared (the class's status explains), the request is still unconverted.
        assert!(
            validate_pod(&config, ctx(&classes, &[], &claims), &asking("a100-shared", "9"))
                .unwrap_err()
                .message
                .contains("Forbidden")
        );
        // Other resources and plain pods pass.
        let plain: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}], "containers": [{"name": "main"}]}
        }))
        .unwrap();
        assert_eq!(validate_pod(&config, c, &plain), Ok(()));
        // An init container's request in `requests` names that map.
        let init: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"initContainers": [{"name": "warm", "resources": {"requests": {"gpu.deckhouse.io/gone": "1"}}}], "containers": [{"name": "main"}]}
        }))
        .unwrap();
        assert_eq!(
            validate_pod(&config, c, &init).unwrap_err().message,
            "container \"warm\": spec.initContainers[0].resources.requests[gpu.deckhouse.io/gone]: Not found: GPUClass \"gone\" does not exist"
        );
    }

    #[test]
    fn claims_must_name_existing_classes_and_belong_to_the_pod() {
        let config = ControllerConfig::default();
        let classes = [fixture::class("a100-shared", "nvidia", None, Some(4))];
        let time = fixture::time(0);
        let mut mine = fixture::generated_claim("ml", "web-main-a100", "id-1", time);
        mine.spec = class_claim("x", "a100-shared.gpu.deckhouse.io").spec;
        let theirs = fixture::generated_claim("ml", "other-main-a100", "id-2", time);
        let gone = class_claim("old", "gone.gpu.deckhouse.io");
        let mut alternatives = class_claim("alt", "vgpu-manager");
        let r =
            &mut alternatives.spec.as_mut().unwrap().devices.as_mut().unwrap().requests.as_mut().unwrap()[0];
        r.exactly = None;
        r.first_available = Some(vec![k8s_openapi::api::resource::v1::DeviceSubRequest {
            name: "big".into(),
            device_class_name: "h100.gpu.deckhouse.io".into(),
            ..Default::default()
        }]);
        let claims: BTreeMap<String, ResourceClaim> =
            [mine, theirs, gone, alternatives, class_claim("plain", "vgpu-manager")]
                .into_iter()
                .map(|c| (c.name_any(), c))
                .collect();
        let c = ctx(&classes, &[], &claims);

        assert_eq!(
            validate_pod(
                &config,
                c,
                &fixture::pod("ml", "web", "", "id-1", &["web-main-a100", "plain", "missing"])
            ),
            Ok(())
        );
        assert_eq!(
            validate_pod(&config, c, &fixture::pod("ml", "web", "", "id-1", &["plain", "other-main-a100"]))
                .unwrap_err()
                .message,
            "spec.resourceClaims[1].resourceClaimName: Invalid value: \"other-main-a100\": ResourceClaim \"other-main-a100\" was made by the pod mutation for another pod (label gpu.deckhouse.io/admission-id \"id-2\"; this pod has \"id-1\")"
        );
        let mut unlabelled = fixture::pod("ml", "web", "", "id-1", &["web-main-a100"]);
        unlabelled.metadata.labels = None;
        assert_eq!(
            validate_pod(&config, c, &unlabelled).unwrap_err().message,
            "spec.resourceClaims[0].resourceClaimName: Invalid value: \"web-main-a100\": ResourceClaim \"web-main-a100\" was made by the pod mutation for another pod (label gpu.deckhouse.io/admission-id \"id-1\"; this pod has none)"
        );
        assert_eq!(
            validate_pod(&config, c, &fixture::pod("ml", "web", "", "id-1", &["old"])).unwrap_err().message,
            "spec.resourceClaims[0].resourceClaimName: Invalid value: \"old\": ResourceClaim \"old\" asks for GPUClass \"gone\" (spec.devices.requests[0].exactly.deviceClassName), which does not exist"
        );
        assert_eq!(
            validate_pod(&config, c, &fixture::pod("ml", "web", "", "id-1", &["alt"])).unwrap_err().message,
            "spec.resourceClaims[0].resourceClaimName: Invalid value: \"alt\": ResourceClaim \"alt\" asks for GPUClass \"h100\" (spec.devices.requests[0].firstAvailable[0].deviceClassName), which does not exist"
        );
        assert_eq!(claim_names(&fixture::pod("ml", "web", "", "id-1", &["a", "b"])), ["a", "b"]);
    }

    #[test]
    fn updates_refuse_only_new_violations() {
        let config = ControllerConfig::default();
        let claims: BTreeMap<String, ResourceClaim> =
            [("old".to_owned(), class_claim("old", "gone.gpu.deckhouse.io"))].into_iter().collect();
        let c = ctx(&[], &[], &claims);
        let before = fixture::pod("ml", "web", "u", "id-1", &["old"]);
        let mut after = before.clone();
        after.metadata.finalizers = None;
        assert_eq!(
            validate_pod_update(&config, c, &before, &after),
            Ok(()),
            "the class went away after the pod"
        );
        let good = fixture::pod("ml", "web", "u", "id-1", &["missing"]);
        assert!(validate_pod_update(&config, c, &good, &before).is_err(), "a violation the update brings in");
    }
}
