//! The Volcano Job routes (`/volcano-jobs/mutate`, `/volcano-jobs/validate`) through `Admission` over the
//! in-memory cluster (`MemoryApi`): the CREATE patch and the template names (per container, per task when
//! combined, with `generateName`), no conversion without `--default-convert2-dra` or of a converted Job, the
//! ResourceClaimTemplates created (all or none, dry runs store nothing) and deleted, the record refused when it
//! does not match the Job, and the UPDATE that makes the Job the templates' owner and shrinks the record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::{Value, json};
use vgpu_api::names::{safe_resource_name, short_hash};
use vgpu_kube::claims::{ClusterApi, MemoryApi};
use vgpu_webhook::admit::Admission;
use vgpu_webhook::config::WebhookConfig;

const RECORD: &str = "vgpu-manager.io/original-resources";

fn dra() -> WebhookConfig {
    WebhookConfig { convert_to_dra: true, ..WebhookConfig::default() }
}

fn admission(api: &MemoryApi, config: WebhookConfig) -> Admission<MemoryApi> {
    Admission::new(config, api.clone()).with_clock(Arc::new(|| 1_700_000_000_123))
}

fn ctr(name: &str, limits: Value) -> Value {
    json!({"name": name, "image": "train:1", "resources": {"limits": limits}})
}

fn vgpu(number: &str) -> Value {
    json!({"nvidia.com/vgpu-number": number})
}

fn task(name: &str, containers: Value) -> Value {
    json!({"name": name, "replicas": 2, "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"restartPolicy": "Never", "containers": containers}}})
}

fn job(tasks: Value) -> Value {
    json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "uid": "uid-job"},
        "spec": {"minAvailable": 2, "schedulerName": "volcano", "queue": "default", "tasks": tasks}})
}

/// Job "train" with tasks "a" and "b", each one container "main" asking one vGPU, after `/volcano-jobs/mutate`
/// CREATE (request UID `u-1`).
fn two_tasks_converted(adm: &Admission<MemoryApi>) -> Value {
    let tasks =
        json!([task("a", json!([ctr("main", vgpu("1"))])), task("b", json!([ctr("main", vgpu("1"))]))]);
    mutated(adm, "CREATE", "u-1", &job(tasks))
}

fn body(operation: &str, uid: &str, object: &Value, dry_run: bool) -> Vec<u8> {
    let field = if operation == "DELETE" { "oldObject" } else { "object" };
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
        "resource": {"group": "batch.volcano.sh", "version": "v1alpha1", "resource": "jobs"}, "dryRun": dry_run,
        "operation": operation, "userInfo": {}, "namespace": "ml", "name": name, field: object}}))
    .unwrap()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
}

fn mutate(adm: &Admission<MemoryApi>, operation: &str, uid: &str, job: &Value, dry_run: bool) -> Value {
    let review = block_on(adm.mutate_volcano_jobs(&body(operation, uid, job, dry_run))).unwrap();
    serde_json::to_value(review).unwrap()["response"].clone()
}

fn validate(adm: &Admission<MemoryApi>, operation: &str, job: &Value, dry_run: bool) -> Value {
    let review = block_on(adm.validate_volcano_jobs(&body(operation, "u-v", job, dry_run))).unwrap();
    serde_json::to_value(review).unwrap()["response"].clone()
}

/// The response's patch (kube writes its bytes as an array of numbers); `None` without one.
fn patch_of(response: &Value) -> Option<json_patch::Patch> {
    assert_eq!(response["allowed"], true, "{response}");
    let bytes: Vec<u8> = serde_json::from_value(response.get("patch")?.clone()).unwrap();
    Some(serde_json::from_slice(&bytes).unwrap())
}

/// `job` as the API server stores it after `/volcano-jobs/mutate` answered CREATE (or UPDATE).
fn mutated(adm: &Admission<MemoryApi>, operation: &str, uid: &str, job: &Value) -> Value {
    let mut out = job.clone();
    if let Some(p) = patch_of(&mutate(adm, operation, uid, job, false)) {
        json_patch::patch(&mut out, &p).unwrap();
    }
    out
}

fn message(response: &Value) -> String {
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["reason"], "Invalid");
    response["status"]["message"].as_str().unwrap().to_owned()
}

fn record(job: &Value) -> Value {
    serde_json::from_str(job["metadata"]["annotations"][RECORD].as_str().unwrap()).unwrap()
}

