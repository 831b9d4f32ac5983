//! `sm_node.config`: the container-wide shared SM token bucket of the control library (contract §7.4).
//!
//! Library-owned: every process of a container that shares the bucket maps `/tmp/.sm_node/sm_node.config`
//! (host `<manager-dir>/<podUID>_<ctr>/sm_node/`[`FILE_NAME`]) and updates it with atomics; the plugins
//! delete it before each container start, and a layout mismatch makes the library rebuild it in place.
//! This module decodes it for diagnostics and tests and writes fresh images for fixtures. Exactly
//! [`FILE_SIZE`] (8192) bytes, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | `u32 magic` = [`MAGIC`] (`0x534D4E44`, "SMND") |
//! | 4 | 4 | `u32 layout_version` = [`LAYOUT_VERSION`] (3, the code's value; the design doc says 1) |
//! | 8 | 4 | `u32 region_size` = [`REGION_SIZE`] (2176 = 128 + 16 × 128) |
//! | 12 | 4 | `u32 device_count` = 16 |
//! | 16 | 112 | padding to 128 |
//! | 128 + i × 128 | 128 | `devices[i]`, `i < 16` (host GPU index) |
//!
//! Device entry (128 bytes): `i64 cur_cuda_cores`@0, `i64 total_cuda_cores`@8, `i64 last_refill_ns`@16,
//! `i64 share`@24, `i64 sample_published_ns`@32; `i32 up_limit`@40, `is_cnt`@44, `avg_sys_free`@48,
//! `pre_external_proc`@52, `md_cooldown`@56, `excl_debounced`@60, `excl_streak`@64,
//! `lost_excl_pending`@68, `throttled_since_watch`@72, `s_user_current`@76, `s_sys_current`@80,
//! `s_sys_process_num`@84, `s_external_proc_num`@88, `leader_pid`@92; `i64 sample_interval_ns`@96;
//! padding to 128.
//!
//! The contract names a 16-byte header without spelling its last two words; this layout takes them as
//! `region_size` and `device_count` like `vgpu.config` and `vmem_node.config`, and [`decode`](SmNode::decode)
//! checks only magic, layout version and size (the two words are returned as found). Fields are updated
//! one atomic at a time with no lock, so [`read`] decodes until two consecutive reads agree.

use std::path::Path;

use super::{
    AbiError,
    atomic::write_atomic,
    le::{get_i32, get_i64, get_u32, open, put_i32, put_i64, put_u32, read_stable},
};

/// "SMND" read as a little-endian `u32`.
pub const MAGIC: u32 = 0x534D_4E44;
/// Layout version of the code.
pub const LAYOUT_VERSION: u32 = 3;
/// The exact file size.
pub const FILE_SIZE: usize = 8192;
/// Header size (16 bytes used, padded to 128).
pub const HEADER_SIZE: usize = 128;
/// Size of one device entry.
pub const DEVICE_SIZE: usize = 128;
/// Device slots.
pub const MAX_DEVICE_COUNT: usize = 16;
/// Header plus devices.
pub const REGION_SIZE: usize = HEADER_SIZE + MAX_DEVICE_COUNT * DEVICE_SIZE;
/// File name.
pub const FILE_NAME: &str = "sm_node.config";
/// The sampling-ownership lock file beside it.
pub const LOCK_FILE_NAME: &str = "sm_node.lock";
/// Directory (inside `<manager-dir>/<podUID>_<ctr>/`) holding [`FILE_NAME`].
pub const DIR_NAME: &str = "sm_node";
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

    /// Offsets inside one device entry.
    pub mod device {
        /// `cur_cuda_cores`.
        pub const CUR_CUDA_CORES: usize = 0;
        /// `total_cuda_cores`.
        pub const TOTAL_CUDA_CORES: usize = 8;
        /// `last_refill_ns`.
        pub const LAST_REFILL_NS: usize = 16;
        /// `share`.
        pub const SHARE: usize = 24;
        /// `sample_published_ns`.
        pub const SAMPLE_PUBLISHED_NS: usize = 32;
        /// `up_limit`.
        pub const UP_LIMIT: usize = 40;
        /// `is_cnt`.
        pub const IS_CNT: usize = 44;
        /// `avg_sys_free`.
        pub const AVG_SYS_FREE: usize = 48;
        /// `pre_external_proc`.
        pub const PRE_EXTERNAL_PROC: usize = 52;
        /// `md_cooldown`.
        pub const MD_COOLDOWN: usize = 56;
        /// `excl_debounced`.
        pub const EXCL_DEBOUNCED: usize = 60;
        /// `excl_streak`.
        pub const EXCL_STREAK: usize = 64;
        /// `lost_excl_pending`.
        pub const LOST_EXCL_PENDING: usize = 68;
        /// `throttled_since_watch`.
        pub const THROTTLED_SINCE_WATCH: usize = 72;
        /// `s_user_current`.
        pub const S_USER_CURRENT: usize = 76;
        /// `s_sys_current`.
        pub const S_SYS_CURRENT: usize = 80;
        /// `s_sys_process_num`.
        pub const S_SYS_PROCESS_NUM: usize = 84;
        /// `s_external_proc_num`.
        pub const S_EXTERNAL_PROC_NUM: usize = 88;
        /// `leader_pid`.
        pub const LEADER_PID: usize = 92;
        /// `sample_interval_ns`.
        pub const SAMPLE_INTERVAL_NS: usize = 96;
    }
}

