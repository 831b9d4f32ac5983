//! `vgpu.config`: the `resource_data_t` image the control library reads (contract §7.1).
//!
//! A raw little-endian struct image, file size exactly [`FILE_SIZE`] (8192) bytes, of which the first
//! [`REGION_SIZE`] (2560) are the struct and the rest zero:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | `u32 magic` = [`MAGIC`] (`0x56474346`, "VGCF") |
//! | 4 | 4 | `u32 layout_version` = [`LAYOUT_VERSION`] (1) |
//! | 8 | 4 | `u32 region_size` = 2560 |
//! | 12 | 4 | `u32 device_count` = 16 |
//! | 16 | 8 | `version_t cuda_version { i32 major; i32 minor }` |
//! | 24 | 32 | `char driver_version[32]` |
//! | 56 | 72 | padding to 128 |
//! | 128 | 48 | `char pod_uid[48]` |
//! | 176 | 64 | `char pod_name[64]` |
//! | 240 | 64 | `char pod_namespace[64]` |
//! | 304 | 64 | `char container_name[64]` |
//! | 368 | 48 | `char reg_uuid[48]` |
//! | 416 | 4 | `i32 compatibility_mode` |
//! | 420 | 4 | `i32 sm_watcher` |
//! | 424 | 4 | `i32 vmem_node` |
//! | 428 | 84 | padding to 512 |
//! | 512 | 16 × 128 | `device_t devices[16]`, indexed by **host** GPU index (the node device id found by the claim's UUID) |
//!
//! `device_t` (128 bytes, cache-line aligned): `u32 seq`@0, `u32 pad`@4, `char uuid[48]`@8,
//! `u64 total_memory`@56 (bytes), `u64 real_memory`@64, `i32 hard_core`@72, `i32 soft_core`@76,
//! `i32 core_limit`@80, `i32 hard_limit`@84, `i32 memory_limit`@88, `i32 memory_oversold`@92,
//! `i32 activate`@96, `i32 reserved[7]`@100.
//!
//! Strings are NUL-terminated: at most `len - 1` bytes are copied (cut back to a UTF-8 character boundary).
//! `seq` is the per-device seqlock word (even = stable, odd = a writer is inside); its lock byte for OFD
//! locks is [`lock_offset`]. This module writes fresh files only (seq 0); in-place modification through a
//! shared mapping is the library's business and never done by rename.

use std::path::Path;

use super::{AbiError, atomic::write_atomic};
use crate::model::{ComputePolicy, DeviceClaim, GpuDevice};

/// `CONFIG_MAGIC`: "VGCF" read as a little-endian `u32`.
pub const MAGIC: u32 = 0x5647_4346;
/// `CONFIG_LAYOUT_VERSION`.
pub const LAYOUT_VERSION: u32 = 1;
/// `CONFIG_FILE_SIZE`: the file is truncated to exactly this size.
pub const FILE_SIZE: usize = 8192;
/// `sizeof(resource_data_t)`.
pub const REGION_SIZE: usize = 2560;
/// `MAX_DEVICE_COUNT`: device slots; claims on a device whose host index is ≥ this are skipped.
pub const MAX_DEVICE_COUNT: usize = 16;
/// UUID buffers (`pod_uid`, `reg_uuid`, device `uuid`).
pub const UUID_BUFFER_SIZE: usize = 48;
/// Name buffers (`pod_name`, `pod_namespace`, `container_name`).
pub const NAME_BUFFER_SIZE: usize = 64;
/// `DRIVER_VERSION_BUFFER_SIZE`.
pub const DRIVER_VERSION_BUFFER_SIZE: usize = 32;
/// `CACHELINE`: size of one `device_t`.
pub const DEVICE_SIZE: usize = 128;
/// Offset of `devices[0]`.
pub const DEVICES_OFFSET: usize = 512;
/// File name inside `<manager-dir>/<podUID>_<ctr>/config/`.
pub const FILE_NAME: &str = "vgpu.config";

/// Header field offsets.
pub mod offsets {
    /// `magic`.
    pub const MAGIC: usize = 0;
    /// `layout_version`.
    pub const LAYOUT_VERSION: usize = 4;
    /// `region_size`.
    pub const REGION_SIZE: usize = 8;
    /// `device_count`.
    pub const DEVICE_COUNT: usize = 12;
    /// `cuda_version.major`.
    pub const CUDA_MAJOR: usize = 16;
    /// `cuda_version.minor`.
    pub const CUDA_MINOR: usize = 20;
    /// `driver_version`.
    pub const DRIVER_VERSION: usize = 24;
    /// `pod_uid`.
    pub const POD_UID: usize = 128;
    /// `pod_name`.
    pub const POD_NAME: usize = 176;
    /// `pod_namespace`.
    pub const POD_NAMESPACE: usize = 240;
    /// `container_name`.
    pub const CONTAINER_NAME: usize = 304;
    /// `reg_uuid`.
    pub const REG_UUID: usize = 368;
    /// `compatibility_mode`.
    pub const COMPATIBILITY_MODE: usize = 416;
    /// `sm_watcher`.
    pub const SM_WATCHER: usize = 420;
    /// `vmem_node`.
    pub const VMEM_NODE: usize = 424;

