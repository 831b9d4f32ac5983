//! `vgpu.config` ABI (contract §7.1): every offset and size pinned as a literal, a documented example as a
//! hex dump, the field rules, and round-trip / never-panic properties.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use proptest::prelude::*;
use vgpu_core::{
    abi::{
        AbiError,
        vgpu_config::{
            self, BuildOptions, ContainerIdentity, CudaVersion, DeviceConfig, VgpuConfig, lock_offset,
            offsets,
        },
    },
    model::{ComputePolicy, DeviceClaim, GpuDevice},
};

#[test]
fn constants_and_offsets_are_the_c_layout() {
    assert_eq!(vgpu_config::MAGIC, 0x5647_4346);
    assert_eq!(&vgpu_config::MAGIC.to_le_bytes(), b"FCGV"); // "VGCF" as a big-endian word
    assert_eq!(vgpu_config::LAYOUT_VERSION, 1);
    assert_eq!(vgpu_config::FILE_SIZE, 8192);
    assert_eq!(vgpu_config::REGION_SIZE, 2560);
    assert_eq!(vgpu_config::MAX_DEVICE_COUNT, 16);
    assert_eq!(vgpu_config::UUID_BUFFER_SIZE, 48);
    assert_eq!(vgpu_config::NAME_BUFFER_SIZE, 64);
    assert_eq!(vgpu_config::DRIVER_VERSION_BUFFER_SIZE, 32);
    assert_eq!(vgpu_config::DEVICE_SIZE, 128);
    assert_eq!(vgpu_config::DEVICES_OFFSET, 512);
    assert_eq!(vgpu_config::DEVICES_OFFSET + 16 * vgpu_config::DEVICE_SIZE, 2560);

    let header = [
        (offsets::MAGIC, 0),
        (offsets::LAYOUT_VERSION, 4),
        (offsets::REGION_SIZE, 8),
        (offsets::DEVICE_COUNT, 12),
        (offsets::CUDA_MAJOR, 16),
        (offsets::CUDA_MINOR, 20),
        (offsets::DRIVER_VERSION, 24),
        (offsets::POD_UID, 128),
        (offsets::POD_NAME, 176),
        (offsets::POD_NAMESPACE, 240),
        (offsets::CONTAINER_NAME, 304),
        (offsets::REG_UUID, 368),
        (offsets::COMPATIBILITY_MODE, 416),
        (offsets::SM_WATCHER, 420),
        (offsets::VMEM_NODE, 424),
    ];
    for (got, want) in header {
        assert_eq!(got, want);
    }
    use offsets::device as d;
    let device = [
        (d::SEQ, 0),
        (d::UUID, 8),
        (d::TOTAL_MEMORY, 56),
        (d::REAL_MEMORY, 64),
        (d::HARD_CORE, 72),
        (d::SOFT_CORE, 76),
        (d::CORE_LIMIT, 80),
        (d::HARD_LIMIT, 84),
        (d::MEMORY_LIMIT, 88),
        (d::MEMORY_OVERSOLD, 92),
        (d::ACTIVATE, 96),
        (d::RESERVED, 100),
    ];
    for (got, want) in device {
        assert_eq!(got, want);
    }
    assert_eq!(d::RESERVED + 7 * 4, 128);
    assert_eq!(lock_offset(0), 512);
    assert_eq!(lock_offset(1), 640);
    assert_eq!(lock_offset(15), 2432);
}

fn gpu(index: u32, uuid: &str, memory_mib: u64, cores: u64) -> GpuDevice {
    GpuDevice { index, uuid: uuid.into(), memory_mib, cores, split_count: 10, ..GpuDevice::default() }
}

fn claim(index: u32, uuid: &str, cores: u64, memory_mib: u64) -> DeviceClaim {
    DeviceClaim { index, uuid: uuid.into(), cores, memory_mib }
}

/// `xxd`-like dump of the rows that are not all zero.
fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (row, chunk) in bytes.chunks(16).enumerate() {
        if chunk.iter().all(|&b| b == 0) {
            continue;
        }
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{:04x}: {}\n", row * 16, hex.join(" ")));
    }
    out
}

