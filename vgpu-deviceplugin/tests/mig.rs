//! The MIG plugins over real unix sockets: `mixed` serves one plugin per profile next to the vnumber plugin
//! (which skips the MIG-enabled GPU), `single` serves only the MIG plugin of a uniform node, `none` none.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use tokio_stream::StreamExt;
use vgpu_core::{
    backend::{DeviceBackend, mock::MockBackend},
    node_config::MigStrategy,
};
use vgpu_deviceplugin::{
    build_handlers,
    cluster::InMemoryCluster,
    config::PluginConfig,
    daemon::Daemon,
    inventory::{DeviceState, node_devices},
    server::serve,
};
use vgpu_kubelet::{
    api::v1beta1::{
        AllocateRequest, ContainerAllocateRequest, Empty, device_plugin_client::DevicePluginClient,
    },
    socket::connect_unix,
};

const NODE: &str = "
gpus:
  - uuid: GPU-a
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    numaNode: 1
    minor: 2
    mig:
      mode: Enabled
      instances:
        - { uuid: MIG-x, profile: 3g.40gb, gpuInstanceId: 1, computeInstanceId: 0, placementStart: 0, placementSize: 4, memoryMiB: 30000 }
        - { uuid: MIG-y, profile: 3g.40gb, gpuInstanceId: 2, computeInstanceId: 0, placementStart: 4, placementSize: 4, memoryMiB: 30000 }
        - { uuid: MIG-z, profile: 1g.10gb+me, gpuInstanceId: 9, computeInstanceId: 0, placementStart: 0, placementSize: 1, memoryMiB: 9856 }
  - { uuid: GPU-b, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled } }
";

fn daemon(yaml: &str, strategy: MigStrategy, dir: &std::path::Path) -> Result<Daemon, String> {
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(yaml).unwrap());
    let cluster = Arc::new(InMemoryCluster::default());
    let mut config = PluginConfig::new("n1");
    config.settings.mig_strategy = strategy;
    config.device_plugin_path = dir.to_path_buf();
    config.device_root = dir.join("driver-root");
    Daemon::new(config, backend, cluster.clone(), cluster).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_serves_one_plugin_per_profile() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon(NODE, MigStrategy::Mixed, dir.path()).unwrap();
    let config = Arc::new(daemon.config);
    let state = DeviceState::new(
        node_devices(&daemon.backend.devices().unwrap(), &config.settings),
        &config.settings,
    );
    let handlers = build_handlers(&config, &state, None);
    let names: Vec<(&str, &str)> = handlers.iter().map(|h| (h.socket_name(), h.resource_name())).collect();
    assert_eq!(
        names,
        [
            ("nvidia-vgpu.sock", "nvidia.com/vgpu-number"),
            ("nvidia-mig-1g.10gb+me.sock", "nvidia.com/mig-1g.10gb.me"),
            ("nvidia-mig-3g.40gb.sock", "nvidia.com/mig-3g.40gb"),
        ]
    );
    // The node's CDI spec: the non-MIG GPU and every MIG instance, with their device nodes.
    let (cdi, control) = vgpu_deviceplugin::daemon::cdi_spec_devices(&config, &state.devices());
    let names: Vec<(&str, Vec<&str>)> =
        cdi.iter().map(|d| (d.name.as_str(), d.nodes.iter().map(String::as_str).collect())).collect();
    assert_eq!(
        names,
        [
            ("GPU-b", vec!["/dev/nvidia1"]),
            ("MIG-x", vec!["/dev/nvidia2"]),
            ("MIG-y", vec!["/dev/nvidia2"]),
            ("MIG-z", vec!["/dev/nvidia2"]),
        ]
    );
    assert!(control.is_empty());
    // The vnumber plugin skips the MIG-enabled GPU.
    assert!(handlers[0].devices(&state.devices()).iter().all(|d| d.id.starts_with("GPU-b::")));

    let plugin = Arc::clone(&handlers[2]);
    let socket = dir.path().join(plugin.socket_name());
    let server = serve(plugin, socket.clone(), state.subscribe()).unwrap();
    let mut client = DevicePluginClient::new(connect_unix(&socket, Duration::from_secs(5)).await.unwrap());
    let options = client.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(!options.pre_start_required);
    let list = client.list_and_watch(Empty {}).await.unwrap().into_inner().next().await.unwrap().unwrap();
    let ids: Vec<&str> = list.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["MIG-x", "MIG-y"]);
    assert_eq!(list.devices[0].health, "Healthy");
    assert_eq!(list.devices[0].topology.as_ref().unwrap().nodes[0].id, 1);

    let resp = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec!["MIG-y".into()] }],
        })
        .await
        .unwrap()
        .into_inner();
    let ctr = &resp.container_responses[0];
    assert_eq!(ctr.envs.len(), 1, "no vGPU environment: {:?}", ctr.envs);
    assert_eq!(ctr.envs["NVIDIA_VISIBLE_DEVICES"], "MIG-y");
    assert_eq!(ctr.devices.iter().map(|d| d.container_path.as_str()).collect::<Vec<_>>(), ["/dev/nvidia2"]);
    assert!(ctr.mounts.is_empty());
    let err = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec!["MIG-z".into()] }],
        })
        .await
        .unwrap_err();
    assert!(
        err.message().starts_with("Allocate check failed: unknown nvidia.com/mig-3g.40gb device"),
        "{}",
        err.message()
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn single_and_none() {
    let dir = tempfile::tempdir().unwrap();
    let err = daemon(NODE, MigStrategy::Single, dir.path()).unwrap_err();
    assert!(err.contains("migStrategy single needs MIG enabled on every GPU"), "{err}");
    let uniform = NODE
        .replace("  - { uuid: GPU-b, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled } }\n", "")
        .replace("        - { uuid: MIG-z, profile: 1g.10gb+me, gpuInstanceId: 9, computeInstanceId: 0, placementStart: 0, placementSize: 1, memoryMiB: 9856 }\n", "");
    let daemon_single = daemon(&uniform, MigStrategy::Single, dir.path()).unwrap();
    let config = Arc::new(daemon_single.config);
    let state = DeviceState::new(Vec::new(), &config.settings);
    let handlers = build_handlers(&config, &state, None);
    let names: Vec<&str> = handlers.iter().map(|h| h.resource_name()).collect();
    assert_eq!(names, ["nvidia.com/mig-3g.40gb"], "single: no vnumber plugin");

    let daemon_none = daemon(NODE, MigStrategy::None, dir.path()).unwrap();
    let config = Arc::new(daemon_none.config);
    let handlers = build_handlers(&config, &state, None);
    assert_eq!(handlers.iter().map(|h| h.resource_name()).collect::<Vec<_>>(), ["nvidia.com/vgpu-number"]);
}
