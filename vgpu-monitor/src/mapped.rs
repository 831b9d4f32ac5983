//! The per-container shared files read through memory mappings kept between scrapes (`memmap2`):
//! `vgpu.config` and, with `VirtualMemoryTracking`, `vmem_node.config`.
//!
//! The monitor reads every collectable container's `vgpu.config` (8 KiB) on each scrape, and its
//! `vmem_node.config` (320 KiB) with the gate on. A plain read costs an `open`, an `fstat`, reads and a `close`
//! per file (the ledger: a `pread` per header and device slot, twice for a stable answer); a mapping kept in
//! [`MappedFiles`] costs one `stat` of the path (to notice a replaced file) and one `fstat` of the open file (to
//! notice a truncated one), and the bytes come straight from the page cache.
//! `cargo bench -p vgpu-monitor --bench monitor -- vgpu_config_100` compares the two for `vgpu.config`.
//!
//! | event | what happens |
//! |---|---|
//! | first read of a path | open, check the size ([`vgpu_config::FILE_SIZE`], [`vmem_node::FILE_SIZE`]), map read-only, decode |
//! | same device and inode, same size | decode from the mapping (no open) |
//! | the path names another device/inode (file replaced by rename) | the old mapping is dropped, the new file mapped |
//! | the open file's size changed (truncated or grown in place) | the mapping is dropped before any byte is touched; [`AbiError::Size`] |
//! | wrong size, magic or header | [`AbiError`] naming the file; nothing stays mapped |
//! | `vgpu.config`: a device slot mid-update (odd sequence word), or sequence words that changed during the copy | copied again, up to [`vgpu_config::READ_ATTEMPTS`] times, then [`AbiError::Busy`] |
//! | `vmem_node.config`: entries changing under the reader | decoded until two consecutive decodes agree ([`vmem_node::decode_slots_stable`]) |
//! | a path not read during a scrape | unmapped by [`MappedFiles::retain_read`] |
//!
//! This is the crate's only module that may use `unsafe` (`tests/unsafe_boundary.rs` enforces it): mapping a
//! file is `unsafe` in Rust because another process could truncate it, and touching a page beyond the new end
//! of file raises `SIGBUS`. Nothing truncates these files: the device plugin and the DRA plugin write a fresh
//! `vgpu.config` and rename it over the old one ([`vgpu_config::write`]), which leaves our mapping on the old
//! inode, and the in-container library creates the ledger at its full size and updates entries in place. The
//! size is checked with `fstat` before every access. What remains is a process truncating a file in place
//! between that check and the copy, which nothing in this system does.

#![allow(unsafe_code)]

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use memmap2::Mmap;
use vgpu_core::abi::{
    AbiError,
    vgpu_config::{self, VgpuConfig},
    vmem_node::{self, VmemNode},
};

/// One mapped file.
#[derive(Debug)]
struct Mapping {
    device: u64,
    inode: u64,
    file: File,
    map: Mmap,
    read_in_scrape: bool,
}

impl Mapping {
    /// The mapped bytes, after checking that the file still has its full size `size`.
    fn bytes(&self, path: &Path, size: usize) -> Result<&[u8], AbiError> {
        let meta = self.file.metadata().map_err(|source| AbiError::Io {
            path: path.to_path_buf(),
            action: "stat",
            source,
        })?;
        check_size(path, meta.len(), size)?;
        Ok(&self.map)
    }
}

/// Mappings of the containers' shared files, by path, kept between scrapes.
#[derive(Debug, Default)]
pub struct MappedFiles {
    maps: HashMap<PathBuf, Mapping>,
}

impl MappedFiles {
    /// An empty set of mappings.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many files are mapped now.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// Whether no file is mapped.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Reads and validates the `vgpu.config` at `path` (the checks of [`vgpu_config::read`], with the seqlock
    /// re-read), mapping it on first use and re-mapping it when the path names another file.
    pub fn vgpu_config(&mut self, path: &Path) -> Result<VgpuConfig, AbiError> {
        self.with(path, vgpu_config::FILE_SIZE, |mapping| decode_config(path, mapping))
    }

    /// Reads the device slots `slots` of the `vmem_node.config` ledger at `path` (the checks of
    /// [`vmem_node::read_slots`]), mapping it on first use and re-mapping it when the path names another file.
    pub fn vmem_slots(&mut self, path: &Path, slots: &[usize]) -> Result<VmemNode, AbiError> {
        self.with(path, vmem_node::FILE_SIZE, |mapping| {
            vmem_node::decode_slots_stable(mapping.bytes(path, vmem_node::FILE_SIZE)?, path, slots)
        })
    }

    /// Unmaps every file not read since the previous call (containers that are gone) and starts a new round.
    pub fn retain_read(&mut self) {
        self.maps.retain(|_, m| std::mem::take(&mut m.read_in_scrape));
    }

