//! The node configuration file reloaded while `Daemon::run` serves (`--node-config-path`, the chart's
//! per-NodeGroup ConfigMap): the file lives in a ConfigMap-volume layout (`node.yaml -> ..data/node.yaml`,
//! `..data -> ..<timestamp>`) and is changed the way the kubelet changes it, by an atomic swap of `..data`.
//! A test kubelet (our own `Registration` server) takes the registrations; a client holds one
//! `ListAndWatch` stream on the real unix socket.
//!
//! - a new split count: the SAME stream sends the new device list (2 GPUs × 2 → 2 × 5), the plugin is not
//!   registered again, the node's `node-config-info` / `node-device-register` annotations follow;
//! - an invalid version: nothing is sent, the running settings stay, the next valid version applies;
//! - a memory scaling change (read by `Allocate`): the plugin is served and registered again in the same
//!   process, and a new stream sends the list;
//! - a `migStrategy` change: deferred to the next start, nothing is resent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{path::Path, sync::Arc, time::Duration};

use tokio::{net::UnixListener, sync::mpsc, task::JoinHandle};
use tokio_stream::{StreamExt, wrappers::UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use vgpu_core::{
    backend::{DeviceBackend, mock::MockBackend},
    node_config::NodeSettings,
};
use vgpu_deviceplugin::{
    cluster::InMemoryCluster, config::PluginConfig, daemon::Daemon, error::ServerError,
    node_config_watch::NodeConfigSource,
};
use vgpu_kubelet::{
    api::v1beta1::{
        Empty, ListAndWatchResponse, RegisterRequest,
        device_plugin_client::DevicePluginClient,
        registration_server::{Registration, RegistrationServer},
    },
    socket::connect_unix,
};

const WAIT: Duration = Duration::from_secs(10);
const MOCK: &str = "\
gpus:
  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192 }
  - { uuid: GPU-b, name: NVIDIA L4, memoryMiB: 8192 }
";

struct TestKubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for TestKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

fn start_kubelet(socket: &Path) -> mpsc::UnboundedReceiver<RegisterRequest> {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener = UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(TestKubelet(tx)))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    rx
}

/// A ConfigMap volume holding `node.yaml`, written as the kubelet's atomic writer does.
struct ConfigMapVolume {
    dir: std::path::PathBuf,
    version: u32,
}

impl ConfigMapVolume {
    fn create(dir: &Path, content: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut volume = Self { dir: dir.to_path_buf(), version: 0 };
        volume.update(content);
        std::os::unix::fs::symlink("..data/node.yaml", dir.join("node.yaml")).unwrap();
        volume
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.join("node.yaml")
    }

    /// A new timestamped folder, `..data_tmp` pointing at it renamed over `..data`, the old folder removed.
    fn update(&mut self, content: &str) {
        let old = format!("..2026_12_06_{:02}", self.version);
        self.version += 1;
        let new = format!("..2026_12_06_{:02}", self.version);
        std::fs::create_dir(self.dir.join(&new)).unwrap();
        std::fs::write(self.dir.join(&new).join("node.yaml"), content).unwrap();
        std::os::unix::fs::symlink(&new, self.dir.join("..data_tmp")).unwrap();
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
        let _ = std::fs::remove_dir_all(self.dir.join(old));
    }
}

fn node_yaml(split: i64, memory_scaling: f64, mig: &str) -> String {
    format!(
        "version: v1\nconfigs:\n  - nodeName: node-.*\n    deviceSplitCount: {split}\n    \
         deviceMemoryScaling: {memory_scaling}\n    migStrategy: {mig}\n"
    )
}

struct Running {
    dir: tempfile::TempDir,
    cluster: Arc<InMemoryCluster>,
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    volume: ConfigMapVolume,
    stop: tokio_util::sync::CancellationToken,
    task: JoinHandle<Result<(), ServerError>>,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let registrations = start_kubelet(&plugins.join("kubelet.sock"));
    let volume = ConfigMapVolume::create(&dir.path().join("config"), &node_yaml(2, 1.0, "none"));

    let flags = NodeSettings::default();
    let source =
        NodeConfigSource::new(volume.path(), "node-1", flags).with_interval(Duration::from_millis(50));
    let loaded = source.load().unwrap();
    assert_eq!(loaded.device_split_count, 2);

    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster = Arc::new(InMemoryCluster::default());
    cluster.upsert_node("node-1", Default::default());
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = plugins;
    config.manager_dir = dir.path().join("manager");
    config.watch_interval = Duration::from_millis(20);
    config.dial_timeout = Duration::from_secs(2);
    config.settings = loaded.clone();
    let daemon = Daemon::new(config, backend, cluster.clone(), cluster.clone())
        .unwrap()
        .with_node_config(source, loaded);
    let (stop, task) = support::spawn_daemon(daemon);
    Running { dir, cluster, registrations, volume, stop, task }
}

