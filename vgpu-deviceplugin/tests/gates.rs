//! Each device-plugin gate that shapes `Allocate` or the preferred allocation, on and off, over the real
//! unix socket of the vnumber plugin (wired by `Daemon::new`, so gate checks and backend facts apply):
//! `VirtualMemoryTracking`, `DevicePluginClientMode`, `HonorPreAllocatedDeviceIDs` (the contract's three
//! scenarios: one batched request, the kubelet's serial GetPreferred/Allocate pairs, no leak between
//! retried pairs), `SharedSMUtilizationWatcher` (env, `vgpu.config`, the `watcher/` mount; its sampler is
//! tested in `sm_watcher.rs`), and the `volume-mounts` device-list strategy.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use vgpu_core::{
    abi::vgpu_config,
    backend::{DeviceBackend, mock::MockBackend},
    node_config::DeviceListStrategy,
};
use vgpu_deviceplugin::{cluster::InMemoryCluster, config::PluginConfig, daemon::Daemon};
use vgpu_kubelet::api::v1beta1::{
    ContainerAllocateResponse, ContainerPreferredAllocationRequest, Empty, PreferredAllocationRequest,
};

use support::Served;

const MOCK: &str = "\
gpus:
  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192 }
  - { uuid: GPU-b, name: NVIDIA L4, memoryMiB: 8192 }
  - { uuid: GPU-c, name: NVIDIA L4, memoryMiB: 8192 }
";
const UID: &str = "5a1d2f0e-0d7c-4c59-9a53-2b6f0c1e9d11";
/// Three containers, one vGPU each, on GPUs A, B and C.
const THREE: &str = "c0[0_GPU-a_50_1024];c1[1_GPU-b_50_1024];c2[2_GPU-c_50_1024]";

struct Node {
    _dir: tempfile::TempDir,
    served: Served,
}

async fn start(gates: &[&str], pre_allocated: &str, tune: impl FnOnce(&mut PluginConfig)) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster = Arc::new(InMemoryCluster::new(vec![support::allocating_pod(UID, "p", pre_allocated)]));
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.path().to_path_buf();
    config.manager_dir = dir.path().join("manager");
    config.gates = vgpu_deviceplugin::feature_gates().configure(gates.iter().copied()).unwrap();
    tune(&mut config);
    let daemon = Daemon::new(config, Arc::clone(&backend), cluster.clone(), cluster.clone()).unwrap();
    let served = Served::start(daemon, cluster, dir.path()).await;
    Node { _dir: dir, served }
}

impl Node {
    async fn allocate(&mut self, ids: &[&str]) -> ContainerAllocateResponse {
        self.served.allocate(ids).await
    }

    /// GetPreferredAllocation for `sizes.len()` containers, every vGPU of the node available.
    async fn preferred(&mut self, sizes: &[i32]) -> Vec<Vec<String>> {
        let available: Vec<String> = ["GPU-a", "GPU-b", "GPU-c"]
            .iter()
            .flat_map(|g| (0..10).map(move |i| format!("{g}::{i}")))
            .collect();
        let container_requests = sizes
            .iter()
            .map(|&allocation_size| ContainerPreferredAllocationRequest {
                available_device_i_ds: available.clone(),
                must_include_device_i_ds: vec![],
                allocation_size,
            })
            .collect();
        let resp = self
            .served
            .client
            .get_preferred_allocation(PreferredAllocationRequest { container_requests })
            .await
            .unwrap()
            .into_inner();
        resp.container_responses.into_iter().map(|r| r.device_i_ds).collect()
    }

    fn config_of(&self, container: &str) -> vgpu_config::VgpuConfig {
        let manager = &self.served.config.manager_dir;
        vgpu_config::read(&manager.join(format!("{UID}_{container}/config/vgpu.config"))).unwrap()
    }

    async fn stop(self) {
        self.served.stop().await;
    }
}

fn mount_of<'a>(resp: &'a ContainerAllocateResponse, container_path: &str) -> Option<&'a str> {
    resp.mounts.iter().find(|m| m.container_path == container_path).map(|m| m.host_path.as_str())
}

#[tokio::test]
async fn virtual_memory_tracking_reaches_the_env_and_vgpu_config() {
    for (gates, on) in [(&["VirtualMemoryTracking=true"][..], true), (&[][..], false)] {
        let mut node = start(gates, "c0[0_GPU-a_50_1024]", |_| {}).await;
        let resp = node.allocate(&["GPU-a::3"]).await;
        assert_eq!(resp.envs["VMEMORY_NODE_ENABLED"], on.to_string());
        assert_eq!(node.config_of("c0").vmem_node, i32::from(on));
        // The ledger directory is mounted either way (the library decides from the env and vgpu.config).
        assert_eq!(
            mount_of(&resp, "/tmp/.vmem_node"),
            Some(format!("/etc/vgpu-manager/{UID}_c0/vmem_node").as_str())
        );
        node.stop().await;
    }
}

