//! Every validation rule of contract §10 as a table, through `Admission::validate_pods` and
//! `Admission::validate_claims` over the in-memory cluster (`MemoryApi`): the exact denial message, and for a
//! converted pod the exact ResourceClaims created (and rolled back, and deleted with the pod).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde_json::{Value, json};
use vgpu_kube::claims::MemoryApi;
use vgpu_webhook::admit::Admission;
use vgpu_webhook::config::WebhookConfig;
use vgpu_webhook::mutate;

fn admission(api: &MemoryApi, config: WebhookConfig) -> Admission<MemoryApi> {
    Admission::new(config, api.clone()).with_clock(Arc::new(|| 1_700_000_000_123))
}

fn dra_admission() -> WebhookConfig {
    WebhookConfig { dra_admission: true, ..WebhookConfig::default() }
}

fn body(operation: &str, kind: (&str, &str, &str), object: Value, dry_run: bool) -> Vec<u8> {
    let (group, version, k) = kind;
    let field = if operation == "DELETE" { "oldObject" } else { "object" };
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": group, "version": version, "kind": k},
        "resource": {"group": group, "version": version, "resource": "x"}, "dryRun": dry_run,
        "operation": operation, "userInfo": {}, "namespace": "ml", "name": "web", field: object}}))
    .unwrap()
}

const POD: (&str, &str, &str) = ("", "v1", "Pod");

fn run(adm: &Admission<MemoryApi>, operation: &str, pod: Value, dry_run: bool) -> Value {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let review = rt.block_on(adm.validate_pods(&body(operation, POD, pod, dry_run))).unwrap();
    serde_json::to_value(review).unwrap()["response"].clone()
}

fn message(response: &Value) -> String {
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["reason"], "Invalid");
    response["status"]["message"].as_str().unwrap().to_owned()
}

fn vgpu_claim(name: &str, requests: &[&str]) -> ResourceClaim {
    let reqs: Vec<Value> =
        requests.iter().map(|r| json!({"name": r, "exactly": {"deviceClassName": "vgpu-manager"}})).collect();
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "ml"}, "spec": {"devices": {"requests": reqs}}}),
    )
    .unwrap()
}

fn ctr(name: &str, claims: Value) -> Value {
    json!({"name": name, "resources": {"claims": claims}})
}

fn pod(containers: Value, init: Value, claims: &[&str]) -> Value {
    let pcs: Vec<Value> = claims.iter().map(|c| json!({"name": c, "resourceClaimName": c})).collect();
    json!({"metadata": {"name": "web", "namespace": "ml"},
        "spec": {"containers": containers, "initContainers": init, "resourceClaims": pcs}})
}