    /// Offsets inside one `device_t`.
    pub mod device {
        /// `seq` (seqlock word).
        pub const SEQ: usize = 0;
        /// `uuid`.
        pub const UUID: usize = 8;
        /// `total_memory`.
        pub const TOTAL_MEMORY: usize = 56;
        /// `real_memory`.
        pub const REAL_MEMORY: usize = 64;
        /// `hard_core`.
        pub const HARD_CORE: usize = 72;
        /// `soft_core`.
        pub const SOFT_CORE: usize = 76;
        /// `core_limit`.
        pub const CORE_LIMIT: usize = 80;
        /// `hard_limit`.
        pub const HARD_LIMIT: usize = 84;
        /// `memory_limit`.
        pub const MEMORY_LIMIT: usize = 88;
        /// `memory_oversold`.
        pub const MEMORY_OVERSOLD: usize = 92;
        /// `activate`.
        pub const ACTIVATE: usize = 96;
        /// `reserved[7]`.
        pub const RESERVED: usize = 100;
    }
}

/// The byte the seqlock's OFD lock covers for device slot `index` (`GET_CONFIG_LOCK_OFFSET`): its `seq` word.
pub const fn lock_offset(index: usize) -> usize {
    DEVICES_OFFSET + index * DEVICE_SIZE + offsets::device::SEQ
}

/// `version_t`: the CUDA driver API version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CudaVersion {
    /// Major (e.g. 12).
    pub major: i32,
    /// Minor (e.g. 4).
    pub minor: i32,
}

/// One `device_t` slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeviceConfig {
    /// Seqlock word (even when stable).
    pub seq: u32,
    /// GPU UUID (empty for an unused slot).
    pub uuid: String,
    /// Memory granted, bytes.
    pub total_memory: u64,
    /// Physical memory behind the grant, bytes (`total / memoryScaling` when oversold).
    pub real_memory: u64,
    /// Cores granted (percent).
    pub hard_core: i32,
    /// Soft core ceiling (percent).
    pub soft_core: i32,
    /// 1 = limit cores.
    pub core_limit: i32,
    /// 1 = the core limit is hard.
    pub hard_limit: i32,
    /// 1 = limit memory.
    pub memory_limit: i32,
    /// 1 = memory is oversold (virtual memory).
    pub memory_oversold: i32,
    /// 1 = slot in use.
    pub activate: i32,
}

/// The decoded `resource_data_t`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct VgpuConfig {
    /// CUDA driver API version.
    pub cuda_version: CudaVersion,
    /// NVIDIA driver version string (e.g. `570.86.10`).
    pub driver_version: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Container name.
    pub container_name: String,
    /// Client-mode register UUID (empty on the device-plugin path).
    pub register_uuid: String,
    /// `MANAGER_COMPATIBILITY_MODE` bits (contract §7.5).
    pub compatibility_mode: i32,
    /// 1 = the shared SM watcher is on.
    pub sm_watcher: i32,
    /// 1 = virtual-memory node tracking is on.
    pub vmem_node: i32,
    /// Device slots by host GPU index.
    pub devices: [DeviceConfig; MAX_DEVICE_COUNT],
}

/// Options of [`VgpuConfig::build`] besides the identity and the claims.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildOptions {
    /// Node `deviceMemoryScaling`; > 1 means oversold memory.
    pub memory_scaling: f64,
    /// The pod's (or node's) compute policy.
    pub compute_policy: ComputePolicy,
    /// `CUDA_MEM_OVERSOLD` is truthy in the container.
    pub memory_oversold: bool,
    /// `MANAGER_COMPATIBILITY_MODE` bits.
    pub compatibility_mode: i32,
    /// Gate `SharedSMUtilizationWatcher`.
    pub sm_watcher: bool,
    /// Gate `VirtualMemoryTracking`.
    pub vmem_node: bool,
    /// CUDA driver API version.
    pub cuda_version: CudaVersion,
    /// Driver version string.
    pub driver_version: String,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            memory_scaling: 1.0,
            compute_policy: ComputePolicy::Fixed,
            memory_oversold: false,
            compatibility_mode: 0,
            sm_watcher: false,
            vmem_node: false,
            cuda_version: CudaVersion::default(),
            driver_version: String::new(),
        }
    }
}

