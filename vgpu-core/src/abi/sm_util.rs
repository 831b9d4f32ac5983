//! `sm_util.config`: the node-wide SM-utilization samples of the shared watcher (contract §7.3).
//!
//! With gate `SharedSMUtilizationWatcher` on, the device plugin (or the DRA kubelet plugin) samples every
//! GPU once per period and writes `<manager-dir>/watcher/`[`FILE_NAME`] in place; the in-container limiter
//! (container path `/etc/vgpu-manager/watcher/sm_util.config`) and the device monitor read it. No header:
//! the file is `device_util_t`, 16 × `device_process_t`, exactly [`FILE_SIZE`] (1 311 232) bytes,
//! little-endian, device `i` at `i × 81 952` (host GPU index):
//!
//! | offset in `device_process_t` | size | field |
//! |---|---|---|
//! | 0 | 1024 × 32 | `nvmlProcessUtilizationSample_t samples[1024]` |
//! | 32 768 | 4 | `u32 samples_size` |
//! | 32 772 | 4 | padding |
//! | 32 776 | 8 | `u64 last_seen_ts` (µs; the newest sample time, the next sampling's `since`) |
//! | 32 784 | 1024 × 24 | `nvmlProcessInfo_v2 compute[1024]` |
//! | 57 360 | 4 | `u32 compute_size` |
//! | 57 364 | 4 | padding |
//! | 57 368 | 1024 × 24 | `nvmlProcessInfo_v2 graphics[1024]` |
//! | 81 944 | 4 | `u32 graphics_size` |
//! | 81 948 | 1 | `u8 lock_byte` ([`lock_offset`]) |
//! | 81 949 | 3 | padding to 81 952 |
//!
//! `nvmlProcessUtilizationSample_t` (32 bytes): `u32 pid`@0, padding@4, `u64 timeStamp`@8 (µs),
//! `u32 smUtil`@16, `u32 memUtil`@20, `u32 encUtil`@24, `u32 decUtil`@28.
//! `nvmlProcessInfo_v2` (24 bytes): `u32 pid`@0, padding@4, `u64 usedGpuMemory`@8 (bytes;
//! `u64::MAX` = not available), `u32 gpuInstanceId`@16, `u32 computeInstanceId`@20.
//!
//! Upstream locks one byte per device (`F_WRLCK` writer, `F_RDLCK` readers, OFD with a POSIX fallback).
//! The writer in `vgpu-deviceplugin` holds a whole-file POSIX write lock while it rewrites the image in
//! place ([`write_in_place`]); byte-range and whole-file locks share the kernel's lock table, so the
//! library's byte read locks wait for it. [`read`] takes no lock and decodes until two consecutive reads
//! agree, so a torn image is never returned. Counts above 1024 and a wrong file size are errors naming the
//! file.

use std::{fs::File, os::unix::fs::FileExt, path::Path};

use super::{
    AbiError,
    atomic::write_atomic,
    le::{FileSource, Source, get_u32, get_u64, open, put_u32, put_u64, read_stable},
};
use crate::backend::ProcessUtilizationSample;

/// Device slots.
pub const MAX_DEVICE_COUNT: usize = 16;
/// Entries in each array (`samples`, `compute`, `graphics`).
pub const MAX_ENTRIES: usize = 1024;
/// Size of one `nvmlProcessUtilizationSample_t`.
pub const SAMPLE_SIZE: usize = 32;
/// Size of one `nvmlProcessInfo_v2`.
pub const PROCESS_INFO_SIZE: usize = 24;
/// Size of one `device_process_t`.
pub const DEVICE_SIZE: usize = 81_952;
/// The exact file size.
pub const FILE_SIZE: usize = MAX_DEVICE_COUNT * DEVICE_SIZE;
/// File name.
pub const FILE_NAME: &str = "sm_util.config";
/// Directory (inside the manager directory) holding [`FILE_NAME`].
pub const DIR_NAME: &str = "watcher";
/// How many extra consecutive reads [`read`] makes waiting for two equal ones.
pub const READ_ATTEMPTS: usize = 64;
/// `usedGpuMemory` when the driver does not say.
pub const MEMORY_NOT_AVAILABLE: u64 = u64::MAX;

