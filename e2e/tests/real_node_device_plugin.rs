//! The device plugin under the real kubelet (issue #31): `vgpu-device-plugin` on the mock backend (four
//! L40S, one unhealthy, split 4 ways) registers with the upstream kubelet, which advertises the node's
//! `nvidia.com/vgpu-*` capacity; kube-scheduler with our extender places a vGPU pod there; the kubelet calls
//! `GetPreferredAllocation` (gate `HonorPreAllocatedDeviceIDs`), `Allocate` and `PreStartContainer`, and
//! containerd starts the container. The container prints what it got (`vgpu_e2e::probe`): the env of the
//! Allocate response, its mounts, the GPU's (fake) device node and `vgpu.config`, which decodes to the pod's
//! limits. The kubelet's pod-resources API names device IDs of the GPU the extender pre-allocated.
//!
//! Before the vGPU runtime files are installed a vGPU pod is refused with the plugin's message (the
//! kubelet's `UnexpectedAdmissionError`) and nothing is created in their place; after a kubelet restart the
//! plugin registers again, a second pod runs, and the first one was never restarted.
//!
//! Needs the control plane, the real node and root: `e2e/run.sh real_node_device_plugin`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use vgpu_core::{abi::runtime_files, abi::vgpu_config, codec::pod_devices, domain::ResourceDomain};
use vgpu_deviceplugin::{
    api::podresources::{
        AllocatableResourcesRequest, ListPodResourcesRequest,
        pod_resources_lister_client::PodResourcesListerClient,
    },
    registration::connect_unix,
};
use vgpu_e2e::{
    fixtures::{VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER},
    plugin_node::{DEVICE_PLUGIN, mock_description, start_vgpu_scheduling},
    probe::{self, Probe},
    real_node::{self, RealNode},
    vgpu_binary,
};

const TIMEOUT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = "default";
const SPLIT: u32 = 4;

fn probe_pod(name: &str, image: &str) -> Pod {
    let limits = json!({"limits": {VGPU_NUMBER: "1", VGPU_CORES: "50", VGPU_MEMORY: "4096"}});
    probe::pod(NAMESPACE, name, "main", image, limits, json!({})).unwrap()
}

