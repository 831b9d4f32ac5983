//! `vgpu-mig-manager --backend mock` against the real API server (issue #20 §6): a node with two A100 80GB
//! GPUs (the mock backend's MIG state machine, its state in a `migStateFile` so the device plugin started
//! afterwards sees it), the mig-parted ConfigMap, a GPU pod, a CPU pod and
//! a device plugin pod object on the node.
//!
//! Label `all-disabled` → `success`, node schedulable. Label changed to `all-1g.10gb`: state `pending`,
//! the node cordoned and tainted, the GPU pod evicted through the Eviction API and waited for while it
//! terminates (this test plays the kubelet and finishes the graceful deletion); then 7 × `1g.10gb` per GPU
//! in the mock state, the device plugin pod deleted,
//! GFD labels (`nvidia.com/mig-1g.10gb.count=14`), node uncordoned and untainted, state `success`, the CPU
//! pod untouched. Our real `vgpu-device-plugin`, started as its DaemonSet would restart it, registers
//! `nvidia.com/mig-1g.10gb` with 14 devices. Label `bad-profile` → state `failed`, the reason annotation,
//! the node schedulable and the layout unchanged.
//!
//! The second scenario (`--drain`, issue #34 item 6) exercises a PodDisruptionBudget: this control plane has
//! no controller-manager, so the test writes the PDB's status as the disruption controller would; the API
//! server then answers the eviction with 429 until the budget allows it. It also skips a DaemonSet pod and
//! ends with a reboot request (GPUs that cannot be reset) that the manager withdraws after the "reboot".
//!
//! The manager runs as the ServiceAccount of `deploy/mig-manager/rbac.yaml` (so the manifests grant every
//! call it makes).
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use vgpu_core::backend::{DeviceBackend, MigMode, mock::MockBackend};
use vgpu_e2e::{TestEnv, kubelet::TestKubelet, vgpu_binary};
use vgpu_kubelet::api::v1beta1::Empty;

const NODE: &str = "mig-node";
const NS: &str = "d8-gpu";
const MANAGER: &str = "vgpu-mig-manager";
const PLUGIN: &str = "vgpu-device-plugin";
const CONFIG_LABEL: &str = "nvidia.com/mig.config";
const STATE_LABEL: &str = "nvidia.com/mig.config.state";
const REASON: &str = "nvidia.com/mig.config.state.reason";
const REBOOT_ANNOTATION: &str = "nvidia.com/mig.config.reboot-required";
const TIMEOUT: Duration = Duration::from_secs(60);

const CONFIG: &str = r#"version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  bad-profile:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.11gb": 7
"#;

fn object<T: k8s_openapi::serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn pod(name: &str, labels: serde_json::Value, resources: serde_json::Value) -> Pod {
    object(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": NS, "labels": labels },
        "spec": { "nodeName": NODE, "containers": [ { "name": "c", "image": "busybox", "resources": resources } ] }
    }))
}

/// Applies `deploy/mig-manager/rbac.yaml` and writes a kubeconfig acting as its ServiceAccount.
async fn manager_kubeconfig(env: &TestEnv, client: &kube::Client) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/mig-manager/rbac.yaml");
    let (ns, name) = vgpu_e2e::rbac::apply_rbac_manifest(client, &path).await.unwrap();
    assert_eq!((ns.as_str(), name.as_str()), (NS, MANAGER));
    vgpu_e2e::rbac::token_kubeconfig(env, client, (&ns, &name), "mig-manager.kubeconfig").await.unwrap()
}

async fn node_state(nodes: &Api<Node>) -> Option<(String, bool, usize)> {
    let node = nodes.get(NODE).await.ok()?;
    let state = node.metadata.labels?.get(STATE_LABEL)?.clone();
    let spec = node.spec.unwrap_or_default();
    Some((state, spec.unschedulable.unwrap_or(false), spec.taints.unwrap_or_default().len()))
}

