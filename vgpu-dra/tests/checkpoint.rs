//! The checkpoint codec (`checkpoint.json`, contract §9) at the byte level: golden v1 and v2 files pinned
//! byte for byte (`tests/fixtures/checkpoint-v{1,2}.json`; regenerate with
//! `VGPU_REGEN=1 cargo test -p vgpu-dra --test checkpoint` after a deliberate format change), the v1 → v2
//! upgrade, checksum verification, and proptests: encode → decode is the identity, and decoding arbitrary
//! bytes never panics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use proptest::prelude::*;
use vgpu_dra::checkpoint::{
    Checkpoint, CheckpointV1, ClaimState, PreparedClaim, PreparedDevice, fnv1a32, go_json, kubelet_checksum,
};

fn device(name: &str, share: Option<&str>) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpu".into()],
        pool_name: "node-1".into(),
        device_name: name.into(),
        share_id: share.map(str::to_owned),
        cdi_device_ids: vec![format!(
            "k8s.manager.nvidia.com/claim=uid-1-gpu-{name}-share-{}",
            share.unwrap_or("0")
        )],
        uuid: "GPU-a".into(),
    }
}

fn golden_v2() -> Checkpoint {
    let mut cp = Checkpoint::new("0b6c1c2e-7d1f-4b8e-9a51-2f8c2d9b1a10");
    let mut done = PreparedClaim::started(
        "ns",
        "c1",
        vec![
            "/etc/vgpu-manager/claims/uid-1".into(),
            "/etc/cdi/k8s.manager.nvidia.com-claim_uid-1.json".into(),
        ],
    );
    done.checkpoint_state = ClaimState::PrepareCompleted;
    done.prepared_devices = vec![device("vgpu-0", Some("s1"))];
    done.status =
        Some(serde_json::json!({"reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}]}));
    cp.claims_mut().insert("uid-1".into(), done);
    cp.claims_mut().insert(
        "uid-2".into(),
        PreparedClaim::started("ns", "c2", vec!["/etc/cdi/k8s.manager.nvidia.com-claim_uid-2.json".into()]),
    );
    cp
}

fn golden_v1() -> Checkpoint {
    let mut v1 = CheckpointV1::default();
    v1.prepared_claims.insert("uid-1".into(), vec![device("gpu-0", None)]);
    let mut cp = Checkpoint { checksum: 0, v1: Some(v1), v2: None };
    // A v1-only writer: the checksum covers the v1 object as it stands.
    cp.checksum = kubelet_checksum(&go_json(&cp).unwrap());
    cp
}

fn fixture(name: &str, fresh: &[u8]) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    if std::env::var_os("VGPU_REGEN").is_some() {
        std::fs::write(&path, fresh).unwrap();
    }
    std::fs::read(&path).unwrap()
}

#[test]
fn golden_v2_is_pinned_and_round_trips() {
    let bytes = golden_v2().encode().unwrap();
    let committed = fixture("checkpoint-v2.json", &bytes);
    assert_eq!(String::from_utf8(committed.clone()).unwrap(), String::from_utf8(bytes).unwrap());
    let back = Checkpoint::decode(&committed).unwrap();
    assert_eq!(back.claims(), golden_v2().claims());
    assert_eq!(back.boot_id(), "0b6c1c2e-7d1f-4b8e-9a51-2f8c2d9b1a10");
    let text = String::from_utf8(committed).unwrap();
    // The layout of contract §9, and v1 mirrors only the completed claim.
    for key in [
        "\"checksum\":",
        "\"v1\":{\"preparedClaims\":{\"uid-1\":[",
        "\"v2\":{\"checksum\":",
        "\"checkpointState\":\"PrepareCompleted\"",
        "\"checkpointState\":\"PrepareStarted\"",
        "\"nodeBootID\":\"0b6c1c2e",
        "\"cdiDeviceIDs\":",
        "\"shareID\":\"s1\"",
    ] {
        assert!(text.contains(key), "{key} not in {text}");
    }
    assert!(!text.contains("\"uid-2\":["), "a started claim is not in v1");
}

#[test]
fn golden_v1_is_upgraded() {
    let bytes = go_json(&golden_v1()).unwrap();
    let committed = fixture("checkpoint-v1.json", &bytes);
    assert_eq!(committed, bytes);
    let cp = Checkpoint::decode(&committed).unwrap();
    let claim = &cp.claims()["uid-1"];
    assert_eq!(claim.checkpoint_state, ClaimState::PrepareCompleted);
    assert_eq!(claim.prepared_devices, [device("gpu-0", None)]);
    assert!(claim.name.is_empty() && cp.boot_id().is_empty());
    assert!(!cp.rebooted("any-boot"), "no recorded boot ID: no invalidation");
    // Written back as v2 (with the v1 mirror), it reads the same.
    let again = Checkpoint::decode(&cp.encode().unwrap()).unwrap();
    assert_eq!(again.claims(), cp.claims());
}

/// The kubelet's `checksum.New(data []byte)` from its definition: FNV-1a 32 over spew's `%#v` of the byte
/// slice, `([]uint8)[b0 b1 …]` in decimal, built here as text (the crate hashes it without building it).
fn kubelet_checksum_by_definition(json: &[u8]) -> u32 {
    let rendered = format!("([]uint8)[{}]", json.iter().map(u8::to_string).collect::<Vec<_>>().join(" "));
    fnv1a32(rendered.as_bytes())
}

#[test]
fn the_committed_file_carries_the_kubelet_checksum() {
    let text = String::from_utf8(fixture("checkpoint-v2.json", &golden_v2().encode().unwrap())).unwrap();
    // Outer: the file with its own checksum field 0 (it is the first field, as in upstream's struct).
    let (head, rest) = text.strip_prefix("{\"checksum\":").unwrap().split_once(',').unwrap();
    let recorded: u32 = head.parse().unwrap();
    let zeroed = format!("{{\"checksum\":0,{rest}");
    assert_eq!(recorded, kubelet_checksum_by_definition(zeroed.as_bytes()));
    // v2: the v2 object alone (the file's last field), with its checksum 0.
    let v2 = &text[text.find("\"v2\":").unwrap() + 5..text.len() - 1];
    let (head, rest) = v2.strip_prefix("{\"checksum\":").unwrap().split_once(',').unwrap();
    let recorded: u32 = head.parse().unwrap();
    let zeroed = format!("{{\"checksum\":0,{rest}");
    assert_eq!(recorded, kubelet_checksum_by_definition(zeroed.as_bytes()));
    // The plain FNV of the JSON (what this crate computed before) is not the kubelet's.
    assert_ne!(recorded, fnv1a32(zeroed.as_bytes()));
}

#[test]
fn any_edit_breaks_a_checksum() {
    let text = String::from_utf8(golden_v2().encode().unwrap()).unwrap();
    let edited = text.replace("\"c2\"", "\"c3\"");
    let err = Checkpoint::decode(edited.as_bytes()).unwrap_err().to_string();
    assert!(err.contains("checksum") && err.contains("corrupt"), "{err}");
    // The v1 mirror is covered by the outer checksum.
    let edited = text.replacen("\"gpu\"", "\"gpx\"", 1);
    assert!(Checkpoint::decode(edited.as_bytes()).is_err());
}

fn arb_device() -> impl Strategy<Value = PreparedDevice> {
    (
        prop::collection::vec("[a-z]{1,8}", 0..3),
        "[a-z0-9-]{0,12}",
        "(vgpu|gpu)-[0-9]{1,2}",
        prop::option::of("[a-z0-9]{1,8}"),
        prop::collection::vec("\\PC{0,20}", 0..3),
        "\\PC{0,16}",
    )
        .prop_map(|(request_names, pool_name, device_name, share_id, cdi_device_ids, uuid)| {
            PreparedDevice { request_names, pool_name, device_name, share_id, cdi_device_ids, uuid }
        })
}

fn arb_claim() -> impl Strategy<Value = PreparedClaim> {
    (
        any::<bool>(),
        prop::option::of("\\PC{0,10}"),
        prop::collection::vec(arb_device(), 0..3),
        "\\PC{0,10}",
        "\\PC{0,10}",
        prop::collection::vec("\\PC{0,30}", 0..3),
        prop::collection::vec(("[a-zA-Z]{1,12}", any::<u32>(), "\\PC{0,12}"), 0..3),
    )
        .prop_map(|(done, status, prepared_devices, name, namespace, paths, actions)| PreparedClaim {
            checkpoint_state: if done { ClaimState::PrepareCompleted } else { ClaimState::PrepareStarted },
            status: status.map(|s| serde_json::json!({ "note": s })),
            prepared_devices,
            name,
            namespace,
            paths,
            register_uuids: Default::default(),
            host_actions: actions
                .into_iter()
                .map(|(mode, n, text)| vgpu_dra::modes::HostAction {
                    mode,
                    action: serde_json::json!({ "index": n, "path": text }),
                })
                .collect(),
        })
}

proptest! {
    #[test]
    fn encode_decode_is_the_identity(
        boot in "[0-9a-f-]{0,36}",
        claims in prop::collection::btree_map("\\PC{1,12}", arb_claim(), 0..5),
    ) {
        let mut cp = Checkpoint::new(&boot);
        *cp.claims_mut() = claims;
        let bytes = cp.encode().unwrap();
        let back = Checkpoint::decode(&bytes).unwrap();
        prop_assert_eq!(back.claims(), cp.claims());
        prop_assert_eq!(back.boot_id(), cp.boot_id());
        prop_assert_eq!(back.encode().unwrap(), bytes, "encoding is deterministic");
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Checkpoint::decode(&bytes);
    }

    #[test]
    fn decoding_mutated_checkpoints_never_panics(flip in 0usize..4096, byte in any::<u8>()) {
        let mut bytes = golden_v2().encode().unwrap();
        let at = flip % bytes.len();
        bytes[at] = byte;
        if let Ok(cp) = Checkpoint::decode(&bytes) {
            // Only an edit that leaves the canonical content unchanged may pass.
            let golden = golden_v2();
            prop_assert_eq!(cp.claims(), golden.claims());
        }
    }
}
