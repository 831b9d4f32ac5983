//! `Allocate` over a real unix socket, for the settings that shape its answer: the device-list strategies
//! (`cdi-annotations` alone and with `envvar`, `cdi-cri`), the GDS / MOFED / GDRCopy envs, the driver roots
//! of the device nodes, the two manager directories, and the driver / CUDA versions the backend reports,
//! read back from the bytes of `vgpu.config`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{collections::BTreeMap, path::Path, sync::Arc};

use vgpu_core::{
    abi::vgpu_config,
    backend::{DeviceBackend, mock::MockBackend},
    node_config::DeviceListStrategy,
};
use vgpu_deviceplugin::{cluster::InMemoryCluster, config::PluginConfig, daemon::Daemon};
use vgpu_kubelet::api::v1beta1::ContainerAllocateResponse;

const MOCK: &str = "\
driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192, minor: 3 }
  - { uuid: GPU-b, name: NVIDIA L4, memoryMiB: 8192, minor: 5 }
";
const UID: &str = "7f1c8c2e-2a8e-4b0e-9c1d-1c1e5a3f2b10";

/// Serves the vnumber plugin built by [`Daemon::new`] (so the backend's driver versions apply) with
/// `tune` applied to its configuration, allocates the two-GPU container and returns its response.
async fn allocate_with(
    tune: impl FnOnce(&mut PluginConfig),
) -> (ContainerAllocateResponse, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let pod = support::allocating_pod(UID, "p", "main[0_GPU-a_50_2048,1_GPU-b_50_2048]");
    let cluster = Arc::new(InMemoryCluster::new(vec![pod]));
    let mut config = support::plugin_config(dir.path());
    tune(&mut config);
    let daemon = Daemon::new(config, Arc::clone(&backend), cluster.clone(), cluster.clone()).unwrap();
    let resp = support::allocate_once(daemon, cluster, dir.path(), "p", &["GPU-a::0", "GPU-b::4"]).await;
    (resp, dir)
}

fn host_paths(resp: &ContainerAllocateResponse) -> Vec<(&str, &str)> {
    resp.devices.iter().map(|d| (d.container_path.as_str(), d.host_path.as_str())).collect()
}