/// Field offsets.
pub mod offsets {
    /// Offsets inside one `device_process_t`.
    pub mod device {
        /// `samples[0]`.
        pub const SAMPLES: usize = 0;
        /// `samples_size`.
        pub const SAMPLES_SIZE: usize = 32_768;
        /// `last_seen_ts`.
        pub const LAST_SEEN_TS: usize = 32_776;
        /// `compute[0]`.
        pub const COMPUTE: usize = 32_784;
        /// `compute_size`.
        pub const COMPUTE_SIZE: usize = 57_360;
        /// `graphics[0]`.
        pub const GRAPHICS: usize = 57_368;
        /// `graphics_size`.
        pub const GRAPHICS_SIZE: usize = 81_944;
        /// `lock_byte`.
        pub const LOCK_BYTE: usize = 81_948;
    }
    /// Offsets inside one `nvmlProcessUtilizationSample_t`.
    pub mod sample {
        /// `pid`.
        pub const PID: usize = 0;
        /// `timeStamp`.
        pub const TIMESTAMP: usize = 8;
        /// `smUtil`.
        pub const SM: usize = 16;
        /// `memUtil`.
        pub const MEMORY: usize = 20;
        /// `encUtil`.
        pub const ENCODER: usize = 24;
        /// `decUtil`.
        pub const DECODER: usize = 28;
    }
    /// Offsets inside one `nvmlProcessInfo_v2`.
    pub mod process {
        /// `pid`.
        pub const PID: usize = 0;
        /// `usedGpuMemory`.
        pub const USED_MEMORY: usize = 8;
        /// `gpuInstanceId`.
        pub const GPU_INSTANCE_ID: usize = 16;
        /// `computeInstanceId`.
        pub const COMPUTE_INSTANCE_ID: usize = 20;
    }
}

/// Offset of `devices[index]`.
pub const fn device_offset(index: usize) -> usize {
    index * DEVICE_SIZE
}

/// The lock byte of device `index`.
pub const fn lock_offset(index: usize) -> usize {
    device_offset(index) + offsets::device::LOCK_BYTE
}

/// One `nvmlProcessInfo_v2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProcessInfo {
    /// Host PID.
    pub pid: u32,
    /// Device memory, bytes; `None` when the driver does not say ([`MEMORY_NOT_AVAILABLE`] on disk).
    pub used_memory_bytes: Option<u64>,
    /// MIG GPU instance (0 outside MIG).
    pub gpu_instance_id: u32,
    /// MIG compute instance (0 outside MIG).
    pub compute_instance_id: u32,
}

/// One device's slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeviceProcesses {
    /// Utilization samples of the last period.
    pub samples: Vec<ProcessUtilizationSample>,
    /// Newest sample time seen, µs since the Unix epoch.
    pub last_seen_ts: u64,
    /// Compute processes.
    pub compute: Vec<ProcessInfo>,
    /// Graphics processes.
    pub graphics: Vec<ProcessInfo>,
}

/// The decoded `device_util_t`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SmUtil {
    /// By host GPU index.
    pub devices: [DeviceProcesses; MAX_DEVICE_COUNT],
}

impl SmUtil {
    /// The exact file image; arrays longer than [`MAX_ENTRIES`] keep their first 1024 entries.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; FILE_SIZE];
        self.encode_into(&mut b);
        b
    }

    /// Writes the image into `b` (which must be [`FILE_SIZE`] bytes; every byte is rewritten).
    pub fn encode_into(&self, b: &mut [u8]) {
        b.fill(0);
        for (i, d) in self.devices.iter().enumerate() {
            use offsets::device as o;
            let at = device_offset(i);
            let n = d.samples.len().min(MAX_ENTRIES);
            for (k, s) in d.samples.iter().take(n).enumerate() {
                use offsets::sample as f;
                let e = at + o::SAMPLES + k * SAMPLE_SIZE;
                put_u32(b, e + f::PID, s.pid);
                put_u64(b, e + f::TIMESTAMP, s.timestamp_us);
                put_u32(b, e + f::SM, s.sm_percent);
                put_u32(b, e + f::MEMORY, s.memory_percent);
                put_u32(b, e + f::ENCODER, s.encoder_percent);
                put_u32(b, e + f::DECODER, s.decoder_percent);
            }
            put_u32(b, at + o::SAMPLES_SIZE, n as u32);
            put_u64(b, at + o::LAST_SEEN_TS, d.last_seen_ts);
            for (list, base, size_at) in
                [(&d.compute, o::COMPUTE, o::COMPUTE_SIZE), (&d.graphics, o::GRAPHICS, o::GRAPHICS_SIZE)]
            {
                let n = list.len().min(MAX_ENTRIES);
                for (k, p) in list.iter().take(n).enumerate() {
                    use offsets::process as f;
                    let e = at + base + k * PROCESS_INFO_SIZE;
                    put_u32(b, e + f::PID, p.pid);
                    put_u64(b, e + f::USED_MEMORY, p.used_memory_bytes.unwrap_or(MEMORY_NOT_AVAILABLE));
                    put_u32(b, e + f::GPU_INSTANCE_ID, p.gpu_instance_id);
                    put_u32(b, e + f::COMPUTE_INSTANCE_ID, p.compute_instance_id);
                }
                put_u32(b, at + size_at, n as u32);
            }
        }
    }

    /// Decodes a whole file image; `path` only names the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self, AbiError> {
        decode_from(bytes, path)
    }
}

