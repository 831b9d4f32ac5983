//! Properties of the pure pod admission rules (`pod_validation`, `pod_update`) over arbitrary pods: validation
//! never panics and refuses every pod that still holds a `gpu.deckhouse.io/<class>` resource (naming that
//! field); an update that changes nothing is never refused; the UPDATE mutation is idempotent, leaves everything
//! but the admission-id label as the update wrote it, and always ends with the old pod's id.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use vgpu_controller::config::ControllerConfig;
use vgpu_controller::fixture;
use vgpu_controller::pod_update::restore_admission_label;
use vgpu_controller::pod_validation::{PodContext, validate_pod, validate_pod_update};

const ID_LABEL: &str = "gpu.deckhouse.io/admission-id";
const RESOURCES: &[&str] =
    &["gpu.deckhouse.io/a100-shared", "gpu.deckhouse.io/gone", "nvidia.com/gpu", "cpu", "example.com/fpga"];
const CLAIMS: &[&str] = &["mine", "theirs", "gone", "missing"];

fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["0", "1", "2", "3", "100", "1.5", "-1", "2Ki"]).prop_map(str::to_owned),
        1 => "\\PC{0,6}",
    ]
}

fn resources() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(prop::sample::select(RESOURCES), quantity(), 0..3)
        .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_owned(), Value::String(v))).collect())
}

fn container(i: usize) -> impl Strategy<Value = Value> {
    (resources(), any::<bool>()).prop_map(move |(limits, in_requests)| {
        let key = if in_requests { "requests" } else { "limits" };
        json!({"name": format!("c{i}"), "resources": {key: limits}})
    })
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        prop::collection::vec(container(0), 1..3),
        prop::collection::vec(container(9), 0..2),
        prop::collection::vec(prop::sample::select(CLAIMS), 0..3),
        prop::option::of(prop::sample::select(vec!["id-mine", "id-theirs", "other"])),
        any::<bool>(),
    )
        .prop_map(|(containers, init, claims, id, team)| {
            let mut labels = Map::new();
            if let Some(id) = id {
                labels.insert(ID_LABEL.to_owned(), json!(id));
            }
            if team {
                labels.insert("team".to_owned(), json!("a"));
            }
            let claims: Vec<Value> = claims
                .iter()
                .enumerate()
                .map(|(i, c)| json!({"name": format!("p{i}"), "resourceClaimName": c}))
                .collect();
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "ml", "labels": labels},
                "spec": {"containers": containers, "initContainers": init, "resourceClaims": claims}
            }))
            .unwrap()
        })
}

struct World {
    classes: Vec<vgpu_api::GPUClass>,
    gpus: Vec<vgpu_api::PhysicalGPU>,
    claims: BTreeMap<String, ResourceClaim>,
}

fn world() -> World {
    let mut gone: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "gone", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gone.gpu.deckhouse.io"}}]}}}))
    .unwrap();
    gone.metadata.uid = Some("uid-gone".into());
    let claims = [
        fixture::generated_claim("ml", "mine", "id-mine", fixture::time(0)),
        fixture::generated_claim("ml", "theirs", "id-theirs", fixture::time(0)),
        gone,
    ]
    .into_iter()
    .map(|c| (c.name_any(), c))
    .collect();
    World {
        classes: vec![fixture::class("a100-shared", "nvidia", Some("a100"), Some(4))],
        gpus: vec![fixture::gpu("w1", 0, "nvidia", "a100", Some(40960))],
        claims,
    }
}

fn has_class_resource(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref().unwrap();
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| {
        let r = c.resources.as_ref();
        [r.and_then(|r| r.limits.as_ref()), r.and_then(|r| r.requests.as_ref())]
            .into_iter()
            .flatten()
            .any(|m| m.keys().any(|k| k.starts_with("gpu.deckhouse.io/")))
    })
}

proptest! {
    #[test]
    fn validation_refuses_every_unconverted_request(pod in pod()) {
        let w = world();
        let ctx = PodContext { classes: &w.classes, gpus: &w.gpus, claims: &w.claims };
        let config = ControllerConfig::default();
        let outcome = validate_pod(&config, ctx, &pod);
        if has_class_resource(&pod) {
            let d = outcome.expect_err("an unconverted GPUClass request is refused");
            prop_assert!(d.message.contains("resources."), "{}", d.message);
            prop_assert!(d.message.contains("[gpu.deckhouse.io/"), "{}", d.message);
        } else if let Err(d) = outcome {
            prop_assert!(d.message.starts_with("spec.resourceClaims["), "{}", d.message);
        }
        // An update that changes nothing is never refused.
        prop_assert_eq!(validate_pod_update(&config, ctx, &pod, &pod), Ok(()));
    }

    #[test]
    fn update_mutation_only_restores_the_label(old in pod(), new in pod()) {
        let config = ControllerConfig::default();
        let Some(restored) = restore_admission_label(&config, &old, &new) else {
            let kept = old.labels().get(ID_LABEL).is_none()
                || old.spec.as_ref().unwrap().resource_claims.as_ref().is_none_or(Vec::is_empty)
                || new.labels().get(ID_LABEL) == old.labels().get(ID_LABEL);
            prop_assert!(kept);
            return Ok(());
        };
        prop_assert_eq!(restored.labels().get(ID_LABEL), old.labels().get(ID_LABEL));
        prop_assert_eq!(&restored.spec, &new.spec);
        let mut others = restored.labels().clone();
        others.remove(ID_LABEL);
        let mut new_others = new.labels().clone();
        new_others.remove(ID_LABEL);
        prop_assert_eq!(others, new_others);
        prop_assert_eq!(restore_admission_label(&config, &old, &restored), None, "idempotent");
    }
}