fn info(container: &str, claim: &str, request: &str, number: &str, cores: &str) -> Value {
    json!({"name": container, "claimName": claim, "requestName": request, "resources": {
        "nvidia.com/vgpu-cores": cores, "nvidia.com/vgpu-memory": "0", "nvidia.com/vgpu-number": number}})
}

/// The per-container template name of `container` in task `task` of the Job `train`.
fn per_container(task: &str, container: &str) -> String {
    safe_resource_name(&[&safe_resource_name(&["train", task]), container])
}

fn template_names(api: &MemoryApi) -> Vec<String> {
    api.templates().iter().map(|t| t.metadata.name.clone().unwrap()).collect()
}

#[test]
fn create_converts_every_vgpu_container_of_a_task_template() {
    let adm = admission(&MemoryApi::new(), dra());
    let mut original = job(json!([
        task("worker", json!([ctr("main", vgpu("2")), ctr("log", json!({"cpu": "1"}))])),
        task("ps", json!([ctr("main", json!({"cpu": "2"}))])),
    ]));
    original["spec"]["tasks"][0]["template"]["spec"]["initContainers"] =
        json!([ctr("warmup", json!({"nvidia.com/vgpu-cores": "30", "cpu": "1"}))]);
    let response = mutate(&adm, "CREATE", "u-1", &original, false);
    let patch = patch_of(&response).unwrap();
    for op in &patch.0 {
        let path = op.path().to_string();
        assert!(
            path.starts_with("/metadata/annotations") || path.starts_with("/spec/tasks/0/template/spec/"),
            "{path}"
        );
    }
    let mut got = original.clone();
    json_patch::patch(&mut got, &patch).unwrap();

    let main = per_container("worker", "main");
    let warmup = per_container("worker", "warmup");
    let mut want = original.clone();
    let spec = &mut want["spec"]["tasks"][0]["template"]["spec"];
    spec["initContainers"][0]["resources"] =
        json!({"limits": {"cpu": "1"}, "claims": [{"name": warmup, "request": "vgpu"}]});
    spec["containers"][0]["resources"] = json!({"limits": {}, "claims": [{"name": main, "request": "vgpu"}]});
    spec["resourceClaims"] = json!([
        {"name": warmup, "resourceClaimTemplateName": warmup},
        {"name": main, "resourceClaimTemplateName": main},
    ]);
    assert_eq!(
        record(&got),
        json!({"worker": [info("warmup", &warmup, "vgpu", "1", "30"), info("main", &main, "vgpu", "2", "100")]})
    );
    want["metadata"]["annotations"] = json!({RECORD: got["metadata"]["annotations"][RECORD].clone()});
    assert_eq!(got, want);

    // A converted Job is not converted again.
    assert_eq!(patch_of(&mutate(&adm, "CREATE", "u-2", &got, false)), None);
}

#[test]
fn tasks_with_a_container_of_the_same_name_get_distinct_templates() {
    let adm = admission(&MemoryApi::new(), dra());
    let got = two_tasks_converted(&adm);
    let (a, b) = (per_container("a", "main"), per_container("b", "main"));
    assert_ne!(a, b);
    assert_eq!(
        record(&got),
        json!({"a": [info("main", &a, "vgpu", "1", "100")], "b": [info("main", &b, "vgpu", "1", "100")]})
    );
    assert_eq!(
        got["spec"]["tasks"][1]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
        b
    );
}

#[test]
fn combined_claim_is_one_template_per_task() {
    let cfg = WebhookConfig { combined_claim: true, ..dra() };
    let api = MemoryApi::new();
    let adm = admission(&api, cfg);
    let got = mutated(
        &adm,
        "CREATE",
        "u-1",
        &job(json!([
            task("a", json!([ctr("x", vgpu("1")), ctr("y", vgpu("1"))])),
            task("b", json!([ctr("x", vgpu("1"))]))
        ])),
    );
    let base = format!("train-{}", short_hash("u-1", 5));
    // The task base (`<job>-<suffix>-<task>-<hash>`), made safe once more as the pod code does for combined claims.
    let a = safe_resource_name(&[&safe_resource_name(&[&base, "a"])]);
    let b = safe_resource_name(&[&safe_resource_name(&[&base, "b"])]);
    let (rx, ry) = (safe_resource_name(&["x", "vgpu"]), safe_resource_name(&["y", "vgpu"]));
    assert_eq!(
        record(&got),
        json!({"a": [info("x", &a, &rx, "1", "100"), info("y", &a, &ry, "1", "100")],
            "b": [info("x", &b, &rx, "1", "100")]})
    );
    assert_eq!(
        got["spec"]["tasks"][0]["template"]["spec"]["resourceClaims"],
        json!([{"name": a, "resourceClaimTemplateName": a}])
    );
    assert_eq!(validate(&adm, "CREATE", &got, false)["allowed"], true);
    assert_eq!(template_names(&api), [a.clone(), b]);
    let t = api.templates().into_iter().find(|t| t.metadata.name.as_deref() == Some(&a)).unwrap();
    let requests = t.spec.unwrap().spec.unwrap().devices.unwrap().requests.unwrap();
    assert_eq!(requests.iter().map(|r| r.name.clone()).collect::<Vec<_>>(), [rx, ry]);
}

