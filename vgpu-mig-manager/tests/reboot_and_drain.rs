//! The reset / reboot / drain paths of the reconcile pass at the library layer: [`MigManager`] over an
//! [`InMemoryCluster`] and mock A100 80GB GPUs whose MIG mode changes stay pending until a GPU reset.
//!
//! - reset possible: the pending mode is applied by the reset, the layout finishes in one pass;
//! - reset impossible: state `reboot-required`, the annotation with the boot ID, the condition `True`, the
//!   node kept cordoned and tainted pass after pass (no flapping); after the "reboot" (mock pending modes
//!   applied, new boot ID) the layout applies, the request is withdrawn, the node returns;
//! - a reboot that did not apply the mode: `failed`, no second request;
//! - drain: every pod but DaemonSet and mirror pods evicted, a PDB refusal waited for, then uncordoned.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use vgpu_core::backend::{DeviceBackend, MigMode, mock::MockBackend};
use vgpu_mig_manager::{
    CONFIG_LABEL, InMemoryCluster, ManagerConfig, MigManager, Outcome, REASON_ANNOTATION, REBOOT_ANNOTATION,
    REBOOT_CONDITION, STATE_LABEL, TAINT_KEY,
    cluster::{Call, NodeState, PodState},
    drain::EvictionScope,
};

const NODE: &str = "gpu-node-1";

const CONFIG: &str = r#"
version: v1
mig-configs:
  all-3g.40gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
"#;

fn backend(reset: &str) -> Arc<MockBackend> {
    let gpu = |i: u32| {
        format!(
            "  - {{ uuid: GPU-{i}, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: {{ mode: Disabled, modeChange: Pending, reset: {reset} }} }}\n"
        )
    };
    Arc::new(MockBackend::from_yaml_str(&format!("gpus:\n{}{}", gpu(0), gpu(1))).unwrap())
}

fn pod(name: &str, resources: &[&str], owner: Option<&str>, mirror: bool) -> PodState {
    PodState {
        namespace: "team".to_owned(),
        name: name.to_owned(),
        resources: resources.iter().map(|r| (*r).to_owned()).collect(),
        phase: "Running".to_owned(),
        controller_kind: owner.map(str::to_owned),
        mirror,
        ..PodState::default()
    }
}

fn setup(backend: &Arc<MockBackend>, config: impl FnOnce(&mut ManagerConfig)) -> MigManager<InMemoryCluster> {
    let cluster = InMemoryCluster::default();
    cluster.put_node(
        NODE,
        NodeState {
            labels: [(CONFIG_LABEL.to_owned(), "all-3g.40gb".to_owned())].into_iter().collect(),
            boot_id: "boot-1".to_owned(),
            ..NodeState::default()
        },
    );
    cluster.put_config_map(
        "gpu",
        "default-mig-parted-config",
        [("config.yaml".to_owned(), CONFIG.to_owned())].into(),
    );
    cluster.put_pod(NODE, pod("trainer", &["nvidia.com/gpu"], Some("Job"), false));
    cluster.put_pod(NODE, pod("web", &["cpu"], Some("ReplicaSet"), false));
    cluster.put_pod(NODE, pod("bare", &[], None, false));
    cluster.put_pod(NODE, pod("agent", &[], Some("DaemonSet"), false));
    cluster.put_pod(NODE, pod("static-etcd", &[], Some("Node"), true));
    let mut manager_config = ManagerConfig::new(NODE, "gpu");
    manager_config.gfd_labels = false;
    config(&mut manager_config);
    MigManager::new(manager_config, cluster, Arc::clone(backend) as Arc<dyn DeviceBackend>)
}

fn assert_applied(backend: &MockBackend) {
    for gpu in 0..2 {
        let layout = backend.mig_layout(gpu).unwrap();
        assert_eq!((layout.mode, layout.instances.len()), (MigMode::Enabled, 2), "GPU {gpu}");
    }
}

#[tokio::test]
async fn a_gpu_reset_applies_the_pending_mode_in_one_pass() {
    let backend = backend("Succeeds");
    let manager = setup(&backend, |_| {});
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    assert_applied(&backend);
    let node = manager.cluster().node(NODE).unwrap();
    assert_eq!(node.labels[STATE_LABEL], "success");
    assert!(!node.annotations.contains_key(REBOOT_ANNOTATION));
    assert!(!node.conditions.contains_key(REBOOT_CONDITION), "no reboot asked: no condition written");
    assert!(!node.unschedulable);
}