/// Who the file is for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerIdentity {
    /// Pod UID.
    pub pod_uid: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Container name.
    pub container_name: String,
    /// Client-mode register UUID (empty on the device-plugin path).
    pub register_uuid: String,
}

/// [`VgpuConfig::build`] was given a claim whose UUID is not among the node's devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claimed GPU {uuid} (index {index} in the claim) is not on this node")]
pub struct UnknownDevice {
    /// Claimed UUID.
    pub uuid: String,
    /// The index the claim carries (not used to place the slot; see [`VgpuConfig::build`]).
    pub index: u32,
}

impl DeviceConfig {
    /// The slot for one claim on `device`, by the rules of `NewResourceDataWithOptions`:
    /// total = claim MiB × 2^20; if `memory_scaling > 1`, oversold and real = total / scaling, else real =
    /// total; hard = soft = claim cores; `fixed`: core and hard limit when 0 < cores < 100; `balance`: soft =
    /// the device's total cores, core limit when 0 < cores < 100 and hard limit only when cores ≥ the device's
    /// cores; `none`: no core limit; memory limit unless the claim is the whole card with scaling 1;
    /// `CUDA_MEM_OVERSOLD` also sets oversold; activate = 1.
    pub fn for_claim(claim: &DeviceClaim, device: &GpuDevice, options: &BuildOptions) -> Self {
        let ratio = options.memory_scaling;
        let total = claim.memory_mib.saturating_mul(1 << 20);
        let oversold = ratio > 1.0;
        // f64 → u64 `as` saturates and maps NaN to 0; the value is at most `total`.
        let real = if oversold { (total as f64 / ratio) as u64 } else { total };
        let cores = i32::try_from(claim.cores).unwrap_or(i32::MAX);
        let partial = claim.cores > 0 && claim.cores < 100;
        let mut entry = Self {
            seq: 0,
            uuid: claim.uuid.clone(),
            total_memory: total,
            real_memory: real,
            hard_core: cores,
            soft_core: cores,
            memory_limit: i32::from(!(claim.memory_mib == device.memory_mib && ratio == 1.0)),
            memory_oversold: i32::from(oversold || options.memory_oversold),
            activate: 1,
            ..Self::default()
        };
        match options.compute_policy {
            ComputePolicy::Fixed => {
                if partial {
                    entry.core_limit = 1;
                    entry.hard_limit = 1;
                }
            }
            ComputePolicy::Balance => {
                entry.soft_core = i32::try_from(device.cores).unwrap_or(i32::MAX);
                if partial {
                    entry.core_limit = 1;
                    entry.hard_limit = i32::from(claim.cores >= device.cores);
                }
            }
            ComputePolicy::None => {}
        }
        entry
    }
}

impl VgpuConfig {
    /// Builds the file content for one container: identity, options and one slot per claim.
    ///
    /// The slot follows upstream's rule (`NewResourceDataT`): the claim's UUID is looked up among the
    /// node's `devices` and the slot is that device's host index ([`GpuDevice::index`], the `id` of
    /// `node-device-register`); the claim's own `index` field is not used. A claim whose UUID is not on the
    /// node is an [`UnknownDevice`] error (upstream would silently write slot 0 with a zero device); a
    /// device whose index is ≥ [`MAX_DEVICE_COUNT`] has no slot and its claim is skipped (upstream's map
    /// holds only the first 16 devices and would likewise misplace it in slot 0). When several devices
    /// share the UUID, the first wins.
    pub fn build(
        identity: &ContainerIdentity,
        options: &BuildOptions,
        claims: &[DeviceClaim],
        devices: &[GpuDevice],
    ) -> Result<Self, UnknownDevice> {
        let mut config = Self {
            cuda_version: options.cuda_version,
            driver_version: options.driver_version.clone(),
            pod_uid: identity.pod_uid.clone(),
            pod_name: identity.pod_name.clone(),
            pod_namespace: identity.pod_namespace.clone(),
            container_name: identity.container_name.clone(),
            register_uuid: identity.register_uuid.clone(),
            compatibility_mode: options.compatibility_mode,
            sm_watcher: i32::from(options.sm_watcher),
            vmem_node: i32::from(options.vmem_node),
            ..Self::default()
        };
        for claim in claims {
            let device = devices
                .iter()
                .find(|d| d.uuid == claim.uuid)
                .ok_or_else(|| UnknownDevice { uuid: claim.uuid.clone(), index: claim.index })?;
            let Some(slot) = usize::try_from(device.index).ok().and_then(|i| config.devices.get_mut(i))
            else {
                continue;
            };
            *slot = DeviceConfig::for_claim(claim, device, options);
        }
        Ok(config)
    }