/// The documented example: pod `default/p` (uid `uid-1`), container `main`, CUDA 12.4, driver 570.86.10,
/// compatibility mode 2 (cgroup v2), SM watcher on; one claim of 50 cores and 4096 MiB on host GPU 1
/// (`GPU-b`, 8192 MiB, 100 cores), policy fixed, scaling 1.
#[test]
fn documented_example_hex_dump() {
    let identity = ContainerIdentity {
        pod_uid: "uid-1".into(),
        pod_name: "p".into(),
        pod_namespace: "default".into(),
        container_name: "main".into(),
        register_uuid: String::new(),
    };
    let options = BuildOptions {
        compatibility_mode: 2,
        sm_watcher: true,
        cuda_version: CudaVersion { major: 12, minor: 4 },
        driver_version: "570.86.10".into(),
        ..BuildOptions::default()
    };
    let devices = [gpu(0, "GPU-a", 8192, 100), gpu(1, "GPU-b", 8192, 100)];
    let config = VgpuConfig::build(&identity, &options, &[claim(1, "GPU-b", 50, 4096)], &devices).unwrap();
    let bytes = config.encode();
    assert_eq!(bytes.len(), 8192);
    let expected = "\
0000: 46 43 47 56 01 00 00 00 00 0a 00 00 10 00 00 00
0010: 0c 00 00 00 04 00 00 00 35 37 30 2e 38 36 2e 31
0020: 30 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0080: 75 69 64 2d 31 00 00 00 00 00 00 00 00 00 00 00
00b0: 70 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00f0: 64 65 66 61 75 6c 74 00 00 00 00 00 00 00 00 00
0130: 6d 61 69 6e 00 00 00 00 00 00 00 00 00 00 00 00
01a0: 02 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00
0280: 00 00 00 00 00 00 00 00 47 50 55 2d 62 00 00 00
02b0: 00 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00
02c0: 00 00 00 00 01 00 00 00 32 00 00 00 32 00 00 00
02d0: 01 00 00 00 01 00 00 00 01 00 00 00 00 00 00 00
02e0: 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
";
    assert_eq!(hex_dump(&bytes), expected);
}

#[test]
fn field_rules() {
    let dev = gpu(0, "GPU-a", 8192, 100);
    let opts = |policy, scaling: f64| BuildOptions {
        compute_policy: policy,
        memory_scaling: scaling,
        ..BuildOptions::default()
    };
    // fixed, partial cores: both limits.
    let e = DeviceConfig::for_claim(&claim(0, "GPU-a", 30, 1024), &dev, &opts(ComputePolicy::Fixed, 1.0));
    assert_eq!((e.hard_core, e.soft_core, e.core_limit, e.hard_limit), (30, 30, 1, 1));
    assert_eq!(
        (e.total_memory, e.real_memory, e.memory_limit, e.memory_oversold, e.activate),
        (1 << 30, 1 << 30, 1, 0, 1)
    );
    // fixed, whole card: no limits at all (memory == device memory and scaling 1).
    let e = DeviceConfig::for_claim(&claim(0, "GPU-a", 100, 8192), &dev, &opts(ComputePolicy::Fixed, 1.0));
    assert_eq!((e.core_limit, e.hard_limit, e.memory_limit), (0, 0, 0));
    // balance: soft = device cores, core limit, no hard limit below the device's cores.
    let e = DeviceConfig::for_claim(&claim(0, "GPU-a", 30, 1024), &dev, &opts(ComputePolicy::Balance, 1.0));
    assert_eq!((e.hard_core, e.soft_core, e.core_limit, e.hard_limit), (30, 100, 1, 0));
    // balance on a device with fewer cores than asked (cores scaling < 1): hard limit.
    let small = gpu(0, "GPU-a", 8192, 50);
    let e = DeviceConfig::for_claim(&claim(0, "GPU-a", 60, 1024), &small, &opts(ComputePolicy::Balance, 1.0));
    assert_eq!((e.soft_core, e.core_limit, e.hard_limit), (50, 1, 1));
    // none: no core limits.
    let e = DeviceConfig::for_claim(&claim(0, "GPU-a", 30, 1024), &dev, &opts(ComputePolicy::None, 1.0));
    assert_eq!((e.core_limit, e.hard_limit), (0, 0));
    // oversold memory: real = total / ratio; whole card still limited.
    let e = DeviceConfig::for_claim(&claim(0, "GPU-a", 100, 8192), &dev, &opts(ComputePolicy::Fixed, 2.0));
    assert_eq!((e.total_memory, e.real_memory, e.memory_limit, e.memory_oversold), (8 << 30, 4 << 30, 1, 1));
    // CUDA_MEM_OVERSOLD alone.
    let o = BuildOptions { memory_oversold: true, ..BuildOptions::default() };
    let e = DeviceConfig::for_claim(&claim(0, "GPU-a", 10, 10), &dev, &o);
    assert_eq!((e.memory_oversold, e.real_memory), (1, 10 << 20));
}

