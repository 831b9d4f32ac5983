//! Mixed vendors in one cluster (issue #20, "Mixed vendors"), against the real control plane
//! (kube-apiserver + kube-scheduler) and our real binaries:
//!
//! * Two Nodes without a kubelet: `nv-node` and `mx-node`. On each runs a `vgpu-kubelet-plugin` process on
//!   the mock backend: `nv-node`'s mock has two NVIDIA A100-SXM4-40GB (driver `manager.nvidia.com`, the
//!   NVIDIA adapter), `mx-node`'s two MetaX MXC500 (`vendor: metax`, so the mock returns the MetaX adapter),
//!   run with `--driver-name gpu.metax-tech.com`. Both pools are published as ResourceSlices: the A100s as
//!   `vgpu-0`/`vgpu-1`, the MetaX GPUs whole as `gpu-0`/`gpu-1` (HAMi-core cannot limit MetaX's runtime).
//! * The GPU module CRDs of `deploy/gpu-module/crds/` are created, the four PhysicalGPUs are written through
//!   the API (spec as the node agent writes it, PCI addresses equal to the mock's bus ids), and `vgpu-controller`
//!   runs (admin kubeconfig, no webhooks registered: admission is `tests/gpu_controller.rs`' part). GPUClasses
//!   `metax-whole` (vendor metax, Exclusive) and `a100-whole` (vendor nvidia, device type a100-sxm4-40gb, at
//!   least 40,000 MiB and compute capability 8.0, Exclusive) become DeviceClasses and each is valid with
//!   exactly the two GPUs of its node: the memory and capability it needs are the adapter's, not the test's.
//! * The adapters (issue #20, "Adapters"): each plugin writes its node's PhysicalGPUs' `status.driverVersion`
//!   (its mock's driver version: `570.86.10` NVIDIA, `2.33.0.5` MetaX), `memoryMiB`, `computeCapability`
//!   (NVIDIA only), condition `DriverReady=True` (`DriverAnswering`) and condition `HardwareHealthy=True`
//!   by server-side apply (field manager `vgpu-kubelet-plugin`), found by `spec.nodeName` and matched by PCI
//!   address, although the CRD is created after the plugins start; the other status fields stay as written.
//! * Claims of those DeviceClasses, each used by a pod without `nodeName`: the real kube-scheduler allocates
//!   both MetaX claims from pool `mx-node`, driver `gpu.metax-tech.com` (distinct devices) and binds their pods
//!   to `mx-node`; the NVIDIA claim from pool `nv-node`, driver `manager.nvidia.com`, pod on `nv-node`. A third
//!   MetaX claim stays unallocated and its pod Unschedulable although `nv-node` still has a free A100: a MetaX
//!   claim is never placed on the NVIDIA node.
//! * Occupancy: the controller marks the allocated PhysicalGPUs `Allocated` with their claim (resolved by the
//!   slice device's `resource.kubernetes.io/pciBusID` = `spec.pciAddress`; the controller's index fallback
//!   would name the same GPU here, so the test does not tell the two apart), the free A100 stays `Available`.
//!   When the first MetaX pod and claim are deleted (the test plays kube-controller-manager's part, which does
//!   not run here: it removes the claim's `resource.kubernetes.io/delete-protection` finalizer) the scheduler
//!   gives the freed MetaX GPU to the pending third claim (on `mx-node` again) and the controller moves the
//!   GPU's occupancy to it; when that one is deleted too, the GPU is `Available` with no claims.
//!
//! Needs the control-plane binaries and `vgpu-kubelet-plugin` / `vgpu-controller` built: run
//! `e2e/run.sh gpu_module_mixed`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use vgpu_e2e::webhook::{RunningWebhook, register_manifest_webhooks, webhook_pki};
use vgpu_e2e::{SCHEDULER_NAME, TestEnv, fixtures, free_port, scheduler_configuration, vgpu_binary};

const NV_NODE: &str = "nv-node";
const MX_NODE: &str = "mx-node";
const NV_DRIVER: &str = "manager.nvidia.com";
const MX_DRIVER: &str = "gpu.metax-tech.com";
const NAMESPACE: &str = "default";
const CONTROLLER: &str = "vgpu-controller";
const WAIT: Duration = Duration::from_secs(60);

