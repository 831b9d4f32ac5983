//! `vgpu-webhook` in the real kube-apiserver's admission chain (issue #19): the Mutating- and
//! ValidatingWebhookConfiguration of `deploy/webhook/webhooks.yaml` (failurePolicy Fail, the
//! namespace/object selectors), pointed at the webhook binary on loopback with the test's CA, and pods
//! created through the API:
//!
//! * a pod asking `nvidia.com/vgpu-number: 1` comes back with 100 cores, our scheduler and the default
//!   policies, and is placed by the extender;
//! * a vGPU pod with `spec.nodeName` comes back with a hostname nodeSelector instead and is then placed on
//!   that node by kube-scheduler and the extender (pre-allocation annotation on the pod);
//! * a pod with 150 cores is refused with reason Invalid and the container and field named; the same pod
//!   labelled `vgpu-manager.io/ignore-webhook=true` is not sent to the webhook;
//! * with `--default-convert2-dra`, the pod gets claims, the ResourceClaim exists with the exact request, and
//!   deleting the pod deletes it; a pod breaking a sharing rule is refused with the rule's message; a claim
//!   with an unknown opaque config kind is refused — the webhook acting as the ServiceAccount of
//!   `deploy/webhook/rbac.yaml`;
//! * with `--default-convert2-dra` and a minimal Volcano Job CRD (`batch.volcano.sh/v1alpha1` `jobs`, any
//!   content), a Job asking vGPUs in two tasks comes back with each task's template referring to its own
//!   ResourceClaimTemplate, which exists with the exact request; the Job's next update makes it the templates'
//!   controller and takes the record off; a Job deleted before that takes its templates with it.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh webhook`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use vgpu_e2e::TestEnv;
use vgpu_e2e::fixtures::{self, VGPU_CORES, VGPU_NUMBER};
use vgpu_e2e::plugin_node::start_vgpu_scheduling;
use vgpu_e2e::webhook::{register_webhooks, service_account_kubeconfig, start_webhook};

const NS: &str = "default";

fn pod(name: &str, limits: Value, extra: Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/vgpu-e2e/pause:none",
            "resources": {"limits": limits}}]}
    });
    merge(&mut p, extra);
    serde_json::from_value(p).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn limit(p: &Pod, key: &str) -> Option<String> {
    p.spec.as_ref()?.containers[0].resources.as_ref()?.limits.as_ref()?.get(key).map(|q| q.0.clone())
}

fn annotation(p: &Pod, key: &str) -> Option<String> {
    p.metadata.annotations.as_ref()?.get(key).cloned()
}

