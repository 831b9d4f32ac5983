//! The kubelet's plugin watcher against our sockets, byte for byte: `fixtures/kubelet-plugin-watcher.h2` is
//! what grpc-go writes when the kubelet (`k8s.io/kubernetes` v1.37.2) registers a plugin — `GetInfo`, then
//! `NotifyRegistrationStatus`, on one connection, with the registration socket's path as the HTTP/2
//! `:authority` (Huffman-coded, then an indexed reference). It was recorded by `e2e/tools/kubelet-dial`.
//! A plain tonic server resets both streams (`PROTOCOL_ERROR`: the defect of issue #31); the plugin's
//! servers answer them, and the DRA socket answers a call made the same way.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use prost::Message as _;
use support::TestNode;
use tokio_stream::wrappers::UnixListenerStream;
use vgpu_dra::registration::RegistrationService;
use vgpu_kubelet::api::{dra_v1, pluginregistration as pr};
use vgpu_kubelet::authority::call::{call, exchange};

const RECORDED: &[u8] = include_bytes!("fixtures/kubelet-plugin-watcher.h2");
const WAIT: Duration = Duration::from_secs(10);
/// HTTP/2 `PROTOCOL_ERROR`.
const PROTOCOL_ERROR: u32 = 1;

#[tokio::test]
async fn a_plain_tonic_server_resets_the_kubelets_registration_calls() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plain-reg.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let service = RegistrationService::new("manager.nvidia.com", &dir.path().join("dra.sock"));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pr::registration_server::RegistrationServer::new(service))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let answers = exchange(&socket, RECORDED, 2, WAIT).await.unwrap();
    assert_eq!(answers.len(), 2, "{answers:?}");
    for (stream, answer) in &answers {
        assert_eq!(answer.reset, Some(PROTOCOL_ERROR), "stream {stream}: {answer:?}");
    }
    server.abort();
}

#[tokio::test]
async fn the_plugin_answers_the_kubelets_recorded_registration() {
    let node = TestNode::new();
    let running = node.serve().await;
    let mut registration = running.registration.clone();

    let answers = exchange(&running.registration_socket, RECORDED, 2, WAIT).await.unwrap();
    let info = &answers[&1];
    assert_eq!(info.reset, None, "{info:?}");
    assert_eq!(info.grpc_status(), Some(0), "{info:?}");
    let info = pr::PluginInfo::decode(info.message().unwrap()).unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "manager.nvidia.com");
    assert_eq!(std::path::Path::new(&info.endpoint), node.config.dra_socket());
    let notified = &answers[&3];
    assert_eq!((notified.reset, notified.grpc_status()), (None, Some(0)), "{notified:?}");
    registration.wait_for(|s| s.notifications == 1 && s.registered).await.unwrap();
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_dra_socket_answers_a_path_authority() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    let running = node.serve().await;
    let dra_socket = node.config.dra_socket();
    let request = dra_v1::NodePrepareResourcesRequest {
        claims: vec![dra_v1::Claim { namespace: "ns".into(), uid: "uid-1".into(), name: "c1".into() }],
    };
    let answer = call(
        &dra_socket,
        &dra_socket.display().to_string(),
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        &request.encode_to_vec(),
        WAIT,
    )
    .await
    .unwrap();
    assert_eq!((answer.reset, answer.grpc_status()), (None, Some(0)), "{answer:?}");
    let response = dra_v1::NodePrepareResourcesResponse::decode(answer.message().unwrap()).unwrap();
    assert_eq!(response.claims["uid-1"].error, "");
    assert_eq!(response.claims["uid-1"].devices.len(), 1);
    running.stop().await.unwrap();
}