const NV_MOCK: &str = "driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - { uuid: GPU-NV-0, name: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, computeCapability: '8.0', busId: '0000:01:00.0' }
  - { uuid: GPU-NV-1, name: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, computeCapability: '8.0', busId: '0000:02:00.0' }
";
const MX_MOCK: &str = "driver: { version: 2.33.0.5 }
gpus:
  - { uuid: GPU-MX-0, name: MXC500, vendor: metax, memoryMiB: 65536, busId: '0000:01:00.0' }
  - { uuid: GPU-MX-1, name: MXC500, vendor: metax, memoryMiB: 65536, busId: '0000:02:00.0' }
";

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("gpu.deckhouse.io", "v1alpha1", kind), plural)
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// A bare node (the kubelet's part: hostname label, Ready, capacity) without the DeviceClasses of
/// `deploy/dra/deviceclasses.yaml` (those are created once, with the first node).
async fn create_node(client: &kube::Client, name: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("kubernetes.io/hostname".to_owned(), name.to_owned())].into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    fixtures::set_node_capacity(client, name, 0, 0, 0).await.unwrap();
}

/// Starts `vgpu-kubelet-plugin` for `node` on the mock backend described by `mock` (as `tests/dra_prepare.rs`).
fn start_plugin(env: &mut TestEnv, node: &str, mock: &str, driver: &str) {
    let dir = env.workdir().join(node);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mock.yaml"), mock).unwrap();
    let path = |rel: &str| dir.join(rel).display().to_string();
    // The vGPU runtime files an install step puts on the host.
    vgpu_core::abi::runtime_files::install(&dir.join("manager"), "v1.0.0", b"").unwrap();
    let args = vec![
        "--backend=mock".to_owned(),
        format!("--mock-config={}", path("mock.yaml")),
        format!("--driver-name={driver}"),
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--kubelet-registrar-directory-path={}", path("plugins_registry")),
        format!("--kubelet-plugins-directory-path={}", path("plugins")),
        format!("--cdi-root={}", path("cdi")),
        format!("--host-manager-dir={}", path("manager")),
        "--healthcheck-port=0".to_owned(),
        "--physical-gpu-resync-interval=1s".to_owned(),
    ];
    let vars = vec![("NODE_NAME".to_owned(), node.to_owned()), ("RUST_LOG".to_owned(), "info".to_owned())];
    env.start_process(
        &format!("kubelet-plugin-{node}"),
        &vgpu_binary("vgpu-kubelet-plugin").unwrap(),
        &args,
        &vars,
    )
    .unwrap();
}

/// A PhysicalGPU as the node agent writes it (spec and `status.driver`); the adapter writes the rest.
async fn put_gpu(
    gpus: &Api<DynamicObject>,
    node: &str,
    index: u32,
    vendor: &str,
    ids: (&str, &str),
    model: &str,
) {
    let (vendor_id, device_id) = ids;
    let vendor_name = if vendor == "metax" { "MetaX Integrated Circuits" } else { "NVIDIA Corporation" };
    let name = format!("{node}-{index}");
    let spec = json!({
        "nodeName": node, "index": index, "pciAddress": format!("0000:{:02x}:00.0", index + 1),
        "vendor": vendor, "vendorId": vendor_id, "vendorName": vendor_name,
        "deviceId": device_id, "deviceName": model, "model": model, "classCode": "030200"
    });
    let gpu = object(json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
        "metadata": {"name": name}, "spec": spec}));
    gpus.create(&PostParams::default(), &gpu).await.unwrap();
    let status = json!({"driver": vendor});
    let status = json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
        "metadata": {"name": name}, "status": status});
    gpus.patch_status(&name, &PatchParams::apply("e2e-adapter").force(), &Patch::Apply(&status))
        .await
        .unwrap();
}

fn claim(name: &str, device_class: &str) -> ResourceClaim {
    serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 1}}]}}}))
    .unwrap()
}

/// A pod for the test scheduler using claim `claim` (no `nodeName`; the image is never pulled).
fn pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"schedulerName": SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "example.invalid/gpu:never-pulled",
                "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}))
    .unwrap()
}

