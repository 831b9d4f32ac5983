//! Every mutation rule of contract §10 as a table: pod in → the exact JSON patch out (or the exact denial),
//! through the pure decision function `mutate::pod_patch` and, for operations and the wire form, through
//! `Admission::mutate_pods`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{SchedulingPolicy, TopologyMode};
use vgpu_kube::claims::MemoryApi;
use vgpu_webhook::admit::Admission;
use vgpu_webhook::config::WebhookConfig;
use vgpu_webhook::mutate;

fn config() -> WebhookConfig {
    WebhookConfig {
        scheduler_name: Some("vgpu-scheduler".into()),
        default_node_policy: Some(SchedulingPolicy::Binpack),
        default_device_policy: Some(SchedulingPolicy::Spread),
        default_topology_mode: Some(TopologyMode::Link),
        default_runtime_class: Some("nvidia".into()),
        ..WebhookConfig::default()
    }
}

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn patch(config: &WebhookConfig, p: Value) -> Value {
    serde_json::to_value(mutate::pod_patch(config, "uid-1", &pod(p)).unwrap()).unwrap()
}

fn denial(config: &WebhookConfig, p: Value) -> String {
    mutate::pod_patch(config, "uid-1", &pod(p)).unwrap_err().message
}

fn ctr(name: &str, limits: Value) -> Value {
    json!({"name": name, "resources": {"limits": limits}})
}

fn plain(containers: Value) -> Value {
    json!({"metadata": {"name": "web", "namespace": "ml"}, "spec": {"containers": containers}})
}

/// The patch a single-GPU vGPU pod without annotations gets besides its container defaults.
fn vgpu_pod_defaults() -> Vec<Value> {
    vec![json!({"op": "add", "path": "/metadata/annotations", "value": {
        "nvidia.com/device-scheduler-policy": "spread", "nvidia.com/node-scheduler-policy": "binpack"}})]
}

#[test]
fn number_without_cores_or_memory_gets_whole_card_cores() {
    let got = patch(&config(), plain(json!([ctr("main", json!({"nvidia.com/vgpu-number": "1"}))])));
    let mut want = vgpu_pod_defaults();
    want.extend([
        json!({"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-cores", "value": "100"}),
        json!({"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"}),
        json!({"op": "add", "path": "/spec/schedulerName", "value": "vgpu-scheduler"}),
    ]);
    assert_eq!(got, Value::Array(want));
}

#[test]
fn defaults_are_mirrored_into_requests() {
    let c = json!({"name": "main", "resources": {
        "limits": {"nvidia.com/vgpu-cores": "30"}, "requests": {"nvidia.com/vgpu-cores": "30"}}});
    let cfg = WebhookConfig::default();
    assert_eq!(
        patch(&cfg, plain(json!([c]))),
        json!([
            {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-number", "value": "1"},
            {"op": "add", "path": "/spec/containers/0/resources/requests/nvidia.com~1vgpu-number", "value": "1"},
        ])
    );
}

#[test]
fn cores_or_memory_without_number_get_one_vgpu() {
    let cfg = WebhookConfig::default();
    for limits in [json!({"nvidia.com/vgpu-cores": "50"}), json!({"nvidia.com/vgpu-memory": "4Ki"})] {
        assert_eq!(
            patch(&cfg, plain(json!([ctr("main", limits.clone())]))),
            json!([{"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-number", "value": "1"}]),
            "{limits}"
        );
    }
    // Number and memory: no cores default (memory alone decides the share).
    let limits = json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "2048"});
    assert_eq!(patch(&cfg, plain(json!([ctr("main", limits)]))), json!([]));
}

