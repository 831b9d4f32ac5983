//! `vgpu-controller` against the real API server (issue #20 §3): the generated CRDs from
//! `deploy/gpu-module/crds/` are created, three PhysicalGPUs (two `a100-sxm4-40gb` on `w1`, one `t4` on `w2`,
//! memory in their status) and the binary started on a loopback HTTPS port, with the webhook configurations of
//! `deploy/gpu-module/controller.yaml` registered (clientConfig pointed at it, like `tests/webhook.rs`).
//!
//! The controller runs as its own ServiceAccount with exactly the RBAC of `controller.yaml` (ClusterRole,
//! Role for the Lease in `d8-gpu`), so the test also proves the manifest's least privilege is enough.
//!
//! * GPUClass `a100-shared` → DeviceClass `a100-shared.gpu.deckhouse.io` (the API server compiles its CEL
//!   selector), ownerReference to the GPUClass (asserted; no controller-manager runs, so no cascade), status
//!   `valid: true` with the DeviceClass name; a class matching no GPU gets `valid: false` and the reason.
//! * Admission: a GPUClass of a vendor without a DRA driver, a DeviceClass and a ResourceClaim naming a
//!   missing GPUClass, and a claim asking more devices than one node has are refused with the message.
//! * A pod asking for `gpu.deckhouse.io/a100-shared: 1` is mutated (pod claim, no extended resource, the
//!   `gpu.deckhouse.io/admission-id` label) and its ResourceClaim exists; the controller then sets the pod
//!   (name and UID of the stored pod) as the claim's controller owner, also for a `generateName` pod, whose name
//!   the mutation cannot know. No controller-manager runs here, so the garbage collector's part (deleting the
//!   claim with its pod) is not exercised; the ownerReference it works from is asserted.
//! * UPDATE: a merge patch that drops the pod's `gpu.deckhouse.io/admission-id` label is mutated back to the
//!   same id (its other label change stays). Pod validation (`pod-validation.gpu.deckhouse.io`): a pod naming
//!   the trainer's generated claim is refused (another pod's claim), and so is a pod naming a claim whose
//!   GPUClass (`h100`) was deleted after the claim was made — both messages as the client sees them.
//! * A pod that is mutated and then refused by the API server's validation (`restartPolicy: Sometimes`) leaves
//!   a claim without an owner: a watch sees it created and deleted by the controller after the grace
//!   (`--orphaned-claim-grace-period=3s`), while the owned claims stay.
//! * Occupancy: the allocation is written through the API (`resourceclaims/status`) as the scheduler would
//!   (no kubelet publishes slices here, so the real allocator is not involved); PhysicalGPU `w1-1` becomes
//!   `Allocated` with the claim, and is `Available` again when the claim is deleted.
//! * Passthrough policy: GPUClass `t4-vm` (`passthrough: true`) puts `classPassthrough: true` and condition
//!   `PassthroughPolicy` (`ClassesAgree`) on `w2-0` and its DeviceClass selects `vfio` devices; `t4-no`
//!   (`passthrough: false`) makes it `ConflictingClasses` with no wish; both deleted, the field and condition
//!   are released (the adapter's `driver` stays). The schema refuses `passthrough: true` with `Shared`.
//! * Node `w2` is deleted: the controller deletes its PhysicalGPU `w2-0` (the manifest's RBAC allows exactly
//!   that), and `w1`'s stay.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use vgpu_e2e::webhook::{RunningWebhook, register_manifest_webhooks, webhook_pki};
use vgpu_e2e::{TestEnv, free_port, vgpu_binary};

const CONTROLLER: &str = "vgpu-controller";
const WAIT: Duration = Duration::from_secs(30);

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("gpu.deckhouse.io", "v1alpha1", kind), plural)
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

