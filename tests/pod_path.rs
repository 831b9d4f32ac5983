//! One pod end to end, over in-memory clusters and a real unix socket:
//!
//! 1. the device plugin's node publisher describes a mock node (driver 570.86.10, CUDA 12.8, 2 × 16 GiB GPUs);
//!    its annotations become the scheduler's node;
//! 2. the scheduler extender filters and binds a two-container pod (`vgpu_scheduler::MemoryCluster`), which
//!    writes `pre-allocated`, `predicate-*` and `assigned-phase=allocating`;
//! 3. a small adapter copies the bound pod into the device plugin's `InMemoryCluster`;
//! 4. the kubelet's `Allocate` reaches the vnumber plugin over gRPC on a unix socket with the device IDs the
//!    scheduler chose;
//! 5. the envs, mounts, the `real-allocated` / `assigned-phase` patches and the bytes of each `vgpu.config`
//!    are checked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use vgpu_core::clock::ManualClock;
use vgpu_core::{
    alloc::{PodContainer, PodSpec},
    backend::{DeviceBackend, mock::MockBackend},
    codec::pod_devices,
    domain::ResourceDomain,
};
use vgpu_deviceplugin::{
    cluster::{ContainerInfo, InMemoryCluster, PodInfo},
    config::PluginConfig,
    daemon::Daemon,
    ids,
    inventory::{DeviceState, node_devices},
    plugin::PluginHandler,
    publisher::NodePublisher,
    server::serve,
    vnumber::VgpuNumberPlugin,
};
use vgpu_kubelet::{
    api::v1beta1::{AllocateRequest, ContainerAllocateRequest, device_plugin_client::DevicePluginClient},
    socket::connect_unix,
};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Node, Pod, PodPhase};

const MOCK: &str = "\
driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - { uuid: GPU-aaaa, name: NVIDIA L4, memoryMiB: 16384, numaNode: 0, minor: 0 }
  - { uuid: GPU-bbbb, name: NVIDIA L4, memoryMiB: 16384, numaNode: 0, minor: 1 }
";
const NODE: &str = "node-1";
const NOW_NS: i64 = 1_700_000_000_000_000_000;

/// The adapter: the scheduler's pod as the device plugin's cluster client reports it.
fn to_plugin_pod(pod: &Pod) -> PodInfo {
    PodInfo {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        node_name: pod.node_name.clone().unwrap_or_default(),
        phase: match pod.phase {
            PodPhase::Pending => "Pending",
            PodPhase::Running => "Running",
            PodPhase::Succeeded => "Succeeded",
            PodPhase::Failed => "Failed",
            PodPhase::Unknown => "Unknown",
        }
        .to_owned(),
        deleting: pod.deleting,
        labels: pod.labels.clone(),
        annotations: pod.annotations.clone(),
        containers: pod
            .spec
            .containers
            .iter()
            .map(|c| ContainerInfo { name: c.name.clone(), env: BTreeMap::new() })
            .collect(),
    }
}

