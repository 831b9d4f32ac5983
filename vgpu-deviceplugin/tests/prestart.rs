//! `PreStartContainer` over real unix sockets: the container is found through the kubelet checkpoint file
//! (which names the pod's UID: no pod LIST before the answer) or, when it has no entry, a fake kubelet
//! pod-resources server (`v1.PodResourcesLister/List`); the IDs are
//! checked against `devices.json`; a missing `vgpu.config` is rebuilt; the library's runtime files and the
//! directories of vanished pods are removed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use support::FakePodResources;
use tonic::Status;
use vgpu_core::{
    abi::{devices_json, vgpu_config},
    backend::{DeviceBackend, mock::MockBackend},
};
use vgpu_deviceplugin::{
    cluster::{ContainerInfo, InMemoryCluster, PodInfo},
    config::PluginConfig,
    inventory::{DeviceState, node_devices},
    plugin::PluginHandler,
    server::{RunningServer, serve},
    vnumber::VgpuNumberPlugin,
};
use vgpu_kubelet::{
    api::{
        podresources::{ContainerDevices, ContainerResources, PodResources},
        v1beta1::{
            AllocateRequest, ContainerAllocateRequest, PreStartContainerRequest,
            device_plugin_client::DevicePluginClient,
        },
    },
    socket::connect_unix,
};

const WAIT: Duration = Duration::from_secs(5);
const RESOURCE: &str = "nvidia.com/vgpu-number";
const MOCK: &str = "\
gpus:
  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192 }
  - { uuid: GPU-b, name: NVIDIA L4, memoryMiB: 8192 }
";

fn container(name: &str, ids: &[&str]) -> ContainerResources {
    ContainerResources {
        name: name.into(),
        devices: vec![ContainerDevices {
            resource_name: RESOURCE.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            topology: None,
        }],
        ..Default::default()
    }
}

// === fixture ===

struct Fixture {
    dir: tempfile::TempDir,
    manager: PathBuf,
    fake: Arc<FakePodResources>,
    cluster: Arc<InMemoryCluster>,
    server: Option<RunningServer>,
    client: DevicePluginClient<tonic::transport::Channel>,
}

fn pod() -> PodInfo {
    let labels = BTreeMap::from([("nvidia.com/assigned-phase".to_owned(), "allocating".to_owned())]);
    let annotations = BTreeMap::from([
        ("nvidia.com/pre-allocated".to_owned(), "main[0_GPU-a_30_1024];side[1_GPU-b_100_8192]".to_owned()),
        ("nvidia.com/predicate-node".to_owned(), "node-1".to_owned()),
        ("nvidia.com/predicate-time".to_owned(), "100".to_owned()),
    ]);
    PodInfo {
        namespace: "ns".into(),
        name: "p1".into(),
        uid: "uid-p1".into(),
        node_name: "node-1".into(),
        phase: "Pending".into(),
        deleting: false,
        labels,
        annotations,
        containers: vec![
            ContainerInfo { name: "main".into(), env: BTreeMap::new() },
            ContainerInfo { name: "side".into(), env: BTreeMap::new() },
        ],
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let manager = dir.path().join("manager");
    std::fs::create_dir_all(&manager).unwrap();
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.path().to_path_buf();
    config.manager_dir = manager.clone();
    vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
    config.pod_resources_socket = dir.path().join("pod-resources.sock");
    config.pod_resources_timeout = Duration::from_secs(2);
    config.stale_dir_grace = Duration::ZERO;
    config.gates =
        vgpu_deviceplugin::feature_gates().configure(["AllocationFailureReschedule=true"]).unwrap();
    config.driver_version = "570.86.10".into();
    let backend = MockBackend::from_yaml_str(MOCK).unwrap();
    let state =
        DeviceState::new(node_devices(&backend.devices().unwrap(), &config.settings), &config.settings);
    let cluster = Arc::new(InMemoryCluster::new(vec![pod()]));
    let fake = Arc::new(FakePodResources::default());
    fake.serve(&config.pod_resources_socket);
    let plugin: Arc<dyn PluginHandler> =
        Arc::new(VgpuNumberPlugin::new(Arc::new(config), state.clone(), Some(cluster.clone())));
    let socket = dir.path().join("nvidia-vgpu.sock");
    let server = serve(plugin, socket.clone(), state.subscribe()).unwrap();
    let client = DevicePluginClient::new(connect_unix(&socket, WAIT).await.unwrap());
    Fixture { dir, manager, fake, cluster, server: Some(server), client }
}

impl Fixture {
    async fn allocate(&mut self) {
        let req = |ids: &[&str]| ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        };
        self.client
            .allocate(AllocateRequest { container_requests: vec![req(&["GPU-a::0"]), req(&["GPU-b::3"])] })
            .await
            .unwrap();
    }

    async fn pre_start(&mut self, ids: &[&str]) -> Result<(), Status> {
        let devices_ids = ids.iter().map(|s| (*s).to_owned()).collect();
        self.client.pre_start_container(PreStartContainerRequest { devices_ids }).await.map(|_| ())
    }

    fn ctr(&self, name: &str) -> PathBuf {
        self.manager.join(format!("uid-p1_{name}"))
    }

    async fn stop(mut self) {
        self.server.take().unwrap().stop().await.unwrap();
    }
}