async fn put_gpu(
    gpus: &Api<DynamicObject>,
    name: &str,
    node: &str,
    index: u32,
    model: &str,
    memory_mib: u64,
) {
    let spec = json!({
        "nodeName": node, "index": index, "pciAddress": format!("0000:{:02x}:00.0", index + 1),
        "vendor": "nvidia", "vendorId": "10de", "vendorName": "NVIDIA Corporation",
        "deviceId": "20b0", "deviceName": model, "model": model, "classCode": "030200"
    });
    let gpu = object(json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
        "metadata": {"name": name}, "spec": spec}));
    gpus.create(&PostParams::default(), &gpu).await.unwrap();
    let status = json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "metadata": {"name": name},
        "status": {"driver": "nvidia", "memoryMiB": memory_mib, "computeCapability": "8.0"}});
    gpus.patch_status(name, &PatchParams::apply("e2e-adapter").force(), &Patch::Apply(&status))
        .await
        .unwrap();
}

/// Creates the ServiceAccount, roles and bindings of `controller.yaml` (and its namespace), and writes a
/// kubeconfig acting as that ServiceAccount; returns its path.
async fn controller_kubeconfig(env: &TestEnv, client: &kube::Client, manifest: &Path) -> std::path::PathBuf {
    vgpu_e2e::rbac::manifest_kubeconfig(env, client, manifest, "controller.kubeconfig").await.unwrap()
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// Waits until claim `name` has the controller ownerReference to pod `pod` with `uid` (set by the controller).
async fn owned_by(env: &TestEnv, claims: &Api<ResourceClaim>, name: &str, pod: &str, uid: &str) {
    let owners = env
        .poll(&format!("ResourceClaim {name} owned by pod {pod}"), WAIT, || {
            let claims = claims.clone();
            async move { claims.get(name).await.ok()?.metadata.owner_references }
        })
        .await
        .unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let o = &owners[0];
    assert_eq!(
        (o.api_version.as_str(), o.kind.as_str(), o.name.as_str(), o.uid.as_str(), o.controller),
        ("v1", "Pod", pod, uid, Some(true))
    );
}

fn claim(name: &str, device_class: &str, count: i64) -> ResourceClaim {
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}]}}}))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn gpu_controller_makes_device_classes_admits_and_tracks_occupancy() {
    let mut env = TestEnv::builder("gpu_controller_makes_device_classes_admits_and_tracks_occupancy")
        .start()
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpu-module");

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in ["physicalgpus.gpu.deckhouse.io.yaml", "gpuclasses.gpu.deckhouse.io.yaml"] {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(deploy.join("crds").join(file)).unwrap())
                .unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for name in ["physicalgpus.gpu.deckhouse.io", "gpuclasses.gpu.deckhouse.io"] {
        env.poll(&format!("CRD {name} Established"), WAIT, || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(name).await.ok()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            }
        })
        .await
        .unwrap();
    }
    let gpus: Api<DynamicObject> = Api::all_with(client.clone(), &ar("PhysicalGPU", "physicalgpus"));
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &ar("GPUClass", "gpuclasses"));
    // The CRDs may serve a moment after Established.
    env.poll("PhysicalGPU API served", WAIT, || {
        let gpus = gpus.clone();
        async move { gpus.list(&Default::default()).await.ok().map(drop) }
    })
    .await
    .unwrap();
    // Their nodes (the controller deletes the PhysicalGPUs of deleted nodes).
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["w1", "w2"] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    put_gpu(&gpus, "w1-0", "w1", 0, "a100-sxm4-40gb", 40960).await;
    put_gpu(&gpus, "w1-1", "w1", 1, "a100-sxm4-40gb", 40960).await;
    put_gpu(&gpus, "w2-0", "w2", 0, "t4", 15360).await;

    // The controller on a loopback HTTPS port, and its webhooks.
    let (ca_pem, cert, key) = webhook_pki().unwrap();
    let cert_dir = env.workdir().join("controller-certs");
    std::fs::create_dir_all(&cert_dir).unwrap();
    std::fs::write(cert_dir.join("tls.crt"), cert).unwrap();
    std::fs::write(cert_dir.join("tls.key"), key).unwrap();
    let kubeconfig = controller_kubeconfig(&env, &client, &deploy.join("controller.yaml")).await;
    let port = free_port().unwrap();
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--server-bind-port={port}"),
        "--server-bind-address=127.0.0.1".to_owned(),
        format!("--cert-dir={}", cert_dir.display()),
        "--leader-elect".to_owned(),
        "--leader-elect-resource-namespace=d8-gpu".to_owned(),
        "--orphaned-claim-grace-period=3s".to_owned(),
    ];
    env.start_process(
        CONTROLLER,
        &vgpu_binary(CONTROLLER).unwrap(),
        &args,
        &[("RUST_LOG".into(), "info".into())],
    )
    .unwrap();
    env.poll("vgpu-controller listening", WAIT, || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop)
    })
    .await
    .unwrap();
    let running = RunningWebhook { port, ca_pem: ca_pem.clone(), cert_dir: cert_dir.clone() };
    let registered =
        register_manifest_webhooks(&client, &deploy.join("controller.yaml"), &running).await.unwrap();
    assert_eq!(registered, 2, "controller.yaml holds one validating and one mutating configuration");

    // GPUClass a100-shared → DeviceClass.
    let a100 = object(
        json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "a100-shared"},
        "spec": {"vendor": "nvidia", "deviceType": "a100-sxm4-40gb", "requirements": {"minMemoryMiB": 20480, "minComputeCapability": "8.0", "capabilities": ["coreRatio"]},
            "sharing": {"mode": "Shared", "shares": 4}}}),
    );
    let created = classes.create(&PostParams::default(), &a100).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let device_classes: Api<DeviceClass> = Api::all(client.clone());
    let dc = env
        .poll("DeviceClass a100-shared.gpu.deckhouse.io", WAIT, || {
            let device_classes = device_classes.clone();
            async move { device_classes.get_opt("a100-shared.gpu.deckhouse.io").await.ok().flatten() }
        })
        .await
        .unwrap();
    let owner = &dc.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("GPUClass", "a100-shared", uid.as_str())
    );
    assert_eq!(owner.controller, Some(true));
    let expression =
        &dc.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression;
    assert!(expression.starts_with("device.driver == \"manager.nvidia.com\""), "{expression}");
    assert!(expression.contains("quantity(\"20480Mi\")"), "{expression}");
    assert!(expression.contains("semver(\"8.0.0\")"), "{expression}");
    let status = env
        .poll("GPUClass a100-shared valid", WAIT, || {
            let classes = classes.clone();
            async move {
                let c = classes.get("a100-shared").await.ok()?;
                let s = c.data.get("status")?.clone();
                (s["valid"] == true).then_some(s)
            }
        })
        .await
        .unwrap();
    assert_eq!(status["deviceClassName"], "a100-shared.gpu.deckhouse.io");
    assert_eq!(status["message"], "matches 2 PhysicalGPUs on 1 node");

    // A class no GPU matches: valid false with the reason.
    let h100 = object(
        json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
        "spec": {"vendor": "nvidia", "deviceType": "h100-sxm5-80gb", "sharing": {"mode": "Exclusive"}}}),
    );
    classes.create(&PostParams::default(), &h100).await.unwrap();
    let status = env
        .poll("GPUClass h100 invalid", WAIT, || {
            let classes = classes.clone();
            async move {
                let s = classes.get("h100").await.ok()?.data.get("status")?.clone();
                (s["valid"] == false).then_some(s)
            }
        })
        .await
        .unwrap();
    assert_eq!(status["message"], "matches no PhysicalGPU of 3: 3 of another device type");

    // Admission refusals, with the message.
    let amd = object(
        json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "amd"},
        "spec": {"vendor": "amd", "sharing": {"mode": "Exclusive"}}}),
    );
    let err = classes.create(&PostParams::default(), &amd).await.unwrap_err().to_string();
    assert!(
        err.contains("denied the request: GPUClass \"amd\": spec.vendor: Unsupported value: \"amd\": supported values: \"metax\", \"nvidia\""),
        "{err}"
    );
    let orphan: DeviceClass =
        serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gone.gpu.deckhouse.io"}, "spec": {}}))
        .unwrap();
    let err = device_classes.create(&PostParams::default(), &orphan).await.unwrap_err().to_string();
    assert!(err.contains("GPUClass \"gone\" does not exist"), "{err}");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let err = claims
        .create(&PostParams::default(), &claim("x", "gone.gpu.deckhouse.io", 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "deviceClassName: Invalid value: \"gone.gpu.deckhouse.io\": GPUClass \"gone\" does not exist"
        ),
        "{err}"
    );
    let err = claims
        .create(&PostParams::default(), &claim("y", "a100-shared.gpu.deckhouse.io", 3))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "count: Invalid value: 3: GPUClass \"a100-shared\" has at most 2 matching GPUs on one node"
        ),
        "{err}"
    );

    // Pod mutation: the extended resource becomes a pod claim, and its ResourceClaim exists.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {"gpu.deckhouse.io/a100-shared": "1"}}}]}}))
        .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let spec = pod.spec.unwrap();
    let pod_claim = &spec.resource_claims.as_ref().unwrap()[0];
    let claim_name = pod_claim.resource_claim_name.clone().unwrap();
    let container = &spec.containers[0];
    assert_eq!(container.resources.as_ref().unwrap().claims.as_ref().unwrap()[0].name, pod_claim.name);
    assert!(container.resources.as_ref().unwrap().limits.as_ref().is_none_or(|l| l.is_empty()));
    let generated = claims.get(&claim_name).await.unwrap();
    let request = &generated.spec.as_ref().unwrap().devices.as_ref().unwrap().requests.as_ref().unwrap()[0];
    assert_eq!(request.exactly.as_ref().unwrap().device_class_name, "a100-shared.gpu.deckhouse.io");
    let id = pod.metadata.labels.as_ref().unwrap()["gpu.deckhouse.io/admission-id"].clone();
    assert_eq!(generated.metadata.labels.as_ref().unwrap()["gpu.deckhouse.io/admission-id"], id);
    let pod_uid = pod.metadata.uid.clone().unwrap();
    owned_by(&env, &claims, &claim_name, "trainer", &pod_uid).await;

    // UPDATE mutation: an update dropping the admission-id label gets it back; its other changes stay.
    let relabel = json!({"metadata": {"labels": {"gpu.deckhouse.io/admission-id": null, "team": "a"}}});
    let updated = pods.patch("trainer", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    let labels = updated.metadata.labels.clone().unwrap();
    assert_eq!(labels.get("gpu.deckhouse.io/admission-id"), Some(&id), "{labels:?}");
    assert_eq!(labels.get("team").map(String::as_str), Some("a"), "{labels:?}");

    // Pod validation: a pod may not use the claim the mutation made for another pod.
    let thief: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "thief"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}}))
    .unwrap();
    let err = pods.create(&PostParams::default(), &thief).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "admission webhook \"pod-validation.gpu.deckhouse.io\" denied the request: spec.resourceClaims[0].resourceClaimName: Invalid value: \"{claim_name}\": ResourceClaim \"{claim_name}\" was made by the pod mutation for another pod (label gpu.deckhouse.io/admission-id \"{id}\"; this pod has none)"
        )),
        "{err}"
    );

    // generateName: the stored name is only known after admission; the owner is the stored pod.
    let generated_pod: Pod = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "gen-"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {"gpu.deckhouse.io/a100-shared": "1"}}}]}}),
    )
    .unwrap();
    let gen_pod = pods.create(&PostParams::default(), &generated_pod).await.unwrap();
    let gen_claim = gen_pod.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    let gen_name = gen_pod.metadata.name.clone().unwrap();
    assert!(gen_name.starts_with("gen-"), "{gen_name}");
    owned_by(&env, &claims, &gen_claim, &gen_name, gen_pod.metadata.uid.as_deref().unwrap()).await;

    // A pod refused after the mutation: its claim is created, then deleted by the controller past the grace.
    let refused_selector = "vgpu-manager.io/owner-key=default-refused";
    let version = claims
        .list(&ListParams::default().labels(refused_selector))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = Box::pin(
        claims.watch(&WatchParams::default().labels(refused_selector).timeout(60), &version).await.unwrap(),
    );
    let refused: Pod =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "refused"},
        "spec": {"restartPolicy": "Sometimes", "containers": [{"name": "main", "image": "busybox",
            "resources": {"limits": {"gpu.deckhouse.io/a100-shared": "1"}}}]}}))
        .unwrap();
    let err = pods.create(&PostParams::default(), &refused).await.unwrap_err().to_string();
    assert!(err.contains("restartPolicy"), "{err}");
    let mut added = None;
    let deleted = loop {
        let event = tokio::time::timeout(WAIT, events.next())
            .await
            .expect("a watch event for the refused pod's claim within 30 s")
            .expect("the watch stays open")
            .unwrap();
        match event {
            WatchEvent::Added(c) => {
                assert!(c.metadata.owner_references.is_none(), "a claim of a refused pod has no owner");
                added = c.metadata.name.clone();
            }
            WatchEvent::Deleted(c) => break c,
            WatchEvent::Modified(_) | WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
        }
    };
    assert_eq!(deleted.metadata.name, added, "the refused pod's claim was created, then deleted");
    let age = deleted
        .metadata
        .deletion_timestamp
        .map_or(jiff_now(), |t| t.0)
        .duration_since(deleted.metadata.creation_timestamp.unwrap().0);
    assert!(age.as_secs() >= 3, "deleted only after the 3 s grace, not {age:?}");
    // The owned claims stay.
    assert!(claims.get_opt(&claim_name).await.unwrap().is_some());
    assert!(claims.get_opt(&gen_claim).await.unwrap().is_some());

    // Pod validation: a claim asking for a GPUClass that is gone (h100, deleted after the claim was made)
    // keeps a new pod out, with the claim's field named.
    claims.create(&PostParams::default(), &claim("h100-claim", "h100.gpu.deckhouse.io", 1)).await.unwrap();
    classes.delete("h100", &DeleteParams::default()).await.unwrap();
    let h100_pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "h100-user"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "h100-claim"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}}))
    .unwrap();
    let err = env
        .poll("a pod naming a claim of the deleted GPUClass h100 refused", WAIT, || {
            let pods = pods.clone();
            let h100_pod = h100_pod.clone();
            async move {
                // Dry runs until the controller's caches hold the claim and miss the class.
                let dry_run = PostParams { dry_run: true, ..Default::default() };
                let err = pods.create(&dry_run, &h100_pod).await.err()?.to_string();
                err.contains("does not exist").then_some(err)
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.log_tail(CONTROLLER, 30)));
    assert!(
        err.contains("spec.resourceClaims[0].resourceClaimName: Invalid value: \"h100-claim\": ResourceClaim \"h100-claim\" asks for GPUClass \"h100\" (spec.devices.requests[0].exactly.deviceClassName), which does not exist"),
        "{err}"
    );
    claims.delete("h100-claim", &DeleteParams::default()).await.unwrap();

    // Occupancy follows the claim's allocation (written as the scheduler writes it) and release.
    claims.create(&PostParams::default(), &claim("job", "a100-shared.gpu.deckhouse.io", 1)).await.unwrap();
    let allocation = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "manager.nvidia.com", "pool": "w1", "device": "vgpu-1"}]}}}});
    claims.patch_status("job", &PatchParams::default(), &Patch::Merge(&allocation)).await.unwrap();
    let occupancy = env
        .poll("PhysicalGPU w1-1 Allocated", WAIT, || {
            let gpus = gpus.clone();
            async move {
                let s = gpus.get("w1-1").await.ok()?.data.get("status")?.clone();
                (s["state"] == "Allocated").then_some(s["occupancy"].clone())
            }
        })
        .await
        .unwrap();
    assert_eq!(occupancy, json!({"totalShares": 4, "usedShares": 1, "claims": ["default/job"]}));
    let other = gpus.get("w1-0").await.unwrap().data["status"].clone();
    assert_eq!(other["state"], "Available");
    claims.delete("job", &DeleteParams::default()).await.unwrap();
    env.poll("PhysicalGPU w1-1 released", WAIT, || {
        let gpus = gpus.clone();
        async move {
            let s = gpus.get("w1-1").await.ok()?.data.get("status")?.clone();
            (s["state"] == "Available" && s["occupancy"]["usedShares"] == 0).then_some(())
        }
    })
    .await
    .unwrap();

    // Passthrough policy: a GPUClass asking for passthrough puts its wish in the matching GPU's status
    // (status.classPassthrough, condition PassthroughPolicy), a disagreeing class withdraws it, and with the
    // classes gone both are released (server-side apply). The schema refuses passthrough with Shared.
    let class = |name: &str, passthrough: bool, sharing: serde_json::Value| {
        object(
            json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": name},
            "spec": {"vendor": "nvidia", "deviceType": "t4", "sharing": sharing, "passthrough": passthrough}}),
        )
    };
    let err = classes
        .create(&PostParams::default(), &class("t4-shared-vm", true, json!({"mode": "Shared", "shares": 2})))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("passthrough: true needs sharing.mode Exclusive"), "{err}");
    classes
        .create(&PostParams::default(), &class("t4-vm", true, json!({"mode": "Exclusive"})))
        .await
        .unwrap();
    let policy = |want_wish: serde_json::Value, want_reason: &'static str| {
        let gpus = gpus.clone();
        async move {
            let s = gpus.get("w2-0").await.ok()?.data.get("status")?.clone();
            let c = s["conditions"].as_array()?.iter().find(|c| c["type"] == "PassthroughPolicy")?.clone();
            (s["classPassthrough"] == want_wish && c["reason"] == want_reason).then_some(c)
        }
    };
    let agreed = env
        .poll("PhysicalGPU w2-0 classPassthrough true", WAIT, || policy(json!(true), "ClassesAgree"))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.log_tail(CONTROLLER, 30)));
    assert_eq!(agreed["message"], "passthrough true from GPUClass t4-vm");
    let vm_dc = device_classes.get("t4-vm.gpu.deckhouse.io").await.unwrap();
    let expression =
        &vm_dc.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression;
    assert!(expression.contains(r#".type == "vfio""#), "{expression}");
    classes
        .create(&PostParams::default(), &class("t4-no", false, json!({"mode": "Exclusive"})))
        .await
        .unwrap();
    let conflict = env
        .poll("PhysicalGPU w2-0 conflicting classes", WAIT, || {
            policy(serde_json::Value::Null, "ConflictingClasses")
        })
        .await
        .unwrap();
    assert_eq!(conflict["status"], "False");
    for name in ["t4-vm", "t4-no"] {
        classes.delete(name, &DeleteParams::default()).await.unwrap();
    }
    env.poll("PhysicalGPU w2-0 passthrough policy released", WAIT, || {
        let gpus = gpus.clone();
        async move {
            let s = gpus.get("w2-0").await.ok()?.data.get("status")?.clone();
            let has_condition = s["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "PassthroughPolicy"));
            (s.get("classPassthrough").is_none() && !has_condition && s["driver"] == "nvidia").then_some(())
        }
    })
    .await
    .unwrap();

    // Node w2 is deleted: its PhysicalGPU goes (the controller's delete, with the manifest's RBAC), w1's stay.
    nodes.delete("w2", &DeleteParams::default()).await.unwrap();
    env.poll("PhysicalGPU w2-0 deleted with its node", WAIT, || {
        let gpus = gpus.clone();
        async move { gpus.get_opt("w2-0").await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.log_tail(CONTROLLER, 30)));
    for name in ["w1-0", "w1-1"] {
        assert!(gpus.get_opt(name).await.unwrap().is_some(), "{name} was deleted");
    }

    env.check_process(CONTROLLER).unwrap();
    env.finish();
}