/// Creates claim `name` of `device_class` and pod `name` using it.
async fn claim_and_pod(client: &kube::Client, name: &str, device_class: &str) {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    claims.create(&PostParams::default(), &claim(name, device_class)).await.unwrap();
    pods.create(&PostParams::default(), &pod(name, name)).await.unwrap();
}

/// The one allocation result of claim `name`: `(driver, pool, device)`.
async fn allocation(claims: &Api<ResourceClaim>, name: &str) -> (String, String, String) {
    let claim = claims.get(name).await.unwrap();
    let results =
        claim.status.and_then(|s| s.allocation).and_then(|a| a.devices).and_then(|d| d.results).unwrap();
    assert_eq!(results.len(), 1, "{results:?}");
    let r = &results[0];
    (r.driver.clone(), r.pool.clone(), r.device.clone())
}

/// Deletes pod `name` (no kubelet: at once) and then claim `name`; kube-controller-manager does not run here,
/// so its part (removing the scheduler's `resource.kubernetes.io/delete-protection` finalizer) is played.
async fn release(env: &TestEnv, client: &kube::Client, name: &str) {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .unwrap();
    claims.delete(name, &DeleteParams::default()).await.unwrap();
    if claims.get_opt(name).await.unwrap().is_some() {
        let unprotect = json!({"metadata": {"finalizers": null}});
        claims.patch(name, &PatchParams::default(), &Patch::Merge(&unprotect)).await.unwrap();
    }
    env.poll(&format!("claim {name} gone"), WAIT, || {
        let claims = claims.clone();
        async move { claims.get_opt(name).await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
}

/// The minor in a device name `gpu-<n>` / `vgpu-<n>` (the PhysicalGPU index of these mocks).
fn minor(device: &str) -> &str {
    device.rsplit('-').next().unwrap()
}

/// Waits until PhysicalGPU `name` has `state` and returns its `status.occupancy`.
async fn gpu_state(env: &TestEnv, gpus: &Api<DynamicObject>, name: &str, state: &str) -> Value {
    env.poll(&format!("PhysicalGPU {name} {state}"), WAIT, || {
        let gpus = gpus.clone();
        async move {
            let s = gpus.get(name).await.ok()?.data.get("status")?.clone();
            (s["state"] == state).then(|| s["occupancy"].clone())
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn metax_claims_land_only_on_the_metax_node() {
    let mut env = TestEnv::builder("metax_claims_land_only_on_the_metax_node").start().await.unwrap();
    let client = env.client().await.unwrap();
    env.start_scheduler_with_config(&scheduler_configuration(env.kubeconfig_path(), &[])).await.unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpu-module");

    // Two nodes, each with its plugin on the mock backend; both pools published.
    fixtures::create_dra_node_and_classes(&client, NV_NODE).await.unwrap();
    create_node(&client, MX_NODE).await;
    start_plugin(&mut env, NV_NODE, NV_MOCK, NV_DRIVER);
    start_plugin(&mut env, MX_NODE, MX_MOCK, MX_DRIVER);
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let pools = env
        .poll("both nodes' ResourceSlices", WAIT, || {
            let slices = slices.clone();
            async move {
                let list = slices.list(&ListParams::default()).await.ok()?;
                let pools: BTreeSet<(String, String, Option<String>, Vec<String>)> = list
                    .items
                    .into_iter()
                    .map(|s| {
                        let devices = s.spec.devices.iter().flatten().map(|d| d.name.clone()).collect();
                        (s.spec.driver, s.spec.pool.name, s.spec.node_name, devices)
                    })
                    .collect();
                (pools.len() == 2).then_some(pools)
            }
        })
        .await
        .unwrap();
    // NVIDIA GPUs are published as vGPUs; MetaX GPUs whole (vgpu-dra::devices: HAMi-core cannot limit
    // another vendor's runtime).
    let names = |prefix: &str| vec![format!("{prefix}-0"), format!("{prefix}-1")];
    assert_eq!(
        pools,
        BTreeSet::from([
            (MX_DRIVER.to_owned(), MX_NODE.to_owned(), Some(MX_NODE.to_owned()), names("gpu")),
            (NV_DRIVER.to_owned(), NV_NODE.to_owned(), Some(NV_NODE.to_owned()), names("vgpu")),
        ])
    );

    // The GPU module: CRDs, PhysicalGPUs, the controller.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in ["physicalgpus.gpu.deckhouse.io.yaml", "gpuclasses.gpu.deckhouse.io.yaml"] {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(deploy.join("crds").join(file)).unwrap())
                .unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let gpus: Api<DynamicObject> = Api::all_with(client.clone(), &ar("PhysicalGPU", "physicalgpus"));
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &ar("GPUClass", "gpuclasses"));
    env.poll("PhysicalGPU and GPUClass APIs served", WAIT, || {
        let (gpus, classes) = (gpus.clone(), classes.clone());
        async move {
            gpus.list(&Default::default()).await.ok()?;
            classes.list(&Default::default()).await.ok().map(drop)
        }
    })
    .await
    .unwrap();
    for index in 0..2 {
        put_gpu(&gpus, NV_NODE, index, "nvidia", ("10de", "20b0"), "a100-sxm4-40gb").await;
        put_gpu(&gpus, MX_NODE, index, "metax", ("9999", "4000"), "MXC500").await;
    }
    // The adapters: driver version, memory, compute capability, DriverReady and HardwareHealthy from each
    // node's own plugin (the test writes none of them).
    for (node, version) in [(NV_NODE, "570.86.10"), (MX_NODE, "2.33.0.5")] {
        for index in 0..2 {
            let name = format!("{node}-{index}");
            let status = env
                .poll(&format!("PhysicalGPU {name} status from the adapter"), WAIT, || {
                    let gpus = gpus.clone();
                    let name = name.clone();
                    async move {
                        let s = gpus.get(&name).await.ok()?.data.get("status")?.clone();
                        s.get("driverVersion").is_some().then_some(s)
                    }
                })
                .await
                .unwrap();
            assert_eq!(status["driverVersion"], version, "{name}: {status}");
            let healthy = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "HardwareHealthy"))
                .cloned()
                .unwrap_or_else(|| panic!("{name}: no HardwareHealthy: {status}"));
            assert_eq!(
                (&healthy["status"], &healthy["reason"]),
                (&json!("True"), &json!("Healthy")),
                "{name}"
            );
            let driver = if node == MX_NODE { "metax" } else { "nvidia" };
            assert_eq!(status["driver"], driver, "{name}: the other writers' fields stay");
            let (memory, capability) = if node == MX_NODE { (65536, None) } else { (40960, Some("8.0")) };
            assert_eq!(status["memoryMiB"], memory, "{name}: {status}");
            assert_eq!(status["computeCapability"].as_str(), capability, "{name}: {status}");
            let ready = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "DriverReady"))
                .cloned()
                .unwrap_or_else(|| panic!("{name}: no DriverReady: {status}"));
            assert_eq!(
                (&ready["status"], &ready["reason"]),
                (&json!("True"), &json!("DriverAnswering")),
                "{name}"
            );
            let managers: Vec<String> = gpus
                .get(&name)
                .await
                .unwrap()
                .metadata
                .managed_fields
                .unwrap_or_default()
                .into_iter()
                .filter_map(|m| m.manager)
                .collect();
            assert!(managers.iter().any(|m| m == "vgpu-kubelet-plugin"), "{name}: {managers:?}");
        }
    }

    let (ca_pem, cert, key) = webhook_pki().unwrap();
    let cert_dir = env.workdir().join("controller-certs");
    std::fs::create_dir_all(&cert_dir).unwrap();
    std::fs::write(cert_dir.join("tls.crt"), cert).unwrap();
    std::fs::write(cert_dir.join("tls.key"), key).unwrap();
    let port = free_port().unwrap();
    let args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={port}"),
        "--server-bind-address=127.0.0.1".to_owned(),
        format!("--cert-dir={}", cert_dir.display()),
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
    // Its admission webhooks (controller.yaml), so pods asking for a GPUClass are mutated.
    let manifest =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpu-module/controller.yaml");
    let running = RunningWebhook { port, ca_pem, cert_dir: cert_dir.clone() };
    assert_eq!(register_manifest_webhooks(&client, &manifest, &running).await.unwrap(), 2);

    // GPUClasses → DeviceClasses, each valid with its own node's two GPUs.
    let metax = object(json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": "metax-whole"}, "spec": {"vendor": "metax", "sharing": {"mode": "Exclusive"}}}));
    let a100 = object(json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": "a100-whole"},
        "spec": {"vendor": "nvidia", "deviceType": "a100-sxm4-40gb", "minMemoryMiB": 40000,
            "minComputeCapability": "8.0", "sharing": {"mode": "Exclusive"}}}));
    classes.create(&PostParams::default(), &metax).await.unwrap();
    classes.create(&PostParams::default(), &a100).await.unwrap();
    let device_classes: Api<DeviceClass> = Api::all(client.clone());
    for (class, driver) in [("metax-whole", MX_DRIVER), ("a100-whole", NV_DRIVER)] {
        let status = env
            .poll(&format!("GPUClass {class} valid"), WAIT, || {
                let classes = classes.clone();
                async move {
                    let s = classes.get(class).await.ok()?.data.get("status")?.clone();
                    (s["valid"] == true).then_some(s)
                }
            })
            .await
            .unwrap();
        let dc_name = format!("{class}.gpu.deckhouse.io");
        assert_eq!(status["deviceClassName"], dc_name.as_str());
        assert_eq!(status["message"], "matches 2 PhysicalGPUs on 1 node", "{class}");
        let dc = device_classes.get(&dc_name).await.unwrap();
        let expression = &dc.spec.unwrap().selectors.unwrap()[0].cel.clone().unwrap().expression;
        assert!(expression.starts_with(&format!("device.driver == \"{driver}\"")), "{expression}");
    }

    // The real scheduler: MetaX claims on mx-node, the NVIDIA claim on nv-node.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    claim_and_pod(&client, "mx-a", "metax-whole.gpu.deckhouse.io").await;
    claim_and_pod(&client, "mx-b", "metax-whole.gpu.deckhouse.io").await;
    claim_and_pod(&client, "nv-a", "a100-whole.gpu.deckhouse.io").await;
    let mut mx_devices = BTreeSet::new();
    for name in ["mx-a", "mx-b"] {
        assert_eq!(fixtures::wait_for_pod_node(&client, NAMESPACE, name, WAIT).await.unwrap(), MX_NODE);
        let (driver, pool, device) = allocation(&claims, name).await;
        assert_eq!((driver.as_str(), pool.as_str()), (MX_DRIVER, MX_NODE), "{name}: {device}");
        mx_devices.insert(device);
    }
    assert_eq!(mx_devices, BTreeSet::from(["gpu-0".to_owned(), "gpu-1".to_owned()]));
    assert_eq!(fixtures::wait_for_pod_node(&client, NAMESPACE, "nv-a", WAIT).await.unwrap(), NV_NODE);
    let (driver, pool, nv_device) = allocation(&claims, "nv-a").await;
    assert_eq!((driver.as_str(), pool.as_str()), (NV_DRIVER, NV_NODE), "{nv_device}");

    // Both MetaX GPUs are taken: a third MetaX claim is not placed on nv-node, whose second A100 is free.
    claim_and_pod(&client, "mx-c", "metax-whole.gpu.deckhouse.io").await;
    let message = env
        .poll("pod mx-c Unschedulable", WAIT, || {
            let pods = pods.clone();
            async move {
                let status = pods.get("mx-c").await.ok()?.status?;
                status.conditions?.into_iter().find_map(|c| {
                    (c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable"))
                    .then(|| c.message.unwrap_or_default())
                })
            }
        })
        .await
        .unwrap();
    println!("mx-c: {message}");
    let pending = pods.get("mx-c").await.unwrap();
    assert_eq!(pending.spec.unwrap().node_name, None);
    assert!(claims.get("mx-c").await.unwrap().status.and_then(|s| s.allocation).is_none());

    // Occupancy from the scheduler's allocations.
    let mx_a_device = allocation(&claims, "mx-a").await.2;
    let mx_a_gpu = format!("{MX_NODE}-{}", minor(&mx_a_device));
    for (claim, device, node) in [
        ("mx-a", mx_a_device.clone(), MX_NODE),
        ("mx-b", allocation(&claims, "mx-b").await.2, MX_NODE),
        ("nv-a", nv_device.clone(), NV_NODE),
    ] {
        let gpu = format!("{node}-{}", minor(&device));
        let occupancy = gpu_state(&env, &gpus, &gpu, "Allocated").await;
        assert_eq!(
            occupancy,
            json!({"totalShares": 1, "usedShares": 1, "claims": [format!("{NAMESPACE}/{claim}")]}),
            "{gpu}"
        );
    }
    let free_a100 = if nv_device == "vgpu-0" { "nv-node-1" } else { "nv-node-0" };
    assert_eq!(gpus.get(free_a100).await.unwrap().data["status"]["state"], "Available");

    // Release mx-a: the scheduler gives the freed MetaX GPU to the pending mx-c (still never nv-node), and
    // the controller moves the GPU's occupancy to it; releasing mx-c makes the GPU Available.
    release(&env, &client, "mx-a").await;
    assert_eq!(fixtures::wait_for_pod_node(&client, NAMESPACE, "mx-c", WAIT).await.unwrap(), MX_NODE);
    let (driver, pool, device) = allocation(&claims, "mx-c").await;
    assert_eq!((driver.as_str(), pool.as_str(), device.as_str()), (MX_DRIVER, MX_NODE, mx_a_device.as_str()));
    env.poll(&format!("PhysicalGPU {mx_a_gpu} held by mx-c"), WAIT, || {
        let gpus = gpus.clone();
        let gpu = mx_a_gpu.clone();
        async move {
            let s = gpus.get(&gpu).await.ok()?.data.get("status")?.clone();
            (s["state"] == "Allocated" && s["occupancy"]["claims"] == json!([format!("{NAMESPACE}/mx-c")]))
                .then_some(())
        }
    })
    .await
    .unwrap();
    release(&env, &client, "mx-c").await;
    let occupancy = gpu_state(&env, &gpus, &mx_a_gpu, "Available").await;
    assert_eq!(occupancy["usedShares"], 0, "{occupancy}");
    assert_eq!(occupancy["claims"].as_array().map_or(0, Vec::len), 0, "{occupancy}");
    assert_eq!(
        gpus.get(&format!("{MX_NODE}-{}", minor(&allocation(&claims, "mx-b").await.2))).await.unwrap().data["status"]
            ["state"],
        "Allocated"
    );

    for name in [NV_NODE, MX_NODE] {
        env.check_process(&format!("kubelet-plugin-{name}")).unwrap();
    }
    // A pod that only names the GPUClass in its limits: the controller's mutation gives it a claim of
    // a100-whole's DeviceClass, and the real scheduler allocates it on nv-node's other A100, never on mx-node
    // (another product, which has a free GPU again by now).
    let asking: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nv-mutated", "namespace": NAMESPACE},
        "spec": {"schedulerName": SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "example.invalid/gpu:never-pulled",
                "resources": {"limits": {"gpu.deckhouse.io/a100-whole": "1"}}}]}}))
    .unwrap();
    let created = pods.create(&PostParams::default(), &asking).await.unwrap();
    let pod_claims = created.spec.as_ref().and_then(|s| s.resource_claims.clone()).unwrap_or_default();
    assert_eq!(pod_claims.len(), 1, "the mutation adds one claim: {pod_claims:?}");
    let generated = pod_claims[0].resource_claim_name.clone().expect("a named claim");
    let generated_claim = claims.get(&generated).await.unwrap();
    let requests = generated_claim.spec.unwrap().devices.unwrap().requests.unwrap();
    assert_eq!(requests[0].exactly.as_ref().unwrap().device_class_name, "a100-whole.gpu.deckhouse.io");
    assert_eq!(fixtures::wait_for_pod_node(&client, NAMESPACE, "nv-mutated", WAIT).await.unwrap(), NV_NODE);
    let (driver, pool, device) = allocation(&claims, &generated).await;
    assert_eq!((driver.as_str(), pool.as_str()), (NV_DRIVER, NV_NODE));
    assert_ne!(device, nv_device, "the other A100");
    env.check_process(CONTROLLER).unwrap();
    env.finish();
}
