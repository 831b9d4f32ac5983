//! The claim-mode seam at the state layer ([`DeviceState::with_modes`] over real files in a temporary
//! directory), with a fake mode whose "host" is an in-memory set: host actions are recorded in the checkpoint
//! before they run, their CDI edits land in the claim's spec, Unprepare and rollback revert them newest first,
//! a crash after the first action converges on restart, a recorded action whose mode is not installed is
//! never dropped silently. Also the `NRISupport` side of Prepare (no partition mounts in the spec, a vGPU
//! claim shared by several pods).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, atomic::Ordering},
};

use serde::{Deserialize, Serialize};
use support::{DRIVER, NODE, TestNode};
use vgpu_core::cdi::Spec;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    checkpoint::ClaimState,
    claims::{allocated, allocation_result, claim},
    modes::{ClaimContext, ClaimMode, ModeEdits, ModeError, decode, encode},
    state::{error::ClaimFailure, fault::FaultPoint},
};

/// What the fake mode does to its "host": the set of devices it holds.
#[derive(Debug, Default)]
struct FakeHost {
    held: Mutex<BTreeSet<String>>,
    applies: Mutex<usize>,
    reverts: Mutex<usize>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hold {
    device: String,
    cdi: String,
}

#[derive(Debug)]
struct FakeMode {
    host: Arc<FakeHost>,
    /// Plan fails for claims of this name.
    refuse: Option<&'static str>,
    /// Apply fails for this device.
    fail_on: Option<&'static str>,
}

impl FakeMode {
    fn boxed(host: &Arc<FakeHost>) -> Arc<dyn ClaimMode> {
        Arc::new(Self { host: Arc::clone(host), refuse: None, fail_on: None })
    }
}

impl ClaimMode for FakeMode {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn gate(&self) -> &'static str {
        "FakeGate"
    }
    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
        if self.refuse == Some(ctx.claim.name.as_str()) {
            return Err(ModeError::claim("fake", "this claim asks for something impossible"));
        }
        ctx.devices
            .iter()
            .map(|d| encode("fake", &Hold { device: d.device.name.clone(), cdi: d.cdi_name.clone() }))
            .collect()
    }
    fn apply(&self, _ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
        let hold: Hold = decode("fake", action)?;
        if self.fail_on == Some(hold.device.as_str()) {
            return Err(ModeError::host("fake", format!("hold {}", hold.device), "device is busy"));
        }
        *self.host.applies.lock().unwrap() += 1;
        self.host.held.lock().unwrap().insert(hold.device.clone());
        let mut edits = ModeEdits::default();
        edits.common.env.push("FAKE_MODE=on".to_owned());
        edits.devices.entry(hold.cdi).or_default().env.push(format!("FAKE_HELD={}", hold.device));
        Ok(edits)
    }
    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError> {
        let hold: Hold = decode("fake", action)?;
        *self.host.reverts.lock().unwrap() += 1;
        self.host.held.lock().unwrap().remove(&hold.device);
        Ok(())
    }
}

/// Claim `ns/two` (UID `uid-2d`) with a share of both GPUs.
fn add_two_device_claim(node: &TestNode) {
    let results = vec![
        allocation_result("gpu", DRIVER, NODE, "vgpu-0", Some("s1"), &[("cores", "10")]),
        allocation_result("gpu", DRIVER, NODE, "vgpu-1", Some("s2"), &[("cores", "10")]),
    ];
    node.claims.insert(allocated(claim("ns", "two", "uid-2d"), results, &["pod-1"]));
}

fn two() -> ClaimRef {
    ClaimRef::new("ns", "two", "uid-2d")
}