#[test]
fn build_skips_high_indices_and_rejects_unknown_gpus() {
    let id = ContainerIdentity::default();
    let o = BuildOptions::default();
    let devices = [gpu(16, "GPU-x", 100, 100)];
    let c = VgpuConfig::build(&id, &o, &[claim(16, "GPU-x", 10, 10)], &devices).unwrap();
    assert!(c.devices.iter().all(|d| d.activate == 0));
    // The device id decides, not the claim's index: a claim saying 0 for a device with id 16 is skipped.
    let c = VgpuConfig::build(&id, &o, &[claim(0, "GPU-x", 10, 10)], &devices).unwrap();
    assert!(c.devices.iter().all(|d| d.activate == 0));
    let err = VgpuConfig::build(&id, &o, &[claim(0, "GPU-nope", 10, 10)], &devices).unwrap_err();
    assert_eq!(err.to_string(), "claimed GPU GPU-nope (index 0 in the claim) is not on this node");
}

/// Upstream places a claim at the node device id found through the claim's UUID; the claim's index is
/// ignored (a stale or hand-edited index cannot move the slot).
#[test]
fn build_places_claims_by_the_uuid_device_id() {
    let id = ContainerIdentity::default();
    let o = BuildOptions::default();
    let devices = [gpu(0, "GPU-a", 8192, 100), gpu(3, "GPU-d", 8192, 100), gpu(15, "GPU-p", 8192, 100)];
    let claims = [claim(7, "GPU-d", 50, 1024), claim(0, "GPU-p", 20, 2048), claim(15, "GPU-a", 100, 8192)];
    let c = VgpuConfig::build(&id, &o, &claims, &devices).unwrap();
    let placed: Vec<(usize, &str, i32)> = c
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.activate == 1)
        .map(|(i, d)| (i, d.uuid.as_str(), d.hard_core))
        .collect();
    assert_eq!(placed, [(0, "GPU-a", 100), (3, "GPU-d", 50), (15, "GPU-p", 20)]);
    // The slot's memory rule compares with the device found by UUID (whole card on GPU-a: no limit).
    assert_eq!(c.devices[0].memory_limit, 0);
}

proptest! {
    /// Whatever index a claim carries, its slot is the device id of its UUID (or none when that id is ≥ 16).
    #[test]
    fn build_slot_is_the_device_id_of_the_uuid(
        ids in proptest::sample::subsequence((0u32..20).collect::<Vec<_>>(), 1..8),
        claim_indices in proptest::collection::vec(any::<u32>(), 8),
        pick in proptest::sample::subsequence((0usize..8).collect::<Vec<_>>(), 0..8),
    ) {
        let devices: Vec<GpuDevice> = ids.iter().map(|&i| gpu(i, &format!("GPU-{i}"), 4096, 100)).collect();
        let claims: Vec<DeviceClaim> = pick
            .iter()
            .filter_map(|&p| devices.get(p))
            .zip(&claim_indices)
            .map(|(d, &index)| claim(index, &d.uuid, 10, 100))
            .collect();
        let c = VgpuConfig::build(&ContainerIdentity::default(), &BuildOptions::default(), &claims, &devices).unwrap();
        for (slot, entry) in c.devices.iter().enumerate() {
            let want = claims.iter().find(|cl| cl.uuid == format!("GPU-{slot}"));
            prop_assert_eq!(entry.activate == 1, want.is_some(), "slot {}", slot);
            if let Some(cl) = want {
                prop_assert_eq!(&entry.uuid, &cl.uuid);
            }
        }
    }
}

