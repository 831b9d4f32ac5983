//! `sm_util.config` ABI (contract §7.3): every offset and size pinned as a literal, bytes at the pinned
//! offsets, errors for wrong size and counts, round-trip / never-panic properties (codec layer), and a
//! real file rewritten in place by one thread while another reads it (the reader only ever sees whole
//! images).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    fs::OpenOptions,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use proptest::prelude::*;
use vgpu_core::{
    abi::{
        AbiError,
        sm_util::{self, DeviceProcesses, ProcessInfo, SmUtil, lock_offset, offsets},
    },
    backend::ProcessUtilizationSample,
};

#[test]
fn constants_and_offsets_are_the_c_layout() {
    assert_eq!(sm_util::MAX_DEVICE_COUNT, 16);
    assert_eq!(sm_util::MAX_ENTRIES, 1024);
    assert_eq!(sm_util::SAMPLE_SIZE, 32);
    assert_eq!(sm_util::PROCESS_INFO_SIZE, 24);
    assert_eq!(sm_util::DEVICE_SIZE, 81_952);
    assert_eq!(sm_util::FILE_SIZE, 1_311_232);
    use offsets::device as d;
    assert_eq!(d::SAMPLES, 0);
    assert_eq!(d::SAMPLES_SIZE, 32_768);
    assert_eq!(d::LAST_SEEN_TS, 32_776);
    assert_eq!(d::COMPUTE, 32_784);
    assert_eq!(d::COMPUTE_SIZE, 57_360);
    assert_eq!(d::GRAPHICS, 57_368);
    assert_eq!(d::GRAPHICS_SIZE, 81_944);
    assert_eq!(d::LOCK_BYTE, 81_948);
    use offsets::sample as s;
    assert_eq!((s::PID, s::TIMESTAMP, s::SM, s::MEMORY, s::ENCODER, s::DECODER), (0, 8, 16, 20, 24, 28));
    use offsets::process as p;
    assert_eq!((p::PID, p::USED_MEMORY, p::GPU_INSTANCE_ID, p::COMPUTE_INSTANCE_ID), (0, 8, 16, 20));
    assert_eq!(lock_offset(0), 81_948);
    assert_eq!(lock_offset(1), 81_952 + 81_948);
    assert_eq!(sm_util::device_offset(15), 15 * 81_952);
}

fn sample(pid: u32, sm: u32) -> ProcessUtilizationSample {
    ProcessUtilizationSample {
        pid,
        timestamp_us: 1_700_000_000_000_000 + u64::from(pid),
        sm_percent: sm,
        memory_percent: 3,
        encoder_percent: 4,
        decoder_percent: 5,
    }
}

