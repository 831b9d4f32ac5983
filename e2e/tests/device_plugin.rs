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

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use vgpu_core::codec::{node_devices, pod_devices};
use vgpu_e2e::TestEnv;
use vgpu_e2e::fixtures::{self, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::plugin_node::{DEVICE_PLUGIN, MockPluginNode, start_vgpu_scheduling};

const NODE: &str = "dp-node";
const SPLIT: u32 = 10;

async fn node_annotation(nodes: &Api<Node>, key: &str) -> Option<String> {
    nodes.get(NODE).await.ok()?.metadata.annotations?.get(key).cloned()
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

    // The test kubelet, the plugin, its registration and ListAndWatch; capacity advertised on the Node.
    let mut node = MockPluginNode::start(&mut env, NODE, SPLIT, &[]).await.unwrap();
    let registration = &node.registration;
    assert_eq!(registration.version, "v1beta1");
    assert_eq!(registration.endpoint, "nvidia-vgpu.sock");

    // The node annotations and labels, read back from the API server.
    let register = node.device_register.clone();
    let inventory = node_devices::decode(&register).unwrap();
    assert_eq!(inventory.devices.len(), 4, "{register}");
    assert!(inventory.devices.iter().all(|d| d.split_count == SPLIT), "{register}");
    // The mock description marks GPU 3 unhealthy (an ECC event): listed, but not schedulable.
    let schedulable: Vec<u32> =
        inventory.devices.iter().filter(|d| d.is_schedulable()).map(|d| d.index).collect();
    assert_eq!(schedulable, [0, 1, 2], "{register}");
    let config = node_annotation(&nodes, fixtures::NODE_CONFIG_INFO).await.unwrap();
    assert!(config.contains(&format!("\"deviceSplit\":{SPLIT}")), "{config}");

    // ListAndWatch: GPUs × split device IDs, the unhealthy GPU's as Unhealthy.
    let split = SPLIT as usize;
    assert_eq!(node.devices.len(), 4 * split);
    let healthy = node.devices.iter().filter(|d| d.health == "Healthy").count();
    assert_eq!(healthy, 3 * split, "GPU 3's devices are Unhealthy");
    let advertised = nodes.get(NODE).await.unwrap().status.unwrap().allocatable.unwrap();
    assert_eq!(advertised[VGPU_NUMBER].0, healthy.to_string());
    assert_eq!(advertised[VGPU_MEMORY].0, (3 * 46068).to_string());

    // Our extender under the real kube-scheduler pre-allocates and binds a pod.
    start_vgpu_scheduling(&mut env).await.unwrap();
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
    let index = claim.containers[0].devices[0].index;

    // Admission: Allocate with a device of the pre-allocated GPU.
    let response = node
        .allocate_pre_allocated(&pod)
        .await
        .unwrap_or_else(|e| panic!("Allocate: {e:#}\n{}", env.log_tail(DEVICE_PLUGIN, 30)));
    let envs = &response.container_responses[0].envs;
    assert_eq!(envs.get(&format!("CUDA_MEM_LIMIT_{index}")).map(String::as_str), Some("2048m"), "{envs:?}");
    let admitted = env
        .poll("assigned-phase=succeed", Duration::from_secs(20), || async {
            let p = pods.get("train").await.ok()?;
            let phase = p.metadata.labels.as_ref()?.get("nvidia.com/assigned-phase")?.clone();
            (phase == "succeed").then_some(p)
        })
        .await
        .unwrap();
    let real = admitted.metadata.annotations.unwrap_or_default()["nvidia.com/real-allocated"].clone();
    assert_eq!(pod_devices::decode_real_allocated(&real).unwrap(), claim, "real {real} vs pre {pre}");

    // Shutdown removes the node annotations.
    env.stop_process(DEVICE_PLUGIN).unwrap();
    env.poll("annotations removed", Duration::from_secs(20), || async {
        node_annotation(&nodes, fixtures::NODE_DEVICE_REGISTER).await.is_none().then_some(())
    })
    .await
    .unwrap();
    drop(node);
    env.finish();
}
