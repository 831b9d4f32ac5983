//! IMEX channels (`--imex-channel-ids`, `--imex-required`, node config `imex`) through `Allocate` over a
//! real unix socket, one test per device-list strategy (`envvar`, `volume-mounts`, `cdi-annotations`,
//! `cdi-cri`), plus the start-up rules: a required channel whose device node is missing stops
//! `Daemon::new`, an optional one is skipped, and the node's CDI specs gain the `imex-channel` kind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use vgpu_core::{
    backend::{DeviceBackend, mock::MockBackend},
    node_config::{DeviceListStrategy, ImexSettings},
};
use vgpu_deviceplugin::{
    cdi,
    cluster::InMemoryCluster,
    config::PluginConfig,
    daemon::{Daemon, cdi_spec_devices},
};
use vgpu_kubelet::api::v1beta1::ContainerAllocateResponse;

const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA GB200, memoryMiB: 8192, minor: 3 }\n";
const UID: &str = "0b1a2c3d-0000-4000-8000-000000000001";

/// A node whose driver root holds `/dev/nvidiactl` and the IMEX channel nodes `present`.
fn node(dir: &std::path::Path, present: &[u32], tune: impl FnOnce(&mut PluginConfig)) -> PluginConfig {
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.to_path_buf();
    config.manager_dir = dir.join("manager");
    config.device_root = dir.join("driver-root");
    config.cdi_root = dir.join("cdi");
    let channels = config.device_root.join("dev/nvidia-caps-imex-channels");
    std::fs::create_dir_all(&channels).unwrap();
    std::fs::write(config.device_root.join("dev/nvidiactl"), b"").unwrap();
    for id in present {
        std::fs::write(channels.join(format!("channel{id}")), b"").unwrap();
    }
    tune(&mut config);
    config
}

fn daemon(config: PluginConfig) -> Result<(Daemon, Arc<InMemoryCluster>), String> {
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster =
        Arc::new(InMemoryCluster::new(vec![support::allocating_pod(UID, "p", "main[0_GPU-a_50_2048]")]));
    Daemon::new(config, backend, cluster.clone(), cluster.clone())
        .map(|d| (d, cluster))
        .map_err(|e| e.to_string())
}

/// Channels 0 and 5 configured (5 present, 0 missing, 7 present but not configured), `strategies` on;
/// allocates the one-GPU container over the socket.
async fn allocate(strategies: Vec<DeviceListStrategy>) -> (ContainerAllocateResponse, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = node(dir.path(), &[5, 7], |c| {
        c.settings.device_list_strategy = strategies;
        c.settings.imex = ImexSettings { channel_ids: vec![5, 0, 5], required: false };
        c.host_driver_root = "/run/nvidia/driver".into();
    });
    let (daemon, cluster) = daemon(config).unwrap();
    assert_eq!(daemon.config.imex_channels, [5], "missing channel 0 skipped, duplicate 5 once");
    let resp = support::allocate_once(daemon, cluster, dir.path(), "p", &["GPU-a::0"]).await;
    (resp, dir)
}

fn device_paths(resp: &ContainerAllocateResponse) -> Vec<(&str, &str)> {
    resp.devices.iter().map(|d| (d.container_path.as_str(), d.host_path.as_str())).collect()
}

const CHANNEL5: (&str, &str) =
    ("/dev/nvidia-caps-imex-channels/channel5", "/run/nvidia/driver/dev/nvidia-caps-imex-channels/channel5");

#[tokio::test]
async fn envvar_sets_nvidia_imex_channels_and_the_channel_node() {
    let (resp, _dir) = allocate(vec![DeviceListStrategy::Envvar]).await;
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a");
    assert_eq!(resp.envs["NVIDIA_IMEX_CHANNELS"], "5");
    assert_eq!(
        device_paths(&resp),
        [
            ("/dev/nvidia3", "/run/nvidia/driver/dev/nvidia3"),
            ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
            CHANNEL5
        ]
    );
    assert!(!resp.mounts.iter().any(|m| m.container_path.contains("/imex/")));
    assert!(resp.annotations.is_empty() && resp.cdi_devices.is_empty());
}

