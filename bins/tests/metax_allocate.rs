//! A MetaX pod through the device plugin: the MetaX backend (`vgpu-nvml`) on a fake sysfs tree, wired by
//! `Daemon::new` (which takes the backend's vendor adapter), `Allocate` over a real unix socket. The
//! container gets the GPU's DRM nodes (`/dev/dri/cardN`, `/dev/dri/renderDN`, found through
//! `<sysfs>/bus/pci/devices/<bdf>/drm/`) and `/dev/mxcd`, no NVIDIA device node or env, the MetaX CDI kind;
//! IMEX does not apply. The test lives here because `bins` is the crate that depends on both the backend
//! and the device plugin.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-deviceplugin/tests/support/mod.rs"]
mod support;

use std::{path::Path, sync::Arc};

use vgpu_core::{
    backend::DeviceBackend,
    model::Vendor,
    node_config::{DeviceListStrategy, ImexSettings},
};
use vgpu_deviceplugin::{
    cdi,
    cluster::InMemoryCluster,
    config::PluginConfig,
    daemon::{Daemon, cdi_spec_devices},
};
use vgpu_kubelet::api::v1beta1::ContainerAllocateResponse;
use vgpu_nvml::{MetaxBackend, MetaxOptions};

const UID: &str = "5e7a0000-1111-4000-8000-000000000002";
/// The second GPU's synthetic UUID (no `libmxsml.so` in the tree).
const GPU1: &str = "METAX-0000:86:00.0";

/// One PCI function under `<root>/sys`, with its DRM entries mirrored as device nodes under `<root>/dev/dri`.
fn pci_function(root: &Path, address: &str, vendor: &str, class: &str, drm: &[&str]) {
    let dir = root.join("sys/bus/pci/devices").join(address);
    std::fs::create_dir_all(&dir).unwrap();
    for (file, value) in [("vendor", vendor), ("device", "0x4000"), ("class", class), ("numa_node", "0")] {
        std::fs::write(dir.join(file), format!("{value}\n")).unwrap();
    }
    std::fs::create_dir_all(root.join("dev/dri")).unwrap();
    for name in drm {
        std::fs::create_dir_all(dir.join("drm").join(name)).unwrap();
        std::fs::write(root.join("dev/dri").join(name), "").unwrap();
    }
}

/// Two MetaX GPUs, a NIC, `/dev/mxcd`, and an NVIDIA control node that must not leak into MetaX pods.
fn metax_node() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    pci_function(root, "0000:3b:00.0", "0x9999", "0x030000", &["card1", "renderD129"]);
    pci_function(root, "0000:86:00.0", "0x9999", "0x038000", &["card2", "renderD130"]);
    pci_function(root, "0000:17:00.0", "0x15b3", "0x020000", &[]);
    std::fs::write(root.join("dev/mxcd"), "").unwrap();
    std::fs::write(root.join("dev/nvidiactl"), "").unwrap();
    dir
}

fn backend(root: &Path) -> Arc<dyn DeviceBackend> {
    let options = MetaxOptions {
        sysfs_root: root.join("sys"),
        dev_root: root.join("dev"),
        library_path: None,
        library_dirs: vec![root.join("no-library")],
        pci_ids_paths: Vec::new(),
    };
    Arc::new(MetaxBackend::new(options).unwrap())
}

/// The plugin configuration of the fake node: the tree is the container driver root (so `/dev/mxcd` is
/// found), host paths stay `/dev/...`.
fn config(root: &Path, tune: impl FnOnce(&mut PluginConfig)) -> PluginConfig {
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = root.join("device-plugins");
    config.manager_dir = root.join("manager");
    vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
    config.device_root = root.to_path_buf();
    config.cdi_root = root.join("cdi");
    std::fs::create_dir_all(&config.device_plugin_path).unwrap();
    tune(&mut config);
    config
}

async fn allocate(tune: impl FnOnce(&mut PluginConfig)) -> (ContainerAllocateResponse, tempfile::TempDir) {
    let tree = metax_node();
    let backend = backend(tree.path());
    let cluster = Arc::new(InMemoryCluster::new(vec![support::allocating_pod(
        UID,
        "mx",
        &format!("main[1_{GPU1}_50_2048]"),
    )]));
    let daemon =
        Daemon::new(config(tree.path(), tune), Arc::clone(&backend), cluster.clone(), cluster.clone())
            .unwrap();
    assert_eq!(daemon.config.vendor.vendor(), Vendor::MetaX);
    let dir = daemon.config.device_plugin_path.clone();
    let id = format!("{GPU1}::3");
    let resp = support::allocate_once(daemon, cluster, &dir, "mx", &[&id]).await;
    (resp, tree)
}