impl Running {
    async fn registration(&mut self) -> RegisterRequest {
        tokio::time::timeout(WAIT, self.registrations.recv()).await.expect("no registration in time").unwrap()
    }

    async fn list_and_watch(&self) -> Streaming<ListAndWatchResponse> {
        let socket = self.dir.path().join("device-plugins/nvidia-vgpu.sock");
        let mut client = DevicePluginClient::new(connect_unix(&socket, WAIT).await.unwrap());
        client.list_and_watch(Empty {}).await.unwrap().into_inner()
    }

    /// The node's `node-config-info` once it holds `"deviceSplit":<split>`.
    async fn published_split(&self, split: u32) -> String {
        let want = format!("\"deviceSplit\":{split},");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let info = self
                .cluster
                .node("node-1")
                .and_then(|n| n.annotations.get("nvidia.com/node-config-info").cloned())
                .unwrap_or_default();
            if info.contains(&want) {
                return info;
            }
            assert!(tokio::time::Instant::now() < deadline, "node-config-info {info:?} never had {want}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.task).await.unwrap().unwrap().unwrap();
    }
}

async fn next_list(stream: &mut Streaming<ListAndWatchResponse>) -> Vec<String> {
    let resp = tokio::time::timeout(WAIT, stream.next()).await.expect("no ListAndWatch response in time");
    let mut ids: Vec<String> = resp.unwrap().unwrap().devices.into_iter().map(|d| d.id).collect();
    ids.sort();
    ids
}

async fn nothing_sent(stream: &mut Streaming<ListAndWatchResponse>, for_: Duration) {
    if let Ok(got) = tokio::time::timeout(for_, stream.next()).await {
        panic!("ListAndWatch sent {got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_split_count_is_sent_on_the_open_stream_without_a_restart() {
    let mut run = start().await;
    let first = run.registration().await;
    assert_eq!(first.resource_name, "nvidia.com/vgpu-number");
    let mut stream = run.list_and_watch().await;
    let ids = next_list(&mut stream).await;
    assert_eq!(ids, ["GPU-a::0", "GPU-a::1", "GPU-b::0", "GPU-b::1"]);
    run.published_split(2).await;

    // Split 2 → 5 by a `..data` swap: the same stream sends 10 devices; no new registration.
    run.volume.update(&node_yaml(5, 1.0, "none"));
    let ids = next_list(&mut stream).await;
    assert_eq!(ids.len(), 10, "{ids:?}");
    assert!(ids.contains(&"GPU-b::4".to_owned()), "{ids:?}");
    let info = run.published_split(5).await;
    assert!(info.contains("\"memoryScaling\":1"), "{info}");
    let register = run.cluster.node("node-1").unwrap().annotations["nvidia.com/node-device-register"].clone();
    assert!(register.contains("\"number\":5,"), "the device register carries the new split: {register}");
    assert!(run.registrations.try_recv().is_err(), "registered again for a split change");

    // An invalid version (a negative split) changes nothing; the next valid one applies.
    run.volume.update(&node_yaml(-1, 1.0, "none"));
    nothing_sent(&mut stream, Duration::from_millis(400)).await;
    run.volume.update("version: v1\nconfigs: [ {nodeName: node-1, deviceSplitCount: 3} ]\n");
    let ids = next_list(&mut stream).await;
    assert_eq!(ids.len(), 6, "{ids:?}");
    run.published_split(3).await;

    // A restart-only setting (migStrategy) alone: deferred, nothing resent.
    run.volume
        .update("version: v1\nconfigs: [ {nodeName: node-1, deviceSplitCount: 3, migStrategy: single} ]\n");
    nothing_sent(&mut stream, Duration::from_millis(400)).await;

    // Memory scaling (read by Allocate): the list is resent, then the plugin is served and registered
    // again in this process; a new stream on the new socket sends the current list.
    run.volume.update(&node_yaml(3, 2.0, "single"));
    let again = run.registration().await;
    assert_eq!(again.resource_name, "nvidia.com/vgpu-number");
    let info = run.published_split(3).await;
    assert!(info.contains("\"memoryScaling\":2"), "{info}");
    let mut stream = run.list_and_watch().await;
    assert_eq!(next_list(&mut stream).await.len(), 6);
    assert!(!run.task.is_finished(), "the daemon keeps running");
    run.stop().await;
}
