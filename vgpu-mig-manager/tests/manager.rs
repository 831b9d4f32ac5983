//! The MIG manager's reconcile pass at the library layer: [`MigManager`] over an [`InMemoryCluster`] and the
//! mock backend's MIG state machine (A100 80GB GPUs). Covers the all-disabled → all-1g.10gb change (pending,
//! taint + cordon, eviction of GPU pods only, refused evictions retried, apply, device plugin pod deleted,
//! GFD labels, uncordon, success), an administrator's cordon kept, and failures that leave the node
//! untouched with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc};

use vgpu_core::backend::{DeviceBackend, MigMode, mock::MockBackend};
use vgpu_mig_manager::{
    CONFIG_LABEL, CORDONED_ANNOTATION, InMemoryCluster, ManagerConfig, MigManager, Outcome,
    REASON_ANNOTATION, STATE_LABEL, TAINT_KEY,
    cluster::{Call, NodeState, PodState},
};

const NODE: &str = "gpu-node-1";

const BACKEND: &str = "\
driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - { uuid: GPU-0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', pciDeviceId: '0x20B210DE',
      mig: { mode: Disabled } }
  - { uuid: GPU-1, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', pciDeviceId: '0x20B210DE',
      mig: { mode: Disabled } }
";

const CONFIG: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  too-big:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 3
  per-model:
    - devices: all
      device-filter: "0x20B010DE"
      mig-enabled: true
      mig-devices:
        "1g.5gb": 7
    - devices: all
      device-filter: ["0x20B210DE", "0x20B510DE"]
      mig-enabled: true
      mig-devices:
        "2g.20gb": 3
  bad-profile:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.11gb": 1
"#;

fn pod(ns: &str, name: &str, resources: &[&str], labels: &[(&str, &str)]) -> PodState {
    PodState {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        resources: resources.iter().map(|r| r.to_string()).collect(),
        phase: "Running".to_owned(),
        ..PodState::default()
    }
}

fn setup(config_name: &str) -> (MigManager<InMemoryCluster>, Arc<MockBackend>) {
    let cluster = InMemoryCluster::default();
    let node = NodeState {
        labels: [(CONFIG_LABEL.to_owned(), config_name.to_owned())].into_iter().collect(),
        ..NodeState::default()
    };
    cluster.put_node(NODE, node);
    cluster.put_config_map(
        "gpu",
        "default-mig-parted-config",
        [("config.yaml".to_owned(), CONFIG.to_owned())].into(),
    );
    cluster.put_pod(NODE, pod("team", "trainer", &["nvidia.com/vgpu-number"], &[]));
    cluster.put_pod(NODE, pod("team", "web", &["cpu"], &[]));
    cluster.put_pod(
        NODE,
        pod("gpu", "vgpu-device-plugin-x", &[], &[("app.kubernetes.io/name", "vgpu-device-plugin")]),
    );
    cluster.put_pod("other-node", pod("team", "elsewhere", &["nvidia.com/gpu"], &[]));
    let backend = Arc::new(MockBackend::from_yaml_str(BACKEND).unwrap());
    let manager = MigManager::new(
        ManagerConfig::new(NODE, "gpu"),
        cluster,
        Arc::clone(&backend) as Arc<dyn DeviceBackend>,
    );
    (manager, backend)
}

#[tokio::test]
async fn all_disabled_to_all_1g_10gb() {
    let (manager, backend) = setup("all-disabled");
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::InSync);
    let node = manager.cluster().node(NODE).unwrap();
    assert_eq!(node.labels[STATE_LABEL], "success");
    assert_eq!(node.labels["nvidia.com/mig.capable"], "true");
    assert_eq!(node.labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    assert!(!node.unschedulable);

    // A PDB refuses the first eviction: the node stays in maintenance, nothing applied yet.
    let cluster = manager.cluster();
    cluster.refuse_eviction("team/trainer", true);
    cluster.set_node_label(NODE, CONFIG_LABEL, "all-1g.10gb");
    match manager.reconcile().await.unwrap() {
        Outcome::Waiting(why) => assert!(why.contains("team/trainer: eviction refused"), "{why}"),
        other => panic!("{other:?}"),
    }
    let node = cluster.node(NODE).unwrap();
    assert_eq!(node.labels[STATE_LABEL], "pending");
    assert!(node.unschedulable);
    assert!(node.taints.iter().any(|t| t.key == TAINT_KEY && t.effect == "NoSchedule"));
    assert_eq!(node.annotations[CORDONED_ANNOTATION], "true");
    assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::Disabled, "not applied while GPU pods remain");

    cluster.refuse_eviction("team/trainer", false);
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    for gpu in 0..2 {
        let layout = backend.mig_layout(gpu).unwrap();
        assert_eq!(layout.mode, MigMode::Enabled);
        assert_eq!(layout.instances.len(), 7);
        assert!(layout.instances.iter().all(|i| i.profile.to_string() == "1g.10gb"));
    }
    assert!(!cluster.has_pod("team/trainer"), "GPU pod evicted");
    assert!(cluster.has_pod("team/web"), "CPU pod kept");
    assert!(cluster.has_pod("team/elsewhere"), "other node's pod kept");
    assert!(!cluster.has_pod("gpu/vgpu-device-plugin-x"), "device plugin pod restarted");
    let node = cluster.node(NODE).unwrap();
    assert_eq!(node.labels[STATE_LABEL], "success");
    assert!(!node.unschedulable);
    assert!(node.taints.is_empty());
    assert!(!node.annotations.contains_key(CORDONED_ANNOTATION));
    assert_eq!(node.labels["nvidia.com/mig-1g.10gb.count"], "14");
    assert_eq!(node.labels["nvidia.com/mig.strategy"], "mixed");

    let calls = cluster.calls();
    let evictions: Vec<_> = calls.iter().filter(|c| matches!(c, Call::Evict(_))).collect();
    assert_eq!(evictions, vec![&Call::Evict("team/trainer".into()), &Call::Evict("team/trainer".into())]);
    assert!(calls.contains(&Call::Delete("gpu/vgpu-device-plugin-x".into())));
    let specs: Vec<_> = calls
        .iter()
        .filter_map(|c| if let Call::SetSpec(u, t) = c { Some((*u, t.len())) } else { None })
        .collect();
    assert_eq!(specs, vec![(true, 1), (false, 0)], "cordon+taint once, return once");

    // Converged: the next pass changes nothing.
    let before = cluster.calls().len();
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::InSync);
    assert_eq!(cluster.calls().len(), before);

    // And back: the GFD MIG labels go away with the instances.
    cluster.set_node_label(NODE, CONFIG_LABEL, "all-disabled");
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    assert_eq!(backend.mig_layout(1).unwrap().mode, MigMode::Disabled);
    assert!(!cluster.node(NODE).unwrap().labels.contains_key("nvidia.com/mig-1g.10gb.count"));
}

