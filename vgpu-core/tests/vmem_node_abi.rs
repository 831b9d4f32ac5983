//! `vmem_node.config` ABI (contract §7.2): every offset and size pinned as a literal, bytes at the pinned
//! offsets, errors for wrong size/magic/layout/count, and round-trip / never-panic properties (codec layer,
//! plus real files in a temp dir for `read`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use proptest::prelude::*;
use vgpu_core::abi::{
    AbiError,
    vmem_node::{self, ProcessUsed, VmemNode, lock_offset, offsets},
};

#[test]
fn constants_and_offsets_are_the_c_layout() {
    assert_eq!(vmem_node::MAGIC, 0x564D_4E44);
    assert_eq!(&vmem_node::MAGIC.to_le_bytes(), b"DNMV");
    assert_eq!(vmem_node::LAYOUT_VERSION, 1);
    assert_eq!(vmem_node::FILE_SIZE, 327_680);
    assert_eq!(vmem_node::HEADER_SIZE, 128);
    assert_eq!(vmem_node::REGION_SIZE, 262_400);
    assert_eq!(vmem_node::DEVICE_SIZE, 16_392);
    assert_eq!(vmem_node::PROCESS_SIZE, 16);
    assert_eq!(vmem_node::MAX_PROCESSES, 1024);
    assert_eq!(vmem_node::MAX_DEVICE_COUNT, 16);
    assert_eq!(offsets::MAGIC, 0);
    assert_eq!(offsets::LAYOUT_VERSION, 4);
    assert_eq!(offsets::REGION_SIZE, 8);
    assert_eq!(offsets::DEVICE_COUNT, 12);
    assert_eq!(offsets::DEVICES, 128);
    assert_eq!(offsets::device::PROCESSES, 0);
    assert_eq!(offsets::device::PROCESSES_SIZE, 16_384);
    assert_eq!(offsets::device::LOCK_BYTE, 16_388);
    assert_eq!(offsets::process::PID, 0);
    assert_eq!(offsets::process::USED, 8);
    assert_eq!(lock_offset(0), 16_516);
    assert_eq!(lock_offset(1), 32_908);
    assert_eq!(vmem_node::device_offset(15), 128 + 15 * 16_392);
}

#[test]
fn bytes_land_at_the_pinned_offsets() {
    let mut node = VmemNode::default();
    node.devices[1] =
        vec![ProcessUsed { pid: 4242, used: 0x0102_0304_0506_0708 }, ProcessUsed { pid: -1, used: 9 }];
    let b = node.encode();
    assert_eq!(b.len(), 327_680);
    assert_eq!(&b[0..4], b"DNMV");
    assert_eq!(&b[4..8], &1u32.to_le_bytes());
    assert_eq!(&b[8..12], &262_400u32.to_le_bytes());
    assert_eq!(&b[12..16], &16u32.to_le_bytes());
    let d1 = 128 + 16_392;
    assert_eq!(&b[d1..d1 + 4], &4242i32.to_le_bytes());
    assert_eq!(&b[d1 + 4..d1 + 8], &[0; 4]);
    assert_eq!(&b[d1 + 8..d1 + 16], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&b[d1 + 16..d1 + 20], &(-1i32).to_le_bytes());
    assert_eq!(&b[d1 + 16_384..d1 + 16_388], &2u32.to_le_bytes());
    // Device 0 is empty.
    assert_eq!(&b[128 + 16_384..128 + 16_388], &0u32.to_le_bytes());
    assert!(b[128 + 16 * 16_392..].iter().all(|&x| x == 0));
}

#[test]
fn bad_files_are_named_errors() {
    let p = Path::new("/x/vmem_node.config");
    let good = VmemNode::default().encode();
    let err = VmemNode::decode(&good[..1000], p).unwrap_err();
    assert!(matches!(err, AbiError::Size { expected: 327_680, actual: 1000, .. }), "{err}");
    assert!(err.to_string().contains("/x/vmem_node.config"), "{err}");
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(VmemNode::decode(&bad, p).unwrap_err(), AbiError::Magic { .. }));
    let mut bad = good.clone();
    bad[4] = 2;
    let err = VmemNode::decode(&bad, p).unwrap_err();
    assert!(err.to_string().contains("layout version 2"), "{err}");
    let mut bad = good.clone();
    bad[128 + 16_384..128 + 16_388].copy_from_slice(&1025u32.to_le_bytes());
    let err = VmemNode::decode(&bad, p).unwrap_err();
    assert!(err.to_string().contains("device 0: processes_size 1025 exceeds 1024"), "{err}");
}

#[test]
fn read_from_a_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(vmem_node::FILE_NAME);
    let mut node = VmemNode::default();
    node.devices[15] = (0..1024).map(|i| ProcessUsed { pid: i, used: u64::from(i as u32) << 20 }).collect();
    vmem_node::write(&path, &node).unwrap();
    assert_eq!(vmem_node::read(&path).unwrap(), node);
    // Only the slots asked for.
    let some = vmem_node::read_slots(&path, &[15, 3]).unwrap();
    assert_eq!(some.devices[15], node.devices[15]);
    assert!(some.devices[..15].iter().all(Vec::is_empty));
    std::fs::write(&path, b"short").unwrap();
    assert!(matches!(vmem_node::read_slots(&path, &[0]).unwrap_err(), AbiError::Size { actual: 5, .. }));
    assert!(matches!(vmem_node::read(&path).unwrap_err(), AbiError::Size { actual: 5, .. }));
    let err = vmem_node::read(&dir.path().join("missing")).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
}

fn node_strategy() -> impl Strategy<Value = VmemNode> {
    proptest::collection::vec(
        (0usize..16, proptest::collection::vec((any::<i32>(), any::<u64>()), 0..40)),
        0..6,
    )
    .prop_map(|slots| {
        let mut node = VmemNode::default();
        for (i, entries) in slots {
            node.devices[i] = entries.into_iter().map(|(pid, used)| ProcessUsed { pid, used }).collect();
        }
        node
    })
}

proptest! {
    #[test]
    fn round_trip(node in node_strategy()) {
        let bytes = node.encode();
        prop_assert_eq!(VmemNode::decode(&bytes, Path::new("f")).unwrap(), node);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = VmemNode::decode(&bytes, Path::new("f"));
    }

    #[test]
    fn corrupted_images_never_panic(node in node_strategy(), flips in proptest::collection::vec((0usize..327_680, any::<u8>()), 1..20)) {
        let mut bytes = node.encode();
        for (at, v) in flips {
            bytes[at] = v;
        }
        let _ = VmemNode::decode(&bytes, Path::new("f"));
    }
}
