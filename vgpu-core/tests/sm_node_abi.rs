//! `sm_node.config` ABI (contract §7.4): every offset and size pinned as a literal, bytes at the pinned
//! offsets, errors for wrong size/magic/layout, and round-trip / never-panic properties (codec layer, plus
//! a real file for `read`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use proptest::prelude::*;
use vgpu_core::abi::{
    AbiError,
    sm_node::{self, SmNode, SmNodeDevice, offsets},
};

#[test]
fn constants_and_offsets_are_the_c_layout() {
    assert_eq!(sm_node::MAGIC, 0x534D_4E44);
    assert_eq!(&sm_node::MAGIC.to_le_bytes(), b"DNMS");
    assert_eq!(sm_node::LAYOUT_VERSION, 3);
    assert_eq!(sm_node::FILE_SIZE, 8192);
    assert_eq!(sm_node::HEADER_SIZE, 128);
    assert_eq!(sm_node::DEVICE_SIZE, 128);
    assert_eq!(sm_node::REGION_SIZE, 2176);
    assert_eq!(
        (offsets::MAGIC, offsets::LAYOUT_VERSION, offsets::REGION_SIZE, offsets::DEVICE_COUNT),
        (0, 4, 8, 12)
    );
    assert_eq!(offsets::DEVICES, 128);
    use offsets::device as d;
    let pinned = [
        (d::CUR_CUDA_CORES, 0),
        (d::TOTAL_CUDA_CORES, 8),
        (d::LAST_REFILL_NS, 16),
        (d::SHARE, 24),
        (d::SAMPLE_PUBLISHED_NS, 32),
        (d::UP_LIMIT, 40),
        (d::IS_CNT, 44),
        (d::AVG_SYS_FREE, 48),
        (d::PRE_EXTERNAL_PROC, 52),
        (d::MD_COOLDOWN, 56),
        (d::EXCL_DEBOUNCED, 60),
        (d::EXCL_STREAK, 64),
        (d::LOST_EXCL_PENDING, 68),
        (d::THROTTLED_SINCE_WATCH, 72),
        (d::S_USER_CURRENT, 76),
        (d::S_SYS_CURRENT, 80),
        (d::S_SYS_PROCESS_NUM, 84),
        (d::S_EXTERNAL_PROC_NUM, 88),
        (d::LEADER_PID, 92),
        (d::SAMPLE_INTERVAL_NS, 96),
    ];
    for (got, want) in pinned {
        assert_eq!(got, want);
    }
    assert_eq!(d::SAMPLE_INTERVAL_NS + 8, 104); // padding to 128
    assert_eq!(sm_node::device_offset(1), 256);
}

#[test]
fn bytes_land_at_the_pinned_offsets() {
    let mut node = SmNode::default();
    node.devices[1] = SmNodeDevice {
        cur_cuda_cores: -5,
        total_cuda_cores: 1 << 40,
        up_limit: 70,
        leader_pid: 4242,
        sample_interval_ns: 100_000_000,
        ..SmNodeDevice::default()
    };
    let b = node.encode();
    assert_eq!(b.len(), 8192);
    assert_eq!(&b[0..4], b"DNMS");
    assert_eq!(&b[4..8], &3u32.to_le_bytes());
    assert_eq!(&b[8..12], &2176u32.to_le_bytes());
    assert_eq!(&b[12..16], &16u32.to_le_bytes());
    assert_eq!(&b[256..264], &(-5i64).to_le_bytes());
    assert_eq!(&b[264..272], &(1i64 << 40).to_le_bytes());
    assert_eq!(&b[296..300], &70i32.to_le_bytes());
    assert_eq!(&b[348..352], &4242i32.to_le_bytes());
    assert_eq!(&b[352..360], &100_000_000i64.to_le_bytes());
    assert!(b[360..384].iter().all(|&x| x == 0));
}

#[test]
fn bad_files_are_named_errors_and_read_works_on_real_files() {
    let p = Path::new("/x/sm_node.config");
    let good = SmNode::default().encode();
    assert!(matches!(SmNode::decode(&good[..100], p).unwrap_err(), AbiError::Size { actual: 100, .. }));
    let mut bad = good.clone();
    bad[1] = 0;
    assert!(matches!(SmNode::decode(&bad, p).unwrap_err(), AbiError::Magic { .. }));
    let mut bad = good.clone();
    bad[4] = 1;
    let err = SmNode::decode(&bad, p).unwrap_err();
    assert!(err.to_string().contains("/x/sm_node.config: unsupported layout version 1, expected 3"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(sm_node::FILE_NAME);
    let mut node = SmNode::default();
    node.devices[0].share = 77;
    sm_node::write(&path, &node).unwrap();
    assert_eq!(sm_node::read(&path).unwrap(), node);
    std::fs::write(&path, [0u8; 8193]).unwrap();
    assert!(matches!(sm_node::read(&path).unwrap_err(), AbiError::Size { actual: 8193, .. }));
}

proptest! {
    #[test]
    fn round_trip(raw in proptest::collection::vec(any::<u8>(), 8192)) {
        // Any device bytes decode; the decoded value encodes to an image that decodes to itself.
        let mut bytes = SmNode::default().encode();
        bytes[128..2176].copy_from_slice(&raw[128..2176]);
        let node = SmNode::decode(&bytes, Path::new("f")).unwrap();
        prop_assert_eq!(SmNode::decode(&node.encode(), Path::new("f")).unwrap(), node);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
        let _ = SmNode::decode(&bytes, Path::new("f"));
    }
}