#[test]
fn generate_name_bases_names_on_the_request_uid() {
    let adm = admission(&MemoryApi::new(), dra());
    let mut original = job(json!([task("w", json!([ctr("main", vgpu("1"))]))]));
    original["metadata"] = json!({"generateName": "train-", "namespace": "ml"});
    let names = |uid: &str| {
        let got = mutated(&adm, "CREATE", uid, &original);
        record(&got)["w"][0]["claimName"].as_str().unwrap().to_owned()
    };
    let want = safe_resource_name(&[
        &safe_resource_name(&[&format!("train-{}", short_hash("u-1", 5)), "w"]),
        "main",
    ]);
    assert_eq!(names("u-1"), want);
    assert_eq!(names("u-1"), want, "a retried request gets the same names");
    assert_ne!(names("u-2"), want);
}

#[test]
fn without_convert2_dra_everything_passes_unchanged() {
    let api = MemoryApi::new();
    let adm = admission(&api, WebhookConfig::default());
    let original = job(json!([task("w", json!([ctr("main", vgpu("1"))]))]));
    assert_eq!(patch_of(&mutate(&adm, "CREATE", "u-1", &original, false)), None);
    let converted = mutated(&admission(&api, dra()), "CREATE", "u-1", &original);
    for op in ["CREATE", "DELETE"] {
        assert_eq!(validate(&adm, op, &converted, false)["allowed"], true);
    }
    assert_eq!(patch_of(&mutate(&adm, "UPDATE", "u-2", &converted, false)), None);
    assert!(api.templates().is_empty());
    assert_eq!(api.create_calls(), 0);
    // Nor does a Job without vGPUs change with it.
    let plain = job(json!([task("w", json!([ctr("main", json!({"cpu": "1"}))]))]));
    assert_eq!(patch_of(&mutate(&admission(&api, dra()), "CREATE", "u-1", &plain, false)), None);
}

#[test]
fn malformed_limits_are_denied_naming_the_task() {
    let adm = admission(&MemoryApi::new(), dra());
    let bad = job(json!([task("w", json!([ctr("main", json!({"nvidia.com/vgpu-cores": "150"}))]))]));
    assert_eq!(
        message(&mutate(&adm, "CREATE", "u-1", &bad, false)),
        r#"task "w" (spec.tasks[0].template): container "main": spec.containers[0].resources.limits[nvidia.com/vgpu-cores]: Invalid value: "150": request exceeds limit, maximum: 100"#
    );
    let mut other = bad.clone();
    other["kind"] = json!("Deployment");
    let review = block_on(
        adm.mutate_volcano_jobs(
            &serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "operation": "CREATE", "userInfo": {}, "namespace": "ml", "name": "train", "object": other}}),
            )
            .unwrap(),
        ),
    )
    .unwrap();
    assert_eq!(
        message(&serde_json::to_value(review).unwrap()["response"]),
        "expected a batch.volcano.sh/v1alpha1 Job, got apps/v1 Deployment"
    );
}

