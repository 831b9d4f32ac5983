//! `vmem_node.config`: the per-container virtual-memory ledger (contract §7.2).
//!
//! Written by the in-container control library when `VirtualMemoryTracking` is on (`vmem_node=1` in
//! `vgpu.config`); read by the device monitor, which adds each container's virtual bytes to
//! `container_vgpu_device_memory_usage_in_bytes`. Host path `<manager-dir>/<podUID>_<ctr>/vmem_node/`
//! [`FILE_NAME`] (container path `/tmp/.vmem_node/vmem_node.config`). The file is exactly [`FILE_SIZE`]
//! (327 680) bytes, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | `u32 magic` = [`MAGIC`] (`0x564D4E44`, "VMND") |
//! | 4 | 4 | `u32 layout_version` = [`LAYOUT_VERSION`] (1) |
//! | 8 | 4 | `u32 region_size` = [`REGION_SIZE`] (262 400 = 128 + 16 × 16 392) |
//! | 12 | 4 | `u32 device_count` = 16 |
//! | 16 | 112 | padding to 128 |
//! | 128 + i × 16 392 | 16 392 | `device_vmem_used_t devices[i]`, `i < 16` (host GPU index) |
//! | 262 528 | 65 152 | zero up to the file size |
//!
//! `device_vmem_used_t` (16 392 bytes): `process_used_t processes[1024]`@0 (16 bytes each: `i32 pid`@0,
//! padding@4, `u64 used`@8, bytes), `u32 processes_size`@16 384, `u8 lock_byte`@16 388, padding to 16 392.
//!
//! Upstream readers take a 1-byte `F_RDLCK` at [`lock_offset`] (device 0: 16 516, device 1: 32 908) while
//! the library updates a device under `F_WRLCK` on the same byte. This module's [`read`] takes no lock
//! (the workspace has no safe byte-range-lock call); it fetches only the header and each device's used
//! entries by offset and decodes twice until two consecutive reads agree, so an update in progress is
//! never returned half-done. A wrong size, magic, layout or a `processes_size` over 1024 is an error
//! naming the file (the monitor skips such a file; it never rebuilds it).

use std::path::Path;

use super::{
    AbiError,
    atomic::write_atomic,
    le::{FileSource, Source, get_i32, get_u32, get_u64, open, put_i32, put_u32, put_u64, read_stable},
};

/// "VMND" read as a little-endian `u32`.
pub const MAGIC: u32 = 0x564D_4E44;
/// Layout version.
pub const LAYOUT_VERSION: u32 = 1;
/// The exact file size (320 KiB).
pub const FILE_SIZE: usize = 327_680;
/// Header size.
pub const HEADER_SIZE: usize = 128;
/// Device slots.
pub const MAX_DEVICE_COUNT: usize = 16;
/// Process entries per device.
pub const MAX_PROCESSES: usize = 1024;
/// Size of one `process_used_t`.
pub const PROCESS_SIZE: usize = 16;
/// Size of one `device_vmem_used_t`.
pub const DEVICE_SIZE: usize = 16_392;
/// `region_size`: header plus the device array.
pub const REGION_SIZE: usize = HEADER_SIZE + MAX_DEVICE_COUNT * DEVICE_SIZE;
/// File name.
pub const FILE_NAME: &str = "vmem_node.config";
/// Directory (inside `<manager-dir>/<podUID>_<ctr>/`) holding [`FILE_NAME`].
pub const DIR_NAME: &str = "vmem_node";
/// How many extra consecutive reads [`read`] makes waiting for two equal ones.
pub const READ_ATTEMPTS: usize = 64;

/// Field offsets.
pub mod offsets {
    /// `magic`.
    pub const MAGIC: usize = 0;
    /// `layout_version`.
    pub const LAYOUT_VERSION: usize = 4;
    /// `region_size`.
    pub const REGION_SIZE: usize = 8;
    /// `device_count`.
    pub const DEVICE_COUNT: usize = 12;
    /// `devices[0]`.
    pub const DEVICES: usize = 128;

    /// Offsets inside one `device_vmem_used_t`.
    pub mod device {
        /// `processes[0]`.
        pub const PROCESSES: usize = 0;
        /// `processes_size`.
        pub const PROCESSES_SIZE: usize = 16_384;
        /// `lock_byte`.
        pub const LOCK_BYTE: usize = 16_388;
    }

    /// Offsets inside one `process_used_t`.
    pub mod process {
        /// `pid`.
        pub const PID: usize = 0;
        /// `used` (bytes).
        pub const USED: usize = 8;
    }
}

/// Offset of `devices[index]`.
pub const fn device_offset(index: usize) -> usize {
    offsets::DEVICES + index * DEVICE_SIZE
}

/// The byte readers lock (`F_RDLCK`) and the library's writer locks (`F_WRLCK`) for device `index`.
pub const fn lock_offset(index: usize) -> usize {
    device_offset(index) + offsets::device::LOCK_BYTE
}

/// One ledger entry: virtual memory a process holds on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProcessUsed {
    /// Process ID (as seen by the library: the host PID in the compatibility modes the monitor reads).
    pub pid: i32,
    /// Virtual bytes.
    pub used: u64,
}

/// The decoded ledger: the used entries (`processes[..processes_size]`) of each device slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct VmemNode {
    /// By host GPU index.
    pub devices: [Vec<ProcessUsed>; MAX_DEVICE_COUNT],
}

impl VmemNode {
    /// Virtual bytes on device `index` held by the processes `pid_in` accepts (0 for a slot ≥ 16).
    pub fn used_by(&self, index: usize, mut pid_in: impl FnMut(i32) -> bool) -> u64 {
        self.devices
            .get(index)
            .map_or(0, |d| d.iter().filter(|p| pid_in(p.pid)).fold(0u64, |acc, p| acc.saturating_add(p.used)))
    }