#[tokio::test]
async fn client_mode_mounts_the_registry_instead_of_the_host_proc() {
    let mut node = start(&["DevicePluginClientMode=true"], "c0[0_GPU-a_50_1024]", |c| {
        c.settings.open_kernel_modules = true;
    })
    .await;
    let resp = node.allocate(&["GPU-a::0"]).await;
    // ClientReg (200) replaces the cgroup bit; OpenKernel (100) is OR-ed: 236 = 200 | 100 on the wire.
    assert_eq!(resp.envs["MANAGER_COMPATIBILITY_MODE"], (200 | 100).to_string());
    assert_eq!(node.config_of("c0").compatibility_mode, 200 | 100);
    assert_eq!(mount_of(&resp, "/etc/vgpu-manager/registry"), Some("/etc/vgpu-manager/registry"));
    assert_eq!(mount_of(&resp, "/etc/vgpu-manager/.host_proc"), None);
    assert_eq!(resp.envs["MANAGER_CLIENT_REGISTER_UUID"], "");
    node.stop().await;

    let mut node = start(&[], "c0[0_GPU-a_50_1024]", |_| {}).await;
    let resp = node.allocate(&["GPU-a::0"]).await;
    assert_eq!(mount_of(&resp, "/etc/vgpu-manager/.host_proc"), Some("/proc"));
    assert_eq!(mount_of(&resp, "/etc/vgpu-manager/registry"), None);
    assert_ne!(resp.envs["MANAGER_COMPATIBILITY_MODE"], "200");
    node.stop().await;
}

#[tokio::test]
async fn volume_mounts_strategy_lists_devices_as_mounts() {
    let mut node = start(&[], "c0[0_GPU-a_50_1024,2_GPU-c_50_1024]", |c| {
        c.settings.device_list_strategy = vec![DeviceListStrategy::VolumeMounts];
    })
    .await;
    let resp = node.allocate(&["GPU-a::1", "GPU-c::2"]).await;
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "/var/run/nvidia-container-devices");
    for uuid in ["GPU-a", "GPU-c"] {
        let m = resp
            .mounts
            .iter()
            .find(|m| m.container_path == format!("/var/run/nvidia-container-devices/{uuid}"))
            .unwrap_or_else(|| panic!("no volume mount for {uuid}: {:?}", resp.mounts));
        assert_eq!(m.host_path, "/dev/null");
        assert!(m.read_only);
    }
    assert!(resp.cdi_devices.is_empty() && resp.annotations.is_empty());
    node.stop().await;
}

#[tokio::test]
async fn honor_pre_allocated_ids_batch_request() {
    // One GetPreferredAllocation for three containers: each gets its own pre-allocated GPU, in order.
    let mut node = start(&["HonorPreAllocatedDeviceIDs=true"], THREE, |_| {}).await;
    let options = node.served.client.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(options.get_preferred_allocation_available);
    assert_eq!(node.preferred(&[1, 1, 1]).await, [["GPU-a::0"], ["GPU-b::0"], ["GPU-c::0"]]);
    node.stop().await;
}

#[tokio::test]
async fn honor_pre_allocated_ids_serial_kubelet_pairs() {
    // The kubelet's usual pattern: GetPreferred then Allocate per container; only Allocate's patch of
    // real-allocated advances to the next container.
    let mut node = start(&["HonorPreAllocatedDeviceIDs=true"], THREE, |_| {}).await;
    for (container, gpu) in [("c0", "GPU-a"), ("c1", "GPU-b"), ("c2", "GPU-c")] {
        let preferred = node.preferred(&[1]).await;
        assert_eq!(preferred, [[format!("{gpu}::0")]], "container {container}");
        let ids: Vec<&str> = preferred[0].iter().map(String::as_str).collect();
        let resp = node.allocate(&ids).await;
        assert_eq!(resp.envs["VGPU_CONTAINER_NAME"], container);
    }
    let pod = node.served.cluster.pod("ns", "p").unwrap();
    assert_eq!(pod.annotations["nvidia.com/real-allocated"], THREE);
    assert_eq!(pod.labels["nvidia.com/assigned-phase"], "succeed");
    node.stop().await;
}

#[tokio::test]
async fn honor_pre_allocated_ids_no_leak_between_retried_pairs() {
    // A GetPreferred that is not followed by Allocate (kubelet retry) must not advance the cursor.
    let mut node = start(&["HonorPreAllocatedDeviceIDs=true"], THREE, |_| {}).await;
    assert_eq!(node.preferred(&[1]).await, [["GPU-a::0"]]);
    assert_eq!(node.preferred(&[1]).await, [["GPU-a::0"]]);
    node.allocate(&["GPU-a::0"]).await;
    assert_eq!(node.preferred(&[1]).await, [["GPU-b::0"]]);
    assert_eq!(node.preferred(&[1]).await, [["GPU-b::0"]]);
    // A size that does not match the claim falls back to the default preference (first available IDs).
    assert_eq!(node.preferred(&[2]).await, [["GPU-a::0", "GPU-a::1"]]);
    node.stop().await;
}

#[tokio::test]
async fn honor_pre_allocated_ids_off_gives_the_default_preference() {
    let mut node = start(&[], THREE, |_| {}).await;
    let options = node.served.client.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(!options.get_preferred_allocation_available);
    assert_eq!(node.preferred(&[1, 1]).await, [["GPU-a::0"], ["GPU-a::1"]]);
    node.stop().await;
}

#[tokio::test]
async fn shared_sm_watcher_reaches_the_env_vgpu_config_and_mounts() {
    for (gates, on) in [(&["SharedSMUtilizationWatcher=true"][..], true), (&[][..], false)] {
        let mut node = start(gates, "c0[0_GPU-a_50_1024]", |_| {}).await;
        let resp = node.allocate(&["GPU-a::3"]).await;
        assert_eq!(resp.envs["EXTERNAL_SM_WATCHER_ENABLED"], on.to_string());
        assert_eq!(node.config_of("c0").sm_watcher, i32::from(on));
        assert_eq!(mount_of(&resp, "/etc/vgpu-manager/watcher").is_some(), on);
        node.stop().await;
    }
}