#[test]
fn validate_create_makes_the_templates_and_delete_removes_them() {
    let api = MemoryApi::new();
    let adm = admission(&api, dra());
    let mut original = job(json!([
        task(
            "w",
            json!([ctr("main", json!({"nvidia.com/vgpu-number": "2", "nvidia.com/vgpu-memory": "1024"}))])
        ),
        task("ps", json!([ctr("main", vgpu("1"))])),
    ]));
    original["spec"]["tasks"][0]["template"]["metadata"]["annotations"] = json!({
        "nvidia.com/include-gpu-uuid": "GPU-AB", "nvidia.com/device-topology-mode": "link",
        "nvidia.com/vgpu-compute-policy": "balance"});
    let converted = mutated(&adm, "CREATE", "u-1", &original);

    // A dry run creates nothing.
    assert_eq!(validate(&adm, "CREATE", &converted, true)["allowed"], true);
    assert!(api.templates().is_empty());
    assert_eq!(api.create_calls(), 2);

    assert_eq!(validate(&adm, "CREATE", &converted, false)["allowed"], true);
    let w = per_container("w", "main");
    let ps = per_container("ps", "main");
    let mut names = template_names(&api);
    names.sort();
    let mut want = vec![w.clone(), ps.clone()];
    want.sort();
    assert_eq!(names, want);
    let t: &ResourceClaimTemplate =
        &api.templates().into_iter().find(|t| t.metadata.name.as_deref() == Some(&w)).unwrap();
    let sel = |e: &str| json!({"cel": {"expression": e}});
    assert_eq!(
        serde_json::to_value(t).unwrap(),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": w, "namespace": "ml", "labels": {
            "vgpu-manager.io/owner-key": "ml-train", "vgpu-manager.io/create-timestamp": "1700000000123"}},
        "spec": {
            "metadata": {"annotations": {"nvidia.com/vgpu-compute-policy": "balance"}},
            "spec": {"devices": {
                "requests": [{"name": "vgpu", "exactly": {
                    "deviceClassName": "vgpu-manager", "allocationMode": "ExactCount", "count": 2,
                    // Memory asked: no default cores (rule 2 of the pod mutation).
                    "capacity": {"requests": {"memory": "1024Mi"}},
                    "selectors": [
                        sel(r#"device.attributes["manager.nvidia.com"].type == "vgpu""#),
                        sel(r#"device.attributes["manager.nvidia.com"].uuid in ["gpu-ab"]"#),
                    ]}}],
                "constraints": [
                    {"requests": ["vgpu"], "distinctAttribute": "manager.nvidia.com/uuid"},
                    {"requests": ["vgpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
                ]}}}})
    );

    // The API server calling again for the same Job is fine (the templates are ours).
    assert_eq!(validate(&adm, "CREATE", &converted, false)["allowed"], true);
    // A dry-run delete deletes nothing; a delete deletes both.
    assert_eq!(validate(&adm, "DELETE", &converted, true)["allowed"], true);
    assert_eq!(api.templates().len(), 2);
    assert_eq!(validate(&adm, "DELETE", &converted, false)["allowed"], true);
    assert!(api.templates().is_empty());
    assert_eq!(api.deleted_templates().len(), 2);
    // Deleting again: not found is fine.
    assert_eq!(validate(&adm, "DELETE", &converted, false)["allowed"], true);
}

#[test]
fn a_failed_create_rolls_back_and_denies() {
    let api = MemoryApi::new();
    let adm = admission(&api, dra());
    let converted = two_tasks_converted(&adm);
    let (a, b) = (per_container("a", "main"), per_container("b", "main"));
    api.fail_creates_after(1, 1);
    assert_eq!(
        message(&validate(&adm, "CREATE", &converted, false)),
        format!("create ResourceClaimTemplate ml/{b}: injected failure")
    );
    assert!(api.templates().is_empty());
    assert_eq!(api.deleted_templates(), [("ml".to_owned(), a)]);

    // A template of the same name that belongs to another Job denies too.
    let mut foreign = ResourceClaimTemplate::default();
    foreign.metadata.name = Some(b.clone());
    foreign.metadata.namespace = Some("ml".into());
    foreign.metadata.labels = Some([("vgpu-manager.io/owner-key".to_owned(), "ml-other".to_owned())].into());
    api.put_template(foreign);
    assert_eq!(
        message(&validate(&adm, "CREATE", &converted, false)),
        format!(
            "create ResourceClaimTemplate ml/{b}: already exists: ResourceClaimTemplate ml/{b} exists and does not belong to Job ml-train (label vgpu-manager.io/owner-key)"
        )
    );
    assert_eq!(template_names(&api), [b]);
}