async fn set_config(nodes: &Api<Node>, name: &str) {
    let patch = serde_json::json!({ "metadata": { "labels": { CONFIG_LABEL: name } } });
    nodes.patch(NODE, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn mig_manager_applies_the_labelled_layout_with_the_node_in_maintenance() {
    let mut env = TestEnv::builder("mig_manager_applies_the_labelled_layout_with_the_node_in_maintenance")
        .start()
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    let state_file = env.workdir().join("mig-state.json");
    let description = env.workdir().join("mock.yaml");
    std::fs::write(
        &description,
        format!(
            "driver: {{ version: 570.86.10, cudaVersion: '12.8' }}\ngpus:\n  - {{ uuid: GPU-a, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', mig: {{ mode: Disabled }} }}\n  - {{ uuid: GPU-b, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', mig: {{ mode: Disabled }} }}\nmigStateFile: {}\n",
            state_file.display()
        ),
    )
    .unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": NODE, "labels": { CONFIG_LABEL: "all-disabled" } }
            })),
        )
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &object(serde_json::json!({ "metadata": { "name": NS } })))
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    config_maps
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "metadata": { "name": "default-mig-parted-config" }, "data": { "config.yaml": CONFIG }
            })),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let gpu = serde_json::json!({ "limits": { "nvidia.com/vgpu-number": "1" }, "requests": { "nvidia.com/vgpu-number": "1" } });
    pods.create(&PostParams::default(), &pod("trainer", serde_json::json!({ "app": "trainer" }), gpu))
        .await
        .unwrap();
    pods.create(
        &PostParams::default(),
        &pod("web", serde_json::json!({ "app": "web" }), serde_json::json!({})),
    )
    .await
    .unwrap();
    let plugin_labels = serde_json::json!({ "app.kubernetes.io/name": "vgpu-device-plugin" });
    pods.create(&PostParams::default(), &pod("vgpu-device-plugin-x", plugin_labels, serde_json::json!({})))
        .await
        .unwrap();

    // The manager runs as the ServiceAccount of deploy/mig-manager/rbac.yaml.
    let kubeconfig = manager_kubeconfig(&env, &client).await;
    let args = vec![
        "--backend=mock".to_owned(),
        format!("--mock-config={}", description.display()),
        format!("--node-name={NODE}"),
        format!("--config-map={NS}/default-mig-parted-config"),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--machine-type-file={}", env.workdir().join("no-dmi").display()),
        "--interval=1s".to_owned(),
        "--retry-interval=1s".to_owned(),
    ];
    env.start_process(MANAGER, &vgpu_binary(MANAGER).unwrap(), &args, &[("RUST_LOG".into(), "info".into())])
        .unwrap();

    // all-disabled is what the GPUs have: success, nothing else happens.
    env.poll("state success for all-disabled", TIMEOUT, || async {
        (node_state(&nodes).await? == ("success".to_owned(), false, 0)).then_some(())
    })
    .await
    .unwrap();
    let labels = nodes.get(NODE).await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    assert_eq!(labels["nvidia.com/mig.capable"], "true");
    assert_eq!(labels["nvidia.com/cuda.driver.major"], "570");

    // all-1g.10gb: maintenance: pending, cordoned and tainted; the GPU pod is evicted (the API server
    // starts its graceful deletion) and the manager waits for it with the GPUs unchanged.
    set_config(&nodes, "all-1g.10gb").await;
    env.poll("state pending, cordoned and tainted", TIMEOUT, || async {
        (node_state(&nodes).await? == ("pending".to_owned(), true, 1)).then_some(())
    })
    .await
    .unwrap();
    env.poll("the GPU pod evicted (terminating)", TIMEOUT, || async {
        pods.get("trainer").await.ok()?.metadata.deletion_timestamp.map(|_| ())
    })
    .await
    .unwrap();
    env.poll("the manager waiting for the terminating GPU pod", TIMEOUT, || async {
        env.log_tail(MANAGER, 400).contains("gpu/trainer is terminating").then_some(())
    })
    .await
    .unwrap();
    let backend = MockBackend::from_path(&description).unwrap();
    assert_eq!(
        backend.mig_layout(0).unwrap().mode,
        MigMode::Disabled,
        "nothing applied while a GPU pod remains"
    );
    assert_eq!(node_state(&nodes).await.unwrap(), ("pending".to_owned(), true, 1));

    // As the kubelet: the container stopped, the deletion completes.
    pods.delete("trainer", &DeleteParams::default().grace_period(0)).await.unwrap();
    env.poll("state success for all-1g.10gb, node returned", TIMEOUT, || async {
        (node_state(&nodes).await? == ("success".to_owned(), false, 0)).then_some(())
    })
    .await
    .unwrap();
    for gpu in 0..2 {
        let layout = backend.mig_layout(gpu).unwrap();
        assert_eq!(layout.mode, MigMode::Enabled);
        assert_eq!(layout.instances.len(), 7, "{layout:?}");
        assert!(layout.instances.iter().all(|i| i.profile.to_string() == "1g.10gb"));
    }
    let labels = nodes.get(NODE).await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels["nvidia.com/mig-1g.10gb.count"], "14");
    assert_eq!(labels["nvidia.com/mig.strategy"], "mixed");
    assert!(pods.get("web").await.unwrap().metadata.deletion_timestamp.is_none(), "CPU pod untouched");
    let plugin_pod = pods.get_opt("vgpu-device-plugin-x").await.unwrap();
    assert!(
        plugin_pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the device plugin pod is deleted so that it re-advertises"
    );

    // The device plugin, started again as its DaemonSet would, advertises the MIG devices.
    let mut kubelet = TestKubelet::start(env.workdir().join("device-plugins")).unwrap();
    let manager_dir = env.workdir().join("manager");
    std::fs::create_dir_all(&manager_dir).unwrap();
    let plugin_args = vec![
        "--backend=mock".to_owned(),
        format!("--mock-config={}", description.display()),
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--device-plugin-path={}", kubelet.dir().display()),
        format!("--manager-dir={}", manager_dir.display()),
        format!("--host-manager-dir={}", manager_dir.display()),
        format!("--kubelet-root={}", env.workdir().display()),
        format!("--pod-resources-socket={}", env.workdir().join("no-pod-resources.sock").display()),
        "--mig-strategy=mixed".to_owned(),
    ];
    env.start_process(
        PLUGIN,
        &vgpu_binary(PLUGIN).unwrap(),
        &plugin_args,
        &[("RUST_LOG".into(), "info".into())],
    )
    .unwrap();
    let registration = match kubelet.registration("nvidia.com/mig-1g.10gb", TIMEOUT).await {
        Ok(r) => r,
        Err(e) => panic!("{e}\n{PLUGIN} log:\n{}", env.log_tail(PLUGIN, 40)),
    };
    let mut plugin = kubelet.connect(&registration.endpoint).await.unwrap();
    let mut updates = plugin.list_and_watch(Empty {}).await.unwrap().into_inner();
    let devices = updates.message().await.unwrap().unwrap().devices;
    assert_eq!(devices.len(), 14);
    assert!(devices.iter().all(|d| d.id.starts_with("MIG-")), "{devices:?}");
    env.stop_process(PLUGIN).unwrap();

    // An invalid profile name: failed with the reason, node untouched, layout unchanged.
    set_config(&nodes, "bad-profile").await;
    let reason = env
        .poll("state failed with a reason", TIMEOUT, || async {
            let node = nodes.get(NODE).await.ok()?;
            let labels: BTreeMap<String, String> = node.metadata.labels?;
            (labels.get(STATE_LABEL)? == "failed").then_some(())?;
            node.metadata.annotations?.get(REASON).cloned()
        })
        .await
        .unwrap();
    assert!(reason.contains("profile \"1g.11gb\" does not exist on A100-80GB"), "{reason}");
    assert_eq!(node_state(&nodes).await.unwrap(), ("failed".to_owned(), false, 0));
    assert_eq!(backend.mig_layout(1).unwrap().instances.len(), 7);
    env.check_process(MANAGER).unwrap();
    env.finish();
}