#[test]
fn bad_limits_are_denied_naming_container_and_field() {
    let cfg = config();
    let cases = [
        (
            json!({"nvidia.com/vgpu-number": "1.5"}),
            r#"container "main": spec.containers[1].resources.limits[nvidia.com/vgpu-number]: Invalid value: "1.5": must be a non-negative integer"#,
        ),
        (
            json!({"nvidia.com/vgpu-number": "17"}),
            r#"container "main": spec.containers[1].resources.limits[nvidia.com/vgpu-number]: Invalid value: "17": request exceeds limit, maximum: 16"#,
        ),
        (
            json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "101"}),
            r#"container "main": spec.containers[1].resources.limits[nvidia.com/vgpu-cores]: Invalid value: "101": request exceeds limit, maximum: 100"#,
        ),
        (
            json!({"nvidia.com/vgpu-memory": "-1"}),
            r#"container "main": spec.containers[1].resources.limits[nvidia.com/vgpu-memory]: Invalid value: "-1": must be a non-negative integer"#,
        ),
    ];
    for (limits, message) in cases {
        let p = plain(json!([ctr("side", json!({})), ctr("main", limits)]));
        assert_eq!(denial(&cfg, p), message);
    }
    let init = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "main"}],
        "initContainers": [ctr("setup", json!({"nvidia.com/vgpu-cores": "x"}))]}});
    assert_eq!(
        denial(&cfg, init),
        r#"container "setup": spec.initContainers[0].resources.limits[nvidia.com/vgpu-cores]: Invalid value: "x": must be a non-negative integer"#
    );
}

#[test]
fn scheduler_name_only_replaces_empty_or_default() {
    let cfg = WebhookConfig { scheduler_name: Some("vgpu-scheduler".into()), ..WebhookConfig::default() };
    let limits = json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10"});
    for (given, want) in [
        (None, json!([{"op": "add", "path": "/spec/schedulerName", "value": "vgpu-scheduler"}])),
        (
            Some("default-scheduler"),
            json!([{"op": "replace", "path": "/spec/schedulerName", "value": "vgpu-scheduler"}]),
        ),
        (Some("volcano"), json!([])),
    ] {
        let mut p = plain(json!([ctr("main", limits.clone())]));
        if let Some(s) = given {
            p["spec"]["schedulerName"] = json!(s);
        }
        assert_eq!(patch(&cfg, p), want, "{given:?}");
    }
}

