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
//! PodDisruptionBudgets are not exercised here: in this control plane (no controller-manager) an eviction
//! that has to evaluate PDBs — any Running pod — gets no answer from the API server (observed: the manager's
//! 30 s eviction timeout fires again and again), so the 429 → retry path is covered by the library tests
//! (`vgpu-mig-manager/tests/manager.rs`) only.
//!
//! The manager runs as the ServiceAccount of `deploy/mig-manager/rbac.yaml` (so the manifests grant every
//! call it makes).
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use vgpu_core::backend::{DeviceBackend, MigMode, mock::MockBackend};
use vgpu_deviceplugin::api::v1beta1::Empty;
use vgpu_e2e::{TestEnv, kubelet::TestKubelet, vgpu_binary};

const NODE: &str = "mig-node";
const NS: &str = "d8-gpu";
const MANAGER: &str = "vgpu-mig-manager";
const PLUGIN: &str = "vgpu-device-plugin";
const CONFIG_LABEL: &str = "nvidia.com/mig.config";
const STATE_LABEL: &str = "nvidia.com/mig.config.state";
const REASON: &str = "nvidia.com/mig.config.state.reason";
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