    /// Maps `path` (of exactly `size` bytes) unless its current file is mapped already, then runs `decode`
    /// over the mapping (which checks the size before each access, [`Mapping::bytes`]). A failure unmaps the file.
    fn with<T>(
        &mut self,
        path: &Path,
        size: usize,
        decode: impl FnOnce(&Mapping) -> Result<T, AbiError>,
    ) -> Result<T, AbiError> {
        let io = |action: &'static str| {
            move |source: std::io::Error| AbiError::Io { path: path.to_path_buf(), action, source }
        };
        let meta = std::fs::metadata(path).map_err(io("stat"))?;
        let current = self.maps.get(path).is_some_and(|m| m.device == meta.dev() && m.inode == meta.ino());
        if !current {
            self.maps.remove(path);
            let file = File::open(path).map_err(io("open"))?;
            let meta = file.metadata().map_err(io("stat"))?;
            check_size(path, meta.len(), size)?;
            // SAFETY: the file is mapped read-only and its size was just checked; see the module docs for
            // why nothing truncates it, and `Mapping::bytes` checks the size again before every access.
            let map = unsafe { Mmap::map(&file) }.map_err(io("map"))?;
            let mapping = Mapping { device: meta.dev(), inode: meta.ino(), file, map, read_in_scrape: false };
            self.maps.insert(path.to_path_buf(), mapping);
        }
        let result = match self.maps.get_mut(path) {
            Some(mapping) => {
                mapping.read_in_scrape = true;
                decode(mapping)
            }
            None => Err(AbiError::Invalid { path: path.to_path_buf(), message: "mapping vanished".into() }),
        };
        if result.is_err() {
            // Never keep a mapping of a file that does not read as what it should be.
            self.maps.remove(path);
        }
        result
    }
}

fn check_size(path: &Path, len: u64, expected: usize) -> Result<(), AbiError> {
    if len == expected as u64 {
        Ok(())
    } else {
        Err(AbiError::Size {
            path: path.to_path_buf(),
            expected,
            actual: usize::try_from(len).unwrap_or(usize::MAX),
        })
    }
}

/// Copies the mapped `vgpu.config` out (each time through the size check of `bytes`), decodes it, and retries
/// while a device slot is mid-update or a writer changed a sequence word during the copy.
fn decode_config(path: &Path, mapping: &Mapping) -> Result<VgpuConfig, AbiError> {
    let mut last_busy = None;
    for _ in 0..vgpu_config::READ_ATTEMPTS {
        let copy = mapping.bytes(path, vgpu_config::FILE_SIZE)?.to_vec();
        let config = VgpuConfig::decode(&copy, path)?;
        let odd = config.devices.iter().enumerate().find(|(_, d)| d.seq % 2 == 1);
        if let Some((index, d)) = odd {
            last_busy = Some((index, d.seq));
            std::thread::yield_now();
            continue;
        }
        if sequence_words(mapping.bytes(path, vgpu_config::FILE_SIZE)?, config.devices.len())
            == sequence_words(&copy, config.devices.len())
        {
            return Ok(config);
        }
        std::thread::yield_now();
    }
    let (index, seq) = last_busy.unwrap_or_default();
    Err(AbiError::Busy { path: path.to_path_buf(), index, seq })
}

