//! Crash safety of Prepare at the state layer ([`DeviceState`] over real files in a temporary directory):
//! a fault-injection hook stops Prepare between `PrepareStarted` and `PrepareCompleted` as a crash would,
//! then the plugin restarts (a new `DeviceState` over the same directories) or simply prepares again. No
//! double prepare, no leaked directory or CDI file, and the claim ends prepared. A changed boot ID drops
//! every prepared claim and its files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::Ordering;

use support::TestNode;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    checkpoint::ClaimState,
    state::{error::ClaimFailure, fault::FaultPoint},
};

fn c1() -> ClaimRef {
    ClaimRef::new("ns", "c1", "uid-1")
}

#[tokio::test]
async fn crash_after_side_effects_then_restart_rolls_back_and_prepares_once() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    node.add_vgpu_claim("c2", "uid-2", "vgpu-1", "s2", "20", "2Gi");
    let (hook, fired) = support::crash_once(FaultPoint::AfterSideEffects);
    let state = node.state_with(Some(hook)).await;
    let results = state.prepare(&[c1(), ClaimRef::new("ns", "c2", "uid-2")]).await;
    assert!(fired.load(Ordering::SeqCst));
    assert!(matches!(results["uid-1"], Err(ClaimFailure::Injected(FaultPoint::AfterSideEffects))));
    assert!(!results.contains_key("uid-2"), "a crash stops the whole call");
    // What a crash leaves: the started entry, the directory and the spec.
    let cp = state.checkpoint().await.unwrap();
    assert_eq!(cp.claims()["uid-1"].checkpoint_state, ClaimState::PrepareStarted);
    assert_eq!(node.cdi_files(), ["k8s.manager.nvidia.com-claim_uid-1.json"]);
    assert_eq!(node.claim_dirs(), ["uid-1"]);
    drop(state);

    // Restart: the started claim is rolled back before anything is served.
    let state = node.state().await;
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert!(node.cdi_files().is_empty() && node.claim_dirs().is_empty());
    let results = state.prepare(&[c1(), ClaimRef::new("ns", "c2", "uid-2")]).await;
    assert_eq!(results["uid-1"].as_ref().unwrap().len(), 1);
    assert_eq!(results["uid-2"].as_ref().unwrap().len(), 1);
    assert_eq!(
        node.cdi_files(),
        ["k8s.manager.nvidia.com-claim_uid-1.json", "k8s.manager.nvidia.com-claim_uid-2.json"]
    );
    assert_eq!(node.claim_dirs(), ["uid-1", "uid-2"]);
    let cp = state.checkpoint().await.unwrap();
    assert!(cp.claims().values().all(|c| c.checkpoint_state == ClaimState::PrepareCompleted));
    // Preparing again changes nothing.
    let again = state.prepare(&[c1()]).await;
    assert_eq!(again["uid-1"].as_ref().unwrap(), results["uid-1"].as_ref().unwrap());
    assert_eq!(state.checkpoint().await.unwrap(), cp);
}

#[tokio::test]
async fn crash_after_prepare_started_is_rolled_back_by_the_next_prepare() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    let (hook, _) = support::crash_once(FaultPoint::AfterPrepareStarted);
    let state = node.state_with(Some(hook)).await;
    assert!(matches!(state.prepare(&[c1()]).await["uid-1"], Err(ClaimFailure::Injected(_))));
    assert_eq!(
        state.checkpoint().await.unwrap().claims()["uid-1"].checkpoint_state,
        ClaimState::PrepareStarted
    );
    assert!(node.cdi_files().is_empty(), "nothing written yet");
    // Same process, next call: rollback first, then a full prepare.
    let devices = state.prepare(&[c1()]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(devices[0].device_name, "vgpu-0");
    assert_eq!(node.cdi_files().len(), 1);
    assert_eq!(
        state.checkpoint().await.unwrap().claims()["uid-1"].checkpoint_state,
        ClaimState::PrepareCompleted
    );
}

#[tokio::test]
async fn a_failing_side_effect_rolls_back_only_its_claim() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    node.add_vgpu_claim("c2", "uid-2", "vgpu-1", "s2", "10", "1Gi");
    let state = node.state().await;
    // A directory where uid-2's spec file must go makes its CDI write fail.
    std::fs::create_dir_all(node.config.cdi_spec_path("uid-2").join("blocker")).unwrap();
    let results = state.prepare(&[c1(), ClaimRef::new("ns", "c2", "uid-2")]).await;
    assert!(results["uid-1"].is_ok());
    let err = results["uid-2"].as_ref().unwrap_err().to_string();
    assert!(err.contains("k8s.manager.nvidia.com-claim_uid-2.json"), "{err}");
    assert!(!state.checkpoint().await.unwrap().claims().contains_key("uid-2"));
    assert_eq!(node.claim_dirs(), ["uid-1"], "uid-2's partition directory was removed");
}

#[tokio::test]
async fn a_reboot_invalidates_the_checkpoint() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    let state = node.state().await;
    state.prepare(&[c1()]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(state.checkpoint().await.unwrap().boot_id(), "boot-1");
    drop(state);
    // Same boot: the claim survives a restart.
    let state = node.state().await;
    assert!(state.checkpoint().await.unwrap().claims().contains_key("uid-1"));
    drop(state);
    std::fs::write(&node.config.boot_id_path, "boot-2\n").unwrap();
    let state = node.state().await;
    let cp = state.checkpoint().await.unwrap();
    assert!(cp.claims().is_empty());
    assert_eq!(cp.boot_id(), "boot-2");
    assert!(node.cdi_files().is_empty() && node.claim_dirs().is_empty());
    // The kubelet prepares it again after the reboot.
    assert!(state.prepare(&[c1()]).await["uid-1"].is_ok());
}