    /// The exact file image ([`FILE_SIZE`] bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; FILE_SIZE];
        put_u32(&mut b, offsets::MAGIC, MAGIC);
        put_u32(&mut b, offsets::LAYOUT_VERSION, LAYOUT_VERSION);
        put_u32(&mut b, offsets::REGION_SIZE, REGION_SIZE as u32);
        put_u32(&mut b, offsets::DEVICE_COUNT, MAX_DEVICE_COUNT as u32);
        put_i32(&mut b, offsets::CUDA_MAJOR, self.cuda_version.major);
        put_i32(&mut b, offsets::CUDA_MINOR, self.cuda_version.minor);
        put_str(&mut b, offsets::DRIVER_VERSION, DRIVER_VERSION_BUFFER_SIZE, &self.driver_version);
        put_str(&mut b, offsets::POD_UID, UUID_BUFFER_SIZE, &self.pod_uid);
        put_str(&mut b, offsets::POD_NAME, NAME_BUFFER_SIZE, &self.pod_name);
        put_str(&mut b, offsets::POD_NAMESPACE, NAME_BUFFER_SIZE, &self.pod_namespace);
        put_str(&mut b, offsets::CONTAINER_NAME, NAME_BUFFER_SIZE, &self.container_name);
        put_str(&mut b, offsets::REG_UUID, UUID_BUFFER_SIZE, &self.register_uuid);
        put_i32(&mut b, offsets::COMPATIBILITY_MODE, self.compatibility_mode);
        put_i32(&mut b, offsets::SM_WATCHER, self.sm_watcher);
        put_i32(&mut b, offsets::VMEM_NODE, self.vmem_node);
        for (i, d) in self.devices.iter().enumerate() {
            use offsets::device as o;
            let at = DEVICES_OFFSET + i * DEVICE_SIZE;
            put_u32(&mut b, at + o::SEQ, d.seq);
            put_str(&mut b, at + o::UUID, UUID_BUFFER_SIZE, &d.uuid);
            put_u64(&mut b, at + o::TOTAL_MEMORY, d.total_memory);
            put_u64(&mut b, at + o::REAL_MEMORY, d.real_memory);
            put_i32(&mut b, at + o::HARD_CORE, d.hard_core);
            put_i32(&mut b, at + o::SOFT_CORE, d.soft_core);
            put_i32(&mut b, at + o::CORE_LIMIT, d.core_limit);
            put_i32(&mut b, at + o::HARD_LIMIT, d.hard_limit);
            put_i32(&mut b, at + o::MEMORY_LIMIT, d.memory_limit);
            put_i32(&mut b, at + o::MEMORY_OVERSOLD, d.memory_oversold);
            put_i32(&mut b, at + o::ACTIVATE, d.activate);
        }
        b
    }

    /// Decodes a file image; `path` only names the file in errors. Checks, in order: at least a header,
    /// magic, layout version, region size, device count, then the exact file size. Device sequence words are
    /// returned as found (see [`read`] for the seqlock retry).
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self, AbiError> {
        let size_err =
            || AbiError::Size { path: path.to_path_buf(), expected: FILE_SIZE, actual: bytes.len() };
        if bytes.len() < 16 {
            return Err(size_err());
        }
        let magic = get_u32(bytes, offsets::MAGIC);
        if magic != MAGIC {
            return Err(AbiError::Magic { path: path.to_path_buf(), expected: MAGIC, actual: magic });
        }
        let header = |field, offset, expected: u32| {
            let actual = get_u32(bytes, offset);
            if actual == expected {
                Ok(())
            } else {
                Err(AbiError::Header { path: path.to_path_buf(), field, expected, actual })
            }
        };
        header("layout version", offsets::LAYOUT_VERSION, LAYOUT_VERSION)?;
        header("region size", offsets::REGION_SIZE, REGION_SIZE as u32)?;
        header("device count", offsets::DEVICE_COUNT, MAX_DEVICE_COUNT as u32)?;
        if bytes.len() != FILE_SIZE {
            return Err(size_err());
        }
        let mut config = Self {
            cuda_version: CudaVersion {
                major: get_i32(bytes, offsets::CUDA_MAJOR),
                minor: get_i32(bytes, offsets::CUDA_MINOR),
            },
            driver_version: get_str(bytes, offsets::DRIVER_VERSION, DRIVER_VERSION_BUFFER_SIZE),
            pod_uid: get_str(bytes, offsets::POD_UID, UUID_BUFFER_SIZE),
            pod_name: get_str(bytes, offsets::POD_NAME, NAME_BUFFER_SIZE),
            pod_namespace: get_str(bytes, offsets::POD_NAMESPACE, NAME_BUFFER_SIZE),
            container_name: get_str(bytes, offsets::CONTAINER_NAME, NAME_BUFFER_SIZE),
            register_uuid: get_str(bytes, offsets::REG_UUID, UUID_BUFFER_SIZE),
            compatibility_mode: get_i32(bytes, offsets::COMPATIBILITY_MODE),
            sm_watcher: get_i32(bytes, offsets::SM_WATCHER),
            vmem_node: get_i32(bytes, offsets::VMEM_NODE),
            devices: Default::default(),
        };
        for (i, d) in config.devices.iter_mut().enumerate() {
            use offsets::device as o;
            let at = DEVICES_OFFSET + i * DEVICE_SIZE;
            *d = DeviceConfig {
                seq: get_u32(bytes, at + o::SEQ),
                uuid: get_str(bytes, at + o::UUID, UUID_BUFFER_SIZE),
                total_memory: get_u64(bytes, at + o::TOTAL_MEMORY),
                real_memory: get_u64(bytes, at + o::REAL_MEMORY),
                hard_core: get_i32(bytes, at + o::HARD_CORE),
                soft_core: get_i32(bytes, at + o::SOFT_CORE),
                core_limit: get_i32(bytes, at + o::CORE_LIMIT),
                hard_limit: get_i32(bytes, at + o::HARD_LIMIT),
                memory_limit: get_i32(bytes, at + o::MEMORY_LIMIT),
                memory_oversold: get_i32(bytes, at + o::MEMORY_OVERSOLD),
                activate: get_i32(bytes, at + o::ACTIVATE),
            };
        }
        Ok(config)
    }
}

