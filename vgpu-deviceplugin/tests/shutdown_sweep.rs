//! The per-container directories of gone pods (`<manager-dir>/<podUID>_<container>`) through the whole
//! daemon: `Daemon::run` sweeps them every `gone_pod_sweep_interval` once they are older than
//! `gone_pod_grace`, and once more at shutdown whatever their age, so that the files of a deleted pod go
//! within seconds and a plugin removed from the node leaves no pod's files behind. Directories of pods still
//! on the node, and the manager directory's own folders, stay.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_deviceplugin::{
    cluster::{InMemoryCluster, PodInfo},
    config::PluginConfig,
    daemon::Daemon,
};

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

/// `<manager>/<name>/config/vgpu.config`, the directory's modification time `age` ago.
fn container_dir(manager: &Path, name: &str, age: Duration) {
    let dir = manager.join(name);
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(dir.join("config/vgpu.config"), b"x").unwrap();
    let handle = std::fs::File::open(&dir).unwrap();
    handle.set_modified(SystemTime::now() - age).unwrap();
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
    container_dir(&manager, "uid-live_main", old);
    container_dir(&manager, "uid-gone_main", Duration::ZERO);
    container_dir(&manager, "uid-never_main", old);
    for own in ["registry", "watcher"] {
        std::fs::create_dir_all(manager.join(own)).unwrap();
    }
    std::fs::write(manager.join("ld.so.preload"), b"/x\n").unwrap();

    let cluster = Arc::new(InMemoryCluster::new(vec![pod("uid-live", "live"), pod("uid-gone", "gone")]));
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.path().join("kubelet");
    std::fs::create_dir_all(&config.device_plugin_path).unwrap();
    config.manager_dir.clone_from(&manager);
    assert_eq!(
        (config.gone_pod_sweep_interval, config.gone_pod_grace),
        (Duration::from_secs(15), Duration::from_secs(5))
    );
    config.gone_pod_sweep_interval = Duration::from_millis(20);
    config.gone_pod_grace = Duration::from_secs(120);
    let daemon = Daemon::new(config, backend, cluster.clone(), cluster.clone()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (restart_tx, restart) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn(async move {
        let _keep = restart_tx;
        daemon
            .run(
                async {
                    let _ = stopped.await;
                },
                restart,
            )
            .await
    });

    // The periodic sweep: an old directory of a pod the node does not have goes.
    wait_for("the old directory of an unknown pod swept", || !manager.join("uid-never_main").exists()).await;
    // A pod deleted now: its directory is younger than the grace, so the periodic sweeps keep it.
    assert!(cluster.remove("ns", "gone"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(manager.join("uid-gone_main/config/vgpu.config").is_file(), "swept before the grace");
    assert!(manager.join("uid-live_main").is_dir());

    // Shutdown: every gone pod's directory goes, whatever its age; the rest stays.
    stop.send(()).unwrap();
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
    container_dir(&manager, "uid-live_a", Duration::from_secs(600));
    container_dir(&manager, "uid-live_b", Duration::ZERO);
    let cluster = Arc::new(InMemoryCluster::new(vec![pod("uid-live", "live")]));
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.path().join("kubelet");
    std::fs::create_dir_all(&config.device_plugin_path).unwrap();
    config.manager_dir.clone_from(&manager);
    config.gone_pod_sweep_interval = Duration::from_millis(10);
    config.gone_pod_grace = Duration::ZERO;
    let daemon = Daemon::new(config, backend, cluster.clone(), cluster).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (restart_tx, restart) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn(async move {
        let _keep = restart_tx;
        daemon
            .run(
                async {
                    let _ = stopped.await;
                },
                restart,
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    assert!(manager.join("uid-live_a/config/vgpu.config").is_file());
    assert!(manager.join("uid-live_b/config/vgpu.config").is_file());
}