#[test]
fn policies_and_runtime_class_are_defaults_only() {
    let cfg = config();
    let p = json!({"metadata": {"name": "web", "annotations": {
            "nvidia.com/node-scheduler-policy": "spread", "nvidia.com/device-scheduler-policy": "binpack"}},
        "spec": {"runtimeClassName": "kata", "schedulerName": "vgpu-scheduler",
            "containers": [ctr("main", json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10"}))]}});
    assert_eq!(patch(&cfg, p), json!([]));
}

#[test]
fn non_vgpu_pods_lose_policy_annotations_only() {
    let p = json!({"metadata": {"name": "web", "annotations": {
            "nvidia.com/node-scheduler-policy": "spread", "nvidia.com/device-scheduler-policy": "binpack",
            "nvidia.com/memory-scheduler-policy": "virtual", "nvidia.com/device-topology-mode": "link", "team": "a"}},
        "spec": {"containers": [ctr("main", json!({"cpu": "1"}))]}});
    assert_eq!(
        patch(&config(), p),
        json!([
            {"op": "remove", "path": "/metadata/annotations/nvidia.com~1device-scheduler-policy"},
            {"op": "remove", "path": "/metadata/annotations/nvidia.com~1memory-scheduler-policy"},
            {"op": "remove", "path": "/metadata/annotations/nvidia.com~1node-scheduler-policy"},
        ])
    );
}

#[test]
fn topology_mode_only_for_multi_gpu_containers() {
    let cfg =
        WebhookConfig { default_topology_mode: Some(TopologyMode::NumaStrict), ..WebhookConfig::default() };
    let two = json!({"nvidia.com/vgpu-number": "2", "nvidia.com/vgpu-cores": "50"});
    assert_eq!(
        patch(
            &cfg,
            plain(json!([
                ctr("a", json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "5"})),
                ctr("b", two.clone())
            ]))
        ),
        json!([{"op": "add", "path": "/metadata/annotations", "value": {"nvidia.com/device-topology-mode": "numa-strict"}}])
    );
    let one = json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "50"});
    assert_eq!(patch(&cfg, plain(json!([ctr("a", one)]))), json!([]));
    let mut given = plain(json!([ctr("b", two)]));
    given["metadata"]["annotations"] = json!({"nvidia.com/device-topology-mode": "none"});
    assert_eq!(patch(&cfg, given), json!([]));
}

#[test]
fn node_name_becomes_a_hostname_selector_for_vgpu_dra_and_extended_pods() {
    let cfg = WebhookConfig::default();
    let moved = json!([
        {"op": "add", "path": "/spec/nodeSelector", "value": {"kubernetes.io/hostname": "gpu-1"}},
        {"op": "remove", "path": "/spec/nodeName"},
    ]);
    let with_node = |containers: Value, extra: Value| {
        let mut p = plain(containers);
        p["spec"]["nodeName"] = json!("gpu-1");
        if let Value::Object(m) = extra {
            for (k, v) in m {
                p["spec"][k] = v;
            }
        }
        p
    };
    let vgpu = json!([ctr("main", json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1024"}))]);
    assert_eq!(patch(&cfg, with_node(vgpu, json!({}))), moved);
    let ext = json!([ctr("main", json!({"example.com/fpga": "1"}))]);
    assert_eq!(patch(&cfg, with_node(ext, json!({}))), moved);
    let claims = json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]});
    assert_eq!(patch(&cfg, with_node(json!([{"name": "main"}]), claims)), moved);
    // An existing selector keeps its other keys.
    let sel = json!({"nodeSelector": {"zone": "a"}});
    let vgpu = json!([ctr("main", json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1024"}))]);
    assert_eq!(
        patch(&cfg, with_node(vgpu, sel)),
        json!([
            {"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": "gpu-1"},
            {"op": "remove", "path": "/spec/nodeName"},
        ])
    );
    // A mirror pod (static pod of a kubelet) stays bound.
    let mut mirror = with_node(
        json!([ctr("main", json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "1024"}))]),
        json!({}),
    );
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    assert_eq!(patch(&cfg, mirror), json!([]));
    // A pod without vGPU, claims or extended resources keeps its nodeName.
    let cpu = json!([ctr("main", json!({"cpu": "2", "hugepages-2Mi": "0"}))]);
    assert_eq!(patch(&cfg, with_node(cpu, json!({}))), json!([]));
}

#[test]
fn stale_scheduling_metadata_is_stripped_from_every_pod() {
    // vgpu-manager's CleanupMetadata deleted the annotation keys from the labels map and left them (§5.6).
    let p = json!({"metadata": {"name": "web",
            "annotations": {"nvidia.com/pre-allocated": "main[0_GPU-a_100_1024]", "nvidia.com/real-allocated": "",
                "nvidia.com/predicate-node": "n1", "nvidia.com/predicate-time": "9223372036854775807", "keep": "1"},
            "labels": {"nvidia.com/assigned-phase": "succeed", "nvidia.com/metrics-node": "n1", "app": "x"}},
        "spec": {"containers": [{"name": "main"}]}});
    assert_eq!(
        patch(&WebhookConfig::default(), p),
        json!([
            {"op": "remove", "path": "/metadata/annotations/nvidia.com~1pre-allocated"},
            {"op": "remove", "path": "/metadata/annotations/nvidia.com~1predicate-node"},
            {"op": "remove", "path": "/metadata/annotations/nvidia.com~1predicate-time"},
            {"op": "remove", "path": "/metadata/annotations/nvidia.com~1real-allocated"},
            {"op": "remove", "path": "/metadata/labels/nvidia.com~1assigned-phase"},
            {"op": "remove", "path": "/metadata/labels/nvidia.com~1metrics-node"},
        ])
    );
}

#[test]
fn another_domain_is_honoured() {
    let cfg =
        WebhookConfig { domain: ResourceDomain::new("example.com").unwrap(), ..WebhookConfig::default() };
    assert_eq!(
        patch(&cfg, plain(json!([ctr("main", json!({"example.com/vgpu-number": "1"}))]))),
        json!([{"op": "add", "path": "/spec/containers/0/resources/limits/example.com~1vgpu-cores", "value": "100"}])
    );
    // nvidia.com limits are then just an extended resource.
    assert_eq!(patch(&cfg, plain(json!([ctr("main", json!({"nvidia.com/vgpu-number": "1"}))]))), json!([]));
}

fn dra() -> WebhookConfig {
    WebhookConfig { convert_to_dra: true, ..WebhookConfig::default() }
}

fn claim_name(parts: &[&str]) -> String {
    vgpu_api::names::safe_resource_name(parts)
}

#[test]
fn convert2dra_per_container_claims() {
    let c = json!({"name": "main", "resources": {
        "limits": {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "2048", "cpu": "1"},
        "requests": {"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-memory": "2048", "cpu": "1"}}});
    let p = json!({"metadata": {"name": "web", "namespace": "ml"},
        "spec": {"initContainers": [ctr("warm", json!({"nvidia.com/vgpu-number": "1"}))], "containers": [c, {"name": "log"}]}});
    let warm = claim_name(&["web", "warm"]);
    let main = claim_name(&["web", "main"]);
    let record = format!(
        r#"[{{"name":"warm","claimName":"{warm}","requestName":"vgpu","resources":{{"nvidia.com/vgpu-cores":"100","nvidia.com/vgpu-memory":"0","nvidia.com/vgpu-number":"1"}}}},{{"name":"main","claimName":"{main}","requestName":"vgpu","resources":{{"nvidia.com/vgpu-cores":"0","nvidia.com/vgpu-memory":"2048","nvidia.com/vgpu-number":"1"}}}}]"#
    );
    assert_eq!(
        patch(&dra(), p),
        json!([
            {"op": "add", "path": "/metadata/annotations", "value": {"vgpu-manager.io/original-resources": record}},
            {"op": "add", "path": "/spec/containers/0/resources/claims", "value": [{"name": main, "request": "vgpu"}]},
            {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-memory"},
            {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-number"},
            {"op": "remove", "path": "/spec/containers/0/resources/requests/nvidia.com~1vgpu-memory"},
            {"op": "remove", "path": "/spec/containers/0/resources/requests/nvidia.com~1vgpu-number"},
            {"op": "add", "path": "/spec/initContainers/0/resources/claims", "value": [{"name": warm, "request": "vgpu"}]},
            {"op": "remove", "path": "/spec/initContainers/0/resources/limits/nvidia.com~1vgpu-number"},
            {"op": "add", "path": "/spec/resourceClaims", "value": [
                {"name": warm, "resourceClaimName": warm}, {"name": main, "resourceClaimName": main}]},
        ])
    );
}

#[test]
fn convert2dra_combined_claim_and_generate_name() {
    let cfg = WebhookConfig { combined_claim: true, ..dra() };
    let suffix = vgpu_api::names::short_hash("uid-1", 5);
    let p = json!({"metadata": {"generateName": "job-", "namespace": "ml"},
        "spec": {"containers": [ctr("a", json!({"nvidia.com/vgpu-number": "1", "nvidia.com/vgpu-cores": "10"})),
                                ctr("b", json!({"nvidia.com/vgpu-number": "2", "nvidia.com/vgpu-cores": "20"}))]}});
    let claim = claim_name(&[&format!("job-{suffix}")]);
    let (ra, rb) = (claim_name(&["a", "vgpu"]), claim_name(&["b", "vgpu"]));
    let got = patch(&cfg, p);
    let record: Value =
        serde_json::from_str(got[0]["value"]["vgpu-manager.io/original-resources"].as_str().unwrap())
            .unwrap();
    assert_eq!(record[0]["claimName"], json!(claim));
    assert_eq!(record[1]["claimName"], json!(claim));
    assert_eq!((record[0]["requestName"].clone(), record[1]["requestName"].clone()), (json!(ra), json!(rb)));
    assert_eq!(
        got.as_array().unwrap()[1..],
        [
            json!({"op": "add", "path": "/spec/containers/0/resources/claims", "value": [{"name": claim, "request": ra}]}),
            json!({"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-cores"}),
            json!({"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-number"}),
            json!({"op": "add", "path": "/spec/containers/1/resources/claims", "value": [{"name": claim, "request": rb}]}),
            json!({"op": "remove", "path": "/spec/containers/1/resources/limits/nvidia.com~1vgpu-cores"}),
            json!({"op": "remove", "path": "/spec/containers/1/resources/limits/nvidia.com~1vgpu-number"}),
            json!({"op": "add", "path": "/spec/resourceClaims", "value": [{"name": claim, "resourceClaimName": claim}]}),
        ]
    );
}

#[test]
fn a_converted_pod_is_left_alone_and_still_counts_as_vgpu() {
    let cfg = WebhookConfig { default_node_policy: Some(SchedulingPolicy::Binpack), ..dra() };
    let p = pod(plain(json!([ctr("main", json!({"nvidia.com/vgpu-number": "2"}))])));
    let once = mutate::mutate_pod(&cfg, "uid-1", &p).unwrap();
    assert_eq!(
        once.metadata.annotations.as_ref().unwrap()["nvidia.com/node-scheduler-policy"],
        "binpack",
        "policies stay on a converted pod"
    );
    let again = serde_json::to_value(mutate::pod_patch(&cfg, "uid-2", &once).unwrap()).unwrap();
    assert_eq!(again, json!([]));
}

fn review(operation: &str, object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-7", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation, "userInfo": {}, "namespace": "ml", "name": "web", "object": object}}))
    .unwrap()
}

#[test]
fn the_wire_answer_carries_a_base64_json_patch_and_other_operations_pass() {
    let admission = Admission::new(config(), MemoryApi::new());
    let p = plain(json!([ctr("main", json!({"nvidia.com/vgpu-number": "1"}))]));
    let answer = serde_json::to_value(admission.mutate_pods(&review("CREATE", p.clone())).unwrap()).unwrap();
    let r = &answer["response"];
    assert_eq!(
        (r["uid"].clone(), r["allowed"].clone(), r["patchType"].clone()),
        (json!("u-7"), json!(true), json!("JSONPatch"))
    );
    // kube writes the patch bytes as a JSON array of numbers, which the API server's decoder takes for []byte.
    let bytes: Vec<u8> = serde_json::from_value(r["patch"].clone()).unwrap();
    let decoded: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(decoded, patch(&config(), p.clone()));
    let update = serde_json::to_value(admission.mutate_pods(&review("UPDATE", p)).unwrap()).unwrap();
    assert_eq!(update["response"]["allowed"], true);
    assert!(update["response"].get("patch").is_none());
}

#[test]
fn a_denial_on_the_wire_has_reason_invalid() {
    let admission = Admission::new(config(), MemoryApi::new());
    let p = plain(json!([ctr("main", json!({"nvidia.com/vgpu-cores": "200"}))]));
    let answer = serde_json::to_value(admission.mutate_pods(&review("CREATE", p)).unwrap()).unwrap();
    assert_eq!(
        answer["response"],
        json!({"uid": "u-7", "allowed": false, "status": {"status": "Failure", "code": 422, "reason": "Invalid",
            "message": "container \"main\": spec.containers[0].resources.limits[nvidia.com/vgpu-cores]: Invalid value: \"200\": request exceeds limit, maximum: 100"}})
    );
}