#[test]
fn sharing_rules_inside_one_pod() {
    let api = MemoryApi::new();
    api.put_claim(vgpu_claim("a", &["r1", "r2"]));
    api.put_claim(vgpu_claim("b", &["r1"]));
    api.put_claim(
        serde_json::from_value(json!({"metadata": {"name": "nic", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "n", "exactly": {"deviceClassName": "sriov"}}]}}}))
        .unwrap(),
    );
    let adm = admission(&api, dra_admission());
    let always = |name: &str, claims: Value| json!({"name": name, "restartPolicy": "Always", "resources": {"claims": claims}});
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "two vgpu claims in one container",
            pod(
                json!([ctr("main", json!([{"name": "a", "request": "r1"}, {"name": "b"}]))]),
                json!([]),
                &["a", "b"],
            ),
            Some(
                r#"app container "main" references multiple vgpu claims [a b]; one container can use at most one vgpu claim"#,
            ),
        ),
        (
            "two app containers, one request",
            pod(
                json!([ctr("x", json!([{"name": "a", "request": "r1"}])), ctr("y", json!([{"name": "a"}]))]),
                json!([]),
                &["a"],
            ),
            Some(
                r#"vgpu request "a/r1" is referenced by multiple app containers [x y]; concurrent app containers cannot share a vgpu request"#,
            ),
        ),
        (
            "two sidecars, one request",
            pod(
                json!([{"name": "main"}]),
                json!([always("s1", json!([{"name": "b"}])), always("s2", json!([{"name": "b"}]))]),
                &["b"],
            ),
            Some(
                r#"vgpu request "b/r1" is referenced by multiple sidecar containers [s1 s2]; concurrent sidecar containers cannot share a vgpu request"#,
            ),
        ),
        (
            "sidecar and app container",
            pod(
                json!([ctr("main", json!([{"name": "b"}]))]),
                json!([always("s1", json!([{"name": "b"}]))]),
                &["b"],
            ),
            Some(
                r#"vgpu request "b/r1" is referenced by sidecar [s1] together with other containers; a sidecar runs concurrently with the app phase and must be the sole user of a vgpu request"#,
            ),
        ),
        (
            "init container overlapping two app containers",
            pod(
                json!([
                    ctr("x", json!([{"name": "a", "request": "r1"}])),
                    ctr("y", json!([{"name": "a", "request": "r2"}]))
                ]),
                json!([ctr("setup", json!([{"name": "a"}]))]),
                &["a"],
            ),
            Some(
                r#"init container "setup" overlaps vgpu requests with multiple app containers [x y]; an init container may only share vgpu requests with at most one app container"#,
            ),
        ),
        (
            "reference to a missing pod claim",
            pod(json!([ctr("main", json!([{"name": "zz"}]))]), json!([]), &["a"]),
            Some(r#"app container "main" claim "zz" validation failed: pod resourceClaim "zz" not found"#),
        ),
        (
            "request not in the claim",
            pod(json!([ctr("main", json!([{"name": "a", "request": "r9"}]))]), json!([]), &["a"]),
            Some(
                r#"app container "main" claim "a" validation failed: request "r9" not found in pod resourceClaim "a""#,
            ),
        ),
        (
            "init container sharing with one app container",
            pod(
                json!([ctr("main", json!([{"name": "a", "request": "r1"}]))]),
                json!([ctr("setup", json!([{"name": "a", "request": "r1"}]))]),
                &["a"],
            ),
            None,
        ),
        (
            "sequential init containers may share",
            pod(
                json!([{"name": "main"}]),
                json!([ctr("i1", json!([{"name": "b"}])), ctr("i2", json!([{"name": "b"}]))]),
                &["b"],
            ),
            None,
        ),
        (
            "non-vgpu claim shared by app containers",
            pod(
                json!([ctr("x", json!([{"name": "nic"}])), ctr("y", json!([{"name": "nic"}]))]),
                json!([]),
                &["nic"],
            ),
            None,
        ),
        (
            "claim not created yet",
            pod(
                json!([ctr("x", json!([{"name": "later"}])), ctr("y", json!([{"name": "later"}]))]),
                json!([]),
                &["later"],
            ),
            None,
        ),
    ];
    for (what, p, want) in cases {
        let r = run(&adm, "CREATE", p.clone(), false);
        match want {
            Some(m) => assert_eq!(message(&r), m, "{what}"),
            None => assert_eq!(r["allowed"], true, "{what}: {r}"),
        }
        // Without --dra-admission-enabled nothing is checked.
        let off = admission(&api, WebhookConfig::default());
        assert_eq!(run(&off, "CREATE", p, false)["allowed"], true, "{what} (rules off)");
    }
}