/// How many times [`read`] re-reads a file whose device slot is mid-update.
pub const READ_ATTEMPTS: usize = 64;

/// Reads and validates a `vgpu.config`. When a device slot's sequence word is odd (a writer is inside the
/// seqlock), the whole file is read again, up to [`READ_ATTEMPTS`] times, then [`AbiError::Busy`].
pub fn read(path: &Path) -> Result<VgpuConfig, AbiError> {
    let mut last_busy = None;
    for _ in 0..READ_ATTEMPTS {
        let bytes = std::fs::read(path).map_err(|source| AbiError::Io {
            path: path.to_path_buf(),
            action: "read",
            source,
        })?;
        let config = VgpuConfig::decode(&bytes, path)?;
        match config.devices.iter().enumerate().find(|(_, d)| d.seq % 2 == 1) {
            None => return Ok(config),
            Some((index, d)) => last_busy = Some((index, d.seq)),
        }
        std::thread::yield_now();
    }
    let (index, seq) = last_busy.unwrap_or_default();
    Err(AbiError::Busy { path: path.to_path_buf(), index, seq })
}

/// Writes `config` to `path` atomically (temporary file in the same directory, fsync, rename), mode 0777
/// before umask as upstream. Callers write fresh files only: never over a file a container has mapped.
pub fn write(path: &Path, config: &VgpuConfig) -> Result<(), AbiError> {
    write_atomic(path, &config.encode(), 0o777)
}

// === byte helpers (offsets are constants inside FILE_SIZE; `get` keeps them total anyway) ===

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(dst) = b.get_mut(at..at + v.len()) {
        dst.copy_from_slice(v);
    }
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    put(b, at, &v.to_le_bytes());
}
fn put_i32(b: &mut [u8], at: usize, v: i32) {
    put(b, at, &v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    put(b, at, &v.to_le_bytes());
}
/// Copies at most `len - 1` bytes (cut back to a character boundary); the rest stays NUL.
fn put_str(b: &mut [u8], at: usize, len: usize, s: &str) {
    let mut n = s.len().min(len - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    put(b, at, &s.as_bytes()[..n]);
}
fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b.get(at..at + N).and_then(|s| s.try_into().ok()).unwrap_or([0; N])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(get(b, at))
}
fn get_i32(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(get(b, at))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(get(b, at))
}
/// Bytes up to the first NUL (or the buffer end), invalid UTF-8 replaced.
fn get_str(b: &[u8], at: usize, len: usize) -> String {
    let buf = b.get(at..at + len).unwrap_or_default();
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
