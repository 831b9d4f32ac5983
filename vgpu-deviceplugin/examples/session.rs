//! A short device-plugin session without a cluster: the mock DGX H100 backend, a test kubelet
//! (`Registration` server) in a temporary directory and an in-memory cluster. Prints the plugin's log and
//! the node annotations it published.
//!
//! `cargo run -p vgpu-deviceplugin --example session`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_core::backend::mock::MockBackend;
use vgpu_deviceplugin::{
    cluster::{InMemoryCluster, NodeInfo},
    config::PluginConfig,
    daemon::Daemon,
};
use vgpu_kubelet::api::v1beta1::{
    Empty, RegisterRequest,
    registration_server::{Registration, RegistrationServer},
};

struct TestKubelet;

#[tonic::async_trait]
impl Registration for TestKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(target: "test_kubelet", resource = %r.resource_name, endpoint = %r.endpoint, "Register");
        Ok(Response::new(Empty {}))
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_env_filter("info").with_target(true).init();
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("kubelet.sock")).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(TestKubelet))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let mock = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mock/dgx-h100-8gpu.yaml");
    let backend = Arc::new(MockBackend::from_path(std::path::Path::new(mock)).unwrap());
    let cluster = Arc::new(InMemoryCluster::default());
    let mut stale = NodeInfo::default();
    stale.capacity.insert("nvidia.com/vgpu-cores".into(), "800".into());
    cluster.upsert_node("dgx-1", stale);

    let mut config = PluginConfig::new("dgx-1");
    config.device_plugin_path = dir.path().to_path_buf();
    config.manager_dir = dir.path().join("manager");
    config.watch_interval = Duration::from_millis(200);
    config.gates = vgpu_deviceplugin::feature_gates()
        .configure(&["TopologyAwareGPUAllocation=true,GPUMemoryResourcePlugin=true".to_owned()])
        .unwrap();
    let mut daemon = Daemon::new(config, backend, cluster.clone(), cluster.clone()).unwrap();
    daemon.publisher.interval = Duration::from_millis(500);
    daemon.publisher.stale_poll = Duration::from_millis(100);
    daemon.publisher.retry_min = Duration::from_millis(100);

    let (_restart_tx, restart_rx) = tokio::sync::mpsc::channel(1);
    let watcher = cluster.clone();
    let run = tokio::spawn(daemon.run(tokio::time::sleep(Duration::from_millis(1500)), restart_rx));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let node = watcher.node("dgx-1").unwrap();
    for (k, v) in &node.annotations {
        let short: String = v.chars().take(110).collect();
        tracing::info!(target: "session", "annotation {k} = {short}...");
    }
    tracing::info!(target: "session", capacity = ?node.capacity, "node status");
    run.await.unwrap().unwrap();
    let node = watcher.node("dgx-1").unwrap();
    tracing::info!(target: "session", annotations = ?node.annotations.keys().collect::<Vec<_>>(), "after shutdown");
}