#[test]
fn a_device_class_or_selector_makes_a_request_vgpu() {
    let api = MemoryApi::new();
    api.put_device_class(serde_json::from_value::<DeviceClass>(json!({"metadata": {"name": "gpus"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'manager.nvidia.com' && device.attributes['manager.nvidia.com'].type == 'vgpu'"}}]}})).unwrap());
    api.put_claim(serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "ml"}, "spec": {"devices": {"requests": [
        {"name": "by-class", "exactly": {"deviceClassName": "gpus"}},
        {"name": "by-selector", "exactly": {"deviceClassName": "other", "selectors": [
            {"cel": {"expression": "device.attributes[\"manager.nvidia.com\"].type == \"vgpu\""}}]}},
        {"name": "mixed", "firstAvailable": [{"name": "v", "deviceClassName": "gpus"}, {"name": "w", "deviceClassName": "other"}]}
    ]}}})).unwrap());
    let adm = admission(&api, dra_admission());
    for req in ["by-class", "by-selector"] {
        let p = pod(
            json!([
                ctr("x", json!([{"name": "c", "request": req}])),
                ctr("y", json!([{"name": "c", "request": req}]))
            ]),
            json!([]),
            &["c"],
        );
        let m = message(&run(&adm, "CREATE", p, false));
        assert!(
            m.starts_with(&format!("vgpu request \"c/{req}\" is referenced by multiple app containers")),
            "{m}"
        );
    }
    // A mixed firstAvailable request is left to the claim webhook.
    let p = pod(
        json!([
            ctr("x", json!([{"name": "c", "request": "mixed"}])),
            ctr("y", json!([{"name": "c", "request": "mixed"}]))
        ]),
        json!([]),
        &["c"],
    );
    assert_eq!(run(&adm, "CREATE", p, false)["allowed"], true);
}

#[test]
fn cross_pod_sharing_of_a_named_claim() {
    let api = MemoryApi::new();
    let mut shared = vgpu_claim("shared", &["r1", "r2"]);
    shared.status = Some(
        serde_json::from_value(
            json!({"reservedFor": [{"resource": "pods", "name": "first", "uid": "uid-first"}]}),
        )
        .unwrap(),
    );
    api.put_claim(shared);
    api.put_pod(serde_json::from_value(json!({"metadata": {"name": "first", "namespace": "ml", "uid": "uid-first"},
        "spec": {"containers": [ctr("m", json!([{"name": "g", "request": "r1"}]))], "resourceClaims": [{"name": "g", "resourceClaimName": "shared"}]}})).unwrap());
    let adm = admission(&api, dra_admission());
    let same =
        pod(json!([ctr("main", json!([{"name": "shared", "request": "r1"}]))]), json!([]), &["shared"]);
    assert_eq!(
        message(&run(&adm, "CREATE", same, false)),
        r#"pod "web" and pod ml/first both use vgpu requests [r1] from claim "shared"; cross-pod sharing of the same vgpu request is not allowed"#
    );
    let other =
        pod(json!([ctr("main", json!([{"name": "shared", "request": "r2"}]))]), json!([]), &["shared"]);
    assert_eq!(run(&adm, "CREATE", other, false)["allowed"], true);
    // A stale reservation (another pod now has the name) does not count.
    api.put_pod(serde_json::from_value(json!({"metadata": {"name": "first", "namespace": "ml", "uid": "uid-new"},
        "spec": {"containers": [ctr("m", json!([{"name": "g", "request": "r1"}]))], "resourceClaims": [{"name": "g", "resourceClaimName": "shared"}]}})).unwrap());
    let same =
        pod(json!([ctr("main", json!([{"name": "shared", "request": "r1"}]))]), json!([]), &["shared"]);
    assert_eq!(run(&adm, "CREATE", same, false)["allowed"], true);
}

fn dra() -> WebhookConfig {
    WebhookConfig { convert_to_dra: true, dra_admission: true, ..WebhookConfig::default() }
}

/// A pod as `/pods/mutate` leaves it with convert2-dra on.
fn converted(config: &WebhookConfig, containers: Value, annotations: Value) -> Value {
    let p = serde_json::from_value(
        json!({"metadata": {"name": "web", "namespace": "ml", "annotations": annotations},
        "spec": {"containers": containers}}),
    )
    .unwrap();
    serde_json::to_value(mutate::mutate_pod(config, "uid-1", &p).unwrap()).unwrap()
}

fn limits(number: &str, cores: &str, memory: &str) -> Value {
    json!({"nvidia.com/vgpu-number": number, "nvidia.com/vgpu-cores": cores, "nvidia.com/vgpu-memory": memory})
}

#[test]
fn converted_pods_get_their_claims() {
    let api = MemoryApi::new();
    let cfg = dra();
    let adm = admission(&api, cfg.clone());
    let p = converted(
        &cfg,
        json!([{"name": "a", "resources": {"limits": limits("2", "50", "1024")}}, {"name": "b", "resources": {"limits": limits("1", "0", "0")}}]),
        json!({"nvidia.com/include-gpu-uuid": "GPU-AB", "nvidia.com/device-topology-mode": "numa"}),
    );
    assert_eq!(run(&adm, "CREATE", p.clone(), false)["allowed"], true);
    let claims: Vec<Value> = api.claims().iter().map(|c| serde_json::to_value(c).unwrap()).collect();
    assert_eq!(claims.len(), 2);
    let a = claims
        .iter()
        .find(|c| c["metadata"]["name"] == json!(vgpu_api::names::safe_resource_name(&["web", "a"])))
        .unwrap();
    let sel = |t: &str| json!({"cel": {"expression": t}});
    assert_eq!(
        a["metadata"]["labels"],
        json!({"vgpu-manager.io/owner-key": "ml-web", "vgpu-manager.io/create-timestamp": "1700000000123"})
    );
    assert_eq!(
        a["spec"]["devices"],
        json!({
            "requests": [{"name": "vgpu", "exactly": {
                "deviceClassName": "vgpu-manager", "allocationMode": "ExactCount", "count": 2,
                "capacity": {"requests": {"cores": "50", "memory": "1024Mi"}},
                "selectors": [
                    sel(r#"device.attributes["manager.nvidia.com"].type == "vgpu""#),
                    sel(r#"device.attributes["manager.nvidia.com"].uuid in ["gpu-ab"]"#),
                ]}}],
            "constraints": [
                {"requests": ["vgpu"], "distinctAttribute": "manager.nvidia.com/uuid"},
                {"requests": ["vgpu"], "matchAttribute": "manager.nvidia.com/numaNode"},
            ]
        })
    );
    let b = claims
        .iter()
        .find(|c| c["metadata"]["name"] == json!(vgpu_api::names::safe_resource_name(&["web", "b"])))
        .unwrap();
    assert_eq!(
        b["spec"]["devices"]["requests"][0]["exactly"]["capacity"],
        json!({"requests": {"cores": "100"}})
    );
    assert!(b["spec"]["devices"].get("constraints").is_none());

    // The API server calling again for the same pod is fine (the claims are ours).
    assert_eq!(run(&adm, "CREATE", p.clone(), false)["allowed"], true);
    // Deleting the pod deletes its claims.
    assert_eq!(run(&adm, "DELETE", p, false)["allowed"], true);
    assert!(api.claims().is_empty());
    assert_eq!(api.deleted().len(), 2);
}

#[test]
fn combined_claim_holds_every_request() {
    let api = MemoryApi::new();
    let cfg = WebhookConfig { combined_claim: true, ..dra() };
    let adm = admission(&api, cfg.clone());
    let p = converted(
        &cfg,
        json!([{"name": "a", "resources": {"limits": limits("1", "10", "0")}}, {"name": "b", "resources": {"limits": limits("1", "20", "0")}}]),
        json!({}),
    );
    assert_eq!(run(&adm, "CREATE", p, false)["allowed"], true);
    let claims = api.claims();
    assert_eq!(claims.len(), 1);
    let requests = claims[0].spec.as_ref().unwrap().devices.as_ref().unwrap().requests.as_ref().unwrap();
    let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            vgpu_api::names::safe_resource_name(&["a", "vgpu"]),
            vgpu_api::names::safe_resource_name(&["b", "vgpu"])
        ]
    );
}

#[test]
fn claim_creation_is_all_or_nothing_and_dry_runs_store_nothing() {
    let api = MemoryApi::new();
    let cfg = dra();
    let adm = admission(&api, cfg.clone());
    let p = converted(
        &cfg,
        json!([{"name": "a", "resources": {"limits": limits("1", "10", "0")}}, {"name": "b", "resources": {"limits": limits("1", "20", "0")}}]),
        json!({}),
    );
    assert_eq!(run(&adm, "CREATE", p.clone(), true)["allowed"], true);
    assert!(api.claims().is_empty());
    assert_eq!(api.create_calls(), 2);

    // The second create fails: the first claim is deleted again and the pod denied.
    let flaky = MemoryApi::new();
    let adm = admission(&flaky, cfg.clone());
    flaky.put_claim(ResourceClaim::default()); // unrelated object in another namespace
    let first = vgpu_api::names::safe_resource_name(&["web", "a"]);
    let second = vgpu_api::names::safe_resource_name(&["web", "b"]);
    let mut foreign = vgpu_claim(&second, &["vgpu"]);
    foreign.metadata.labels = Some([("vgpu-manager.io/owner-key".to_owned(), "ml-other".to_owned())].into());
    flaky.put_claim(foreign);
    let m = message(&run(&adm, "CREATE", p, false));
    assert_eq!(
        m,
        format!(
            "create ResourceClaim ml/{second}: already exists: ResourceClaim ml/{second} exists and does not belong to pod ml-web (label vgpu-manager.io/owner-key)"
        )
    );
    assert_eq!(flaky.deleted(), [("ml".to_owned(), first)]);
}

#[test]
fn bad_records_are_denied() {
    let api = MemoryApi::new();
    let adm = admission(&api, dra());
    let with = |record: &str, containers: Value, claims: Value| {
        json!({"metadata": {"name": "web", "namespace": "ml", "annotations": {"vgpu-manager.io/original-resources": record}},
            "spec": {"containers": containers, "resourceClaims": claims}})
    };
    let m = message(&run(&adm, "CREATE", with("[{", json!([{"name": "a"}]), json!([])), false));
    assert!(m.starts_with("invalid vgpu-manager.io/original-resources annotation: "), "{m}");
    let rec = r#"[{"name":"ghost","claimName":"c1","requestName":"vgpu","resources":{"nvidia.com/vgpu-number":"1"}}]"#;
    assert_eq!(
        message(&run(
            &adm,
            "CREATE",
            with(rec, json!([{"name": "a"}]), json!([{"name": "c1", "resourceClaimName": "c1"}])),
            false
        )),
        r#"Pod "web" is invalid: metadata.annotations[vgpu-manager.io/original-resources][0].containerName: Invalid value: "ghost": container not found"#
    );
    let rec = r#"[{"name":"a","claimName":"c1","requestName":"vgpu","resources":{"nvidia.com/vgpu-number":"1","nvidia.com/vgpu-cores":"300"}}]"#;
    assert_eq!(
        message(&run(
            &adm,
            "CREATE",
            with(rec, json!([{"name": "a"}]), json!([{"name": "c1", "resourceClaimName": "c1"}])),
            false
        )),
        r#"Pod "web" is invalid: spec.containers[0].resources.limits[nvidia.com/vgpu-cores]: Invalid value: 300: request exceeds limit, maximum: 100"#
    );
    let rec =
        r#"[{"name":"a","claimName":"c1","requestName":"vgpu","resources":{"nvidia.com/vgpu-number":"1"}}]"#;
    assert_eq!(
        message(&run(&adm, "CREATE", with(rec, json!([{"name": "a"}]), json!([])), false)),
        r#"Pod "web" is invalid: spec.resourceClaims: Invalid value: ResourceClaimName "c1" not found"#
    );
    assert!(api.claims().is_empty());
}

fn claim_review(operation: &str, kind: &str, version: &str, object: Value) -> Value {
    let adm = admission(&MemoryApi::new(), dra());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let r = rt
        .block_on(adm.validate_claims(&body(operation, ("resource.k8s.io", version, kind), object, false)))
        .unwrap();
    serde_json::to_value(r).unwrap()["response"].clone()
}

#[test]
fn opaque_configs_of_our_driver_must_be_known_kinds() {
    let claim = |params: Value, driver: &str| {
        json!({"metadata": {"name": "c", "namespace": "ml"}, "spec": {"devices": {"requests": [],
            "config": [{"opaque": {"driver": driver, "parameters": params}}]}}})
    };
    let ok = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"});
    assert_eq!(
        claim_review("CREATE", "ResourceClaim", "v1", claim(ok, "manager.nvidia.com"))["allowed"],
        true
    );
    let other_driver = json!({"apiVersion": "x/v1", "kind": "Y"});
    assert_eq!(
        claim_review("UPDATE", "ResourceClaim", "v1", claim(other_driver, "gpu.example.com"))["allowed"],
        true
    );
    let unknown = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "TpuConfig"});
    assert_eq!(
        message(&claim_review("CREATE", "ResourceClaim", "v1", claim(unknown, "manager.nvidia.com"))),
        "1 configs failed to validate: expected a recognized configuration type at spec.devices.config[0].opaque.parameters but got: resource.nvidia.com/v1beta1/TpuConfig"
    );
    let template = json!({"metadata": {"name": "t", "namespace": "ml"}, "spec": {"spec": {"devices": {"config": [
        {"opaque": {"driver": "manager.nvidia.com", "parameters": [1]}},
        {"opaque": {"driver": "manager.nvidia.com", "parameters": {"kind": "GpuConfig"}}}]}}}});
    assert_eq!(
        message(&claim_review("CREATE", "ResourceClaimTemplate", "v1", template)),
        "2 configs failed to validate: error decoding object at spec.spec.devices.config[0].opaque.parameters: expected a JSON object with apiVersion and kind; error decoding object at spec.spec.devices.config[1].opaque.parameters: apiVersion and kind must be set"
    );
    assert_eq!(
        message(&claim_review("CREATE", "ResourceClaim", "v1beta1", json!({}))),
        "expected a resource.k8s.io/v1 ResourceClaim or ResourceClaimTemplate, got resource.k8s.io/v1beta1 ResourceClaim"
    );
}