#[tokio::test]
async fn cdi_annotations_strategy() {
    let (resp, _dir) =
        allocate_with(|c| c.settings.device_list_strategy = vec![DeviceListStrategy::CdiAnnotations]).await;
    let expected = BTreeMap::from([(
        format!("cdi.k8s.io/vgpu-device-plugin_{UID}"),
        "k8s.device-plugin.nvidia.com/gpu=GPU-a,k8s.device-plugin.nvidia.com/gpu=GPU-b".to_owned(),
    )]);
    assert_eq!(resp.annotations.into_iter().collect::<BTreeMap<_, _>>(), expected);
    // CDI only: no NVIDIA_VISIBLE_DEVICES, no device nodes, no CRI CDI devices; the vGPU envs stay.
    assert!(!resp.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
    assert!(resp.devices.is_empty() && resp.cdi_devices.is_empty());
    assert_eq!(resp.envs["CUDA_MEM_LIMIT_1"], "2048m");

    // Combined with envvar and cdi-cri, under a custom prefix.
    let (resp, _dir) = allocate_with(|c| {
        c.settings.device_list_strategy =
            vec![DeviceListStrategy::Envvar, DeviceListStrategy::CdiAnnotations, DeviceListStrategy::CdiCri];
        c.cdi_annotation_prefix = "cdi.example.com/".into();
    })
    .await;
    assert_eq!(
        resp.annotations.keys().collect::<Vec<_>>(),
        [&format!("cdi.example.com/vgpu-device-plugin_{UID}")]
    );
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    let cdi: Vec<&str> = resp.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(cdi, ["k8s.device-plugin.nvidia.com/gpu=GPU-a", "k8s.device-plugin.nvidia.com/gpu=GPU-b"]);
    assert_eq!(resp.devices.len(), 3, "two GPUs and nvidiactl");

    // The default (envvar) adds no annotation.
    let (resp, _dir) = allocate_with(|_| {}).await;
    assert!(resp.annotations.is_empty());
}

#[tokio::test]
async fn gds_mofed_gdrcopy_envs() {
    let (resp, _dir) = allocate_with(|_| {}).await;
    for key in ["NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_GDRCOPY"] {
        assert!(!resp.envs.contains_key(key), "{key}");
    }
    let (resp, _dir) = allocate_with(|c| {
        c.settings.gds_enabled = true;
        c.settings.gdrcopy_enabled = true;
    })
    .await;
    assert_eq!(resp.envs["NVIDIA_GDS"], "enabled");
    assert_eq!(resp.envs["NVIDIA_GDRCOPY"], "enabled");
    assert!(!resp.envs.contains_key("NVIDIA_MOFED"));
    let (resp, _dir) = allocate_with(|c| c.settings.mofed_enabled = true).await;
    assert_eq!(resp.envs["NVIDIA_MOFED"], "enabled");
}

#[tokio::test]
async fn driver_roots_and_manager_dirs() {
    let (resp, dir) = allocate_with(|c| {
        c.host_driver_root = "/run/nvidia/driver".into();
        c.host_manager_dir = "/var/lib/vgpu-manager".into();
        c.settings.open_kernel_modules = true;
    })
    .await;
    // Device nodes: found under the container driver root, handed out under the host driver root, with the
    // backend's minor numbers.
    assert_eq!(
        host_paths(&resp),
        [
            ("/dev/nvidia3", "/run/nvidia/driver/dev/nvidia3"),
            ("/dev/nvidia5", "/run/nvidia/driver/dev/nvidia5"),
            ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
        ]
    );
    // Mount sources are under the host manager dir; the files are written under the local one.
    let config_mount = resp.mounts.iter().find(|m| m.container_path == "/etc/vgpu-manager/config").unwrap();
    assert_eq!(config_mount.host_path, format!("/var/lib/vgpu-manager/{UID}_main/config"));
    let preload = resp.mounts.iter().find(|m| m.container_path == "/etc/ld.so.preload").unwrap();
    assert_eq!(preload.host_path, "/var/lib/vgpu-manager/ld.so.preload");
    let local = dir.path().join(format!("manager/{UID}_main"));
    assert!(local.join("devices.json").is_file());
    assert!(local.join("config/vgpu.config").is_file());
    assert!(!Path::new("/var/lib/vgpu-manager").join(format!("{UID}_main")).exists());
    // Open kernel modules: OpenKernel (100) | cgroup v2 (2).
    assert_eq!(resp.envs["MANAGER_COMPATIBILITY_MODE"], "102");
}

#[tokio::test]
async fn vgpu_config_carries_the_backend_driver_and_cuda_versions() {
    let (_resp, dir) = allocate_with(|_| {}).await;
    let bytes = std::fs::read(dir.path().join(format!("manager/{UID}_main/config/vgpu.config"))).unwrap();
    assert_eq!(bytes.len(), 8192);
    assert_eq!(&bytes[0..4], b"FCGV", "magic 0x56474346 little-endian");
    // version_t cuda_version @16: i32 major, i32 minor.
    assert_eq!(&bytes[16..24], &[12, 0, 0, 0, 8, 0, 0, 0]);
    // char driver_version[32] @24, NUL-terminated, zero-filled.
    let mut driver = [0u8; 32];
    driver[..9].copy_from_slice(b"570.86.10");
    assert_eq!(&bytes[24..56], &driver);
    let read = vgpu_config::read(&dir.path().join(format!("manager/{UID}_main/config/vgpu.config"))).unwrap();
    assert_eq!((read.cuda_version.major, read.cuda_version.minor), (12, 8));
}

#[tokio::test]
async fn daemon_takes_driver_labels_from_the_backend() {
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster = Arc::new(InMemoryCluster::default());
    let daemon = Daemon::new(PluginConfig::new("n"), backend, cluster.clone(), cluster).unwrap();
    assert_eq!(daemon.driver.driver_version, "570.86.10");
    assert_eq!(daemon.driver.cuda_version, Some((12, 8)));
    assert_eq!(daemon.config.device_minors, BTreeMap::from([(0, 3), (1, 5)]));
}