#[test]
fn strings_are_truncated_with_a_nul() {
    let c = VgpuConfig { pod_uid: "u".repeat(100), pod_name: "é".repeat(40), ..VgpuConfig::default() };
    let bytes = c.encode();
    assert_eq!(bytes[offsets::POD_UID + 46], b'u');
    assert_eq!(bytes[offsets::POD_UID + 47], 0);
    let back = VgpuConfig::decode(&bytes, Path::new("x")).unwrap();
    assert_eq!(back.pod_uid, "u".repeat(47));
    assert_eq!(back.pod_name, "é".repeat(31)); // 62 bytes: a 2-byte char never straddles byte 63
}

#[test]
fn reader_rejects_bad_files_with_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vgpu.config");
    let good = VgpuConfig::default().encode();

    let check = |bytes: &[u8], want: &str| {
        std::fs::write(&path, bytes).unwrap();
        let err = vgpu_config::read(&path).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("vgpu.config"), "{text}");
        assert!(text.contains(want), "{text} should contain {want}");
        err
    };
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(check(&bad, "bad magic"), AbiError::Magic { .. }));
    let mut bad = good.clone();
    bad[4] = 2;
    assert!(matches!(check(&bad, "unsupported layout version 2, expected 1"), AbiError::Header { .. }));
    let mut bad = good.clone();
    bad[9] = 0; // 2560 = 0x0a00: the high byte
    assert!(matches!(check(&bad, "region size"), AbiError::Header { .. }));
    let mut bad = good.clone();
    bad[12] = 8;
    assert!(matches!(check(&bad, "device count"), AbiError::Header { .. }));
    assert!(matches!(check(&good[..4096], "size is 4096 bytes, expected 8192"), AbiError::Size { .. }));
    assert!(matches!(check(&good[..3], "size is 3 bytes"), AbiError::Size { .. }));
    let mut bad = good.clone();
    bad[lock_offset(3)] = 1;
    assert!(matches!(check(&bad, "device 3 is being modified"), AbiError::Busy { index: 3, seq: 1, .. }));

    let missing = dir.path().join("absent/vgpu.config");
    let err = vgpu_config::read(&missing).unwrap_err();
    assert!(err.to_string().contains("absent/vgpu.config: read"), "{err}");
}

#[test]
fn write_is_atomic_and_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vgpu.config");
    std::fs::write(&path, b"stale").unwrap();
    let c = VgpuConfig { pod_name: "p".into(), ..VgpuConfig::default() };
    vgpu_config::write(&path, &c).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), c.encode());
    assert_eq!(vgpu_config::read(&path).unwrap(), c);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("[a-zA-Z0-9._-]{{0,{max}}}")).unwrap()
}

prop_compose! {
    fn device()(
        seq in (0u32..1000).prop_map(|s| s * 2),
        uuid in text(47),
        total_memory in any::<u64>(), real_memory in any::<u64>(),
        ints in proptest::array::uniform7(any::<i32>()),
    ) -> DeviceConfig {
        DeviceConfig {
            seq, uuid, total_memory, real_memory,
            hard_core: ints[0], soft_core: ints[1], core_limit: ints[2], hard_limit: ints[3],
            memory_limit: ints[4], memory_oversold: ints[5], activate: ints[6],
        }
    }
}

prop_compose! {
    fn config()(
        major in any::<i32>(), minor in any::<i32>(),
        driver_version in text(31),
        pod_uid in text(47), pod_name in text(63), pod_namespace in text(63), container_name in text(63),
        register_uuid in text(47),
        flags in proptest::array::uniform3(any::<i32>()),
        devices in proptest::array::uniform16(device()),
    ) -> VgpuConfig {
        VgpuConfig {
            cuda_version: CudaVersion { major, minor }, driver_version,
            pod_uid, pod_name, pod_namespace, container_name, register_uuid,
            compatibility_mode: flags[0], sm_watcher: flags[1], vmem_node: flags[2], devices,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn write_read_round_trip(c in config()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.config");
        vgpu_config::write(&path, &c).unwrap();
        prop_assert_eq!(vgpu_config::read(&path).unwrap(), c);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
        let _ = VgpuConfig::decode(&bytes, Path::new("fuzz"));
    }

    #[test]
    fn valid_header_with_arbitrary_body_never_panics(body in proptest::collection::vec(any::<u8>(), 8176)) {
        let mut bytes = VgpuConfig::default().encode();
        bytes[16..].copy_from_slice(&body);
        let _ = VgpuConfig::decode(&bytes, Path::new("fuzz"));
    }
}
