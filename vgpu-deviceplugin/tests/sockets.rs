//! The device plugins over real unix sockets: a test kubelet (our own `Registration` server) receives the
//! registrations, a client calls every RPC, a kubelet restart (re-created `kubelet.sock`) re-registers, and
//! a mock-backend health event reaches the `ListAndWatch` stream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use tokio::{net::UnixListener, sync::mpsc, task::JoinHandle};
use tokio_stream::{StreamExt, wrappers::UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use vgpu_core::{
    abi::{devices_json, vgpu_config},
    backend::{DeviceBackend, HealthEvent, HealthEventKind, mock::MockBackend},
};
use vgpu_deviceplugin::{
    build_handlers,
    cluster::{ContainerInfo, InMemoryCluster, PodInfo},
    config::PluginConfig,
    inventory::{DeviceState, node_devices},
    manager::PluginManager,
};
use vgpu_kubelet::{
    api::v1beta1::{
        AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
        PreStartContainerRequest, PreferredAllocationRequest, RegisterRequest,
        device_plugin_client::DevicePluginClient,
        registration_server::{Registration, RegistrationServer},
    },
    socket::connect_unix,
};

const WAIT: Duration = Duration::from_secs(5);
const MOCK: &str = "\
gpus:
  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192, numaNode: 0 }
  - { uuid: GPU-b, name: NVIDIA L4, memoryMiB: 8192, numaNode: 1 }
";

// === test kubelet ===

struct TestKubelet {
    tx: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for TestKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.tx.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

struct Kubelet {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

fn start_kubelet(socket: &Path, tx: mpsc::UnboundedSender<RegisterRequest>) -> Kubelet {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).unwrap();
    let stop = CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(TestKubelet { tx }))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped)
            .await
            .unwrap();
    });
    Kubelet { stop, task }
}

impl Kubelet {
    async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

async fn next_registration(rx: &mut mpsc::UnboundedReceiver<RegisterRequest>) -> RegisterRequest {
    tokio::time::timeout(WAIT, rx.recv()).await.expect("no registration in time").unwrap()
}

// === fixture ===

struct Node {
    dir: tempfile::TempDir,
    backend: Arc<MockBackend>,
    cluster: Arc<InMemoryCluster>,
    registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    register_tx: mpsc::UnboundedSender<RegisterRequest>,
    kubelet: Option<Kubelet>,
    stop: CancellationToken,
    manager: Option<JoinHandle<Result<(), vgpu_deviceplugin::error::ServerError>>>,
}

fn pod(name: &str, predicate_time: &str, pre_allocated: &str) -> PodInfo {
    let mut labels = BTreeMap::new();
    labels.insert("nvidia.com/assigned-phase".to_owned(), "allocating".to_owned());
    let mut annotations = BTreeMap::new();
    annotations.insert("nvidia.com/pre-allocated".to_owned(), pre_allocated.to_owned());
    annotations.insert("nvidia.com/predicate-node".to_owned(), "node-1".to_owned());
    annotations.insert("nvidia.com/predicate-time".to_owned(), predicate_time.to_owned());
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node_name: "node-1".into(),
        phase: "Pending".into(),
        deleting: false,
        labels,
        annotations,
        containers: vec![ContainerInfo { name: "main".into(), env: BTreeMap::new() }],
    }
}

async fn start_node(gates: &[&str]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let (register_tx, registrations) = mpsc::unbounded_channel();
    let kubelet = start_kubelet(&dir.path().join("kubelet.sock"), register_tx.clone());
    let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.path().to_path_buf();
    config.manager_dir = dir.path().join("manager");
    config.host_manager_dir = "/etc/vgpu-manager".into();
    vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
    config.watch_interval = Duration::from_millis(20);
    config.dial_timeout = Duration::from_secs(2);
    config.settings.device_memory_factor = 1024;
    config.gates = vgpu_deviceplugin::feature_gates().configure(gates.iter().copied()).unwrap();
    config.driver_version = "570.86.10".into();
    // No pod-resources API here: PreStartContainer falls back to the kubelet checkpoint.
    config.pod_resources_socket = dir.path().join("no-pod-resources.sock");
    std::fs::create_dir_all(&config.manager_dir).unwrap();
    let state =
        DeviceState::new(node_devices(&backend.devices().unwrap(), &config.settings), &config.settings);
    tokio::spawn(state.clone().watch_backend(backend.health_events().unwrap()));
    let cluster = Arc::new(InMemoryCluster::default());
    let config = Arc::new(config);
    let handlers = build_handlers(&config, &state, Some(cluster.clone()));
    let stop = CancellationToken::new();
    let manager = PluginManager::new((*config).clone(), state, handlers);
    let manager = tokio::spawn(manager.run(stop.clone().cancelled_owned()));
    Node {
        dir,
        backend,
        cluster,
        registrations,
        register_tx,
        kubelet: Some(kubelet),
        stop,
        manager: Some(manager),
    }
}

