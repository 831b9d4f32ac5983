//! node-feature-discovery integration (issue #34 item 1) against the real API server and the real NFD
//! (`nfd-master` and `nfd-worker` v0.17.3 as processes, built by `e2e/build-nfd.sh`; NFD's own CRDs):
//!
//! 1. The device plugin's code path writes the GPU feature file: `Daemon::with_gfd_labels` over a mock backend
//!    (two A100s) computes the labels, `FeatureFileWriter` (`--gfd-output=nfd-feature-file`) writes
//!    `features.d/gfd`.
//! 2. `nfd-worker` (local source, 1 s sleep interval) reads it into the Node's NodeFeature; `nfd-master` puts the
//!    same `nvidia.com/*` labels on the Node.
//! 3. When Helm is built: the chart's NodeFeatureRule `gpu-module-nvidia` (rendered with `nfd.enabled=true` and a
//!    taint) is created; the master (`-enable-taints`) adds its label and taint, matched on our feature file.
//! 4. A rewritten file changes the Node's label; a removed file removes the labels (and the rule's).
//!
//! Skips, saying so, when NFD is not built. Needs the control-plane binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_deviceplugin::{
    cluster::InMemoryCluster,
    config::PluginConfig,
    daemon::Daemon,
    feature_file::{FeatureFileConfig, FeatureFileWriter},
};
use vgpu_e2e::{TestEnv, helm, nfd};

const NODE: &str = "nfd-node";
const NAMESPACE: &str = "node-feature-discovery";
const RULE_LABEL: &str = "gpu.deckhouse.io/nvidia.present";
const TAINT_KEY: &str = "gpu.deckhouse.io/nvidia";

const MOCK: &str = r#"
driver:
  version: 570.86.10
  cudaVersion: "12.8"
gpus:
  - uuid: GPU-a
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    computeCapability: "8.0"
  - uuid: GPU-b
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    computeCapability: "8.0"
"#;

/// The labels the device plugin computes for the mock node (its `--gfd-labels` code path).
fn plugin_labels() -> BTreeMap<String, String> {
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster = Arc::new(InMemoryCluster::new(Vec::new()));
    let daemon = Daemon::new(PluginConfig::new(NODE), backend, cluster.clone(), cluster).unwrap();
    daemon.with_gfd_labels(None).unwrap().gfd
}