/// Plays the disruption controller (this control plane has no controller-manager): the PDB's status as
/// computed for one healthy pod, allowing `allowed` disruptions.
async fn pdb_status(pdbs: &Api<PodDisruptionBudget>, allowed: i32) {
    let generation = pdbs.get("web").await.unwrap().metadata.generation.unwrap_or(1);
    let status = serde_json::json!({ "status": {
        "observedGeneration": generation, "disruptionsAllowed": allowed,
        "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1
    } });
    pdbs.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

/// The node's reboot request: (state label, reboot annotation, `MIGRebootRequired` condition status).
async fn reboot_state(nodes: &Api<Node>) -> Option<(String, Option<String>, Option<String>)> {
    let node = nodes.get(NODE).await.ok()?;
    let state = node.metadata.labels?.get(STATE_LABEL)?.clone();
    let annotation = node.metadata.annotations.unwrap_or_default().get(REBOOT_ANNOTATION).cloned();
    let condition = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "MIGRebootRequired")
        .map(|c| c.status);
    Some((state, annotation, condition))
}

async fn set_boot_id(nodes: &Api<Node>, boot_id: &str) {
    let info = serde_json::json!({ "status": { "nodeInfo": {
        "bootID": boot_id, "machineID": "m", "systemUUID": "s", "kernelVersion": "6.1", "osImage": "test",
        "containerRuntimeVersion": "containerd://2", "kubeletVersion": "v1.37.2", "kubeProxyVersion": "",
        "operatingSystem": "linux", "architecture": "amd64"
    } } });
    nodes.patch_status(NODE, &PatchParams::default(), &Patch::Merge(&info)).await.unwrap();
}

