//! The per-container directories of gone pods (`<manager-dir>/<podUID>_<container>`) through the whole
//! daemon: `Daemon::run` sweeps them every `gone_pod_sweep_interval` once they are older than
//! `gone_pod_grace`, and once more at shutdown whatever their age, so that the files of a deleted pod go
//! within seconds and a plugin removed from the node leaves no pod's files behind. Directories of pods still
//! on the node, and the manager directory's own folders, stay. When the API server refuses the pod list (at
//! an uninstall the plugin's RBAC goes while its pod stops) the kubelet's pod-resources API decides, by the
//! pod name `vgpu.config` records; with neither, nothing is removed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use support::FakePodResources;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vgpu_core::{
    abi::vgpu_config::{self, VgpuConfig},
    backend::{DeviceBackend, mock::MockBackend},
};
use vgpu_deviceplugin::{
    cluster::{InMemoryCluster, PodInfo},
    config::PluginConfig,
    daemon::Daemon,
    error::ServerError,
};
use vgpu_kubelet::api::podresources::PodResources;

const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 8192 }\n";

fn pod(uid: &str, name: &str) -> PodInfo {
    PodInfo {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
        node_name: "node-1".into(),
        phase: "Running".into(),
        deleting: false,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        containers: Vec::new(),
    }
}

/// `<manager>/<uid>_<container>/config/vgpu.config` of pod `ns/<pod>`, the directory's modification time
/// `age` ago.
fn container_dir(manager: &Path, dir_name: &str, pod: &str, age: Duration) {
    let dir = manager.join(dir_name);
    std::fs::create_dir_all(dir.join("config")).unwrap();
    let config = VgpuConfig { pod_namespace: "ns".into(), pod_name: pod.into(), ..VgpuConfig::default() };
    vgpu_config::write(&dir.join("config").join(vgpu_config::FILE_NAME), &config).unwrap();
    let handle = std::fs::File::open(&dir).unwrap();
    handle.set_modified(SystemTime::now() - age).unwrap();
}

/// The plugin's configuration on `node-1` with every path under `dir` and the manager directory `manager`.
fn plugin_config(dir: &Path, manager: &Path) -> PluginConfig {
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.join("kubelet");
    std::fs::create_dir_all(&config.device_plugin_path).unwrap();
    config.pod_resources_socket = dir.join("pod-resources.sock");
    config.pod_resources_timeout = Duration::from_secs(2);
    config.manager_dir = manager.to_path_buf();
    config
}