fn runtime_files(dir: &Path) -> [PathBuf; 3] {
    [
        dir.join("config/pids.config"),
        dir.join("vmem_node/vmem_node.config"),
        dir.join("sm_node/sm_node.config"),
    ]
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_resources_locates_the_container_and_prestart_cleans_up() {
    let mut f = fixture().await;
    f.allocate().await;
    assert_eq!(f.cluster.pod("ns", "p1").unwrap().labels["nvidia.com/assigned-phase"], "succeed");
    *f.fake.pods.lock().unwrap() = vec![
        PodResources {
            name: "other".into(),
            namespace: "ns".into(),
            containers: vec![container("main", &["GPU-a::7"])],
            ..Default::default()
        },
        PodResources {
            name: "p1".into(),
            namespace: "ns".into(),
            containers: vec![container("main", &["GPU-a::0"]), container("side", &["GPU-b::3"])],
            ..Default::default()
        },
    ];
    for ctr in ["main", "side"] {
        for file in runtime_files(&f.ctr(ctr)) {
            std::fs::write(file, b"left over").unwrap();
        }
    }
    // A vanished pod's directory, a reserved directory and a stray file.
    let gone = f.manager.join("uid-gone_main");
    std::fs::create_dir_all(gone.join("config")).unwrap();
    std::fs::create_dir_all(f.manager.join("watcher")).unwrap();
    std::fs::write(f.manager.join("notes_txt"), b"x").unwrap();

    f.pre_start(&["GPU-b::3"]).await.unwrap();
    for file in runtime_files(&f.ctr("side")) {
        assert!(!file.exists(), "{} should be removed", file.display());
    }
    for file in runtime_files(&f.ctr("main")) {
        assert!(file.exists(), "{} belongs to another container", file.display());
    }
    // The vanished pod's directory is removed after the answer (the pod LIST is off the kubelet's path).
    let deadline = std::time::Instant::now() + WAIT;
    while gone.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!gone.exists(), "the vanished pod's directory is removed");
    assert!(f.manager.join("watcher").exists() && f.manager.join("notes_txt").exists());
    assert!(f.ctr("main").exists());

    // What Allocate recorded differs from what the kubelet starts the container with.
    devices_json::write(&f.ctr("main").join("devices.json"), &["GPU-a::1".to_owned()]).unwrap();
    let err = f.pre_start(&["GPU-a::0"]).await.unwrap_err();
    assert!(
        err.message().starts_with(
            "PreStartContainer check failed: inconsistent allocation results of container equipment"
        ),
        "{}",
        err.message()
    );
    devices_json::write(&f.ctr("main").join("devices.json"), &["GPU-a::0".to_owned()]).unwrap();

    // A missing vgpu.config is rebuilt from the pod's real-allocated claim.
    let config = f.ctr("main").join("config/vgpu.config");
    std::fs::remove_file(&config).unwrap();
    f.pre_start(&["GPU-a::0"]).await.unwrap();
    assert_eq!(std::fs::metadata(&config).unwrap().len(), 8192);
    let rebuilt = vgpu_config::read(&config).unwrap();
    assert_eq!((rebuilt.pod_name.as_str(), rebuilt.container_name.as_str()), ("p1", "main"));
    assert_eq!(rebuilt.devices[0].uuid, "GPU-a");
    assert_eq!(rebuilt.devices[0].total_memory, 1024 << 20);
    assert_eq!(rebuilt.devices[0].hard_core, 30);

    // A truncated vgpu.config fails the size check (gate AllocationFailureReschedule).
    std::fs::write(&config, [0u8; 100]).unwrap();
    let err = f.pre_start(&["GPU-a::0"]).await.unwrap_err();
    assert!(err.message().contains("size 100 is not 8192"), "{}", err.message());

    // IDs nobody holds.
    let err = f.pre_start(&["GPU-a::5"]).await.unwrap_err();
    assert!(err.message().contains("no container was allocated devices"), "{}", err.message());
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_file_names_the_pod_first() {
    let mut f = fixture().await;
    f.allocate().await;
    *f.fake.down.lock().unwrap() = true;
    let checkpoint = f.dir.path().join("kubelet_internal_checkpoint");

    // No checkpoint either: both sources are named.
    let err = f.pre_start(&["GPU-a::0"]).await.unwrap_err();
    let msg = err.message();
    assert!(msg.contains("pod-resources List") && msg.contains("kubelet is restarting"), "{msg}");
    assert!(msg.contains("kubelet_internal_checkpoint: read kubelet checkpoint"), "{msg}");

    // Newer kubelets: DeviceIDs by NUMA node; the checksum is not checked.
    std::fs::write(
        &checkpoint,
        r#"{"Data":{"PodDeviceEntries":[
            {"PodUID":"uid-p1","ContainerName":"main","ResourceName":"nvidia.com/vgpu-number","DeviceIDs":{"-1":["GPU-a::0"]},"AllocResp":""},
            {"PodUID":"uid-p1","ContainerName":"side","ResourceName":"nvidia.com/vgpu-number","DeviceIDs":{"0":["GPU-b::3"]},"AllocResp":""}
        ],"RegisteredDevices":{}},"Checksum":42}"#,
    )
    .unwrap();
    std::fs::write(f.ctr("main").join("sm_node/sm_node.config"), b"x").unwrap();
    f.pre_start(&["GPU-a::0"]).await.unwrap();
    assert!(!f.ctr("main").join("sm_node/sm_node.config").exists());

    // Older kubelets: a plain list.
    std::fs::write(
        &checkpoint,
        r#"{"Data":{"PodDeviceEntries":[{"PodUID":"uid-p1","ContainerName":"side","ResourceName":"nvidia.com/vgpu-number","DeviceIDs":["GPU-b::3"]}]}}"#,
    )
    .unwrap();
    f.pre_start(&["GPU-b::3"]).await.unwrap();

    // A corrupt checkpoint is named.
    std::fs::write(&checkpoint, b"{not json").unwrap();
    let err = f.pre_start(&["GPU-b::3"]).await.unwrap_err();
    assert!(err.message().contains("not a kubelet device-manager checkpoint"), "{}", err.message());
    f.stop().await;
}