fn spec(node: &TestNode, uid: &str) -> Spec {
    let path = node.config.cdi_spec_path(uid);
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

fn held(host: &FakeHost) -> Vec<String> {
    host.held.lock().unwrap().iter().cloned().collect()
}

#[tokio::test]
async fn actions_are_recorded_applied_edited_in_and_reverted() {
    let node = TestNode::new();
    add_two_device_claim(&node);
    let host = Arc::new(FakeHost::default());
    let state = node.state_with_modes(None, vec![FakeMode::boxed(&host)]).await;
    assert_eq!(state.mode_names(), ["fake"]);
    let out = state.prepare(&[two()]).await;
    assert_eq!(out["uid-2d"].as_ref().unwrap().len(), 2);
    assert_eq!(held(&host), ["vgpu-0", "vgpu-1"]);

    let cp = state.checkpoint().await.unwrap();
    let entry = &cp.claims()["uid-2d"];
    assert_eq!(entry.checkpoint_state, ClaimState::PrepareCompleted);
    let recorded: Vec<_> =
        entry.host_actions.iter().map(|a| (a.mode.as_str(), a.action["device"].clone())).collect();
    assert_eq!(recorded, [("fake", "vgpu-0".into()), ("fake", "vgpu-1".into())]);

    let spec = spec(&node, "uid-2d");
    assert_eq!(spec.container_edits.env.iter().filter(|e| *e == "FAKE_MODE=on").count(), 2);
    for (device, gpu) in spec.devices.iter().zip(["vgpu-0", "vgpu-1"]) {
        assert!(device.container_edits.env.contains(&format!("FAKE_HELD={gpu}")), "{device:?}");
        assert!(
            device.container_edits.env.iter().any(|e| e.starts_with("MANAGER_VISIBLE_DEVICE_")),
            "the state's own edits stay"
        );
    }

    // A second Prepare answers from the checkpoint: nothing is applied again.
    let applies = *host.applies.lock().unwrap();
    assert_eq!(state.prepare(&[two()]).await["uid-2d"].as_ref().unwrap().len(), 2);
    assert_eq!(*host.applies.lock().unwrap(), applies);

    assert!(state.unprepare(&[two()]).await["uid-2d"].is_ok());
    assert!(held(&host).is_empty());
    assert!(node.cdi_files().is_empty() && node.claim_dirs().is_empty());
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
}

#[tokio::test]
async fn a_crash_after_the_first_action_converges_on_restart() {
    let node = TestNode::new();
    add_two_device_claim(&node);
    let host = Arc::new(FakeHost::default());
    let (hook, fired) = support::crash_once(FaultPoint::AfterHostAction);
    let state = node.state_with_modes(Some(hook), vec![FakeMode::boxed(&host)]).await;
    let out = state.prepare(&[two()]).await;
    assert!(fired.load(Ordering::SeqCst));
    assert!(matches!(out["uid-2d"], Err(ClaimFailure::Injected(FaultPoint::AfterHostAction))));
    assert_eq!(held(&host), ["vgpu-0"], "the crash came after the first action only");
    let cp = state.checkpoint().await.unwrap();
    assert_eq!(cp.claims()["uid-2d"].checkpoint_state, ClaimState::PrepareStarted);
    assert_eq!(cp.claims()["uid-2d"].host_actions.len(), 2, "every action is recorded before the first runs");
    drop(state);

    // Restart: recovery reverts both recorded actions (the second was never applied: a no-op).
    let state = node.state_with_modes(None, vec![FakeMode::boxed(&host)]).await;
    assert!(held(&host).is_empty());
    assert_eq!(*host.reverts.lock().unwrap(), 2);
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert!(node.cdi_files().is_empty() && node.claim_dirs().is_empty());
    // And a fresh Prepare applies both.
    assert!(state.prepare(&[two()]).await["uid-2d"].is_ok());
    assert_eq!(held(&host), ["vgpu-0", "vgpu-1"]);
}

#[tokio::test]
async fn a_failed_apply_rolls_back_what_was_applied_and_a_refused_plan_does_nothing() {
    let node = TestNode::new();
    add_two_device_claim(&node);
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s9", "10", "1Gi");
    let host = Arc::new(FakeHost::default());
    let mode: Arc<dyn ClaimMode> =
        Arc::new(FakeMode { host: Arc::clone(&host), refuse: Some("c1"), fail_on: Some("vgpu-1") });
    let state = node.state_with_modes(None, vec![mode]).await;

    let out = state.prepare(&[two(), ClaimRef::new("ns", "c1", "uid-1")]).await;
    let err = out["uid-2d"].as_ref().unwrap_err().to_string();
    assert_eq!(err, "ResourceClaim ns/two: fake: hold vgpu-1: device is busy");
    let err = out["uid-1"].as_ref().unwrap_err().to_string();
    assert_eq!(err, "ResourceClaim ns/c1: fake: this claim asks for something impossible");
    assert!(held(&host).is_empty(), "vgpu-0 was held, then reverted by the rollback");
    assert_eq!(*host.reverts.lock().unwrap(), 2, "rollback reverts every recorded action");
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert!(node.cdi_files().is_empty() && node.claim_dirs().is_empty());
}

#[tokio::test]
async fn a_recorded_action_of_a_mode_that_is_not_installed_keeps_the_claim() {
    let node = TestNode::new();
    add_two_device_claim(&node);
    let host = Arc::new(FakeHost::default());
    let state = node.state_with_modes(None, vec![FakeMode::boxed(&host)]).await;
    assert!(state.prepare(&[two()]).await["uid-2d"].is_ok());
    drop(state);

    // Restarted with the mode's gate off: a completed claim stays; unpreparing it is refused by name.
    let state = node.state().await;
    let err = state.unprepare(&[two()]).await["uid-2d"].as_ref().unwrap_err().to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/two: the claim has a recorded \"fake\" host action but that mode is not enabled; turn feature gate (unknown: this build has no such mode) back on to unprepare it"
    );
    assert!(state.checkpoint().await.unwrap().claims().contains_key("uid-2d"));
    assert_eq!(held(&host), ["vgpu-0", "vgpu-1"]);
    drop(state);

    let state = node.state_with_modes(None, vec![FakeMode::boxed(&host)]).await;
    assert!(state.unprepare(&[two()]).await["uid-2d"].is_ok());
    assert!(held(&host).is_empty());
}

