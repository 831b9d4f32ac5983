//! `vgpu-device-plugin --backend mock` against the real API server and a test kubelet (issue #8 §3,
//! second scenario), then the whole pod path: our extender under the real kube-scheduler pre-allocates and
//! binds a pod, and the plugin admits it through `Allocate`.
//!
//! The test plays the kubelet: it serves `Registration` on `kubelet.sock` in a temporary device-plugin
//! folder, reads the device list with `ListAndWatch`, advertises the capacity on the Node status (as the
//! kubelet does from that list), and calls `Allocate` with devices of the pre-allocated GPU. Everything
//! else is read back from the API server: the node annotations and labels appear and are removed on
//! shutdown, and the pod ends `assigned-phase=succeed` with `real-allocated` equal to `pre-allocated`.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_core::codec::{node_devices, pod_devices};
use vgpu_deviceplugin::api::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, Empty, RegisterRequest,
    device_plugin_client::DevicePluginClient,
    registration_server::{Registration, RegistrationServer},
};
use vgpu_deviceplugin::registration::connect_unix;
use vgpu_e2e::fixtures::{self, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::{ExtenderConfig, TestEnv, free_port, vgpu_binary, wait_ready};

const NODE: &str = "dp-node";
const PLUGIN: &str = "vgpu-device-plugin";
const EXTENDER: &str = "vgpu-scheduler-extender";
const SPLIT: usize = 10;

struct TestKubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for TestKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

fn mock_description() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mock/pcie-l40s-4gpu.yaml")
}

async fn node_annotation(nodes: &Api<Node>, key: &str) -> Option<String> {
    nodes.get(NODE).await.ok()?.metadata.annotations?.get(key).cloned()
}

