//! The client-mode device registry over a real unix socket. The caller is this test process: its
//! `SO_PEERCRED` PID is looked up under a fake `/proc` whose `cgroup` file puts it in a pod, and that pod's
//! fake cgroup lists the PIDs that end up in `pids.config`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use tonic::Code;
use vgpu_core::node_config::CgroupDriver;
use vgpu_deviceplugin::{
    api::registry::{ContainerDeviceRequest, v_device_registry_client::VDeviceRegistryClient},
    registration::connect_unix,
    registry::{RegistryConfig, serve_registry, serve_registry_with_guard},
};

const UID: &str = "0b1a22cd-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const CGROUP: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1a22cd_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-c0ffee.scope";

fn request(uid: &str, ctr: &str) -> ContainerDeviceRequest {
    ContainerDeviceRequest { pod_uid: uid.into(), container_name: ctr.into(), register_uuid: String::new() }
}

fn setup(root: &Path, driver: CgroupDriver) -> RegistryConfig {
    let proc = root.join("proc").join(std::process::id().to_string());
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join("cgroup"), format!("0::{CGROUP}\n")).unwrap();
    let cgroup = root.join("cgroup").join(CGROUP.trim_start_matches('/'));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), "4242\n17\n4242\n").unwrap();
    std::fs::create_dir_all(root.join(format!("manager/{UID}_main/config"))).unwrap();
    RegistryConfig {
        manager_dir: root.join("manager"),
        proc_root: root.join("proc"),
        cgroup_root: root.join("cgroup"),
        cgroup_driver: driver,
        poll_interval: Duration::from_millis(10),
        poll_timeout: Duration::from_millis(200),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_the_callers_container_pids() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Systemd);
    let running = serve_registry(config.clone()).unwrap();
    let socket = root.path().join("manager/registry/socket.sock");
    assert_eq!(running.socket, socket);
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o666);
    assert_eq!(std::fs::metadata(socket.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o711);
    let mut client = VDeviceRegistryClient::new(connect_unix(&socket, Duration::from_secs(5)).await.unwrap());

    client.register_container_device(request(UID, "main")).await.unwrap();
    let pids = root.path().join(format!("manager/{UID}_main/config/pids.config"));
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), "17\n4242\n");

    // Another pod's container: refused.
    let err = client.register_container_device(request("someone-else", "main")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(err.message(), format!("caller pod {UID:?} is not authorized for this register request"));
    // A container that was never allocated.
    let err = client.register_container_device(request(UID, "sidecar")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // Bad input.
    let err = client.register_container_device(request(UID, "")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = client.register_container_device(request(UID, "../x")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut with_uuid = request(UID, "main");
    with_uuid.register_uuid = "claim-1".into();
    assert_eq!(client.register_container_device(with_uuid).await.unwrap_err().code(), Code::Unimplemented);

    // A symlink in place of pids.config is refused.
    std::fs::remove_file(&pids).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &pids).unwrap();
    let err = client.register_container_device(request(UID, "main")).await.unwrap_err();
    assert!(err.message().contains("is a symlink"), "{}", err.message());
    std::fs::remove_file(&pids).unwrap();

    // No process in the cgroup within the poll timeout.
    let procs = config.cgroup_root.join(CGROUP.trim_start_matches('/')).join("cgroup.procs");
    std::fs::write(&procs, "").unwrap();
    let err = client.register_container_device(request(UID, "main")).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);

    running.stop().await;
    assert!(!socket.exists(), "socket removed on stop");
}

#[tokio::test]
async fn the_cgroup_driver_decides_how_the_pod_is_read() {
    let root = tempfile::tempdir().unwrap();
    // A cgroupfs node cannot read a systemd path: the caller has no pod.
    let config = setup(root.path(), CgroupDriver::Cgroupfs);
    let running = serve_registry(config).unwrap();
    let mut client =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    let err = client.register_container_device(request(UID, "main")).await.unwrap_err();
    assert_eq!(err.message(), "caller pod \"\" is not authorized for this register request");
    running.stop().await;
}

#[tokio::test]
async fn a_world_writable_socket_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Auto);
    let dir = root.path().join("manager/registry");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = serve_registry(config).unwrap_err().to_string();
    assert!(err.contains("group- or world-writable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_socket_is_republished_and_a_foreign_one_is_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Auto);
    let running = serve_registry_with_guard(config, Duration::from_millis(20)).unwrap();
    let socket = running.socket.clone();
    std::fs::remove_file(&socket).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !socket.exists() {
        assert!(std::time::Instant::now() < deadline, "socket not republished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut client = VDeviceRegistryClient::new(connect_unix(&socket, Duration::from_secs(5)).await.unwrap());
    client.register_container_device(request(UID, "main")).await.unwrap();
    drop(client);
    running.stop().await;
    assert!(!socket.exists());

    // Someone else's socket at the path is not removed on stop.
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Auto);
    let running = serve_registry_with_guard(config, Duration::from_secs(3600)).unwrap();
    let socket = running.socket.clone();
    std::fs::remove_file(&socket).unwrap();
    std::fs::write(&socket, b"someone else").unwrap();
    running.stop().await;
    assert_eq!(std::fs::read(&socket).unwrap(), b"someone else");
}