fn allocated_claim(name: &str, uid: &str, requests: &[&str], reserved: &[(&str, &str)]) -> Value {
    let reqs: Vec<Value> =
        requests.iter().map(|r| json!({"name": r, "exactly": {"deviceClassName": "vgpu-manager"}})).collect();
    let results: Vec<Value> = requests
        .iter()
        .map(|r| json!({"request": r, "driver": "manager.nvidia.com", "pool": "n1", "device": "vgpu-0"}))
        .collect();
    let reserved: Vec<Value> =
        reserved.iter().map(|(n, u)| json!({"resource": "pods", "name": n, "uid": u})).collect();
    json!({"metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"devices": {"requests": reqs}},
        "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}})
}

fn reserved_pod(
    name: &str,
    uid: &str,
    containers: Value,
    init: Value,
    claims: Value,
) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"containers": containers, "initContainers": init, "resourceClaims": claims}}))
    .unwrap()
}

fn status_update(adm: &Admission<MemoryApi>, claim: Value) -> Value {
    let mut b: Value =
        serde_json::from_slice(&body("UPDATE", ("resource.k8s.io", "v1", "ResourceClaim"), claim, false))
            .unwrap();
    b["request"]["subResource"] = json!("status");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let r = rt.block_on(adm.validate_claims(&serde_json::to_vec(&b).unwrap())).unwrap();
    serde_json::to_value(r).unwrap()["response"].clone()
}