async fn wait_running(env: &vgpu_e2e::TestEnv, node: &RealNode, pods: &Api<Pod>, name: &str) -> (Pod, Probe) {
    probe::running(env, node, pods, name, DEVICE_PLUGIN, TIMEOUT).await.unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_runs_a_vgpu_pod_through_the_device_plugin() {
    let Some(binaries) = real_node::locate_or_skip().unwrap() else { return };
    let mut env =
        real_node::env_builder("real_node_runs_a_vgpu_pod_through_the_device_plugin").start().await.unwrap();
    let mut node = RealNode::builder().binaries(binaries).start(&env).await.unwrap();
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let nodes: Api<Node> = Api::all(client.clone());

    // The GPUs' device nodes: fake character devices under a driver root of the test's own.
    let work = env.workdir().join("gpu-host");
    let host = probe::GpuHost::create(&work, 4).unwrap();
    let manager_dir = host.manager_dir.clone();
    let mut args = host.device_plugin_args(&env, &node, &mock_description());
    args.extend([
        format!("--device-split-count={SPLIT}"),
        "--node-publish-interval=2".to_owned(),
        "--feature-gates=HonorPreAllocatedDeviceIDs=true".to_owned(),
    ]);
    env.start_process(
        DEVICE_PLUGIN,
        &vgpu_binary(DEVICE_PLUGIN).unwrap(),
        &args,
        &[("RUST_LOG".into(), "info".into())],
    )
    .unwrap();

    // The kubelet advertises what the plugins registered: 3 healthy GPUs × 4.
    let allocatable = env
        .poll("the kubelet's vgpu-number allocatable", TIMEOUT, || async {
            let alloc = nodes.get(node.node_name()).await.ok()?.status?.allocatable?;
            (alloc.get(VGPU_NUMBER) == Some(&Quantity("12".into()))).then_some(alloc)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(DEVICE_PLUGIN, 40), node.log_tails(40)));
    let allocatable: BTreeMap<_, _> =
        allocatable.into_iter().filter(|(k, _)| k.starts_with("nvidia.com/")).collect();
    println!("allocatable: {allocatable:?}");
    // vgpu-cores and vgpu-memory are the extender's (their plugins are behind GPUCoreResourcePlugin and
    // GPUMemoryResourcePlugin): the kubelet drops extended resources it does not advertise before admission.
    assert_eq!(allocatable.keys().collect::<Vec<_>>(), [VGPU_NUMBER], "{allocatable:?}");

    start_vgpu_scheduling(&mut env).await.unwrap();

    // 1. The runtime files are not installed: the plugin refuses the container, the kubelet fails the pod.
    pods.create(&PostParams::default(), &probe_pod("early", node.busybox_image())).await.unwrap();
    let failed = env
        .poll("pod early Failed", TIMEOUT, || async {
            let status = pods.get("early").await.ok()?.status?;
            (status.phase.as_deref() == Some("Failed")).then_some(status)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(DEVICE_PLUGIN, 40), node.log_tails(40)));
    println!("refused: {:?} {:?}", failed.reason, failed.message);
    assert_eq!(failed.reason.as_deref(), Some("UnexpectedAdmissionError"), "{failed:?}");
    assert!(failed.message.as_deref().unwrap_or_default().contains("vGPU runtime file"), "{failed:?}");
    for file in [runtime_files::library_file_name("v1.0.0"), runtime_files::PRELOAD_FILE.to_owned()] {
        assert!(!manager_dir.join(&file).exists(), "{file} was created in place of the missing file");
    }
    pods.delete("early", &DeleteParams::default()).await.unwrap();

    // 2. Installed: the pod runs and sees what Allocate answered.
    runtime_files::install(&manager_dir, "v1.0.0", b"not a real library: busybox is static").unwrap();
    pods.create(&PostParams::default(), &probe_pod("vgpu", node.busybox_image())).await.unwrap();
    let (pod, probe) = wait_running(&env, &node, &pods, "vgpu").await;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(node.node_name()));
    let uid = pod.metadata.uid.clone().unwrap();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let domain = ResourceDomain::default();
    let pre = pod_devices::decode_pre_allocated(&annotations[&domain.pre_allocated()]).unwrap();
    let device = pre.containers[0].devices[0].clone();
    println!("pre-allocated: {device:?}");

    // Env of the Allocate response.
    for (key, want) in [
        ("VGPU_POD_UID", uid.as_str()),
        ("VGPU_POD_NAME", "vgpu"),
        ("VGPU_CONTAINER_NAME", "main"),
        ("CUDA_MEM_LIMIT_0", "4096m"),
        ("CUDA_CORE_LIMIT_0", "50"),
        ("NVIDIA_VISIBLE_DEVICES", device.uuid.as_str()),
    ] {
        let key = if key.ends_with("_0") {
            key.replace("_0", &format!("_{}", device.index))
        } else {
            key.to_owned()
        };
        assert_eq!(probe.env.get(&key).map(String::as_str), Some(want), "{key} in {:?}", probe.env);
    }
    assert!(probe.env["MANAGER_VISIBLE_DEVICES"].contains(&device.uuid), "{:?}", probe.env);
    // Its mounts.
    for target in [
        "/etc/vgpu-manager/config",
        "/etc/ld.so.preload",
        runtime_files::CONTAINER_LIBRARY,
        "/tmp/.vgpu_lock",
        "/etc/vgpu-manager/.host_proc",
    ] {
        assert!(probe.mounted(target), "{target} not mounted:\n{}", probe.mounts.join("\n"));
    }
    // Its device nodes: the pre-allocated GPU's and the control node, character devices.
    let gpu_node = format!("nvidia{}", device.index);
    for name in [gpu_node.as_str(), "nvidiactl"] {
        let line = probe.device(name).unwrap_or_else(|| panic!("/dev/{name} missing: {:?}", probe.dev));
        assert!(line.starts_with('c'), "{line}");
    }
    // vgpu.config, as the container reads it: the pod's limits.
    let copy = work.join("vgpu.config.from-container");
    std::fs::write(&copy, &probe.vgpu_config).unwrap();
    let config = vgpu_config::read(&copy).unwrap();
    assert_eq!((config.pod_uid.as_str(), config.container_name.as_str()), (uid.as_str(), "main"));
    let slot = &config.devices[usize::try_from(device.index).unwrap()];
    assert_eq!(slot.uuid, device.uuid);
    assert_eq!(slot.memory_limit, 1, "{slot:?}");
    assert_eq!(slot.total_memory, 4096 << 20, "{slot:?}");
    assert_eq!(slot.hard_core, 50, "{slot:?}");

    // 3. The kubelet's own accounting names the pre-allocated GPU.
    let channel = connect_unix(&node.pod_resources_socket(), Duration::from_secs(5)).await.unwrap();
    let listed =
        PodResourcesListerClient::new(channel).list(ListPodResourcesRequest {}).await.unwrap().into_inner();
    let ours = listed.pod_resources.iter().find(|p| p.name == "vgpu").expect("pod in pod-resources");
    let ids: Vec<&String> = ours.containers[0]
        .devices
        .iter()
        .filter(|d| d.resource_name == VGPU_NUMBER)
        .flat_map(|d| &d.device_ids)
        .collect();
    assert_eq!(ids.len(), 1, "{ours:?}");
    assert!(
        ids[0].starts_with(&format!("{}::", device.uuid)),
        "kubelet picked {ids:?}, pre-allocated {}",
        device.uuid
    );

    // 4. A kubelet restart: the plugin registers again (a new pod runs), the running one is untouched.
    let restarts = |pod: &Pod| {
        pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map(|c| c[0].restart_count)
    };
    let restarted_at = k8s_openapi::jiff::Timestamp::now();
    node.restart_kubelet().await.unwrap();
    // A restarted kubelet restores its checkpoint with no healthy device until the plugin registers again
    // and sends ListAndWatch: a pod admitted before that fails "no healthy devices present" (upstream
    // behaviour). The kubelet's pod-resources `GetAllocatableResources` lists only healthy devices, so it
    // says when the plugin is back.
    env.poll("the kubelet's healthy vgpu-number devices after its restart", TIMEOUT, || async {
        let channel = connect_unix(&node.pod_resources_socket(), Duration::from_secs(5)).await.ok()?;
        let answer = PodResourcesListerClient::new(channel)
            .get_allocatable_resources(AllocatableResourcesRequest {})
            .await
            .ok()?
            .into_inner();
        let healthy: usize = answer
            .devices
            .iter()
            .filter(|d| d.resource_name == VGPU_NUMBER)
            .map(|d| d.device_ids.len())
            .sum();
        (healthy == 12).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(DEVICE_PLUGIN, 40), node.log_tails(40)));
    // The restarted kubelet first posts the Node with no vgpu-number (kube-scheduler would then hold a new
    // pod as unschedulable), then the plugin's 12 at its next status update: wait for a post of 12 made after
    // the restart (the Ready condition's heartbeat, whole seconds, so strictly later than the restart's second).
    env.poll("the Node's vgpu-number allocatable posted by the restarted kubelet", TIMEOUT, || async {
        let status = nodes.get(node.node_name()).await.ok()?.status?;
        let heartbeat = status.conditions?.into_iter().find(|c| c.type_ == "Ready")?.last_heartbeat_time?.0;
        let posted_after = heartbeat.as_second() > restarted_at.as_second();
        (posted_after && status.allocatable?.get(VGPU_NUMBER) == Some(&Quantity("12".into()))).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", node.log_tails(40)));
    pods.create(&PostParams::default(), &probe_pod("after-restart", node.busybox_image())).await.unwrap();
    wait_running(&env, &node, &pods, "after-restart").await;
    let again = pods.get("vgpu").await.unwrap();
    assert_eq!(again.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(restarts(&again), Some(0), "{:?}", again.status);

    // 5. Deleted: the containers leave containerd.
    for name in ["vgpu", "after-restart"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    env.poll("the vGPU pods gone", TIMEOUT, || async {
        pods.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await
    .unwrap();
    node.stop().unwrap();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    env.finish();
}
