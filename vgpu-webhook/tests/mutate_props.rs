//! Properties of the pure pod mutation (`mutate::pod_patch`) over arbitrary pods and configurations: it never
//! panics; its patch applies to the pod as received and yields exactly the mutated pod; and it is idempotent
//! (mutating a mutated pod adds nothing).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use vgpu_core::model::{SchedulingPolicy, TopologyMode};
use vgpu_webhook::config::WebhookConfig;
use vgpu_webhook::mutate;

const RESOURCES: &[&str] =
    &["nvidia.com/vgpu-number", "nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory", "example.com/fpga", "cpu"];
const ANNOTATIONS: &[&str] = &[
    "nvidia.com/node-scheduler-policy",
    "nvidia.com/device-scheduler-policy",
    "nvidia.com/memory-scheduler-policy",
    "nvidia.com/device-topology-mode",
    "nvidia.com/pre-allocated",
    "nvidia.com/predicate-time",
    "nvidia.com/include-gpu-uuid",
    "vgpu-manager.io/original-resources",
    "team",
];
const LABELS: &[&str] = &["nvidia.com/assigned-phase", "nvidia.com/metrics-node", "app"];

fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec!["0", "1", "2", "3", "16", "50", "100", "4Ki", "2k"]).prop_map(str::to_owned),
        1 => prop::sample::select(vec!["17", "101", "500m", "1.5"]).prop_map(str::to_owned),
        1 => "[0-9a-zA-Z.+-]{0,6}",
    ]
}

fn string_map(
    keys: &'static [&'static str],
    value: BoxedStrategy<String>,
) -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(prop::sample::select(keys.to_vec()), value, 0..4)
        .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_owned(), Value::String(v))).collect())
}

fn container(name: String) -> impl Strategy<Value = Value> {
    (
        prop::option::of(string_map(RESOURCES, quantity().boxed())),
        prop::option::of(string_map(RESOURCES, quantity().boxed())),
        prop::option::of(prop::collection::vec(("c[0-2]", prop::option::of("vgpu|r1")), 0..3)),
        any::<bool>(),
    )
        .prop_map(move |(limits, requests, claims, sidecar)| {
            let mut resources = Map::new();
            if let Some(l) = limits {
                resources.insert("limits".into(), Value::Object(l));
            }
            if let Some(r) = requests {
                resources.insert("requests".into(), Value::Object(r));
            }
            if let Some(c) = claims {
                let c: Vec<Value> = c.into_iter().map(|(n, r)| json!({"name": n, "request": r})).collect();
                resources.insert("claims".into(), Value::Array(c));
            }
            let mut c = json!({"name": name.clone(), "resources": resources});
            if sidecar {
                c["restartPolicy"] = json!("Always");
            }
            c
        })
}

fn containers(prefix: &'static str, max: usize) -> impl Strategy<Value = Vec<Value>> {
    (0..=max).prop_flat_map(move |n| (0..n).map(|i| container(format!("{prefix}{i}"))).collect::<Vec<_>>())
}

fn annotation_value() -> BoxedStrategy<String> {
    prop_oneof![
        prop::sample::select(vec!["binpack", "spread", "virtual", "link", "", "[]", "[{\"name\":\"a0\"}]"])
            .prop_map(str::to_owned),
        ".{0,12}",
    ]
    .boxed()
}