async fn denied(pods: &Api<Pod>, p: &Pod) -> kube::core::Status {
    match pods.create(&PostParams::default(), p).await {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn webhook_mutates_pods_through_the_api_server() {
    let mut env = TestEnv::builder("webhook_mutates_pods_through_the_api_server").start().await.unwrap();
    let client = env.client().await.unwrap();
    start_vgpu_scheduling(&mut env).await.unwrap();
    fixtures::create_vgpu_node(&client, "gpu-1", 4, 10).await.unwrap();
    fixtures::create_vgpu_node(&client, "gpu-2", 4, 10).await.unwrap();
    let webhook = start_webhook(
        &mut env,
        None,
        &[
            "--scheduler-name=vgpu-scheduler",
            "--default-node-policy=binpack",
            "--default-device-policy=spread",
            "--default-topology-mode=numa",
        ],
    )
    .await
    .unwrap();
    register_webhooks(&client, &webhook).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // Defaults: 100 cores, our scheduler, the policies; then the extender places it.
    let created =
        pods.create(&PostParams::default(), &pod("one", json!({VGPU_NUMBER: "1"}), json!({}))).await.unwrap();
    assert_eq!(limit(&created, VGPU_CORES).as_deref(), Some("100"));
    assert_eq!(created.spec.as_ref().unwrap().scheduler_name.as_deref(), Some("vgpu-scheduler"));
    assert_eq!(annotation(&created, "nvidia.com/node-scheduler-policy").as_deref(), Some("binpack"));
    assert_eq!(annotation(&created, "nvidia.com/device-scheduler-policy").as_deref(), Some("spread"));
    assert_eq!(annotation(&created, "nvidia.com/device-topology-mode"), None, "single-GPU pod");
    let node = fixtures::wait_for_pod_node(&client, NS, "one", Duration::from_secs(60)).await.unwrap();
    assert!(node == "gpu-1" || node == "gpu-2");

    // Multi-GPU: topology mode defaulted.
    let created = pods
        .create(&PostParams::default(), &pod("two", json!({VGPU_NUMBER: "2", VGPU_CORES: "20"}), json!({})))
        .await
        .unwrap();
    assert_eq!(annotation(&created, "nvidia.com/device-topology-mode").as_deref(), Some("numa"));

    // spec.nodeName → hostname nodeSelector, then placed there by kube-scheduler and the extender.
    let pinned =
        pod("pinned", json!({VGPU_NUMBER: "1", VGPU_CORES: "30"}), json!({"spec": {"nodeName": "gpu-2"}}));
    let created = pods.create(&PostParams::default(), &pinned).await.unwrap();
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.node_name, None, "nodeName moved to the selector");
    assert_eq!(spec.node_selector.as_ref().unwrap()["kubernetes.io/hostname"], "gpu-2");
    assert_eq!(
        fixtures::wait_for_pod_node(&client, NS, "pinned", Duration::from_secs(60)).await.unwrap(),
        "gpu-2"
    );
    let placed = pods.get("pinned").await.unwrap();
    let claim = annotation(&placed, "nvidia.com/pre-allocated").expect("the extender pre-allocated the pod");
    assert!(claim.starts_with("main["), "{claim}");

    // A non-vGPU pod loses vGPU policy annotations and keeps its nodeName.
    let plain = pod(
        "plain",
        json!({"cpu": "1"}),
        json!({"metadata": {"annotations": {"nvidia.com/node-scheduler-policy": "spread", "team": "a"}}, "spec": {"nodeName": "gpu-1"}}),
    );
    let created = pods.create(&PostParams::default(), &plain).await.unwrap();
    assert_eq!(annotation(&created, "nvidia.com/node-scheduler-policy"), None);
    assert_eq!(annotation(&created, "team").as_deref(), Some("a"));
    assert_eq!(created.spec.as_ref().unwrap().node_name.as_deref(), Some("gpu-1"));

    // Refused with the container and field named; reason Invalid.
    let greedy = pod("greedy", json!({VGPU_NUMBER: "1", VGPU_CORES: "150"}), json!({}));
    let status = denied(&pods, &greedy).await;
    assert_eq!(status.reason, "Invalid");
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        "admission webhook \"mutatepod.vgpu-manager.io\" denied the request: container \"main\": spec.containers[0].resources.limits[nvidia.com/vgpu-cores]: Invalid value: \"150\": request exceeds limit, maximum: 100"
    );
    // The same pod labelled to be ignored never reaches the webhook.
    let ignored = pod(
        "ignored",
        json!({VGPU_NUMBER: "1", VGPU_CORES: "150"}),
        json!({"metadata": {"labels": {"vgpu-manager.io/ignore-webhook": "true"}}}),
    );
    let created = pods.create(&PostParams::default(), &ignored).await.unwrap();
    assert_eq!(created.spec.as_ref().unwrap().scheduler_name.as_deref(), Some("default-scheduler"));

    // failurePolicy Fail: with the webhook gone, vGPU pods are refused, not admitted unmutated.
    env.stop_process(vgpu_e2e::webhook::WEBHOOK).unwrap();
    let err = pods
        .create(&PostParams::default(), &pod("late", json!({VGPU_NUMBER: "1"}), json!({})))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("failed calling webhook \"mutatepod.vgpu-manager.io\""), "{err}");
    env.finish();
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn webhook_converts_pods_to_dra_and_enforces_sharing() {
    let mut env =
        TestEnv::builder("webhook_converts_pods_to_dra_and_enforces_sharing").start().await.unwrap();
    let client = env.client().await.unwrap();
    // The webhook acts as the ServiceAccount of deploy/webhook/rbac.yaml: creating, reading and deleting the
    // claims below proves that role is enough.
    let kubeconfig = service_account_kubeconfig(&env, &client).await.unwrap();
    let webhook = start_webhook(
        &mut env,
        Some(&kubeconfig),
        &[
            "--scheduler-name=vgpu-scheduler",
            "--default-convert2-dra",
            "--dra-admission-enabled",
            "--default-topology-mode=link",
        ],
    )
    .await
    .unwrap();
    register_webhooks(&client, &webhook).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);

    // Converted: claims on the container and the pod, the record, no vGPU limits; the claim exists.
    let created = pods
        .create(
            &PostParams::default(),
            &pod(
                "train",
                json!({VGPU_NUMBER: "2", VGPU_CORES: "50", "nvidia.com/vgpu-memory": "1024"}),
                json!({}),
            ),
        )
        .await
        .unwrap();
    let spec = created.spec.as_ref().unwrap();
    // `<pod>-<container>-<8 hex digits of SHA-256>` (vgpu-manager's GenerateK8sSafeResourceName).
    let name = spec.resource_claims.as_ref().unwrap()[0].name.clone();
    let hash = name.strip_prefix("train-main-").unwrap_or_default();
    assert!(hash.len() == 8 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
    let refs = spec.containers[0].resources.as_ref().unwrap().claims.clone().unwrap();
    assert_eq!(serde_json::to_value(&refs).unwrap(), json!([{"name": name, "request": "vgpu"}]));
    assert_eq!(
        serde_json::to_value(spec.resource_claims.as_ref().unwrap()).unwrap(),
        json!([{"name": name, "resourceClaimName": name}])
    );
    assert_eq!(limit(&created, VGPU_NUMBER), None);
    assert!(annotation(&created, "vgpu-manager.io/original-resources").unwrap().contains(&name));
    let claim = serde_json::to_value(claims.get(&name).await.unwrap()).unwrap();
    assert_eq!(claim["metadata"]["labels"]["vgpu-manager.io/owner-key"], "default-train");
    // Owned by the pod (no controller-manager runs here, so no garbage collection: only the reference is checked).
    let uid = created.metadata.uid.clone().unwrap();
    assert_eq!(
        claim["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "train", "uid": uid, "controller": true}])
    );
    let exactly = &claim["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(exactly["deviceClassName"], "vgpu-manager");
    assert_eq!(exactly["count"], 2);
    assert_eq!(exactly["capacity"]["requests"], json!({"cores": "50", "memory": "1Gi"}));
    assert_eq!(
        claim["spec"]["devices"]["constraints"],
        json!([
            {"requests": ["vgpu"], "distinctAttribute": "manager.nvidia.com/uuid"},
            {"requests": ["vgpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
        ])
    );

    // Deleting the pod deletes its claim (no controller-manager runs here, so this is the webhook).
    pods.delete("train", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .unwrap();
    env.poll("the converted pod's claim to be deleted", Duration::from_secs(30), || {
        let claims = claims.clone();
        let name = name.clone();
        async move { claims.get_opt(&name).await.ok().flatten().is_none().then_some(()) }
    })
    .await
    .unwrap();

    // A sharing rule: two app containers on one vGPU request.
    let shared: ResourceClaim =
        serde_json::from_value(json!({"metadata": {"name": "shared", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "r1", "exactly": {"deviceClassName": "vgpu-manager"}}]}}}))
        .unwrap();
    claims.create(&PostParams::default(), &shared).await.unwrap();
    let two: Pod = serde_json::from_value(json!({"metadata": {"name": "two", "namespace": NS}, "spec": {
        "resourceClaims": [{"name": "shared", "resourceClaimName": "shared"}],
        "containers": [
            {"name": "a", "image": "registry.invalid/x", "resources": {"claims": [{"name": "shared", "request": "r1"}]}},
            {"name": "b", "image": "registry.invalid/x", "resources": {"claims": [{"name": "shared"}]}}]}}))
    .unwrap();
    let status = denied(&pods, &two).await;
    assert_eq!(status.reason, "Invalid");
    assert_eq!(
        status.message,
        "admission webhook \"validatepod.vgpu-manager.io\" denied the request: vgpu request \"shared/r1\" is referenced by multiple app containers [a b]; concurrent app containers cannot share a vgpu request"
    );

    // /resourceclaims/validate: an opaque config of our driver of an unknown kind.
    let bad: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "bad", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "vgpu-manager"}}],
            "config": [{"opaque": {"driver": "manager.nvidia.com",
                "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "TpuConfig"}}}]}}}))
    .unwrap();
    let status = match claims.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        status.message,
        "admission webhook \"validateresourceclaim.vgpu-manager.io\" denied the request: 1 configs failed to validate: expected a recognized configuration type at spec.devices.config[0].opaque.parameters but got: resource.nvidia.com/v1beta1/TpuConfig"
    );
    env.finish();
}

/// A Volcano Job with tasks `(name, vGPU limits)`, each of one container `main`.
fn volcano_job(name: &str, tasks: &[(&str, Value)]) -> DynamicObject {
    let tasks: Vec<Value> = tasks
        .iter()
        .map(|(task, limits)| {
            json!({"name": task, "replicas": 1, "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": "registry.invalid/vgpu-e2e/pause:none", "resources": {"limits": limits}}]}}})
        })
        .collect();
    serde_json::from_value(json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS}, "spec": {"minAvailable": 1, "tasks": tasks}}))
    .unwrap()
}