#[tokio::test]
async fn nri_support_moves_partition_mounts_out_of_cdi_and_allows_sharing() {
    let mut node = TestNode::new();
    let mut config = (*node.config).clone();
    config.gates = vgpu_dra::feature_gates().configure(["NRISupport=true"]).unwrap();
    node.config = Arc::new(config);
    let result = allocation_result("gpu", DRIVER, NODE, "vgpu-0", Some("s1"), &[("cores", "10")]);
    node.claims.insert(allocated(claim("ns", "shared", "uid-s"), vec![result], &["pod-1", "pod-2"]));
    let state = node.state().await;
    let out = state.prepare(&[ClaimRef::new("ns", "shared", "uid-s")]).await;
    assert_eq!(out["uid-s"].as_ref().unwrap().len(), 1, "two consumers are fine with NRI");
    let spec = spec(&node, "uid-s");
    let device = &spec.devices[0].container_edits;
    assert!(device.mounts.is_empty(), "partition mounts come from the NRI hook: {device:?}");
    assert!(device.env.iter().any(|e| e.starts_with("MANAGER_VISIBLE_DEVICE_0=")), "{device:?}");
    assert_eq!(node.claim_dirs(), ["uid-s"]);
    let partitions = std::fs::read_dir(node.config.claim_dir("uid-s")).unwrap().count();
    assert_eq!(partitions, 0, "no partition is made before CreateContainer");

    // Without NRI the same claim is refused (upstream's rule).
    let plain = TestNode::new();
    let result = allocation_result("gpu", DRIVER, NODE, "vgpu-0", Some("s1"), &[("cores", "10")]);
    plain.claims.insert(allocated(claim("ns", "shared", "uid-s"), vec![result], &["pod-1", "pod-2"]));
    let state = plain.state().await;
    let err = state.prepare(&[ClaimRef::new("ns", "shared", "uid-s")]).await["uid-s"]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(err.contains(vgpu_dra::state::error::SHARED_CLAIM_ERROR), "{err}");
}