/// Offset of `devices[index]`.
pub const fn device_offset(index: usize) -> usize {
    offsets::DEVICES + index * DEVICE_SIZE
}

/// One device's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmNodeDevice {
    /// Tokens left.
    pub cur_cuda_cores: i64,
    /// Bucket size.
    pub total_cuda_cores: i64,
    /// Last refill, ns.
    pub last_refill_ns: i64,
    /// Refill share.
    pub share: i64,
    /// When the sampling owner last published, ns.
    pub sample_published_ns: i64,
    /// Utilization ceiling, percent.
    pub up_limit: i32,
    /// `is_cnt`.
    pub is_cnt: i32,
    /// `avg_sys_free`.
    pub avg_sys_free: i32,
    /// `pre_external_proc`.
    pub pre_external_proc: i32,
    /// `md_cooldown`.
    pub md_cooldown: i32,
    /// `excl_debounced`.
    pub excl_debounced: i32,
    /// `excl_streak`.
    pub excl_streak: i32,
    /// `lost_excl_pending`.
    pub lost_excl_pending: i32,
    /// `throttled_since_watch`.
    pub throttled_since_watch: i32,
    /// `s_user_current`.
    pub s_user_current: i32,
    /// `s_sys_current`.
    pub s_sys_current: i32,
    /// `s_sys_process_num`.
    pub s_sys_process_num: i32,
    /// `s_external_proc_num`.
    pub s_external_proc_num: i32,
    /// PID of the sampling owner.
    pub leader_pid: i32,
    /// The owner's measured sampling interval, ns.
    pub sample_interval_ns: i64,
}

/// The decoded file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SmNode {
    /// `region_size` as found (written as [`REGION_SIZE`]).
    pub region_size: u32,
    /// `device_count` as found (written as 16).
    pub device_count: u32,
    /// By host GPU index.
    pub devices: [SmNodeDevice; MAX_DEVICE_COUNT],
}

impl Default for SmNode {
    fn default() -> Self {
        Self {
            region_size: REGION_SIZE as u32,
            device_count: MAX_DEVICE_COUNT as u32,
            devices: [SmNodeDevice::default(); MAX_DEVICE_COUNT],
        }
    }
}