impl Node {
    async fn client(&self, socket: &str) -> DevicePluginClient<tonic::transport::Channel> {
        DevicePluginClient::new(connect_unix(&self.dir.path().join(socket), WAIT).await.unwrap())
    }

    async fn shutdown(mut self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.manager.take().unwrap()).await.unwrap().unwrap().unwrap();
        self.kubelet.take().unwrap().shutdown().await;
        assert!(!self.dir.path().join("nvidia-vgpu.sock").exists(), "socket removed on shutdown");
    }
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_every_plugin_and_serves_every_rpc() {
    let mut node = start_node(&[
        "GPUCoreResourcePlugin=true",
        "GPUMemoryResourcePlugin=true",
        "HonorPreAllocatedDeviceIDs=true",
    ])
    .await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = next_registration(&mut node.registrations).await;
        assert_eq!(r.version, "v1beta1");
        seen.push((r.endpoint, r.resource_name, r.options.unwrap()));
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(seen[0].0, "nvidia-vgpu-core.sock");
    assert_eq!(seen[0].1, "nvidia.com/vgpu-cores");
    assert_eq!(seen[1].0, "nvidia-vgpu-memory.sock");
    assert_eq!(seen[1].1, "nvidia.com/vgpu-memory");
    assert_eq!(seen[2].0, "nvidia-vgpu.sock");
    assert_eq!(seen[2].1, "nvidia.com/vgpu-number");
    assert!(seen[2].2.pre_start_required && seen[2].2.get_preferred_allocation_available);
    assert!(!seen[0].2.pre_start_required);

    // vnumber: options, devices, preferred allocation, Allocate, PreStart.
    let mut client = node.client("nvidia-vgpu.sock").await;
    let options = client.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(options.pre_start_required && options.get_preferred_allocation_available);
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 20);
    assert_eq!(first.devices[0].id, "GPU-a::0");
    assert_eq!(first.devices[19].id, "GPU-b::9");
    assert_eq!(first.devices[19].health, "Healthy");
    assert_eq!(first.devices[19].topology.as_ref().unwrap().nodes[0].id, 1);

    node.cluster.upsert(pod("older", "100", "main[1_GPU-b_50_4096]"));
    node.cluster.upsert(pod("newer", "200", "main[0_GPU-a_30_1024]"));
    let available: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds, ["GPU-b::0"]);

    let ids = vec!["GPU-b::0".to_owned()];
    let resp = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: ids.clone() }],
        })
        .await
        .unwrap()
        .into_inner();
    let envs = &resp.container_responses[0].envs;
    assert_eq!(envs["VGPU_POD_NAME"], "older");
    assert_eq!(envs["CUDA_MEM_LIMIT_1"], "4096m");
    assert_eq!(envs["CUDA_CORE_LIMIT_1"], "50");
    assert_eq!(envs["CUDA_CORE_SOFT_LIMIT_1"], "50");
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], "GPU-b");
    assert_eq!(envs["CUDA_MEM_RATIO"], "1.00");
    assert_eq!(envs["MANAGER_COMPATIBILITY_MODE"], "2");
    let visible: Vec<&str> = envs["MANAGER_VISIBLE_DEVICES"].split(',').collect();
    assert_eq!(visible.len(), 16);
    assert_eq!(visible[1], "GPU-b");
    assert_eq!(visible[0], "GPU-00000000-0000-0000-0000-000000000000");
    let mounts = &resp.container_responses[0].mounts;
    let config_mount = mounts.iter().find(|m| m.container_path == "/etc/vgpu-manager/config").unwrap();
    assert_eq!(config_mount.host_path, "/etc/vgpu-manager/uid-older_main/config");
    assert!(mounts.iter().any(|m| m.container_path == "/etc/ld.so.preload"));

    let ctr_dir = node.dir.path().join("manager/uid-older_main");
    assert_eq!(devices_json::read(&ctr_dir.join("devices.json")).unwrap(), ids);
    let written = vgpu_config::read(&ctr_dir.join("config/vgpu.config")).unwrap();
    assert_eq!(written.pod_name, "older");
    assert_eq!(written.driver_version, "570.86.10");
    assert_eq!(written.devices[1].uuid, "GPU-b");
    assert_eq!(written.devices[1].total_memory, 4096 << 20);
    assert_eq!(written.devices[1].activate, 1);
    let patched = node.cluster.pod("default", "older").unwrap();
    assert_eq!(patched.labels["nvidia.com/assigned-phase"], "succeed");
    assert_eq!(patched.labels["nvidia.com/metrics-node"], "node-1");
    assert_eq!(patched.annotations["nvidia.com/real-allocated"], "main[1_GPU-b_50_4096]");
    assert_eq!(patched.annotations["nvidia.com/predicate-time"], "9223372036854775807");

    std::fs::write(
        node.dir.path().join("kubelet_internal_checkpoint"),
        r#"{"Data":{"PodDeviceEntries":[{"PodUID":"uid-older","ContainerName":"main","ResourceName":"nvidia.com/vgpu-number","DeviceIDs":{"1":["GPU-b::0"]}}]},"Checksum":1}"#,
    )
    .unwrap();
    std::fs::write(ctr_dir.join("sm_node/sm_node.config"), b"old").unwrap();
    client.pre_start_container(PreStartContainerRequest { devices_ids: ids }).await.unwrap();
    assert!(!ctr_dir.join("sm_node/sm_node.config").exists());
    let err = client
        .pre_start_container(PreStartContainerRequest { devices_ids: vec!["GPU-a::9".into()] })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("PreStartContainer check failed: "), "{}", err.message());

    // The next pod: a count mismatch fails it.
    let err = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["GPU-a::0".into(), "GPU-a::1".into()],
            }],
        })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("Allocate check failed: requested number of devices does not match"));
    let failed = node.cluster.pod("default", "newer").unwrap();
    assert_eq!(failed.labels["nvidia.com/assigned-phase"], "failed");
    // No pod left in the allocating phase.
    let err = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec!["GPU-a::0".into()] }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.message(), "Allocate check failed: no pod in allocating phase on node node-1");

    // vcore / vmemory: visibility only.
    let mut cores = node.client("nvidia-vgpu-core.sock").await;
    let list = cores.list_and_watch(Empty {}).await.unwrap().into_inner().next().await.unwrap().unwrap();
    assert_eq!(list.devices.len(), 200);
    let resp = cores
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![list.devices[0].id.clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.container_responses.len(), 1);
    assert!(resp.container_responses[0].envs.is_empty());
    let options = cores.get_device_plugin_options(Empty {}).await.unwrap().into_inner();
    assert!(!options.pre_start_required && !options.get_preferred_allocation_available);
    let mut memory = node.client("nvidia-vgpu-memory.sock").await;
    let list = memory.list_and_watch(Empty {}).await.unwrap().into_inner().next().await.unwrap().unwrap();
    assert_eq!(list.devices.len(), 16); // 8192 MiB / 1024 per GPU
    memory.pre_start_container(PreStartContainerRequest::default()).await.unwrap();

    drop(stream);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_re_registers() {
    let mut node = start_node(&[]).await;
    let first = next_registration(&mut node.registrations).await;
    assert_eq!(first.endpoint, "nvidia-vgpu.sock");
    let mut client = node.client("nvidia-vgpu.sock").await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    stream.next().await.unwrap().unwrap();

    // The kubelet restarts: its socket disappears and is created again.
    node.kubelet.take().unwrap().shutdown().await;
    let socket = node.dir.path().join("kubelet.sock");
    let _ = std::fs::remove_file(&socket);
    node.kubelet = Some(start_kubelet(&socket, node.register_tx.clone()));
    let again = next_registration(&mut node.registrations).await;
    assert_eq!((again.endpoint.as_str(), again.version.as_str()), ("nvidia-vgpu.sock", "v1beta1"));
    // The old stream ended with the old server; a new client gets the list again.
    let ended = tokio::time::timeout(WAIT, async { while stream.next().await.is_some() {} }).await;
    assert!(ended.is_ok(), "old ListAndWatch stream should end on restart");
    let mut client = node.client("nvidia-vgpu.sock").await;
    let list = client.list_and_watch(Empty {}).await.unwrap().into_inner().next().await.unwrap().unwrap();
    assert_eq!(list.devices.len(), 20);

    // Our socket removed (as a restarting kubelet does) also re-registers.
    std::fs::remove_file(node.dir.path().join("nvidia-vgpu.sock")).unwrap();
    let again = next_registration(&mut node.registrations).await;
    assert_eq!(again.endpoint, "nvidia-vgpu.sock");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_event_reaches_list_and_watch() {
    let mut node = start_node(&[]).await;
    next_registration(&mut node.registrations).await;
    let mut client = node.client("nvidia-vgpu.sock").await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));

    let event = |kind| HealthEvent { index: 1, uuid: "GPU-b".into(), kind, message: String::new() };
    // An application Xid changes nothing; a hardware one does.
    assert_eq!(node.backend.inject_health_event(event(HealthEventKind::Xid { code: 13 })), 1);
    assert_eq!(node.backend.inject_health_event(event(HealthEventKind::Xid { code: 79 })), 1);
    let update = tokio::time::timeout(WAIT, stream.next()).await.unwrap().unwrap().unwrap();
    let unhealthy: Vec<&str> =
        update.devices.iter().filter(|d| d.health == "Unhealthy").map(|d| d.id.as_str()).collect();
    assert_eq!(unhealthy.len(), 10);
    assert!(unhealthy.iter().all(|id| id.starts_with("GPU-b::")));

    node.backend.inject_health_event(event(HealthEventKind::Recovered));
    let update = tokio::time::timeout(WAIT, stream.next()).await.unwrap().unwrap().unwrap();
    assert!(update.devices.iter().all(|d| d.health == "Healthy"));
    drop(stream);
    node.shutdown().await;
}