    /// The exact file image. A device with more than [`MAX_PROCESSES`] entries keeps the first 1024.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; FILE_SIZE];
        put_u32(&mut b, offsets::MAGIC, MAGIC);
        put_u32(&mut b, offsets::LAYOUT_VERSION, LAYOUT_VERSION);
        put_u32(&mut b, offsets::REGION_SIZE, REGION_SIZE as u32);
        put_u32(&mut b, offsets::DEVICE_COUNT, MAX_DEVICE_COUNT as u32);
        for (i, d) in self.devices.iter().enumerate() {
            let at = device_offset(i);
            let n = d.len().min(MAX_PROCESSES);
            for (k, p) in d.iter().take(n).enumerate() {
                let e = at + offsets::device::PROCESSES + k * PROCESS_SIZE;
                put_i32(&mut b, e + offsets::process::PID, p.pid);
                put_u64(&mut b, e + offsets::process::USED, p.used);
            }
            put_u32(&mut b, at + offsets::device::PROCESSES_SIZE, n as u32);
        }
        b
    }

    /// Decodes a whole file image; `path` only names the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self, AbiError> {
        decode_from(bytes, path)
    }
}

fn decode_from<S: Source + ?Sized>(src: &S, path: &Path) -> Result<VmemNode, AbiError> {
    decode_slots(src, path, &mut |_| true)
}

fn decode_slots<S: Source + ?Sized>(
    src: &S,
    path: &Path,
    wanted: &mut dyn FnMut(usize) -> bool,
) -> Result<VmemNode, AbiError> {
    if src.len() != FILE_SIZE {
        return Err(AbiError::Size { path: path.to_path_buf(), expected: FILE_SIZE, actual: src.len() });
    }
    let mut header = [0u8; 16];
    src.read_at(0, &mut header)?;
    let magic = get_u32(&header, offsets::MAGIC);
    if magic != MAGIC {
        return Err(AbiError::Magic { path: path.to_path_buf(), expected: MAGIC, actual: magic });
    }
    for (field, offset, expected) in [
        ("layout version", offsets::LAYOUT_VERSION, LAYOUT_VERSION),
        ("region size", offsets::REGION_SIZE, REGION_SIZE as u32),
        ("device count", offsets::DEVICE_COUNT, MAX_DEVICE_COUNT as u32),
    ] {
        let actual = get_u32(&header, offset);
        if actual != expected {
            return Err(AbiError::Header { path: path.to_path_buf(), field, expected, actual });
        }
    }
    let mut node = VmemNode::default();
    let mut buf = Vec::new();
    for (i, d) in node.devices.iter_mut().enumerate() {
        if !wanted(i) {
            continue;
        }
        let at = device_offset(i);
        let n = src.u32_at(at + offsets::device::PROCESSES_SIZE)? as usize;
        if n > MAX_PROCESSES {
            return Err(AbiError::Invalid {
                path: path.to_path_buf(),
                message: format!("device {i}: processes_size {n} exceeds {MAX_PROCESSES}"),
            });
        }
        buf.resize(n * PROCESS_SIZE, 0);
        src.read_at(at + offsets::device::PROCESSES, &mut buf)?;
        d.extend(buf.chunks_exact(PROCESS_SIZE).map(|e| ProcessUsed {
            pid: get_i32(e, offsets::process::PID),
            used: get_u64(e, offsets::process::USED),
        }));
    }
    Ok(node)
}

/// Reads and validates a ledger, fetching only the header and each device's used entries; decodes until
/// two consecutive reads agree (up to [`READ_ATTEMPTS`] extra reads).
pub fn read(path: &Path) -> Result<VmemNode, AbiError> {
    let file = open(path)?;
    read_stable(path, READ_ATTEMPTS, || {
        let src = FileSource::new(&file, path)?;
        decode_from(&src, path)
    })
}

/// [`read`] of the device slots `slots` only (the others come back empty): the monitor asks for the
/// GPUs a container holds, so a scrape reads a few entries of each ledger instead of all sixteen slots.
pub fn read_slots(path: &Path, slots: &[usize]) -> Result<VmemNode, AbiError> {
    let file = open(path)?;
    let src = FileSource::new(&file, path)?;
    read_stable(path, READ_ATTEMPTS, || decode_slots(&src, path, &mut |i| slots.contains(&i)))
}

/// [`read_slots`] over a file image already in memory (a mapping of the live file): decodes the slots `slots`
/// until two consecutive decodes agree (up to [`READ_ATTEMPTS`] extra decodes); `path` names the file in errors.
pub fn decode_slots_stable(bytes: &[u8], path: &Path, slots: &[usize]) -> Result<VmemNode, AbiError> {
    read_stable(path, READ_ATTEMPTS, || decode_slots(bytes, path, &mut |i| slots.contains(&i)))
}

/// Writes a fresh ledger atomically (mode 0666 before umask). The library owns the live file; this is for
/// fixtures and tests, never for a file a container has mapped.
pub fn write(path: &Path, node: &VmemNode) -> Result<(), AbiError> {
    write_atomic(path, &node.encode(), 0o666)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn used_by_sums_the_accepted_pids() {
        let mut node = VmemNode::default();
        node.devices[2] = vec![ProcessUsed { pid: 7, used: 10 }, ProcessUsed { pid: 8, used: 5 }];
        assert_eq!(node.used_by(2, |p| p == 7), 10);
        assert_eq!(node.used_by(2, |_| true), 15);
        assert_eq!(node.used_by(3, |_| true), 0);
        assert_eq!(node.used_by(99, |_| true), 0);
    }
}