fn pod() -> impl Strategy<Value = Value> {
    (
        (prop::option::of("[a-z]{1,8}"), prop::option::of("[a-z]{1,8}-?")),
        prop::option::of(string_map(ANNOTATIONS, annotation_value())),
        prop::option::of(string_map(LABELS, "[a-z]{0,4}".boxed())),
        containers("a", 3),
        prop::option::of(containers("i", 2)),
        (
            prop::option::of("[a-z-]{0,6}"),
            prop::option::of("default-scheduler|volcano|"),
            prop::option::of("[a-z]{0,4}"),
        ),
        prop::option::of(prop::collection::vec(("c[0-2]", prop::option::of("c[0-2]")), 0..3)),
        prop::option::of(string_map(&["zone", "kubernetes.io/hostname"], "[a-z]{1,3}".boxed())),
    )
        .prop_map(
            |(
                (name, generate),
                annotations,
                labels,
                apps,
                inits,
                (node, scheduler, runtime),
                claims,
                selector,
            )| {
                let mut metadata = Map::new();
                if let Some(n) = name {
                    metadata.insert("name".into(), json!(n));
                }
                if let Some(g) = generate {
                    metadata.insert("generateName".into(), json!(g));
                }
                if let Some(a) = annotations {
                    metadata.insert("annotations".into(), Value::Object(a));
                }
                if let Some(l) = labels {
                    metadata.insert("labels".into(), Value::Object(l));
                }
                let mut spec = json!({"containers": apps});
                if let Some(i) = inits {
                    spec["initContainers"] = json!(i);
                }
                if let Some(n) = node {
                    spec["nodeName"] = json!(n);
                }
                if let Some(s) = scheduler {
                    spec["schedulerName"] = json!(s);
                }
                if let Some(r) = runtime {
                    spec["runtimeClassName"] = json!(r);
                }
                if let Some(c) = claims {
                    let c: Vec<Value> =
                        c.into_iter().map(|(n, r)| json!({"name": n, "resourceClaimName": r})).collect();
                    spec["resourceClaims"] = json!(c);
                }
                if let Some(s) = selector {
                    spec["nodeSelector"] = Value::Object(s);
                }
                json!({"metadata": metadata, "spec": spec})
            },
        )
}

fn config() -> impl Strategy<Value = WebhookConfig> {
    (
        prop::option::of(Just("vgpu-scheduler".to_owned())),
        prop::option::of(prop::sample::select(vec![SchedulingPolicy::Binpack, SchedulingPolicy::Spread])),
        prop::option::of(prop::sample::select(vec![TopologyMode::Numa, TopologyMode::LinkStrict])),
        prop::option::of(Just("nvidia".to_owned())),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(scheduler_name, policy, mode, runtime, convert, combined)| WebhookConfig {
            scheduler_name,
            default_node_policy: policy,
            default_device_policy: policy,
            default_topology_mode: mode,
            default_runtime_class: runtime,
            convert_to_dra: convert,
            combined_claim: convert && combined,
            ..WebhookConfig::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutation_patches_exactly_and_is_idempotent(raw in pod(), config in config(), uid in "[a-z0-9-]{1,12}") {
        let pod: Pod = serde_json::from_value(raw).unwrap();
        let Ok(patch) = mutate::pod_patch(&config, &uid, &pod) else { return Ok(()) };
        let mutated = mutate::mutate_pod(&config, &uid, &pod).unwrap();
        // The patch applies to the pod as received and yields the mutated pod.
        let mut doc = serde_json::to_value(&pod).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        prop_assert_eq!(&doc, &serde_json::to_value(&mutated).unwrap());
        // Mutating the mutated pod (even under another request UID) adds nothing.
        let again = mutate::pod_patch(&config, "another-uid", &mutated);
        prop_assert!(again.is_ok(), "{:?}", again);
        prop_assert!(again.unwrap().0.is_empty(), "second pass changed {}", serde_json::to_string(&doc).unwrap());
        // The validating route never panics on what the mutation produced, and creates one claim per recorded
        // claim name when the pod was converted.
        let api = vgpu_kube::claims::MemoryApi::new();
        let validating = WebhookConfig { dra_admission: true, ..config.clone() };
        let admission = vgpu_webhook::admit::Admission::new(validating, api.clone());
        let body = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
                "userInfo": {}, "namespace": "ns", "name": "p", "object": doc}})).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let answer = serde_json::to_value(rt.block_on(admission.validate_pods(&body)).unwrap()).unwrap();
        let record = mutated.metadata.annotations.as_ref().and_then(|a| a.get("vgpu-manager.io/original-resources"));
        if config.convert_to_dra && answer["response"]["allowed"] == json!(true)
            && let Some(infos) = record.and_then(|r| vgpu_webhook::convert::decode_record(r).ok())
        {
            let names: std::collections::BTreeSet<&str> = infos.iter().map(|i| i.claim_name.as_str()).collect();
            prop_assert_eq!(api.claims().len(), names.len());
        }
    }

    #[test]
    fn arbitrary_json_never_panics(raw in any::<Vec<u8>>()) {
        let admission = vgpu_webhook::admit::Admission::new(WebhookConfig::default(), vgpu_kube::claims::MemoryApi::new());
        let _ = admission.mutate_pods(&raw);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let _ = rt.block_on(admission.validate_claims(&raw));
    }
}