async fn poll<T, F, Fut>(what: &str, timeout: Duration, env: &TestEnv, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!(
                "{what}: not after {timeout:?}\nplugin log:\n{}\nextender log:\n{}",
                env.log_tail(PLUGIN, 30),
                env.log_tail(EXTENDER, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn device_plugin_publishes_the_node_and_admits_a_scheduled_pod() {
    let mut env = TestEnv::builder("device_plugin_publishes_the_node_and_admits_a_scheduled_pod")
        .start()
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}});
    nodes.create(&PostParams::default(), &serde_json::from_value(node).unwrap()).await.unwrap();

    // The test kubelet.
    let plugin_dir = env.workdir().join("device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let (tx, mut registrations) = mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(plugin_dir.join("kubelet.sock")).unwrap();
    let kubelet = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(TestKubelet(tx)))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let manager_dir = env.workdir().join("manager");
    std::fs::create_dir_all(&manager_dir).unwrap();
    let args = vec![
        "--backend=mock".to_owned(),
        format!("--mock-config={}", mock_description().display()),
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--device-plugin-path={}", plugin_dir.display()),
        format!("--manager-dir={}", manager_dir.display()),
        format!("--host-manager-dir={}", manager_dir.display()),
        format!("--kubelet-root={}", env.workdir().display()),
        format!("--pod-resources-socket={}", env.workdir().join("no-pod-resources.sock").display()),
        format!("--device-split-count={SPLIT}"),
        "--node-publish-interval=2".to_owned(),
    ];
    env.start_process(PLUGIN, &vgpu_binary(PLUGIN).unwrap(), &args, &[("RUST_LOG".into(), "info".into())])
        .unwrap();

    // Registration of the vGPU-number resource.
    let deadline = Instant::now() + Duration::from_secs(60);
    let registration = loop {
        let r = tokio::time::timeout_at(deadline, registrations.recv())
            .await
            .unwrap_or_else(|_| panic!("no Register in 60 s\n{}", env.log_tail(PLUGIN, 30)))
            .unwrap();
        if r.resource_name == VGPU_NUMBER {
            break r;
        }
    };
    assert_eq!(registration.version, "v1beta1");
    assert_eq!(registration.endpoint, "nvidia-vgpu.sock");

    // The node annotations and labels, read back from the API server.
    let register = poll("node-device-register annotation", Duration::from_secs(30), &env, || {
        node_annotation(&nodes, fixtures::NODE_DEVICE_REGISTER)
    })
    .await;
    let inventory = node_devices::decode(&register).unwrap();
    assert_eq!(inventory.devices.len(), 4, "{register}");
    assert!(inventory.devices.iter().all(|d| d.split_count as usize == SPLIT), "{register}");
    // The mock description marks GPU 3 unhealthy (an ECC event): listed, but not schedulable.
    let schedulable: Vec<u32> =
        inventory.devices.iter().filter(|d| d.is_schedulable()).map(|d| d.index).collect();
    assert_eq!(schedulable, [0, 1, 2], "{register}");
    let config = node_annotation(&nodes, fixtures::NODE_CONFIG_INFO).await.unwrap();
    assert!(config.contains(&format!("\"deviceSplit\":{SPLIT}")), "{config}");

    // ListAndWatch: GPUs × split device IDs; advertise them on the Node as the kubelet would.
    let channel =
        connect_unix(&plugin_dir.join(&registration.endpoint), Duration::from_secs(5)).await.unwrap();
    let mut plugin = DevicePluginClient::new(channel);
    let mut stream = plugin.list_and_watch(Empty {}).await.unwrap().into_inner();
    let devices = stream.message().await.unwrap().unwrap().devices;
    assert_eq!(devices.len(), 4 * SPLIT);
    let healthy = devices.iter().filter(|d| d.health == "Healthy").count();
    assert_eq!(healthy, 3 * SPLIT, "GPU 3's devices are Unhealthy");
    let resources = json!({"cpu": "32", "memory": "128Gi", "pods": "110", VGPU_NUMBER: healthy.to_string(),
        "nvidia.com/vgpu-cores": "300", VGPU_MEMORY: (3 * 46068).to_string()});
    let status = json!({"status": {"capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test kubelet"}]}});
    nodes.patch_status(NODE, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    // Our extender under the real kube-scheduler pre-allocates and binds a pod.
    let port = free_port().unwrap();
    let ext_args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={port}"),
    ];
    env.start_process(EXTENDER, &vgpu_binary(EXTENDER).unwrap(), &ext_args, &[]).unwrap();
    wait_ready(port, Duration::from_secs(60)).await.unwrap();
    env.start_scheduler(&ExtenderConfig::vgpu(format!("http://127.0.0.1:{port}/scheduler"))).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = fixtures::vgpu_pod_with("default", "train", &[(VGPU_NUMBER, 1), (VGPU_MEMORY, 2048)], &[]);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let bound =
        fixtures::wait_for_pod_node(&client, "default", "train", Duration::from_secs(60)).await.unwrap();
    assert_eq!(bound, NODE);
    let pod = pods.get("train").await.unwrap();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let pre = annotations["nvidia.com/pre-allocated"].clone();
    let claim = pod_devices::decode_pre_allocated(&pre).unwrap();
    assert_ne!(claim.containers[0].devices[0].index, 3, "the unhealthy GPU was pre-allocated: {pre}");
    let uuid = claim.containers[0].devices[0].uuid.clone();
    let index = claim.containers[0].devices[0].index;

    // Admission: Allocate with a device of the pre-allocated GPU.
    let id = devices.iter().map(|d| d.id.clone()).find(|id| id.starts_with(&format!("{uuid}::"))).unwrap();
    let response = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec![id] }],
        })
        .await
        .unwrap_or_else(|e| panic!("Allocate: {e}\n{}", env.log_tail(PLUGIN, 30)))
        .into_inner();
    let envs = &response.container_responses[0].envs;
    assert_eq!(envs.get(&format!("CUDA_MEM_LIMIT_{index}")).map(String::as_str), Some("2048m"), "{envs:?}");
    let admitted = poll("assigned-phase=succeed", Duration::from_secs(20), &env, || async {
        let p = pods.get("train").await.ok()?;
        let phase = p.metadata.labels.as_ref()?.get("nvidia.com/assigned-phase")?.clone();
        (phase == "succeed").then_some(p)
    })
    .await;
    let real = admitted.metadata.annotations.unwrap_or_default()["nvidia.com/real-allocated"].clone();
    assert_eq!(pod_devices::decode_real_allocated(&real).unwrap(), claim, "real {real} vs pre {pre}");

    // Shutdown removes the node annotations.
    env.stop_process(PLUGIN).unwrap();
    poll("annotations removed", Duration::from_secs(20), &env, || async {
        node_annotation(&nodes, fixtures::NODE_DEVICE_REGISTER).await.is_none().then_some(())
    })
    .await;
    kubelet.abort();
    env.finish();
}
