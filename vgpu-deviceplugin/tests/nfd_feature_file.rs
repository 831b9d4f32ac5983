//! `--gfd-output=nfd-feature-file` through the whole daemon: `Daemon::run` over a mock backend writes the
//! GPU feature labels into node-feature-discovery's feature file (read back with `vgpu_core::nfd::read`,
//! the format `nfd-worker` reads), rewrites it every interval, and leaves them out of the Node patch; the
//! default (`node-labels`) patches them onto the Node and writes no file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{path::Path, sync::Arc, time::Duration};

use vgpu_core::{
    backend::{DeviceBackend, mock::MockBackend},
    nfd,
};
use vgpu_deviceplugin::{
    cluster::InMemoryCluster,
    config::PluginConfig,
    daemon::Daemon,
    feature_file::{FeatureFileConfig, GfdOutput},
};

const MOCK: &str = r#"
driver:
  version: 570.86.10
  cudaVersion: "12.8"
gpus:
  - uuid: GPU-a
    name: NVIDIA L4
    memoryMiB: 23034
    computeCapability: "8.9"
"#;

struct Running {
    cluster: Arc<InMemoryCluster>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), vgpu_deviceplugin::error::ServerError>>,
}

fn start(dir: &Path, output: GfdOutput) -> Running {
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster = Arc::new(InMemoryCluster::default());
    cluster.upsert_node("node-1", Default::default());
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.join("kubelet");
    std::fs::create_dir_all(&config.device_plugin_path).unwrap();
    config.manager_dir = dir.join("manager");
    let mut daemon = Daemon::new(config, backend, cluster.clone(), cluster.clone())
        .unwrap()
        .with_gfd_labels(None)
        .unwrap();
    daemon.gfd_output = output;
    let (stop, task) = support::spawn_daemon(daemon);
    Running { cluster, stop, task }
}

async fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within 20 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn published(cluster: &InMemoryCluster) -> Option<vgpu_deviceplugin::cluster::NodeInfo> {
    cluster.node("node-1").filter(|n| n.annotations.contains_key("nvidia.com/node-device-register"))
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs().try_into().unwrap()
}

#[tokio::test]
async fn nfd_mode_writes_the_feature_file_and_keeps_the_labels_off_the_node_patch() {
    let dir = tempfile::tempdir().unwrap();
    let features_d = dir.path().join("features.d");
    std::fs::create_dir(&features_d).unwrap();
    let path = features_d.join("gfd");
    let output =
        GfdOutput::NfdFeatureFile(FeatureFileConfig { path: path.clone(), interval: Duration::from_secs(1) });
    let run = start(dir.path(), output);

    let parsed = eventually("the feature file", || nfd::read(&path).ok()).await;
    let labels = parsed.labels(now());
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-L4");
    assert_eq!(labels["nvidia.com/gpu.count"], "1");
    assert_eq!(labels["nvidia.com/gpu.family"], "ada-lovelace");
    assert_eq!(labels["nvidia.com/cuda.driver.major"], "570");
    // Each write expires three intervals after it was made.
    let first_expiry = parsed.entries[0].expiry.unwrap();
    assert!((now() + 1..=now() + 4).contains(&first_expiry), "expiry {first_expiry}");

    // The node is still published (annotations, driver labels), without the GFD keys.
    let node = eventually("the node patch", || published(&run.cluster)).await;
    assert!(node.annotations.contains_key("nvidia.com/node-device-register"));
    assert!(
        node.labels.keys().all(|k| !vgpu_core::gfd::is_gfd_key(k)),
        "GFD labels patched onto the node in NFD mode: {:?}",
        node.labels
    );

    // Rewritten every interval: the expiry moves on.
    eventually("a rewrite", || {
        nfd::read(&path).ok().filter(|p| p.entries[0].expiry > Some(first_expiry)).map(|_| ())
    })
    .await;
    // Only the file itself in features.d (the temporary is hidden and renamed over it).
    let names: Vec<_> = std::fs::read_dir(&features_d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["gfd"]);

    run.stop.cancel();
    run.task.await.unwrap().unwrap();
    // Left in place at shutdown (a restart does not make the labels flap; the expiry ends them).
    assert!(path.exists());
}

#[tokio::test]
async fn node_labels_mode_patches_the_node_and_writes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(dir.path(), GfdOutput::NodeLabels);
    let node = eventually("the node patch", || published(&run.cluster)).await;
    assert_eq!(node.labels.get("nvidia.com/gpu.product").map(String::as_str), Some("NVIDIA-L4"));
    run.stop.cancel();
    run.task.await.unwrap().unwrap();
    assert!(!dir.path().join("features.d").exists());
}

#[tokio::test]
async fn a_missing_directory_is_logged_and_retried_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let features_d = dir.path().join("features.d");
    let path = features_d.join("gfd");
    let output =
        GfdOutput::NfdFeatureFile(FeatureFileConfig { path: path.clone(), interval: Duration::from_secs(1) });
    let run = start(dir.path(), output);
    eventually("the node patch", || published(&run.cluster)).await;
    assert!(!path.exists());
    // NFD's directory appears later (e.g. nfd-worker installed after the plugin): the next write lands.
    std::fs::create_dir(&features_d).unwrap();
    let parsed = eventually("the feature file", || nfd::read(&path).ok()).await;
    assert_eq!(parsed.labels(now())["nvidia.com/gpu.count"], "1");
    run.stop.cancel();
    run.task.await.unwrap().unwrap();
}