#[test]
fn bad_records_are_denied() {
    let api = MemoryApi::new();
    let adm = admission(&api, dra());
    let converted = mutated(&adm, "CREATE", "u-1", &job(json!([task("w", json!([ctr("main", vgpu("1"))]))])));
    let main = per_container("w", "main");
    let with_record = |value: &str| {
        let mut j = converted.clone();
        j["metadata"]["annotations"][RECORD] = json!(value);
        j
    };
    let entry = |container: &str, claim: &str| {
        serde_json::to_string(&json!({"w": [info(container, claim, "vgpu", "1", "100")]})).unwrap()
    };
    let cases = [
        (
            with_record("[]"),
            "invalid vgpu-manager.io/original-resources annotation of a Volcano Job: invalid type: sequence, expected a map at line 1 column 0; expected a JSON object of task name to an array of {name, claimName, requestName, resources}".to_owned(),
        ),
        (
            with_record(&serde_json::to_string(&json!({"nope": []})).unwrap()),
            r#"Job "train" is invalid: metadata.annotations[vgpu-manager.io/original-resources][nope]: Invalid value: "nope": task not found"#.to_owned(),
        ),
        (
            with_record(&entry("ghost", &main)),
            r#"Job "train" is invalid: metadata.annotations[vgpu-manager.io/original-resources][w][0].containerName: Invalid value: "ghost": container not found"#.to_owned(),
        ),
        (
            with_record(&entry("main", "other")),
            r#"Job "train" is invalid: spec.tasks[0].template.spec.resourceClaims: Invalid value: ResourceClaimTemplateName "other" not found"#.to_owned(),
        ),
    ];
    for (j, want) in cases {
        assert_eq!(message(&validate(&adm, "CREATE", &j, false)), want);
    }
    assert!(api.templates().is_empty());
    // A bad record on DELETE is logged, not refused.
    assert_eq!(validate(&adm, "DELETE", &with_record("{"), false)["allowed"], true);
}

#[test]
fn update_makes_the_job_the_owner_and_shrinks_the_record() {
    let api = MemoryApi::new();
    let adm = admission(&api, dra());
    let converted = two_tasks_converted(&adm);
    assert_eq!(validate(&adm, "CREATE", &converted, false)["allowed"], true);
    let (a, b) = (per_container("a", "main"), per_container("b", "main"));
    // b's template is gone (say, deleted by hand): a is adopted, b stays in the record.
    let b_template = api.templates().into_iter().find(|t| t.metadata.name.as_deref() == Some(&b)).unwrap();
    block_on(api.delete_claim_template("ml", &b)).unwrap();

    // A dry-run update changes nothing.
    assert_eq!(patch_of(&mutate(&adm, "UPDATE", "u-2", &converted, true)), None);
    assert!(api.templates().iter().all(|t| t.metadata.owner_references.is_none()));

    let once = mutated(&adm, "UPDATE", "u-2", &converted);
    assert_eq!(
        owners_of(&api, &a),
        json!([{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train", "uid": "uid-job",
            "controller": true, "blockOwnerDeletion": true}])
    );
    assert_eq!(record(&once), json!({"b": record(&converted)["b"]}));

    // b's template back, already controlled by the Job: the record empties and leaves the Job.
    let mut back = b_template;
    back.metadata.owner_references = Some(serde_json::from_value(owners_of(&api, &a)).unwrap());
    api.put_template(back);
    let twice = mutated(&adm, "UPDATE", "u-3", &once);
    assert!(twice["metadata"].get("annotations").is_none_or(|a| a.get(RECORD).is_none()), "{twice}");
    // Without a record there is nothing to do.
    assert_eq!(patch_of(&mutate(&adm, "UPDATE", "u-4", &twice, false)), None);

    // A template controlled by another object is left alone and its task kept.
    let api = MemoryApi::new();
    let adm = admission(&api, dra());
    assert_eq!(validate(&adm, "CREATE", &converted, false)["allowed"], true);
    let mut t = api.templates().into_iter().find(|t| t.metadata.name.as_deref() == Some(&a)).unwrap();
    t.metadata.owner_references =
        Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "p".into(),
            uid: "x".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
    api.put_template(t);
    let once = mutated(&adm, "UPDATE", "u-2", &converted);
    assert_eq!(record(&once), json!({"a": record(&converted)["a"]}));
    assert_eq!(
        owners_of(&api, &a),
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "x", "controller": true}])
    );
}

fn owners_of(api: &MemoryApi, name: &str) -> Value {
    let t = api.templates().into_iter().find(|t| t.metadata.name.as_deref() == Some(name)).unwrap();
    serde_json::to_value(t.metadata.owner_references).unwrap()
}