#[tokio::test]
async fn a_metax_pod_gets_its_drm_nodes_and_mxcd() {
    let (resp, _tree) = allocate(|c| {
        c.settings.device_list_strategy = vec![DeviceListStrategy::Envvar, DeviceListStrategy::VolumeMounts];
        c.settings.gds_enabled = true;
        c.settings.imex = ImexSettings { channel_ids: vec![0], required: false };
    })
    .await;
    let devices: Vec<(&str, &str, &str)> = resp
        .devices
        .iter()
        .map(|d| (d.container_path.as_str(), d.host_path.as_str(), d.permissions.as_str()))
        .collect();
    assert_eq!(
        devices,
        [
            ("/dev/dri/card2", "/dev/dri/card2", "rw"),
            ("/dev/dri/renderD130", "/dev/dri/renderD130", "rw"),
            ("/dev/mxcd", "/dev/mxcd", "rw"),
        ]
    );
    // No NVIDIA device-list env, feature env, IMEX env or volume-mounts device list.
    let nvidia: Vec<&String> = resp.envs.keys().filter(|k| k.starts_with("NVIDIA_")).collect();
    assert!(nvidia.is_empty(), "{nvidia:?}");
    assert!(!resp.mounts.iter().any(|m| m.container_path.starts_with("/var/run/nvidia-container-devices")));
    // The vGPU contract stays: limits by host index, the visible slot of GPU 1.
    assert_eq!(resp.envs["CUDA_MEM_LIMIT_1"], "2048m");
    assert_eq!(resp.envs["MANAGER_VISIBLE_DEVICES"].split(',').nth(1), Some(GPU1));
    assert!(resp.mounts.iter().any(|m| m.container_path == "/etc/vgpu-manager/config"));
}

#[tokio::test]
async fn cdi_uses_the_metax_kind() {
    let (resp, tree) = allocate(|c| {
        c.settings.device_list_strategy =
            vec![DeviceListStrategy::CdiAnnotations, DeviceListStrategy::CdiCri];
    })
    .await;
    let qualified = format!("k8s.device-plugin.metax-tech.com/gpu={GPU1}");
    assert_eq!(resp.annotations[&format!("cdi.k8s.io/vgpu-device-plugin_{UID}")], qualified);
    assert_eq!(resp.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), [qualified.as_str()]);
    assert!(resp.devices.is_empty(), "CDI only: the runtime adds the nodes from the spec");

    // The node's spec for that kind: each GPU with its DRM nodes, /dev/mxcd for all.
    let backend = backend(tree.path());
    let cluster = Arc::new(InMemoryCluster::default());
    let daemon =
        Daemon::new(config(tree.path(), |_| {}), Arc::clone(&backend), cluster.clone(), cluster).unwrap();
    let config = &daemon.config;
    let (devices, control) = cdi_spec_devices(config, &backend.devices().unwrap());
    let path = cdi::write_node_spec(
        &config.cdi_root,
        config.vendor.cdi_kind(),
        &devices,
        &control,
        &config.host_driver_root,
    )
    .unwrap();
    assert_eq!(path, config.cdi_root.join("k8s.device-plugin.metax-tech.com-gpu.json"));
    let spec: vgpu_core::cdi::Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(spec.kind, "k8s.device-plugin.metax-tech.com/gpu");
    let nodes: Vec<(&str, Vec<&str>)> = spec
        .devices
        .iter()
        .map(|d| (d.name.as_str(), d.container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect()))
        .collect();
    assert_eq!(
        nodes,
        [
            ("METAX-0000:3b:00.0", vec!["/dev/dri/card1", "/dev/dri/renderD129"]),
            (GPU1, vec!["/dev/dri/card2", "/dev/dri/renderD130"]),
        ]
    );
    let edits = spec.container_edits.clone();
    let control: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(control, ["/dev/mxcd"]);
}

#[test]
fn required_imex_refuses_a_metax_node() {
    let tree = metax_node();
    let cluster = Arc::new(InMemoryCluster::default());
    let config =
        config(tree.path(), |c| c.settings.imex = ImexSettings { channel_ids: vec![0], required: true });
    let err = Daemon::new(config, backend(tree.path()), cluster.clone(), cluster).unwrap_err().to_string();
    assert!(err.contains("IMEX applies only to NVIDIA GPUs, not metax"), "{err}");
}