/// The chart's NodeFeatureRule, rendered with NFD on and a NoSchedule taint; `None` (said on stderr) without Helm.
fn chart_rule() -> Option<serde_json::Value> {
    let helm_bin = helm::locate_helm().unwrap()?;
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/gpu-module");
    let args: Vec<String> = [
        "--set",
        "nfd.enabled=true",
        "--set",
        &format!("nfd.rules.taints[0].key={TAINT_KEY}"),
        "--set",
        "nfd.rules.taints[0].value=present",
        "--set",
        "nfd.rules.taints[0].effect=NoSchedule",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let objects = helm::template(&helm_bin, &chart, "r", "d8-gpu", &args).unwrap();
    objects.into_iter().find(|o| o["kind"] == "NodeFeatureRule")
}

async fn node_labels(nodes: &Api<Node>) -> Option<BTreeMap<String, String>> {
    nodes.get(NODE).await.ok()?.metadata.labels
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries and node-feature-discovery: run e2e/run.sh"]
async fn nfd_puts_the_gfd_feature_file_labels_on_the_node() {
    let Some(nfd_bin) = nfd::locate_or_skip().unwrap() else { return };
    let rule = chart_rule();
    let mut env = TestEnv::builder("nfd_puts_the_gfd_feature_file_labels_on_the_node").start().await.unwrap();
    let client = env.client().await.unwrap();

    let crds = helm::read_crds(std::slice::from_ref(&nfd_bin.crds)).unwrap();
    helm::install_crds(&client, &crds, Duration::from_secs(30)).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    // A node as the kubelet registers it, with labels and annotations: nfd-master's JSON patches add keys
    // under /metadata/labels and /metadata/annotations, which fail on a node that has neither map.
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {"kubernetes.io/hostname": NODE},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let ns: Namespace = serde_json::from_value(
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    )
    .unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    if let Some(rule) = &rule {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("nfd.k8s-sigs.io", "v1alpha1", "NodeFeatureRule"),
            "nodefeaturerules",
        );
        let rule: DynamicObject = serde_json::from_value(rule.clone()).unwrap();
        Api::<DynamicObject>::all_with(client.clone(), &ar)
            .create(&PostParams::default(), &rule)
            .await
            .unwrap();
    }

    // 1. The feature file, as the device plugin writes it.
    let work = env.workdir().join("nfd-worker");
    std::fs::create_dir_all(work.join("features.d")).unwrap();
    let file = work.join("features.d/gfd");
    let labels = plugin_labels();
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    let config = FeatureFileConfig { path: file.clone(), interval: Duration::from_secs(60) };
    FeatureFileWriter::new(config.clone(), labels.clone()).write_once().unwrap();

    // 2. NFD.
    let kubeconfig = format!("-kubeconfig={}", env.kubeconfig_path().display());
    let nfd_env = vec![
        ("NODE_NAME".to_owned(), NODE.to_owned()),
        ("KUBERNETES_NAMESPACE".to_owned(), NAMESPACE.to_owned()),
    ];
    let master_args: Vec<String> = vec![
        kubeconfig.clone(),
        "-metrics=0".into(),
        "-grpc-health=0".into(),
        "-enable-taints".into(),
        format!("-config={}", work.join("nfd-master.conf").display()),
    ];
    env.start_process("nfd-master", &nfd_bin.master, &master_args, &nfd_env).unwrap();
    let worker_args: Vec<String> = vec![
        kubeconfig,
        "-metrics=0".into(),
        "-grpc-health=0".into(),
        "-feature-sources=local".into(),
        "-label-sources=local".into(),
        format!("-config={}", work.join("nfd-worker.conf").display()),
        r#"-options={"core":{"sleepInterval":"1s"}}"#.into(),
    ];
    env.start_process_in("nfd-worker", &nfd_bin.worker, &worker_args, &nfd_env, &work).unwrap();

    let (api, want) = (&nodes, &labels);
    env.poll("the GFD labels on the Node through NFD", Duration::from_secs(60), move || async move {
        let got = node_labels(api).await?;
        want.iter().all(|(k, v)| got.get(k) == Some(v)).then_some(())
    })
    .await
    .unwrap();
    env.check_process("nfd-master").unwrap();
    env.check_process("nfd-worker").unwrap();

    // 3. The chart's rule, matched on our feature file: its label and taint.
    if rule.is_some() {
        env.poll("the NodeFeatureRule's label and taint", Duration::from_secs(30), move || async move {
            let node = api.get(NODE).await.ok()?;
            let labelled = node.metadata.labels?.get(RULE_LABEL).map(String::as_str) == Some("true");
            let tainted = node.spec?.taints?.iter().any(|t| t.key == TAINT_KEY && t.effect == "NoSchedule");
            (labelled && tainted).then_some(())
        })
        .await
        .unwrap();
    }

    // 4. A rewrite changes the label; removing the file removes the labels.
    let mut changed = labels.clone();
    changed.insert("nvidia.com/gpu.count".into(), "1".into());
    FeatureFileWriter::new(config, changed).write_once().unwrap();
    env.poll("the changed label", Duration::from_secs(30), move || async move {
        (node_labels(api).await?.get("nvidia.com/gpu.count").map(String::as_str) == Some("1")).then_some(())
    })
    .await
    .unwrap();
    vgpu_core::nfd::remove(&file).unwrap();
    env.poll("the labels removed with the file", Duration::from_secs(30), move || async move {
        let got = node_labels(api).await.unwrap_or_default();
        (!got.contains_key("nvidia.com/gpu.product") && !got.contains_key(RULE_LABEL)).then_some(())
    })
    .await
    .unwrap();
    env.finish();
}