fn le_i32(bytes: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn c_str(bytes: &[u8], at: usize, len: usize) -> &str {
    let field = &bytes[at..at + len];
    let end = field.iter().position(|b| *b == 0).unwrap();
    std::str::from_utf8(&field[..end]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_goes_from_filter_and_bind_to_allocate() {
    let d = ResourceDomain::default();
    let dir = tempfile::tempdir().unwrap();

    // --- device plugin side: backend, configuration, node description ---
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let plugin_cluster = Arc::new(InMemoryCluster::default());
    let mut config = PluginConfig::new(NODE);
    config.device_plugin_path = dir.path().to_path_buf();
    config.manager_dir = dir.path().join("manager");
    config.host_manager_dir = "/etc/vgpu-manager".into();
    vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
    config.device_root = dir.path().join("no-driver-root");
    let daemon =
        Daemon::new(config, Arc::clone(&backend), plugin_cluster.clone(), plugin_cluster.clone()).unwrap();
    let config = Arc::new(daemon.config);
    let state =
        DeviceState::new(node_devices(&backend.devices().unwrap(), &config.settings), &config.settings);
    let publisher =
        NodePublisher::new(NODE, d.clone(), config.settings.clone(), state.clone(), plugin_cluster.clone());
    let published = publisher.publish_patch(&state.devices()).unwrap();

    // --- scheduler side: the node as published, then filter + bind ---
    let sched = MemoryCluster::new();
    let mut node = Node { name: NODE.into(), ..Node::default() };
    node.annotations = published.annotations.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
    node.allocatable.insert(d.vgpu_number(), 20);
    sched.upsert_node(node);
    let ext = Extender::new(sched.clone(), Arc::new(ManualClock::new(NOW_NS)), ExtenderConfig::default());
    ext.attach();
    ext.sync().await.unwrap();
    let spec = PodSpec::new()
        .container(
            PodContainer::app("main")
                .limit(d.vgpu_number(), 2)
                .limit(d.vgpu_cores(), 30)
                .limit(d.vgpu_memory(), 4096),
        )
        .container(PodContainer::app("side").limit(d.vgpu_number(), 1).limit(d.vgpu_memory(), 2048));
    let pod = sched.upsert_pod(Pod {
        uid: "3c9d6b0e-5a1f-4f6e-8a3b-2d4c6e8f0a1b".into(),
        namespace: "default".into(),
        name: "trainer".into(),
        spec,
        ..Pod::default()
    });
    let filtered = ext.filter(Some(&pod), vec![NODE.to_owned()]).await;
    assert_eq!(filtered.node_names(), [NODE], "{filtered:?}");
    let bound = ext.bind("default", "trainer", &pod.uid, NODE).await;
    assert_eq!(bound.error, "");
    let scheduled = sched.pod("default", "trainer").unwrap();
    assert_eq!(scheduled.node_name.as_deref(), Some(NODE));
    assert_eq!(scheduled.labels[&d.assigned_phase()], "allocating");
    let pre_text = scheduled.annotations[&d.pre_allocated()].clone();
    let pre = pod_devices::decode_pre_allocated(&pre_text).unwrap();
    assert_eq!(pre.containers.iter().map(|c| c.devices.len()).collect::<Vec<_>>(), [2, 1]);

    // --- adapter: the bound pod into the device plugin's cluster ---
    plugin_cluster.upsert(to_plugin_pod(&scheduled));

    // --- kubelet: Allocate over gRPC with the IDs of the chosen GPUs ---
    let plugin: Arc<dyn PluginHandler> =
        Arc::new(VgpuNumberPlugin::new(Arc::clone(&config), state.clone(), Some(plugin_cluster.clone())));
    let socket = dir.path().join("nvidia-vgpu.sock");
    let server = serve(plugin, socket.clone(), state.subscribe()).unwrap();
    let mut client = DevicePluginClient::new(connect_unix(&socket, Duration::from_secs(5)).await.unwrap());
    let requests: Vec<ContainerAllocateRequest> = pre
        .containers
        .iter()
        .map(|c| ContainerAllocateRequest {
            devices_ids: c.devices.iter().map(|g| ids::vgpu_device_id(&g.uuid, 3)).collect(),
        })
        .collect();
    let resp = client.allocate(AllocateRequest { container_requests: requests }).await.unwrap().into_inner();
    server.stop().await.unwrap();
    assert_eq!(resp.container_responses.len(), 2);

    // --- envs and mounts ---
    let main = &pre.containers[0];
    let main_resp = &resp.container_responses[0];
    for g in &main.devices {
        assert_eq!(main_resp.envs[&format!("CUDA_MEM_LIMIT_{}", g.index)], "4096m");
        assert_eq!(main_resp.envs[&format!("CUDA_CORE_LIMIT_{}", g.index)], "30");
        assert_eq!(main_resp.envs[&format!("CUDA_CORE_SOFT_LIMIT_{}", g.index)], "30");
    }
    assert_eq!(main_resp.envs["VGPU_POD_NAME"], "trainer");
    assert_eq!(main_resp.envs["VGPU_CONTAINER_NAME"], "main");
    assert_eq!(main_resp.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-aaaa,GPU-bbbb");
    assert_eq!(
        main_resp.envs["MANAGER_VISIBLE_DEVICES"].split(',').take(2).collect::<Vec<_>>(),
        ["GPU-aaaa", "GPU-bbbb"]
    );
    let side = &pre.containers[1];
    let side_resp = &resp.container_responses[1];
    let side_gpu = &side.devices[0];
    assert_eq!(side_resp.envs[&format!("CUDA_MEM_LIMIT_{}", side_gpu.index)], "2048m");
    // No cores requested with memory: the whole compute, no core limit.
    assert_eq!(side_resp.envs[&format!("CUDA_CORE_LIMIT_{}", side_gpu.index)], "");
    let mount = |r: &vgpu_kubelet::api::v1beta1::ContainerAllocateResponse, path: &str| {
        r.mounts.iter().find(|m| m.container_path == path).map(|m| (m.host_path.clone(), m.read_only))
    };
    assert_eq!(
        mount(main_resp, "/etc/vgpu-manager/config"),
        Some((format!("/etc/vgpu-manager/{}_main/config", pod.uid), true))
    );
    assert_eq!(
        mount(main_resp, "/tmp/.vgpu_lock"),
        Some((format!("/etc/vgpu-manager/{}_main/vgpu_lock", pod.uid), false))
    );
    assert_eq!(
        mount(side_resp, "/etc/ld.so.preload"),
        Some(("/etc/vgpu-manager/ld.so.preload".to_owned(), true))
    );
    let dev_paths: Vec<&str> = main_resp.devices.iter().map(|s| s.container_path.as_str()).collect();
    assert_eq!(dev_paths, ["/dev/nvidia0", "/dev/nvidia1"]);

    // --- pod patches ---
    let patched = plugin_cluster.pod("default", "trainer").unwrap();
    assert_eq!(patched.labels[&d.assigned_phase()], "succeed");
    assert_eq!(patched.labels[&d.metrics_node()], NODE);
    assert_eq!(patched.annotations[&d.real_allocated()], pre_text);
    assert_eq!(patched.annotations[&d.predicate_time()], "9223372036854775807");

    // --- vgpu.config bytes (contract §7.1) ---
    let bytes =
        std::fs::read(dir.path().join(format!("manager/{}_main/config/vgpu.config", pod.uid))).unwrap();
    assert_eq!(bytes.len(), 8192);
    assert_eq!(le_i32(&bytes, 0) as u32, 0x5647_4346, "magic VGCF");
    assert_eq!((le_i32(&bytes, 4), le_i32(&bytes, 8), le_i32(&bytes, 12)), (1, 2560, 16));
    assert_eq!((le_i32(&bytes, 16), le_i32(&bytes, 20)), (12, 8), "CUDA version from the backend");
    assert_eq!(c_str(&bytes, 24, 32), "570.86.10");
    assert_eq!(c_str(&bytes, 128, 48), pod.uid);
    assert_eq!(c_str(&bytes, 176, 64), "trainer");
    assert_eq!(c_str(&bytes, 240, 64), "default");
    assert_eq!(c_str(&bytes, 304, 64), "main");
    assert_eq!(le_i32(&bytes, 416), 2, "compatibility mode: cgroup v2");
    for g in &main.devices {
        let at = 512 + 128 * g.index as usize;
        assert_eq!(le_i32(&bytes, at) % 2, 0, "seq even");
        assert_eq!(c_str(&bytes, at + 8, 48), g.uuid);
        assert_eq!(le_u64(&bytes, at + 56), 4096 << 20, "total_memory");
        assert_eq!(le_u64(&bytes, at + 64), 4096 << 20, "real_memory");
        assert_eq!((le_i32(&bytes, at + 72), le_i32(&bytes, at + 76)), (30, 30), "hard/soft core");
        assert_eq!((le_i32(&bytes, at + 80), le_i32(&bytes, at + 84)), (1, 1), "core/hard limit");
        assert_eq!(le_i32(&bytes, at + 88), 1, "memory_limit");
        assert_eq!((le_i32(&bytes, at + 92), le_i32(&bytes, at + 96)), (0, 1), "oversold/activate");
    }
    let unused = (0..16u32).find(|i| main.devices.iter().all(|g| g.index != *i)).unwrap() as usize;
    assert!(bytes[512 + 128 * unused..512 + 128 * (unused + 1)].iter().all(|b| *b == 0));
    let side_bytes =
        std::fs::read(dir.path().join(format!("manager/{}_side/config/vgpu.config", pod.uid))).unwrap();
    let at = 512 + 128 * side_gpu.index as usize;
    assert_eq!(c_str(&side_bytes, at + 8, 48), side_gpu.uuid);
    assert_eq!(le_u64(&side_bytes, at + 56), 2048 << 20);
    assert_eq!(le_i32(&side_bytes, at + 80), 0, "whole compute: no core limit");
}