/// `--drain` and the reboot request (issue #34 item 6), against the real API server: GPUs whose MIG mode
/// change stays pending and cannot be reset (mock `modeChange: Pending, reset: InUse`).
///
/// The drain evicts the Deployment-style pod `web` (Running and Ready) through the Eviction API; its
/// PodDisruptionBudget (status written by this test, playing the disruption controller) first allows no
/// disruption: the API server answers 429 and the pod stays, the manager retrying; once the budget allows
/// one, the eviction goes through. The DaemonSet pod `agent` is never evicted. The layout then needs a
/// reset the mock refuses: state `reboot-required`, the annotation with the boot ID, the condition
/// `MIGRebootRequired=True`, the node kept cordoned. "Reboot": the state file with the modes applied and a
/// new boot ID; the manager applies the layout, withdraws the request (annotation removed, condition
/// `False`) and uncordons the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn mig_manager_drains_through_a_pdb_and_requests_a_reboot() {
    let mut env =
        TestEnv::builder("mig_manager_drains_through_a_pdb_and_requests_a_reboot").start().await.unwrap();
    let client = env.client().await.unwrap();
    let state_file = env.workdir().join("mig-state.json");
    let description = env.workdir().join("mock.yaml");
    let gpu = |id: &str| {
        format!(
            "  - {{ uuid: GPU-{id}, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: {{ mode: Disabled, modeChange: Pending, reset: InUse }} }}\n"
        )
    };
    std::fs::write(
        &description,
        format!("gpus:\n{}{}migStateFile: {}\n", gpu("a"), gpu("b"), state_file.display()),
    )
    .unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": NODE, "labels": { CONFIG_LABEL: "all-disabled" } }
            })),
        )
        .await
        .unwrap();
    set_boot_id(&nodes, "boot-1").await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &object(serde_json::json!({ "metadata": { "name": NS } })))
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    config_maps
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "metadata": { "name": "default-mig-parted-config" }, "data": { "config.yaml": CONFIG }
            })),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let owned = |name: &str, kind: &str, labels: serde_json::Value| -> Pod {
        object(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": NS, "labels": labels, "ownerReferences": [ {
                "apiVersion": "apps/v1", "kind": kind, "name": format!("{name}-owner"),
                "uid": "00000000-0000-0000-0000-000000000001", "controller": true } ] },
            "spec": { "nodeName": NODE, "containers": [ { "name": "c", "image": "busybox" } ] }
        }))
    };
    pods.create(&PostParams::default(), &owned("web", "ReplicaSet", serde_json::json!({ "app": "web" })))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &owned("agent", "DaemonSet", serde_json::json!({ "app": "agent" })))
        .await
        .unwrap();
    // As the kubelet: web runs and is ready (a PDB protects Running, Ready pods).
    let running = serde_json::json!({ "status": { "phase": "Running", "conditions": [
        { "type": "Ready", "status": "True" } ] } });
    pods.patch_status("web", &PatchParams::default(), &Patch::Merge(&running)).await.unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    pdbs.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": { "name": "web" },
            "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "web" } } }
        })),
    )
    .await
    .unwrap();
    pdb_status(&pdbs, 0).await;

    let kubeconfig = manager_kubeconfig(&env, &client).await;
    let args = vec![
        "--backend=mock".to_owned(),
        format!("--mock-config={}", description.display()),
        format!("--node-name={NODE}"),
        format!("--config-map={NS}/default-mig-parted-config"),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--machine-type-file={}", env.workdir().join("no-dmi").display()),
        "--interval=1s".to_owned(),
        "--retry-interval=1s".to_owned(),
        "--max-retry-interval=2s".to_owned(),
        "--drain".to_owned(),
    ];
    env.start_process(MANAGER, &vgpu_binary(MANAGER).unwrap(), &args, &[("RUST_LOG".into(), "info".into())])
        .unwrap();
    env.poll("state success for all-disabled", TIMEOUT, || async {
        (node_state(&nodes).await? == ("success".to_owned(), false, 0)).then_some(())
    })
    .await
    .unwrap();

    // The drain: the PDB refuses (429), the pod stays, the manager retries.
    set_config(&nodes, "all-1g.10gb").await;
    env.poll("the eviction of web refused by its PDB", TIMEOUT, || async {
        env.log_tail(MANAGER, 400).contains("gpu/web: eviction refused").then_some(())
    })
    .await
    .unwrap();
    assert!(pods.get("web").await.unwrap().metadata.deletion_timestamp.is_none(), "the PDB holds web");
    assert_eq!(node_state(&nodes).await.unwrap(), ("pending".to_owned(), true, 1));
    assert_eq!(MockBackend::from_path(&description).unwrap().mig_layout(0).unwrap().mode, MigMode::Disabled);

    // The budget allows one disruption: evicted (the API server starts the graceful deletion).
    pdb_status(&pdbs, 1).await;
    env.poll("web evicted once the PDB allows it", TIMEOUT, || async {
        pods.get("web").await.ok()?.metadata.deletion_timestamp.map(|_| ())
    })
    .await
    .unwrap();
    pods.delete("web", &DeleteParams::default().grace_period(0)).await.unwrap();

    // No reset possible: a reboot is requested, the node stays in maintenance.
    env.poll("reboot requested", TIMEOUT, || async {
        let wanted = ("reboot-required".to_owned(), Some("boot-1".to_owned()), Some("True".to_owned()));
        (reboot_state(&nodes).await? == wanted).then_some(())
    })
    .await
    .unwrap();
    let node = nodes.get(NODE).await.unwrap();
    let reason = node.metadata.annotations.unwrap()[REASON].clone();
    assert!(reason.contains("is pending and the GPU cannot be reset"), "{reason}");
    assert!(node.spec.unwrap().unschedulable.unwrap_or(false), "kept cordoned until the reboot");
    assert!(pods.get("agent").await.unwrap().metadata.deletion_timestamp.is_none(), "DaemonSet pod kept");

    // The reboot operator reboots the node: the manager stops, the pending modes are applied, a new boot ID,
    // the manager starts again.
    env.stop_process(MANAGER).unwrap();
    MockBackend::from_path(&description).unwrap().reboot().unwrap();
    set_boot_id(&nodes, "boot-2").await;
    env.start_process(MANAGER, &vgpu_binary(MANAGER).unwrap(), &args, &[("RUST_LOG".into(), "info".into())])
        .unwrap();
    env.poll("state success after the reboot, request withdrawn", TIMEOUT, || async {
        (reboot_state(&nodes).await? == ("success".to_owned(), None, Some("False".to_owned()))).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(node_state(&nodes).await.unwrap(), ("success".to_owned(), false, 0));
    let backend = MockBackend::from_path(&description).unwrap();
    for gpu in 0..2 {
        let layout = backend.mig_layout(gpu).unwrap();
        assert_eq!((layout.mode, layout.instances.len()), (MigMode::Enabled, 7), "GPU {gpu}");
    }
    let evictions = env.log_tail(MANAGER, 2000);
    assert!(!evictions.contains("gpu/agent"), "the DaemonSet pod was never evicted");
    assert!(pods.get("agent").await.unwrap().metadata.deletion_timestamp.is_none());
    env.check_process(MANAGER).unwrap();
    env.finish();
}
