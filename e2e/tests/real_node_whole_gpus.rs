//! Whole GPUs for kube-scheduler alone on the real node (issue #33, the GPU module's device-plugin mode):
//! `vgpu-device-plugin --whole-gpus` on the mock backend (four L40S, one unhealthy) registers
//! `nvidia.com/gpu` with the upstream kubelet, which advertises 3; the real kube-scheduler, with no
//! extender, places a pod asking for two, containerd starts it, and the container sees what Allocate
//! answered: both UUIDs in `NVIDIA_VISIBLE_DEVICES`, both GPUs' (fake) device nodes, none of the vGPU
//! limiter's mounts. The kubelet's pod-resources API names the same two GPUs. A second pod asking for two
//! stays Pending (`Insufficient nvidia.com/gpu`) until the first is deleted, then runs.
//!
//! Needs the control plane, the real node and root: `e2e/run.sh real_node_whole_gpus`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use vgpu_e2e::{
    plugin_node::{DEVICE_PLUGIN, mock_description},
    probe,
    real_node::{self, RealNode},
    scheduler_configuration, vgpu_binary,
};
use vgpu_kubelet::{
    api::podresources::{ListPodResourcesRequest, pod_resources_lister_client::PodResourcesListerClient},
    socket::connect_unix,
};

const TIMEOUT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = "default";
const GPU: &str = "nvidia.com/gpu";

fn gpu_pod(node: &RealNode, name: &str, count: u32) -> Pod {
    let limits = json!({"limits": {GPU: count.to_string()}});
    probe::pod(NAMESPACE, name, "main", node.busybox_image(), limits, json!({})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_runs_whole_gpu_pods_without_the_extender() {
    let Some((mut env, mut node)) =
        real_node::start_env_and_node("real_node_runs_whole_gpu_pods_without_the_extender").await.unwrap()
    else {
        return;
    };
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    let work = env.workdir().join("gpu-host");
    let host = probe::GpuHost::create(&work, 4).unwrap();
    let mut args = host.device_plugin_args(&env, &node, &mock_description());
    args.push("--whole-gpus".to_owned());
    env.start_process(DEVICE_PLUGIN, &vgpu_binary(DEVICE_PLUGIN).unwrap(), &args, &[]).unwrap();
    let allocatable =
        node.wait_allocatable(&env, GPU, 3, DEVICE_PLUGIN, TIMEOUT).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!allocatable.contains_key("nvidia.com/vgpu-number"), "{allocatable:?}");
    // kube-scheduler alone: no extender.
    env.start_scheduler_with_config(&scheduler_configuration(env.kubeconfig_path(), &[])).await.unwrap();

    pods.create(&PostParams::default(), &gpu_pod(&node, "two", 2)).await.unwrap();
    let (pod, probe) = probe::running(&env, &node, &pods, "two", DEVICE_PLUGIN, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let visible: Vec<String> =
        probe.env["NVIDIA_VISIBLE_DEVICES"].split(',').map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(visible.len(), 2, "{:?}", probe.env);
    // The mock's GPU i is GPU-…-00000000000<i>, with /dev/nvidia<i>.
    for uuid in &visible {
        let index = uuid.chars().last().unwrap();
        let name = format!("nvidia{index}");
        let line = probe.device(&name).unwrap_or_else(|| panic!("/dev/{name} missing: {:?}", probe.dev));
        assert!(line.starts_with('c'), "{line}");
    }
    assert!(probe.device("nvidiactl").is_some(), "{:?}", probe.dev);
    for target in ["/etc/vgpu-manager/config", "/etc/ld.so.preload"] {
        assert!(!probe.mounted(target), "{target} mounted for a whole GPU:\n{}", probe.mounts.join("\n"));
    }
    assert!(!probe.env.keys().any(|k| k.starts_with("CUDA_MEM_LIMIT")), "{:?}", probe.env);
    let annotations = pod.metadata.annotations.unwrap_or_default();
    assert!(!annotations.keys().any(|k| k.starts_with("nvidia.com/")), "{annotations:?}");

    // The kubelet's accounting names the same GPUs.
    let channel = connect_unix(&node.pod_resources_socket(), Duration::from_secs(5)).await.unwrap();
    let listed =
        PodResourcesListerClient::new(channel).list(ListPodResourcesRequest {}).await.unwrap().into_inner();
    let ours = listed.pod_resources.iter().find(|p| p.name == "two").expect("pod in pod-resources");
    let mut ids: Vec<String> = ours.containers[0]
        .devices
        .iter()
        .filter(|d| d.resource_name == GPU)
        .flat_map(|d| d.device_ids.iter().cloned())
        .collect();
    ids.sort();
    let mut want = visible.clone();
    want.sort();
    assert_eq!(ids, want);

    // One GPU left: a second pod of two waits for the first to go.
    pods.create(&PostParams::default(), &gpu_pod(&node, "two-more", 2)).await.unwrap();
    let reason = env
        .poll("the second pod unschedulable", TIMEOUT, || async {
            let status = pods.get("two-more").await.ok()?.status?;
            let scheduled = status.conditions?.into_iter().find(|c| c.type_ == "PodScheduled")?;
            (scheduled.status == "False").then_some(scheduled.message.unwrap_or_default())
        })
        .await
        .unwrap();
    assert!(reason.contains("Insufficient nvidia.com/gpu"), "{reason}");
    pods.delete("two", &DeleteParams::default()).await.unwrap();
    probe::running(&env, &node, &pods, "two-more", DEVICE_PLUGIN, Duration::from_secs(180))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));

    pods.delete("two-more", &DeleteParams::default()).await.unwrap();
    env.poll("the pods gone", TIMEOUT, || async {
        pods.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await
    .unwrap();
    node.stop().unwrap();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    env.finish();
}