#[tokio::test]
async fn volume_mounts_mount_dev_null_per_channel() {
    let (resp, _dir) = allocate(vec![DeviceListStrategy::VolumeMounts]).await;
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "/var/run/nvidia-container-devices");
    assert!(!resp.envs.contains_key("NVIDIA_IMEX_CHANNELS"), "only the envvar strategy sets it");
    let device_mounts: Vec<(&str, &str, bool)> = resp
        .mounts
        .iter()
        .filter(|m| m.container_path.starts_with("/var/run/nvidia-container-devices/"))
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        device_mounts,
        [
            ("/var/run/nvidia-container-devices/GPU-a", "/dev/null", true),
            ("/var/run/nvidia-container-devices/imex/5", "/dev/null", true),
        ]
    );
    assert_eq!(device_paths(&resp).last(), Some(&CHANNEL5));
}

#[tokio::test]
async fn cdi_annotations_and_cri_name_the_channel_devices() {
    let (resp, dir) = allocate(vec![DeviceListStrategy::CdiAnnotations]).await;
    let expected = "k8s.device-plugin.nvidia.com/gpu=GPU-a,k8s.device-plugin.nvidia.com/imex-channel=5";
    assert_eq!(resp.annotations[&format!("cdi.k8s.io/vgpu-device-plugin_{UID}")], expected);
    assert!(resp.devices.is_empty(), "CDI only: the runtime adds the nodes from the spec");
    assert!(
        !resp.envs.contains_key("NVIDIA_IMEX_CHANNELS") && !resp.envs.contains_key("NVIDIA_VISIBLE_DEVICES")
    );
    drop(dir);

    let (resp, _dir) = allocate(vec![DeviceListStrategy::CdiCri]).await;
    let names: Vec<&str> = resp.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["k8s.device-plugin.nvidia.com/gpu=GPU-a", "k8s.device-plugin.nvidia.com/imex-channel=5"]
    );
    assert!(resp.annotations.is_empty());
}

#[test]
fn required_channel_missing_stops_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let config = node(dir.path(), &[5], |c| {
        c.settings.imex = ImexSettings { channel_ids: vec![5, 0], required: true };
    });
    let err = daemon(config).err().unwrap();
    assert!(err.contains("IMEX channel 0 is required"), "{err}");
    assert!(err.contains("nvidia-caps-imex-channels/channel0 does not exist"), "{err}");

    let config = node(dir.path(), &[0, 5], |c| {
        c.settings.imex = ImexSettings { channel_ids: vec![5, 0], required: true };
    });
    assert_eq!(daemon(config).unwrap().0.config.imex_channels, [5, 0]);
    // No channels configured: nothing required, nothing passed.
    let config = node(dir.path(), &[0], |c| c.settings.imex.required = true);
    assert!(daemon(config).unwrap().0.config.imex_channels.is_empty());
}

#[test]
fn node_cdi_specs_hold_the_gpus_and_the_channels() {
    let dir = tempfile::tempdir().unwrap();
    let config = node(dir.path(), &[5], |c| {
        c.settings.imex = ImexSettings { channel_ids: vec![5], required: true };
    });
    let (daemon, _) = daemon(config).unwrap();
    let config = &daemon.config;
    let (devices, control) = cdi_spec_devices(config, &daemon.backend.devices().unwrap());
    let gpus = cdi::write_node_spec(
        &config.cdi_root,
        config.vendor.cdi_kind(),
        &devices,
        &control,
        &config.host_driver_root,
    )
    .unwrap();
    assert_eq!(gpus, config.cdi_root.join("k8s.device-plugin.nvidia.com-gpu.json"));
    let imex =
        cdi::write_spec(&config.cdi_root, &cdi::imex_spec(&config.imex_channels, &config.host_driver_root))
            .unwrap();
    assert_eq!(imex, config.cdi_root.join("k8s.device-plugin.nvidia.com-imex-channel.json"));
    let text = std::fs::read_to_string(&imex).unwrap();
    assert_eq!(
        text,
        r#"{
  "cdiVersion": "0.5.0",
  "kind": "k8s.device-plugin.nvidia.com/imex-channel",
  "devices": [
    {
      "name": "5",
      "containerEdits": {
        "deviceNodes": [
          {
            "path": "/dev/nvidia-caps-imex-channels/channel5",
            "hostPath": "/dev/nvidia-caps-imex-channels/channel5"
          }
        ]
      }
    }
  ],
  "containerEdits": {}
}"#
    );
}