/// The sequence words of the first `count` device slots.
fn sequence_words(bytes: &[u8], count: usize) -> Vec<u32> {
    (0..count)
        .map(|i| {
            let at = vgpu_config::DEVICES_OFFSET + i * vgpu_config::DEVICE_SIZE;
            bytes.get(at..at + 4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;
    use vgpu_core::abi::vgpu_config::DeviceConfig;

    fn config(pod: &str, limit: u64) -> VgpuConfig {
        let mut c = VgpuConfig { pod_uid: pod.into(), ..VgpuConfig::default() };
        c.devices[0] = DeviceConfig {
            uuid: "GPU-1".into(),
            total_memory: limit,
            real_memory: limit,
            activate: 1,
            ..DeviceConfig::default()
        };
        c
    }

    #[test]
    fn maps_once_and_follows_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.config");
        vgpu_config::write(&path, &config("a", 1 << 30)).unwrap();
        let mut maps = MappedFiles::new();
        assert_eq!(maps.vgpu_config(&path).unwrap().pod_uid, "a");
        assert_eq!(maps.len(), 1);
        // Same inode: served from the mapping.
        assert_eq!(maps.vgpu_config(&path).unwrap().devices[0].total_memory, 1 << 30);
        // Replaced by rename (what our writers do): a new inode, re-mapped.
        vgpu_config::write(&path, &config("b", 2 << 30)).unwrap();
        let read = maps.vgpu_config(&path).unwrap();
        assert_eq!((read.pod_uid.as_str(), read.devices[0].total_memory), ("b", 2 << 30));
        assert_eq!(maps.len(), 1);
    }

    #[test]
    fn in_place_edits_are_seen_and_truncation_is_refused_before_touching_the_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.config");
        vgpu_config::write(&path, &config("a", 1 << 30)).unwrap();
        let mut maps = MappedFiles::new();
        maps.vgpu_config(&path).unwrap();
        // An in-place write through the same inode shows through the shared mapping.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[vgpu_config::offsets::POD_UID] = b'z';
        std::fs::write(&path, &bytes).unwrap(); // O_TRUNC + write: the same inode

        assert_eq!(maps.vgpu_config(&path).unwrap().pod_uid, "z");
        // Truncated in place: the size check fails, the mapping is dropped, no SIGBUS.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
        let err = maps.vgpu_config(&path).unwrap_err();
        assert!(matches!(err, AbiError::Size { actual: 100, expected: 8192, .. }), "{err}");
        assert!(maps.is_empty());
    }

    #[test]
    fn wrong_files_are_errors_naming_the_file_and_stay_unmapped() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"short").unwrap();
        let zero = dir.path().join("zero");
        std::fs::write(&zero, vec![0u8; vgpu_config::FILE_SIZE]).unwrap();
        let mut maps = MappedFiles::new();
        let err = maps.vgpu_config(&small).unwrap_err();
        assert!(matches!(err, AbiError::Size { .. }) && err.to_string().contains("small"), "{err}");
        let err = maps.vgpu_config(&zero).unwrap_err();
        assert!(matches!(err, AbiError::Magic { .. }), "{err}");
        let err = maps.vgpu_config(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, AbiError::Io { action: "stat", .. }), "{err}");
        assert!(maps.is_empty());
    }

    #[test]
    fn odd_sequence_word_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.config");
        let mut c = config("a", 1);
        c.devices[0].seq = 3;
        vgpu_config::write(&path, &c).unwrap();
        let err = MappedFiles::new().vgpu_config(&path).unwrap_err();
        assert!(matches!(err, AbiError::Busy { index: 0, seq: 3, .. }), "{err}");
    }

    #[test]
    fn files_not_read_in_a_round_are_unmapped() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        vgpu_config::write(&a, &config("a", 1)).unwrap();
        vgpu_config::write(&b, &config("b", 1)).unwrap();
        let mut maps = MappedFiles::new();
        maps.vgpu_config(&a).unwrap();
        maps.vgpu_config(&b).unwrap();
        maps.retain_read();
        assert_eq!(maps.len(), 2);
        maps.vgpu_config(&a).unwrap();
        maps.retain_read();
        assert_eq!(maps.len(), 1);
        maps.retain_read();
        assert!(maps.is_empty());
    }

    #[test]
    fn vmem_ledger_is_read_through_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmem_node.config");
        let mut node = VmemNode::default();
        node.devices[1] = vec![vmem_node::ProcessUsed { pid: 7, used: 100 }];
        node.devices[2] = vec![vmem_node::ProcessUsed { pid: 8, used: 5 }];
        vmem_node::write(&path, &node).unwrap();
        let mut maps = MappedFiles::new();
        let read = maps.vmem_slots(&path, &[1]).unwrap();
        assert_eq!(read.used_by(1, |_| true), 100);
        assert!(read.devices[2].is_empty(), "only the slots asked for");
        assert_eq!(read, vmem_node::read_slots(&path, &[1]).unwrap());
        // A config file is not a ledger: size error, unmapped.
        let other = dir.path().join("vgpu.config");
        vgpu_config::write(&other, &config("a", 1)).unwrap();
        let err = maps.vmem_slots(&other, &[0]).unwrap_err();
        assert!(matches!(err, AbiError::Size { expected: vmem_node::FILE_SIZE, .. }), "{err}");
        assert_eq!(maps.len(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever bytes a file holds, reading it through a mapping never panics and agrees with the plain
        /// reader.
        #[test]
        fn agrees_with_the_plain_reader(bytes in prop::collection::vec(any::<u8>(), 0..9000), keep_header in any::<bool>()) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("vgpu.config");
            let mut bytes = bytes;
            if keep_header {
                // A valid header (first 64 bytes) over random contents, full size: reaches the device decoding.
                let mut valid = config("p", 7).encode();
                for (slot, b) in valid.iter_mut().zip(&bytes).skip(64) {
                    *slot = *b;
                }
                bytes = valid;
            }
            std::fs::write(&path, &bytes).unwrap();
            let plain = vgpu_config::read(&path);
            let mapped = MappedFiles::new().vgpu_config(&path);
            prop_assert_eq!(plain.is_ok(), mapped.is_ok());
            if let (Ok(a), Ok(b)) = (plain, mapped) {
                prop_assert_eq!(a, b);
            }
        }
    }
}
