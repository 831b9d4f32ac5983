//! Shared fixture of the `Allocate` tests (here and in `bins/tests/metax_allocate.rs`): a pod in the
//! allocating phase, and the vnumber plugin of a [`Daemon`] served on a real unix socket with a client;
//! and a fake kubelet pod-resources server ([`FakePodResources`]) on a real unix socket.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::net::UnixListener;
use tonic::{Request, Response, Status, transport::Channel};
use vgpu_deviceplugin::{
    cluster::{ContainerInfo, InMemoryCluster, PodInfo},
    config::PluginConfig,
    daemon::Daemon,
    inventory::{DeviceState, node_devices},
    server::{RunningServer, serve},
    vnumber::VgpuNumberPlugin,
};
use vgpu_kubelet::{
    api::{
        podresources::{
            AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
            GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
            pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
        },
        v1beta1::{
            AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
            device_plugin_client::DevicePluginClient,
        },
    },
    socket::connect_unix,
};

/// The vnumber plugin's configuration on `node-1` with every path under `dir`: sockets in `dir`, the manager
/// directory `dir/manager`, a driver root `dir/driver-root` that has `/dev/nvidiactl`.
pub fn plugin_config(dir: &Path) -> PluginConfig {
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.to_path_buf();
    config.manager_dir = dir.join("manager");
    config.device_root = dir.join("driver-root");
    std::fs::create_dir_all(config.device_root.join("dev")).unwrap();
    std::fs::write(config.device_root.join("dev/nvidiactl"), b"").unwrap();
    config
}

/// Pod `ns/<name>` on `node-1` in the allocating phase with `pre_allocated` (one container per claim,
/// named as in the claim, no env).
pub fn allocating_pod(uid: &str, name: &str, pre_allocated: &str) -> PodInfo {
    let containers = pre_allocated
        .split(';')
        .map(|c| ContainerInfo { name: c.split('[').next().unwrap().to_owned(), env: BTreeMap::new() })
        .collect();
    PodInfo {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
        node_name: "node-1".into(),
        phase: "Pending".into(),
        deleting: false,
        labels: BTreeMap::from([("nvidia.com/assigned-phase".to_owned(), "allocating".to_owned())]),
        annotations: BTreeMap::from([
            ("nvidia.com/pre-allocated".to_owned(), pre_allocated.to_owned()),
            ("nvidia.com/predicate-node".to_owned(), "node-1".to_owned()),
            ("nvidia.com/predicate-time".to_owned(), "100".to_owned()),
        ]),
        containers,
    }
}

/// The vnumber plugin of a daemon, served on `<dir>/nvidia-vgpu.sock`, and a client of it.
pub struct Served {
    /// The configuration the daemon resolved.
    pub config: Arc<PluginConfig>,
    /// The cluster `Allocate` reads and patches.
    pub cluster: Arc<InMemoryCluster>,
    /// A client on the socket.
    pub client: DevicePluginClient<Channel>,
    server: RunningServer,
}

impl Served {
    /// Serves the vnumber plugin of `daemon` (built over `cluster`) in `dir`.
    pub async fn start(daemon: Daemon, cluster: Arc<InMemoryCluster>, dir: &Path) -> Self {
        let config = Arc::new(daemon.config);
        // The vGPU runtime files an install step puts on the host (Allocate refuses containers without them).
        vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
        let gpus = daemon.backend.devices().unwrap();
        let state = DeviceState::new(node_devices(&gpus, &config.settings), &config.settings);
        let plugin =
            Arc::new(VgpuNumberPlugin::new(Arc::clone(&config), state.clone(), Some(cluster.clone())));
        let socket = dir.join("nvidia-vgpu.sock");
        let server = serve(plugin, socket.clone(), state.subscribe()).unwrap();
        let client = DevicePluginClient::new(connect_unix(&socket, Duration::from_secs(5)).await.unwrap());
        Self { config, cluster, client, server }
    }

    /// `Allocate` of one container with these device IDs.
    pub async fn allocate(&mut self, ids: &[&str]) -> ContainerAllocateResponse {
        let devices_ids = ids.iter().map(|s| (*s).to_owned()).collect();
        let request = AllocateRequest { container_requests: vec![ContainerAllocateRequest { devices_ids }] };
        let resp = self.client.allocate(request).await.unwrap().into_inner();
        resp.container_responses.into_iter().next().unwrap()
    }

    /// Stops the server.
    pub async fn stop(self) {
        self.server.stop().await.unwrap();
    }
}

/// [`Served::start`], one `Allocate` of `ids`, stop: the container's answer, after checking the pod `ns/<pod>`
/// ended `assigned-phase=succeed`.
pub async fn allocate_once(
    daemon: Daemon,
    cluster: Arc<InMemoryCluster>,
    dir: &Path,
    pod: &str,
    ids: &[&str],
) -> ContainerAllocateResponse {
    let mut served = Served::start(daemon, cluster, dir).await;
    let resp = served.allocate(ids).await;
    assert_eq!(served.cluster.pod("ns", pod).unwrap().labels["nvidia.com/assigned-phase"], "succeed");
    served.stop().await;
    resp
}

/// A fake kubelet pod-resources server: `List` answers [`Self::pods`], or `UNAVAILABLE` while
/// [`Self::down`]; the other calls are unimplemented.
#[derive(Default)]
pub struct FakePodResources {
    /// The pods `List` answers.
    pub pods: Mutex<Vec<PodResources>>,
    /// `true`: `List` fails as a restarting kubelet's does.
    pub down: Mutex<bool>,
}

impl FakePodResources {
    /// Serves this fake on a new unix socket at `socket` until the runtime ends.
    pub fn serve(self: &Arc<Self>, socket: &Path) {
        let listener = UnixListener::bind(socket).unwrap();
        let fake = FakeServer(Arc::clone(self));
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(fake))
                .serve_with_incoming(vgpu_kubelet::authority::incoming(listener))
                .await
                .unwrap();
        });
    }
}

struct FakeServer(Arc<FakePodResources>);

#[tonic::async_trait]
impl PodResourcesLister for FakeServer {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        if *self.0.down.lock().unwrap() {
            return Err(Status::unavailable("kubelet is restarting"));
        }
        Ok(Response::new(ListPodResourcesResponse { pod_resources: self.0.pods.lock().unwrap().clone() }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }

    async fn get(
        &self,
        _request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

/// Runs `daemon` on a task of its own until the returned token is cancelled (no restart is ever asked
/// for); the task ends with what [`Daemon::run`](vgpu_deviceplugin::daemon::Daemon::run) returns.
pub fn spawn_daemon(
    daemon: vgpu_deviceplugin::daemon::Daemon,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), vgpu_deviceplugin::error::ServerError>>,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let (restart_tx, restart) = tokio::sync::mpsc::channel(1);
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        let _keep = restart_tx;
        daemon.run(stopped, restart).await
    });
    (stop, task)
}