fn count<S: Source + ?Sized>(
    src: &S,
    at: usize,
    path: &Path,
    what: &str,
    i: usize,
) -> Result<usize, AbiError> {
    let n = src.u32_at(at)? as usize;
    if n > MAX_ENTRIES {
        return Err(AbiError::Invalid {
            path: path.to_path_buf(),
            message: format!("device {i}: {what} {n} exceeds {MAX_ENTRIES}"),
        });
    }
    Ok(n)
}

fn decode_from<S: Source + ?Sized>(src: &S, path: &Path) -> Result<SmUtil, AbiError> {
    if src.len() != FILE_SIZE {
        return Err(AbiError::Size { path: path.to_path_buf(), expected: FILE_SIZE, actual: src.len() });
    }
    let mut out = SmUtil::default();
    let mut buf = Vec::new();
    for (i, d) in out.devices.iter_mut().enumerate() {
        use offsets::device as o;
        let at = device_offset(i);
        let n = count(src, at + o::SAMPLES_SIZE, path, "samples_size", i)?;
        buf.resize(n * SAMPLE_SIZE, 0);
        src.read_at(at + o::SAMPLES, &mut buf)?;
        d.samples = buf
            .chunks_exact(SAMPLE_SIZE)
            .map(|e| {
                use offsets::sample as f;
                ProcessUtilizationSample {
                    pid: get_u32(e, f::PID),
                    timestamp_us: get_u64(e, f::TIMESTAMP),
                    sm_percent: get_u32(e, f::SM),
                    memory_percent: get_u32(e, f::MEMORY),
                    encoder_percent: get_u32(e, f::ENCODER),
                    decoder_percent: get_u32(e, f::DECODER),
                }
            })
            .collect();
        let mut ts = [0u8; 8];
        src.read_at(at + o::LAST_SEEN_TS, &mut ts)?;
        d.last_seen_ts = u64::from_le_bytes(ts);
        for (list, base, size_at, what) in [
            (&mut d.compute, o::COMPUTE, o::COMPUTE_SIZE, "compute_size"),
            (&mut d.graphics, o::GRAPHICS, o::GRAPHICS_SIZE, "graphics_size"),
        ] {
            let n = count(src, at + size_at, path, what, i)?;
            buf.resize(n * PROCESS_INFO_SIZE, 0);
            src.read_at(at + base, &mut buf)?;
            *list = buf
                .chunks_exact(PROCESS_INFO_SIZE)
                .map(|e| {
                    use offsets::process as f;
                    let used = get_u64(e, f::USED_MEMORY);
                    ProcessInfo {
                        pid: get_u32(e, f::PID),
                        used_memory_bytes: (used != MEMORY_NOT_AVAILABLE).then_some(used),
                        gpu_instance_id: get_u32(e, f::GPU_INSTANCE_ID),
                        compute_instance_id: get_u32(e, f::COMPUTE_INSTANCE_ID),
                    }
                })
                .collect();
        }
    }
    Ok(out)
}

/// Reads and validates the file, fetching only the used entries of each array; decodes until two
/// consecutive reads agree (up to [`READ_ATTEMPTS`] extra reads).
pub fn read(path: &Path) -> Result<SmUtil, AbiError> {
    let file = open(path)?;
    read_from(&file, path)
}

/// [`read`] from a file already open (e.g. one the caller holds a lock on); `path` names it in errors.
pub fn read_from(file: &File, path: &Path) -> Result<SmUtil, AbiError> {
    read_stable(path, READ_ATTEMPTS, || {
        let src = FileSource::new(file, path)?;
        decode_from(&src, path)
    })
}

/// Creates the file atomically with `util` (mode 0644 before umask). Use it once, when the file does not
/// exist yet; later updates go through [`write_in_place`] so that readers keep their open file.
pub fn create(path: &Path, util: &SmUtil) -> Result<(), AbiError> {
    write_atomic(path, &util.encode(), 0o644)
}

/// Rewrites the whole image in place at offset 0 of `file` (which must be open for writing and already
/// [`FILE_SIZE`] bytes long); `scratch` is reused between calls. The caller holds the writer's lock.
pub fn write_in_place(
    file: &File,
    path: &Path,
    util: &SmUtil,
    scratch: &mut Vec<u8>,
) -> Result<(), AbiError> {
    scratch.resize(FILE_SIZE, 0);
    util.encode_into(scratch);
    file.write_all_at(scratch, 0).map_err(|source| AbiError::Io {
        path: path.to_path_buf(),
        action: "write in place",
        source,
    })
}