/// Runs a daemon over `cluster` (pods and nodes) until the returned sender fires.
fn run_daemon(
    config: PluginConfig,
    cluster: &Arc<InMemoryCluster>,
) -> (CancellationToken, JoinHandle<Result<(), ServerError>>) {
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let daemon = Daemon::new(config, backend, cluster.clone(), cluster.clone()).unwrap();
    support::spawn_daemon(daemon)
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not after 20 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn gone_pods_files_are_swept_periodically_after_the_grace_and_all_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let manager = dir.path().join("manager");
    let old = Duration::from_secs(600);
    container_dir(&manager, "uid-live_main", "live", old);
    container_dir(&manager, "uid-gone_main", "gone", Duration::ZERO);
    container_dir(&manager, "uid-never_main", "never", old);
    for own in ["registry", "watcher"] {
        std::fs::create_dir_all(manager.join(own)).unwrap();
    }
    std::fs::write(manager.join("ld.so.preload"), b"/x\n").unwrap();

    let cluster = Arc::new(InMemoryCluster::new(vec![pod("uid-live", "live"), pod("uid-gone", "gone")]));
    let mut config = plugin_config(dir.path(), &manager);
    assert_eq!(
        (config.gone_pod_sweep_interval, config.gone_pod_grace),
        (Duration::from_secs(15), Duration::from_secs(5))
    );
    config.gone_pod_sweep_interval = Duration::from_millis(20);
    config.gone_pod_grace = Duration::from_secs(120);
    let (stop, task) = run_daemon(config, &cluster);

    // The periodic sweep: an old directory of a pod the node does not have goes.
    wait_for("the old directory of an unknown pod swept", || !manager.join("uid-never_main").exists()).await;
    // A pod deleted now: its directory is younger than the grace, so the periodic sweeps keep it.
    assert!(cluster.remove("ns", "gone"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(manager.join("uid-gone_main/config/vgpu.config").is_file(), "swept before the grace");
    assert!(manager.join("uid-live_main").is_dir());

    // Shutdown: every gone pod's directory goes, whatever its age; the rest stays.
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(!manager.join("uid-gone_main").exists(), "the gone pod's files outlived the plugin");
    assert!(manager.join("uid-live_main/config/vgpu.config").is_file(), "a live pod's files were removed");
    for own in ["registry", "watcher", "ld.so.preload"] {
        assert!(manager.join(own).exists(), "{own} was removed");
    }
}

#[tokio::test]
async fn no_sweep_removes_a_live_pods_files() {
    let dir = tempfile::tempdir().unwrap();
    let manager = dir.path().join("manager");
    container_dir(&manager, "uid-live_a", "live", Duration::from_secs(600));
    container_dir(&manager, "uid-live_b", "live", Duration::ZERO);
    let cluster = Arc::new(InMemoryCluster::new(vec![pod("uid-live", "live")]));
    let mut config = plugin_config(dir.path(), &manager);
    config.gone_pod_sweep_interval = Duration::from_millis(10);
    config.gone_pod_grace = Duration::ZERO;
    let (stop, task) = run_daemon(config, &cluster);
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(manager.join("uid-live_a/config/vgpu.config").is_file());
    assert!(manager.join("uid-live_b/config/vgpu.config").is_file());
}

/// At an uninstall the plugin's ServiceAccount and RBAC are deleted while its pod stops: the API server
/// refuses the pod list, and the kubelet's pod-resources API (which needs no credentials) names the pods
/// still on the node. With neither answering, nothing goes.
#[tokio::test]
async fn without_the_api_server_the_kubelets_pod_resources_decide() {
    let dir = tempfile::tempdir().unwrap();
    let manager = dir.path().join("manager");
    let young = Duration::ZERO;
    container_dir(&manager, "uid-live_main", "live", young);
    container_dir(&manager, "uid-gone_main", "gone", young);
    container_dir(&manager, "uid-kept_main", "kept", young);
    std::fs::create_dir_all(manager.join("uid-unknown_main")).unwrap(); // no vgpu.config: no name to judge by
    let cluster = Arc::new(InMemoryCluster::new(vec![pod("uid-live", "live"), pod("uid-kept", "kept")]));
    let config = plugin_config(dir.path(), &manager);
    let fake = Arc::new(FakePodResources::default());
    *fake.pods.lock().unwrap() = ["live", "kept"]
        .iter()
        .map(|name| PodResources { name: (*name).into(), namespace: "ns".into(), ..Default::default() })
        .collect();
    fake.serve(&config.pod_resources_socket);

    // Neither the API server nor the kubelet answers: the shutdown sweep removes nothing.
    *fake.down.lock().unwrap() = true;
    cluster.refuse_pod_lists(true);
    let (stop, task) = run_daemon(config.clone(), &cluster);
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    for kept in ["uid-live_main", "uid-gone_main", "uid-kept_main", "uid-unknown_main"] {
        assert!(manager.join(kept).is_dir(), "{kept} removed on a guess");
    }

    // The kubelet answers (the API server still refuses): the deleted pod's files go, those of pods the
    // kubelet still runs and those without a recorded name stay.
    *fake.down.lock().unwrap() = false;
    let (stop, task) = run_daemon(config, &cluster);
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(!manager.join("uid-gone_main").exists(), "the gone pod's files outlived the plugin");
    for kept in ["uid-live_main", "uid-kept_main", "uid-unknown_main"] {
        assert!(manager.join(kept).is_dir(), "{kept} removed");
    }
}
