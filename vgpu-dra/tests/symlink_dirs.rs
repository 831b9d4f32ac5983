//! Prepare never changes permissions through a symbolic link: with `NRISupport` on, Prepare makes the claim
//! directory (mode 0777); a link planted at its path, to a host directory outside, fails the claim with an
//! error naming the link, and the link's target keeps its mode and its content.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use support::{DRIVER, NODE, TestNode};
use vgpu_core::abi::perms::PermsError;
use vgpu_core::backend::NvidiaAdapter;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{allocated, allocation_result, claim},
    state::{DeviceState, error::ClaimFailure},
};
use vgpu_gates::DraGate;

#[tokio::test]
async fn a_symlinked_claim_directory_fails_prepare_and_keeps_its_target_mode() {
    let node = TestNode::new();
    let mut config = (*node.config).clone();
    config.gates.set_gate(DraGate::NRISupport, true).unwrap();
    let share =
        allocation_result("gpu", DRIVER, NODE, "vgpu-0", Some("s1"), &[("cores", "30"), ("memory", "2Gi")]);
    node.claims.insert(allocated(claim("ns", "shared", "u-shared"), vec![share], &["pod-a"]));
    let state = DeviceState::new(
        Arc::new(config),
        Arc::clone(&node.devices),
        Arc::new(NvidiaAdapter),
        node.claims.clone(),
    )
    .await
    .unwrap();

    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("host");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(target.join("keep"), b"host data").unwrap();
    let link = node.config.claim_dir("u-shared");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();

    let out = state.prepare(&[ClaimRef::new("ns", "shared", "u-shared")]).await;
    let err = out["u-shared"].as_ref().unwrap_err();
    assert!(
        matches!(err, ClaimFailure::Permissions(PermsError::Symlink { path }) if *path == link),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&link.display().to_string()), "{text}");
    assert!(text.contains("is a symbolic link; refusing to change its permissions"), "{text}");
    assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777, 0o700);
    // The failed Prepare's clean-up removes at most the link, never what it points at.
    assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"host data");
}