#[tokio::test]
async fn no_reset_possible_requests_a_reboot_then_finishes_after_it() {
    let backend = backend("InUse");
    let manager = setup(&backend, |_| {});
    let cluster = manager.cluster();
    for pass in 0..3 {
        match manager.reconcile().await.unwrap() {
            Outcome::RebootRequired(why) => assert_eq!(
                why,
                "GPU 0: MIG mode enabled is pending and the GPU cannot be reset: GPU 0 cannot be reset: the GPU is in use (mock description: reset: InUse)",
                "pass {pass}"
            ),
            other => panic!("pass {pass}: {other:?}"),
        }
        let node = cluster.node(NODE).unwrap();
        assert_eq!(node.labels[STATE_LABEL], "reboot-required", "pass {pass}");
        assert_eq!(node.annotations[REBOOT_ANNOTATION], "boot-1");
        assert!(node.annotations[REASON_ANNOTATION].contains("cannot be reset"));
        assert_eq!(node.conditions[REBOOT_CONDITION], "True");
        assert!(node.unschedulable && node.taints.iter().any(|t| t.key == TAINT_KEY), "stays in maintenance");
    }
    let states: Vec<_> = cluster
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::PatchNode(p) => p.labels.get(STATE_LABEL).cloned().flatten(),
            _ => None,
        })
        .collect();
    assert_eq!(states, ["pending", "reboot-required"], "the state does not flap between passes");
    assert_eq!(
        cluster.calls().iter().filter(|c| matches!(c, Call::Condition(_, true))).count(),
        1,
        "the condition is written once"
    );
    assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::Disabled);
    for gpu in 0..2 {
        assert_eq!(
            backend.pending_mig_mode(gpu).unwrap(),
            Some(MigMode::Enabled),
            "GPU {gpu}: one reboot for all"
        );
    }

    // The reboot operator reboots the node: pending modes applied, a new boot ID.
    backend.reboot().unwrap();
    cluster.set_boot_id(NODE, "boot-2");
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    assert_applied(&backend);
    let node = cluster.node(NODE).unwrap();
    assert_eq!(node.labels[STATE_LABEL], "success");
    assert!(!node.annotations.contains_key(REBOOT_ANNOTATION));
    assert!(!node.annotations.contains_key(REASON_ANNOTATION));
    assert_eq!(node.conditions[REBOOT_CONDITION], "False");
    assert!(!node.unschedulable && node.taints.is_empty());
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::InSync);
}

#[tokio::test]
async fn a_reboot_that_does_not_apply_the_mode_fails_without_asking_again() {
    let backend = backend("NotSupported");
    let manager = setup(&backend, |c| c.gpu_reset = false);
    let cluster = manager.cluster();
    match manager.reconcile().await.unwrap() {
        Outcome::RebootRequired(why) => {
            assert!(why.ends_with("GPU resets are disabled (--gpu-reset=false)"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    cluster.set_boot_id(NODE, "boot-2"); // rebooted, but the pending mode did not apply
    for _ in 0..2 {
        match manager.reconcile().await.unwrap() {
            Outcome::Failed(why) => {
                assert!(
                    why.contains("still pending after the node rebooted (boot ID boot-1 -> boot-2)"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
    let node = cluster.node(NODE).unwrap();
    assert_eq!(node.labels[STATE_LABEL], "failed");
    assert_eq!(node.conditions[REBOOT_CONDITION], "False");
    assert_eq!(node.annotations[REBOOT_ANNOTATION], "boot-1", "kept: no second reboot is requested");
    assert!(!node.unschedulable, "returned to service");
}

#[tokio::test]
async fn drain_evicts_all_but_daemonset_and_mirror_pods_waiting_for_a_pdb() {
    let backend = backend("Succeeds");
    let manager = setup(&backend, |c| c.eviction = EvictionScope::Drain);
    let cluster = manager.cluster();
    cluster.refuse_eviction("team/web", true);
    match manager.reconcile().await.unwrap() {
        Outcome::Waiting(why) => {
            assert!(why.starts_with("1 pod(s) left: ") && why.contains("team/web: eviction refused"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(cluster.node(NODE).unwrap().unschedulable, "cordoned while draining");
    assert_eq!(
        backend.mig_layout(0).unwrap().mode,
        MigMode::Disabled,
        "nothing applied before the drain ends"
    );
    assert!(!cluster.has_pod("team/trainer") && !cluster.has_pod("team/bare"));
    cluster.refuse_eviction("team/web", false);
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    assert_applied(&backend);
    assert!(
        cluster.has_pod("team/agent") && cluster.has_pod("team/static-etcd"),
        "DaemonSet and mirror pods stay"
    );
    let evicted: Vec<_> = cluster
        .calls()
        .into_iter()
        .filter_map(|c| if let Call::Evict(k) = c { Some(k) } else { None })
        .collect();
    assert!(!evicted.iter().any(|k| k == "team/agent" || k == "team/static-etcd"), "{evicted:?}");
    assert!(!cluster.node(NODE).unwrap().unschedulable, "uncordoned when done");
}

#[tokio::test]
async fn gpu_pods_scope_leaves_other_pods_alone() {
    let backend = backend("Succeeds");
    let manager = setup(&backend, |_| {});
    assert_eq!(manager.reconcile().await.unwrap(), Outcome::Applied);
    let cluster = manager.cluster();
    assert!(!cluster.has_pod("team/trainer"));
    assert!(["web", "bare", "agent", "static-etcd"].iter().all(|p| cluster.has_pod(&format!("team/{p}"))));
}
