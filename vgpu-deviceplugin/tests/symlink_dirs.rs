//! `Allocate` never changes permissions through a symbolic link: a link planted where a container's
//! directory goes (pointing at a host directory outside the manager directory) fails the allocation with an
//! error naming the link, and the link's target keeps its mode.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_deviceplugin::{cluster::InMemoryCluster, daemon::Daemon};
use vgpu_kubelet::api::v1beta1::{AllocateRequest, ContainerAllocateRequest};

const MOCK: &str = "\
driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192, minor: 3 }
";
const UID: &str = "7f1c8c2e-2a8e-4b0e-9c1d-1c1e5a3f2b10";

#[tokio::test]
async fn a_symlinked_container_directory_fails_allocate_and_keeps_its_target_mode() {
    for sub in ["vmem_node", "config"] {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("etc");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();

        let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
        let pod = support::allocating_pod(UID, "p", "main[0_GPU-a_50_2048]");
        let cluster = Arc::new(InMemoryCluster::new(vec![pod]));
        let config = support::plugin_config(dir.path());
        // The container's directory exists with a link where one of its subdirectories goes.
        let container_dir = config.manager_dir.join(format!("{UID}_main"));
        std::fs::create_dir_all(&container_dir).unwrap();
        let link = container_dir.join(sub);
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let daemon = Daemon::new(config, Arc::clone(&backend), cluster.clone(), cluster.clone()).unwrap();
        let mut served = support::Served::start(daemon, cluster, dir.path()).await;
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec!["GPU-a::0".to_owned()] }],
        };
        let status = served.client.allocate(request).await.unwrap_err();
        let message = status.message();
        assert!(message.contains(&link.display().to_string()), "{sub}: {message}");
        assert!(
            message.contains("is a symbolic link; refusing to change its permissions"),
            "{sub}: {message}"
        );
        assert_eq!(
            std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
            0o700,
            "{sub}: the link's target keeps its mode"
        );
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        served.stop().await;
    }
}
