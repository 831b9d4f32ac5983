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
//! plugin registers again, a second pod runs, and the first one was never restarted. The plugin is then
//! restarted with `HonorPreAllocatedDeviceIDs` off: it registers again, the running pods are untouched, and
//! three more containers get their pre-allocated GPU whichever IDs the kubelet picked (`devices.json` holds
//! the kubelet's IDs). containerd is restarted: the running containers survive, and one more pod runs.
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
use vgpu_core::{
    abi::devices_json, abi::runtime_files, abi::vgpu_config, codec::pod_devices, domain::ResourceDomain,
};
use vgpu_e2e::{
    fixtures::{VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER},
    plugin_node::{DEVICE_PLUGIN, mock_description, start_vgpu_scheduling},
    probe::{self, Probe},
    real_node::{self, RealNode},
    vgpu_binary,
};
use vgpu_kubelet::{
    api::podresources::{
        AllocatableResourcesRequest, ListPodResourcesRequest,
        pod_resources_lister_client::PodResourcesListerClient,
    },
    socket::connect_unix,
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

/// The vgpu-number device IDs the kubelet's pod-resources `List` gives pod `name`'s first container.
async fn kubelet_device_ids(node: &RealNode, name: &str) -> Vec<String> {
    let channel = connect_unix(&node.pod_resources_socket(), Duration::from_secs(5)).await.unwrap();
    let listed =
        PodResourcesListerClient::new(channel).list(ListPodResourcesRequest {}).await.unwrap().into_inner();
    let ours = listed.pod_resources.iter().find(|p| p.name == name).expect("pod in pod-resources");
    ours.containers[0]
        .devices
        .iter()
        .filter(|d| d.resource_name == VGPU_NUMBER)
        .flat_map(|d| d.device_ids.iter().cloned())
        .collect()
}

/// Waits until the kubelet's pod-resources `GetAllocatableResources` (healthy devices only) lists `count`
/// vgpu-number devices.
async fn healthy_devices_are(env: &vgpu_e2e::TestEnv, node: &RealNode, count: usize) {
    env.poll(&format!("{count} healthy vgpu-number devices at the kubelet"), TIMEOUT, || async {
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
        (healthy == count).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(DEVICE_PLUGIN, 40), node.log_tails(40)));
}

/// After a kubelet or plugin restart: waits until the plugin is registered again and kube-scheduler can
/// place a vGPU pod on the node.
///
/// A restarted kubelet restores its checkpoint with no healthy device until the plugin registers again and
/// sends ListAndWatch, and a gone plugin's devices are unhealthy: a pod admitted before that fails "no
/// healthy devices present" (upstream behaviour). The kubelet's `GetAllocatableResources` lists only healthy
/// devices, so it says when the plugin is back; from then on every Node status the kubelet computes says 12.
/// The Node itself lags: a restarted kubelet (`kubelet_restarted_at`) posts it at start, with no
/// vgpu-number when the plugin was not back yet, and kube-scheduler then holds a new pod as unschedulable;
/// so wait for a post of 12 made by the restarted kubelet (the Ready heartbeat, whole seconds, in or after
/// the restart's second; the old kubelet posts only on a change, so one in that second is unlikely). A
/// plugin restart under the same kubelet needs only the 12: a post of 0 in between, if any, came before the
/// kubelet saw the plugin back.
async fn plugin_back(
    env: &vgpu_e2e::TestEnv,
    node: &RealNode,
    nodes: &Api<Node>,
    kubelet_restarted_at: Option<k8s_openapi::jiff::Timestamp>,
) {
    healthy_devices_are(env, node, 12).await;
    env.poll("the Node's vgpu-number allocatable 12, posted by the current kubelet", TIMEOUT, || async {
        let status = nodes.get(node.node_name()).await.ok()?.status?;
        if let Some(since) = kubelet_restarted_at {
            let ready = status.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
            let heartbeat = ready.last_heartbeat_time.as_ref()?.0;
            if heartbeat.as_second() < since.as_second() {
                return None;
            }
        }
        (status.allocatable?.get(VGPU_NUMBER) == Some(&Quantity("12".into()))).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", node.log_tails(40)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_runs_a_vgpu_pod_through_the_device_plugin() {
    let Some((mut env, mut node)) =
        real_node::start_env_and_node("real_node_runs_a_vgpu_pod_through_the_device_plugin").await.unwrap()
    else {
        return;
    };
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
    let allocatable = node
        .wait_allocatable(&env, VGPU_NUMBER, 12, DEVICE_PLUGIN, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
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
    let ids = kubelet_device_ids(&node, "vgpu").await;
    assert_eq!(ids.len(), 1, "{ids:?}");
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
    plugin_back(&env, &node, &nodes, Some(restarted_at)).await;
    pods.create(&PostParams::default(), &probe_pod("after-restart", node.busybox_image())).await.unwrap();
    wait_running(&env, &node, &pods, "after-restart").await;
    let again = pods.get("vgpu").await.unwrap();
    assert_eq!(again.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(restarts(&again), Some(0), "{:?}", again.status);

    // 5. A plugin restart, now with HonorPreAllocatedDeviceIDs off (the binary's default): the kubelet is
    // offered no preference and picks IDs itself. The plugin registers again, the running pods are
    // untouched, and each new container gets the pre-allocated GPU whichever IDs the kubelet picked;
    // devices.json records exactly the kubelet's IDs (what PreStartContainer matched).
    env.stop_process(DEVICE_PLUGIN).unwrap();
    // The kubelet marks a gone plugin's devices unhealthy; wait until it has, so the next wait cannot see
    // the old registration.
    healthy_devices_are(&env, &node, 0).await;
    args.retain(|a| !a.starts_with("--feature-gates="));
    env.start_process(
        DEVICE_PLUGIN,
        &vgpu_binary(DEVICE_PLUGIN).unwrap(),
        &args,
        &[("RUST_LOG".into(), "info".into())],
    )
    .unwrap();
    plugin_back(&env, &node, &nodes, None).await;
    assert!(env.log_tail(DEVICE_PLUGIN, 400).contains("gate HonorPreAllocatedDeviceIDs is off"));
    let mut agreed = 0;
    for i in 0..3 {
        let name = format!("gate-off-{i}");
        pods.create(&PostParams::default(), &probe_pod(&name, node.busybox_image())).await.unwrap();
        let (pod, probe) = wait_running(&env, &node, &pods, &name).await;
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let pre = pod_devices::decode_pre_allocated(&annotations[&domain.pre_allocated()]).unwrap();
        let device = &pre.containers[0].devices[0];
        assert_eq!(probe.env.get("NVIDIA_VISIBLE_DEVICES"), Some(&device.uuid), "{name}: {:?}", probe.env);
        assert!(probe.device(&format!("nvidia{}", device.index)).is_some(), "{name}: {:?}", probe.dev);
        let ids = kubelet_device_ids(&node, &name).await;
        let uid = pod.metadata.uid.clone().unwrap();
        let recorded =
            devices_json::read(&manager_dir.join(format!("{uid}_main")).join(devices_json::FILE_NAME))
                .unwrap();
        assert_eq!(recorded, ids, "{name}: devices.json is not the kubelet's IDs");
        agreed += usize::from(ids.iter().all(|id| id.starts_with(&format!("{}::", device.uuid))));
    }
    println!("gate off: the kubelet's IDs named the pre-allocated GPU for {agreed} of 3 pods");
    for name in ["vgpu", "after-restart"] {
        let pod = pods.get(name).await.unwrap();
        assert_eq!(restarts(&pod), Some(0), "{name} after the plugin restart: {:?}", pod.status);
    }

    // 6. A containerd restart: the running containers survive it (their shims are not containerd's children)
    // and nothing of the plugin's is involved; a new vGPU pod runs afterwards.
    let tasks_before = node.task_ids().unwrap().len();
    node.restart_containerd().await.unwrap();
    pods.create(&PostParams::default(), &probe_pod("after-containerd", node.busybox_image())).await.unwrap();
    wait_running(&env, &node, &pods, "after-containerd").await;
    for name in ["vgpu", "after-restart", "gate-off-0"] {
        let pod = pods.get(name).await.unwrap();
        assert_eq!(restarts(&pod), Some(0), "{name} after the containerd restart: {:?}", pod.status);
    }
    assert!(node.task_ids().unwrap().len() > tasks_before, "the new pod's sandbox and container are tasks");

    // 7. Deleted: the containers leave containerd. (The kubelet's device checkpoint keeps their entries until
    // its next allocation: upstream behaviour, not checked here.)
    let names = ["vgpu", "after-restart", "gate-off-0", "gate-off-1", "gate-off-2", "after-containerd"];
    for name in names {
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
