//! This crate's unix-socket gRPC servers called with the socket's path as the HTTP/2 `:authority`, as the
//! kubelet's plugin watcher (and other grpc-go clients that dial a bare path) send it: the device-plugin
//! server and the client-mode registry answer instead of resetting the stream (issue #31). The recorded
//! kubelet registration itself is replayed against the DRA plugin in `vgpu-dra/tests/authority.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use prost::Message as _;
use tokio::sync::watch;
use vgpu_core::{
    backend::{DeviceBackend, mock::MockBackend},
    node_config::CgroupDriver,
};
use vgpu_deviceplugin::{
    api::{registry::ContainerDeviceRequest, v1beta1::DevicePluginOptions},
    authority::call::call,
    build_handlers,
    cluster::InMemoryCluster,
    config::PluginConfig,
    inventory::{DeviceState, node_devices},
    registry::{RegistryConfig, serve_registry},
    server::serve,
};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn the_device_plugin_server_answers_a_path_authority() {
    let dir = tempfile::tempdir().unwrap();
    let backend =
        MockBackend::from_yaml_str("gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034 }\n").unwrap();
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.path().to_path_buf();
    config.manager_dir = dir.path().to_path_buf();
    let gpus = node_devices(&backend.devices().unwrap(), &config.settings);
    let state = DeviceState::new(gpus.clone(), &config.settings);
    let handlers = build_handlers(&Arc::new(config), &state, Some(Arc::new(InMemoryCluster::default())));
    let socket = dir.path().join("vgpu-number.sock");
    let (_gpus_tx, gpus_rx) = watch::channel(gpus);
    let running = serve(Arc::clone(&handlers[0]), socket.clone(), gpus_rx).unwrap();

    let answer = call(
        &socket,
        &socket.display().to_string(),
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        &[],
        WAIT,
    )
    .await
    .unwrap();
    assert_eq!((answer.reset, answer.grpc_status()), (None, Some(0)), "{answer:?}");
    let options = DevicePluginOptions::decode(answer.message().unwrap()).unwrap();
    assert!(options.pre_start_required, "{options:?}");
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_answers_a_path_authority() {
    const UID: &str = "0b1a22cd-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    // This process is the caller: put it in a pod's cgroup under a fake /proc, with one container process.
    let cgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1a22cd_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-c0ffee.scope";
    let proc = root.join("proc").join(std::process::id().to_string());
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
    let cgroup_dir = root.join("cgroup").join(cgroup.trim_start_matches('/'));
    std::fs::create_dir_all(&cgroup_dir).unwrap();
    std::fs::write(cgroup_dir.join("cgroup.procs"), "4242\n").unwrap();
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap();
    let status = root.join("proc/4242");
    std::fs::create_dir_all(&status).unwrap();
    std::fs::write(status.join("status"), format!("Name:\tapp\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")).unwrap();
    std::fs::create_dir_all(root.join(format!("manager/{UID}_main/config"))).unwrap();
    let running = serve_registry(RegistryConfig {
        manager_dir: root.join("manager"),
        proc_root: root.join("proc"),
        cgroup_root: root.join("cgroup"),
        cgroup_driver: CgroupDriver::Systemd,
        poll_interval: Duration::from_millis(10),
        poll_timeout: Duration::from_millis(500),
        socket_group: None,
    })
    .unwrap();

    let request = ContainerDeviceRequest {
        pod_uid: UID.into(),
        container_name: "main".into(),
        register_uuid: String::new(),
    };
    let answer = call(
        &running.socket,
        &running.socket.display().to_string(),
        "/registry.VDeviceRegistry/RegisterContainerDevice",
        &request.encode_to_vec(),
        WAIT,
    )
    .await
    .unwrap();
    assert_eq!((answer.reset, answer.grpc_status()), (None, Some(0)), "{answer:?}");
    assert_eq!(
        std::fs::read_to_string(root.join(format!("manager/{UID}_main/config/pids.config"))).unwrap(),
        "4242\n"
    );
    running.stop().await;
}