#[test]
fn allocated_claims_keep_the_sharing_rules_across_reserved_pods() {
    let api = MemoryApi::new();
    let adm = admission(&api, dra_admission());
    let named = json!([{"name": "g", "resourceClaimName": "shared"}]);
    let uses = |c: &str, req: Option<&str>| json!({"name": c, "resources": {"claims": [{"name": "g", "request": req}]}});
    api.put_pod(reserved_pod("p1", "u1", json!([uses("a", Some("r1"))]), json!([]), named.clone()));
    api.put_pod(reserved_pod("p2", "u2", json!([uses("b", None)]), json!([]), named.clone()));
    let two_pods = allocated_claim("shared", "c-uid", &["r1"], &[("p1", "u1"), ("p2", "u2")]);
    // Containers are keyed by pod: two pods' app containers are two app containers (checked first, as upstream).
    assert_eq!(
        message(&status_update(&adm, two_pods.clone())),
        r#"allocated vgpu request "r1" in claim ml/shared is referenced by multiple app containers [ml/p1/a ml/p2/b]"#
    );
    // Init containers may share inside one pod, never across pods.
    api.put_pod(reserved_pod(
        "q1",
        "v1",
        json!([{"name": "m"}]),
        json!([uses("i", Some("r1"))]),
        named.clone(),
    ));
    api.put_pod(reserved_pod(
        "q2",
        "v2",
        json!([{"name": "m"}]),
        json!([uses("i", Some("r1"))]),
        named.clone(),
    ));
    assert_eq!(
        message(&status_update(
            &adm,
            allocated_claim("shared", "c-uid", &["r1"], &[("q1", "v1"), ("q2", "v2")])
        )),
        r#"allocated vgpu request "r1" in claim ml/shared is shared by multiple pods [ml/q1 ml/q2]"#
    );
    // Without --dra-admission-enabled only the opaque configs are checked.
    let off = admission(&api, WebhookConfig::default());
    assert_eq!(status_update(&off, two_pods)["allowed"], true);
    // A stale reservation (UID of an older pod) is ignored.
    let stale = allocated_claim("shared", "c-uid", &["r1"], &[("p1", "u1"), ("p2", "old")]);
    assert_eq!(status_update(&adm, stale)["allowed"], true);

    api.put_pod(reserved_pod(
        "p3",
        "u3",
        json!([uses("a", Some("r1")), uses("b", Some("r1"))]),
        json!([]),
        named.clone(),
    ));
    assert_eq!(
        message(&status_update(&adm, allocated_claim("shared", "c-uid", &["r1"], &[("p3", "u3")]))),
        r#"allocated vgpu request "r1" in claim ml/shared is referenced by multiple app containers [ml/p3/a ml/p3/b]"#
    );
    let sidecar = json!({"name": "s", "restartPolicy": "Always", "resources": {"claims": [{"name": "g"}]}});
    api.put_pod(reserved_pod("p4", "u4", json!([uses("a", Some("r1"))]), json!([sidecar]), named.clone()));
    assert_eq!(
        message(&status_update(&adm, allocated_claim("shared", "c-uid", &["r1"], &[("p4", "u4")]))),
        r#"allocated vgpu request "r1" in claim ml/shared is referenced by sidecar [ml/p4/s] together with other containers; a sidecar must be the sole user of a vgpu request"#
    );

    // A container using two allocated vGPU claims, one of them generated from a template.
    let mut other: ResourceClaim =
        serde_json::from_value(allocated_claim("p5-tmpl-xyz", "t-uid", &["v"], &[("p5", "u5")])).unwrap();
    other.metadata.namespace = Some("ml".into());
    api.put_claim(other);
    let mut p5 = reserved_pod(
        "p5",
        "u5",
        json!([{"name": "a", "resources": {"claims": [{"name": "g"}, {"name": "t"}]}}]),
        json!([]),
        json!([{"name": "g", "resourceClaimName": "shared"}, {"name": "t", "resourceClaimTemplateName": "tmpl"}]),
    );
    p5.status = Some(
        serde_json::from_value(
            json!({"resourceClaimStatuses": [{"name": "t", "resourceClaimName": "p5-tmpl-xyz"}]}),
        )
        .unwrap(),
    );
    api.put_pod(p5);
    assert_eq!(
        message(&status_update(&adm, allocated_claim("shared", "c-uid", &["r1"], &[("p5", "u5")]))),
        r#"pod ml/p5 app container "a" uses multiple allocated vgpu claims [c-uid t-uid]; one container can use at most one vgpu claim"#
    );

    // One pod, one app container, an init container before it: allowed. A non-vGPU allocation: allowed.
    api.put_pod(reserved_pod(
        "p6",
        "u6",
        json!([uses("a", Some("r1"))]),
        json!([uses("i", Some("r1"))]),
        named,
    ));
    assert_eq!(
        status_update(&adm, allocated_claim("shared", "c-uid", &["r1"], &[("p6", "u6")]))["allowed"],
        true
    );
    let mut gpu = allocated_claim("shared", "c-uid", &["r1"], &[("p1", "u1"), ("p2", "u2")]);
    gpu["status"]["allocation"]["devices"]["results"][0]["driver"] = json!("gpu.example.com");
    assert_eq!(status_update(&adm, gpu)["allowed"], true);
}
