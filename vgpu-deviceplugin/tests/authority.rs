//! This crate's unix-socket gRPC servers called with the socket's path as the HTTP/2 `:authority`, as the
//! kubelet's plugin watcher (and other grpc-go clients that dial a bare path) send it: the device-plugin
//! server answers instead of resetting the stream (issue #31); the client-mode registry's case is in
//! `tests/registry.rs`. The recorded kubelet registration itself is replayed against the DRA plugin in
//! `vgpu-dra/tests/authority.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use prost::Message as _;
use tokio::sync::watch;
use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_deviceplugin::{
    build_handlers,
    cluster::InMemoryCluster,
    config::PluginConfig,
    inventory::{DeviceState, node_devices},
    server::serve,
};
use vgpu_kubelet::{api::v1beta1::DevicePluginOptions, authority::call::call};

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