#[tokio::test]
async fn an_administrators_cordon_is_kept() {
    let (manager, _backend) = setup("all-1g.10gb");
    let cluster = manager.cluster();
    let mut node = cluster.node(NODE).unwrap();
    node.unschedulable = true;
    cluster.put_node(NODE, node);
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    let node = cluster.node(NODE).unwrap();
    assert!(node.unschedulable, "cordoned before the manager: stays cordoned");
    assert!(node.taints.is_empty());
    assert_eq!(node.labels[STATE_LABEL], "success");
}

#[tokio::test]
async fn failures_leave_the_node_untouched_with_the_reason() {
    let cases = [
        ("bad-profile", "\"1g.11gb\" does not exist on A100-80GB"),
        ("too-big", "3g.40gb x3 does not fit on one A100-80GB GPU"),
        ("no-such-config", "MIG configuration \"no-such-config\" does not exist"),
    ];
    for (config, reason) in cases {
        let (manager, backend) = setup(config);
        match manager.reconcile().await.unwrap() {
            Outcome::Failed(r) => assert!(r.contains(reason), "{config}: {r}"),
            other => panic!("{config}: {other:?}"),
        }
        let cluster = manager.cluster();
        let node = cluster.node(NODE).unwrap();
        assert_eq!(node.labels[STATE_LABEL], "failed");
        assert!(
            node.annotations[REASON_ANNOTATION].contains(reason),
            "{}",
            node.annotations[REASON_ANNOTATION]
        );
        assert!(!node.unschedulable && node.taints.is_empty());
        assert!(cluster.has_pod("team/trainer"));
        assert!(cluster.calls().iter().all(|c| matches!(c, Call::PatchNode(_))), "{:?}", cluster.calls());
        assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::Disabled);
        // A second pass writes nothing new.
        let before = cluster.calls().len();
        manager.reconcile().await.unwrap();
        assert_eq!(cluster.calls().len(), before);
        // Fixing the label recovers: success, reason gone.
        cluster.set_node_label(NODE, CONFIG_LABEL, "all-1g.10gb");
        assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
        let node = cluster.node(NODE).unwrap();
        assert_eq!(node.labels[STATE_LABEL], "success");
        assert!(!node.annotations.contains_key(REASON_ANNOTATION));
    }
}

#[tokio::test]
async fn missing_config_map_and_no_label() {
    let (manager, _backend) = setup("all-1g.10gb");
    let cluster = manager.cluster();
    cluster.put_config_map("gpu", "default-mig-parted-config", BTreeMap::new());
    match manager.reconcile().await.unwrap() {
        Outcome::Failed(r) => {
            assert_eq!(r, "ConfigMap gpu/default-mig-parted-config has no key \"config.yaml\"")
        }
        other => panic!("{other:?}"),
    }
    let mut node = cluster.node(NODE).unwrap();
    node.labels.remove(CONFIG_LABEL);
    cluster.put_node(NODE, node);
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::NoConfig);
    let node = cluster.node(NODE).unwrap();
    assert_eq!(node.labels["nvidia.com/gpu.count"], "2", "GFD labels without a MIG configuration too");
    assert_eq!(node.labels[STATE_LABEL], "failed", "the state label is left as it was");
}

/// A configuration with one entry per GPU model (`device-filter`): the node's A100 80GB GPUs (`0x20B210DE`) get
/// the second entry's layout, the A100 40GB entry selects nothing.
#[tokio::test]
async fn device_filter_picks_the_entry_of_the_gpu_model() {
    let (manager, backend) = setup("per-model");
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    for gpu in 0..2 {
        let layout = backend.mig_layout(gpu).unwrap();
        assert_eq!(layout.mode, MigMode::Enabled);
        let profiles: Vec<String> = layout.instances.iter().map(|i| i.profile.to_string()).collect();
        assert_eq!(profiles, ["2g.20gb"; 3], "GPU {gpu}");
    }
    assert_eq!(manager.cluster().node(NODE).unwrap().labels[STATE_LABEL], "success");
}