macro_rules! device_fields {
    ($m:ident) => {
        $m!(i64, cur_cuda_cores, CUR_CUDA_CORES);
        $m!(i64, total_cuda_cores, TOTAL_CUDA_CORES);
        $m!(i64, last_refill_ns, LAST_REFILL_NS);
        $m!(i64, share, SHARE);
        $m!(i64, sample_published_ns, SAMPLE_PUBLISHED_NS);
        $m!(i32, up_limit, UP_LIMIT);
        $m!(i32, is_cnt, IS_CNT);
        $m!(i32, avg_sys_free, AVG_SYS_FREE);
        $m!(i32, pre_external_proc, PRE_EXTERNAL_PROC);
        $m!(i32, md_cooldown, MD_COOLDOWN);
        $m!(i32, excl_debounced, EXCL_DEBOUNCED);
        $m!(i32, excl_streak, EXCL_STREAK);
        $m!(i32, lost_excl_pending, LOST_EXCL_PENDING);
        $m!(i32, throttled_since_watch, THROTTLED_SINCE_WATCH);
        $m!(i32, s_user_current, S_USER_CURRENT);
        $m!(i32, s_sys_current, S_SYS_CURRENT);
        $m!(i32, s_sys_process_num, S_SYS_PROCESS_NUM);
        $m!(i32, s_external_proc_num, S_EXTERNAL_PROC_NUM);
        $m!(i32, leader_pid, LEADER_PID);
        $m!(i64, sample_interval_ns, SAMPLE_INTERVAL_NS);
    };
}

impl SmNode {
    /// The exact file image.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; FILE_SIZE];
        put_u32(&mut b, offsets::MAGIC, MAGIC);
        put_u32(&mut b, offsets::LAYOUT_VERSION, LAYOUT_VERSION);
        put_u32(&mut b, offsets::REGION_SIZE, self.region_size);
        put_u32(&mut b, offsets::DEVICE_COUNT, self.device_count);
        for (i, d) in self.devices.iter().enumerate() {
            let at = device_offset(i);
            macro_rules! put {
                (i64, $f:ident, $o:ident) => {
                    put_i64(&mut b, at + offsets::device::$o, d.$f)
                };
                (i32, $f:ident, $o:ident) => {
                    put_i32(&mut b, at + offsets::device::$o, d.$f)
                };
            }
            device_fields!(put);
        }
        b
    }

    /// Decodes a file image (checks size, magic and layout version); `path` only names the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self, AbiError> {
        if bytes.len() != FILE_SIZE {
            return Err(AbiError::Size {
                path: path.to_path_buf(),
                expected: FILE_SIZE,
                actual: bytes.len(),
            });
        }
        let magic = get_u32(bytes, offsets::MAGIC);
        if magic != MAGIC {
            return Err(AbiError::Magic { path: path.to_path_buf(), expected: MAGIC, actual: magic });
        }
        let version = get_u32(bytes, offsets::LAYOUT_VERSION);
        if version != LAYOUT_VERSION {
            return Err(AbiError::Header {
                path: path.to_path_buf(),
                field: "layout version",
                expected: LAYOUT_VERSION,
                actual: version,
            });
        }
        let mut node = Self {
            region_size: get_u32(bytes, offsets::REGION_SIZE),
            device_count: get_u32(bytes, offsets::DEVICE_COUNT),
            devices: [SmNodeDevice::default(); MAX_DEVICE_COUNT],
        };
        for (i, d) in node.devices.iter_mut().enumerate() {
            let at = device_offset(i);
            macro_rules! get {
                (i64, $f:ident, $o:ident) => {
                    d.$f = get_i64(bytes, at + offsets::device::$o)
                };
                (i32, $f:ident, $o:ident) => {
                    d.$f = get_i32(bytes, at + offsets::device::$o)
                };
            }
            device_fields!(get);
        }
        Ok(node)
    }
}

/// Reads and validates the file; decodes until two consecutive reads agree (up to [`READ_ATTEMPTS`] extra
/// reads), since the library updates fields while it runs.
pub fn read(path: &Path) -> Result<SmNode, AbiError> {
    use std::io::Read as _;
    let file = open(path)?;
    read_stable(path, READ_ATTEMPTS, || {
        let mut bytes = Vec::with_capacity(FILE_SIZE);
        (&file).take(FILE_SIZE as u64 + 1).read_to_end(&mut bytes).map_err(|source| AbiError::Io {
            path: path.to_path_buf(),
            action: "read",
            source,
        })?;
        std::io::Seek::rewind(&mut &file).map_err(|source| AbiError::Io {
            path: path.to_path_buf(),
            action: "seek",
            source,
        })?;
        SmNode::decode(&bytes, path)
    })
}

/// Writes a fresh file atomically (mode 0666 before umask), for fixtures and tests; the library owns the
/// live file.
pub fn write(path: &Path, node: &SmNode) -> Result<(), AbiError> {
    write_atomic(path, &node.encode(), 0o666)
}