#[test]
fn bytes_land_at_the_pinned_offsets() {
    let mut util = SmUtil::default();
    util.devices[1] = DeviceProcesses {
        samples: vec![sample(4242, 55)],
        last_seen_ts: 0x1122_3344_5566_7788,
        compute: vec![ProcessInfo {
            pid: 4242,
            used_memory_bytes: Some(1 << 30),
            gpu_instance_id: 1,
            compute_instance_id: 2,
        }],
        graphics: vec![ProcessInfo { pid: 7, used_memory_bytes: None, ..ProcessInfo::default() }],
    };
    let b = util.encode();
    assert_eq!(b.len(), 1_311_232);
    let d = 81_952;
    assert_eq!(&b[d..d + 4], &4242u32.to_le_bytes());
    assert_eq!(&b[d + 8..d + 16], &(1_700_000_000_000_000u64 + 4242).to_le_bytes());
    assert_eq!(&b[d + 16..d + 20], &55u32.to_le_bytes());
    assert_eq!(&b[d + 20..d + 24], &3u32.to_le_bytes());
    assert_eq!(&b[d + 24..d + 28], &4u32.to_le_bytes());
    assert_eq!(&b[d + 28..d + 32], &5u32.to_le_bytes());
    assert_eq!(&b[d + 32_768..d + 32_772], &1u32.to_le_bytes());
    assert_eq!(&b[d + 32_776..d + 32_784], &0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(&b[d + 32_784..d + 32_788], &4242u32.to_le_bytes());
    assert_eq!(&b[d + 32_792..d + 32_800], &(1u64 << 30).to_le_bytes());
    assert_eq!(&b[d + 32_800..d + 32_804], &1u32.to_le_bytes());
    assert_eq!(&b[d + 32_804..d + 32_808], &2u32.to_le_bytes());
    assert_eq!(&b[d + 57_360..d + 57_364], &1u32.to_le_bytes());
    assert_eq!(&b[d + 57_368..d + 57_372], &7u32.to_le_bytes());
    assert_eq!(&b[d + 57_376..d + 57_384], &u64::MAX.to_le_bytes());
    assert_eq!(&b[d + 81_944..d + 81_948], &1u32.to_le_bytes());
    assert_eq!(b[d + 81_948], 0);
    // Device 0 untouched.
    assert!(b[..d].iter().all(|&x| x == 0));
}

#[test]
fn bad_files_are_named_errors() {
    let p = Path::new("/w/sm_util.config");
    let err = SmUtil::decode(&[0; 100], p).unwrap_err();
    assert!(matches!(err, AbiError::Size { expected: 1_311_232, actual: 100, .. }), "{err}");
    let mut bad = SmUtil::default().encode();
    bad[3 * 81_952 + 57_360..3 * 81_952 + 57_364].copy_from_slice(&5000u32.to_le_bytes());
    let err = SmUtil::decode(&bad, p).unwrap_err();
    assert!(err.to_string().contains("/w/sm_util.config: device 3: compute_size 5000 exceeds 1024"), "{err}");
}

#[test]
fn in_place_rewrites_are_never_seen_torn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(sm_util::FILE_NAME);
    // Two images whose every count and entry differ.
    let image = |n: u32| {
        let mut u = SmUtil::default();
        for d in &mut u.devices {
            d.samples = (0..n).map(|pid| sample(pid, n)).collect();
            d.last_seen_ts = u64::from(n);
            d.compute = (0..n)
                .map(|pid| ProcessInfo {
                    pid,
                    used_memory_bytes: Some(u64::from(n)),
                    ..ProcessInfo::default()
                })
                .collect();
        }
        u
    };
    let (a, b) = (image(3), image(900));
    sm_util::create(&path, &a).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (path, a, b, stop) = (path.clone(), a.clone(), b.clone(), stop.clone());
        std::thread::spawn(move || {
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            let mut scratch = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let next = if n.is_multiple_of(2) { &b } else { &a };
                sm_util::write_in_place(&file, &path, next, &mut scratch).unwrap();
                n += 1;
            }
            n
        })
    };
    let mut seen = 0;
    for _ in 0..50 {
        match sm_util::read(&path) {
            Ok(got) => {
                assert!(got == a || got == b, "a torn image was returned");
                seen += 1;
            }
            // A busy writer may outlast the attempts; that is reported, never a mixed image.
            Err(AbiError::Invalid { message, .. }) => assert!(message.contains("kept changing"), "{message}"),
            Err(other) => panic!("{other}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(writes > 0);
    assert!(seen > 0, "no read succeeded");
    // Without a writer the read is exact.
    let last = sm_util::read(&path).unwrap();
    assert!(last == a || last == b);
}

fn info() -> impl Strategy<Value = ProcessInfo> {
    (any::<u32>(), proptest::option::of(0u64..u64::MAX), any::<u32>(), any::<u32>()).prop_map(
        |(pid, used, gi, ci)| ProcessInfo {
            pid,
            used_memory_bytes: used,
            gpu_instance_id: gi,
            compute_instance_id: ci,
        },
    )
}

fn util_strategy() -> impl Strategy<Value = SmUtil> {
    let sample = (any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>())
        .prop_map(|(pid, timestamp_us, sm_percent, memory_percent, encoder_percent, decoder_percent)| {
            ProcessUtilizationSample {
                pid,
                timestamp_us,
                sm_percent,
                memory_percent,
                encoder_percent,
                decoder_percent,
            }
        });
    let device = (
        proptest::collection::vec(sample, 0..20),
        any::<u64>(),
        proptest::collection::vec(info(), 0..20),
        proptest::collection::vec(info(), 0..5),
    )
        .prop_map(|(samples, last_seen_ts, compute, graphics)| DeviceProcesses {
            samples,
            last_seen_ts,
            compute,
            graphics,
        });
    proptest::collection::vec((0usize..16, device), 0..4).prop_map(|slots| {
        let mut u = SmUtil::default();
        for (i, d) in slots {
            u.devices[i] = d;
        }
        u
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn round_trip(util in util_strategy()) {
        prop_assert_eq!(SmUtil::decode(&util.encode(), Path::new("f")).unwrap(), util);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = SmUtil::decode(&bytes, Path::new("f"));
    }

    #[test]
    fn corrupted_images_never_panic(util in util_strategy(), flips in proptest::collection::vec((0usize..1_311_232, any::<u8>()), 1..30)) {
        let mut bytes = util.encode();
        for (at, v) in flips {
            bytes[at] = v;
        }
        let _ = SmUtil::decode(&bytes, Path::new("f"));
    }
}