#[tokio::test]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn webhook_converts_volcano_jobs_to_claim_templates() {
    let mut env = TestEnv::builder("webhook_converts_volcano_jobs_to_claim_templates").start().await.unwrap();
    let client = env.client().await.unwrap();
    // Volcano's group, version and kind; no schema beyond "any object".
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "jobs.batch.volcano.sh"},
        "spec": {"group": "batch.volcano.sh", "scope": "Namespaced",
            "names": {"plural": "jobs", "singular": "job", "kind": "Job", "listKind": "JobList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}))
    .unwrap();
    vgpu_e2e::helm::install_crds(&client, &[crd], Duration::from_secs(60)).await.unwrap();
    // The webhook acts as the ServiceAccount of deploy/webhook/rbac.yaml (creating, updating and deleting the
    // templates below proves that role is enough).
    let kubeconfig = service_account_kubeconfig(&env, &client).await.unwrap();
    let webhook = start_webhook(&mut env, Some(&kubeconfig), &["--default-convert2-dra"]).await.unwrap();
    register_webhooks(&client, &webhook).await.unwrap();
    let resource = ApiResource {
        group: "batch.volcano.sh".into(),
        version: "v1alpha1".into(),
        api_version: "batch.volcano.sh/v1alpha1".into(),
        kind: "Job".into(),
        plural: "jobs".into(),
    };
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &resource);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);

    // Two tasks with a container of the same name: two templates.
    let created = jobs
        .create(
            &PostParams::default(),
            &volcano_job(
                "train",
                &[("a", json!({VGPU_NUMBER: "1", VGPU_CORES: "50"})), ("b", json!({VGPU_NUMBER: "2"}))],
            ),
        )
        .await
        .unwrap();
    let tasks = &created.data["spec"]["tasks"];
    let claim_of = |i: usize| {
        tasks[i]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (a, b) = (claim_of(0), claim_of(1));
    assert!(a.starts_with("train-a-") && b.starts_with("train-b-") && a != b, "{a} {b}");
    assert_eq!(
        tasks[0]["template"]["spec"]["containers"][0]["resources"],
        json!({"limits": {}, "claims": [{"name": a, "request": "vgpu"}]})
    );
    assert_eq!(tasks[0]["replicas"], 1, "other fields are left alone");
    let record = created.metadata.annotations.as_ref().unwrap()["vgpu-manager.io/original-resources"].clone();
    assert!(record.contains(&a) && record.contains(&b), "{record}");
    let template = serde_json::to_value(templates.get(&a).await.unwrap()).unwrap();
    assert_eq!(template["metadata"]["labels"]["vgpu-manager.io/owner-key"], "default-train");
    assert!(template["metadata"].get("ownerReferences").is_none(), "{template}");
    let exactly = &template["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    assert_eq!(exactly["deviceClassName"], "vgpu-manager");
    assert_eq!(exactly["count"], 1);
    assert_eq!(exactly["capacity"]["requests"], json!({"cores": "50"}));
    let b_template = serde_json::to_value(templates.get(&b).await.unwrap()).unwrap();
    assert_eq!(b_template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"], 2);

    // The next update of the Job: it becomes the templates' controller, and the record goes.
    let updated = jobs
        .patch(
            "train",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "ml"}}})),
        )
        .await
        .unwrap();
    assert!(
        updated
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("vgpu-manager.io/original-resources")),
        "{:?}",
        updated.metadata.annotations
    );
    let uid = created.metadata.uid.clone().unwrap();
    for name in [&a, &b] {
        let t = serde_json::to_value(templates.get(name).await.unwrap()).unwrap();
        assert_eq!(
            t["metadata"]["ownerReferences"],
            json!([{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train", "uid": uid,
                "controller": true, "blockOwnerDeletion": true}])
        );
    }

    // A Job deleted before any update takes its templates with it (no controller-manager runs here: the webhook).
    let short = jobs
        .create(&PostParams::default(), &volcano_job("short", &[("w", json!({VGPU_NUMBER: "1"}))]))
        .await
        .unwrap();
    let name =
        short.data["spec"]["tasks"][0]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            .as_str()
            .unwrap()
            .to_owned();
    assert!(templates.get_opt(&name).await.unwrap().is_some());
    jobs.delete("short", &DeleteParams::default()).await.unwrap();
    env.poll("the deleted Job's template to be deleted", Duration::from_secs(30), || {
        let templates = templates.clone();
        let name = name.clone();
        async move { templates.get_opt(&name).await.ok().flatten().is_none().then_some(()) }
    })
    .await
    .unwrap();
    env.finish();
}
