//! `vgpu.config` files read through memory mappings kept between scrapes (`memmap2`).
//!
//! The monitor reads every collectable container's `vgpu.config` on each scrape. A plain read costs an
//! `open`, an `fstat`, a `read` of 8 KiB and a `close` per file; a mapping kept in [`MappedConfigs`] costs one
//! `stat` of the path (to notice a replaced file) and one `fstat` of the open file (to notice a truncated one),
//! and the bytes are copied straight from the page cache. `cargo bench -p vgpu-monitor --bench monitor`
//! (`vgpu_config/read` against `vgpu_config/mapped`) measures both.
//!
//! | event | what happens |
//! |---|---|
//! | first read of a path | open, check the size is [`vgpu_config::FILE_SIZE`], map read-only, decode |
//! | same device and inode, same size | decode from the mapping (no open) |
//! | the path names another device/inode (file replaced by rename) | the old mapping is dropped, the new file mapped |
//! | the open file's size changed (truncated or grown in place) | the mapping is dropped before any byte is touched; [`AbiError::Size`] |
//! | wrong size or magic | [`AbiError`] naming the file; nothing stays mapped |
//! | a device slot mid-update (odd sequence word) | copied again, up to [`vgpu_config::READ_ATTEMPTS`] times, then [`AbiError::Busy`] |
//! | the copy's sequence words differ from the mapping's after the copy (a writer passed through) | copied again |
//! | a path not read during a scrape | unmapped by [`MappedConfigs::retain_read`] |
//!
//! This is the crate's only module that may use `unsafe` (`tests/unsafe_boundary.rs` enforces it): mapping a
//! file is `unsafe` in Rust because another process could truncate it, and touching a page beyond the new end
//! of file raises `SIGBUS`. Our writers never truncate a `vgpu.config` (the device plugin and the DRA plugin
//! write a fresh file and rename it over the old one, [`vgpu_config::write`], which leaves our mapping on the
//! old inode), and the size is checked with `fstat` before every copy. What remains is a process that
//! truncates the file in place between that check and the copy, which nothing in this system does.

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

/// Mappings of `vgpu.config` files, by path, kept between scrapes.
#[derive(Debug, Default)]
pub struct MappedConfigs {
    maps: HashMap<PathBuf, Mapping>,
}

impl MappedConfigs {
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
    pub fn read(&mut self, path: &Path) -> Result<VgpuConfig, AbiError> {
        let io = |action: &'static str| {
            move |source: std::io::Error| AbiError::Io { path: path.to_path_buf(), action, source }
        };
        let meta = std::fs::metadata(path).map_err(io("stat"))?;
        let current = self.maps.get(path).is_some_and(|m| m.device == meta.dev() && m.inode == meta.ino());
        if !current {
            self.maps.remove(path);
            let file = File::open(path).map_err(io("open"))?;
            let meta = file.metadata().map_err(io("stat"))?;
            check_size(path, meta.len())?;
            // SAFETY: the file is mapped read-only and its size was just checked; see the module docs for
            // why no writer of ours truncates it, and `copy` checks the size again before every access.
            let map = unsafe { Mmap::map(&file) }.map_err(io("map"))?;
            let mapping = Mapping { device: meta.dev(), inode: meta.ino(), file, map, read_in_scrape: false };
            self.maps.insert(path.to_path_buf(), mapping);
        }
        let result = match self.maps.get_mut(path) {
            Some(mapping) => {
                mapping.read_in_scrape = true;
                decode(path, mapping)
            }
            None => Err(AbiError::Invalid { path: path.to_path_buf(), message: "mapping vanished".into() }),
        };
        if result.is_err() {
            // Never keep a mapping of a file that does not read as a `vgpu.config`.
            self.maps.remove(path);
        }
        result
    }

    /// Unmaps every file not read since the previous call (containers that are gone) and starts a new round.
    pub fn retain_read(&mut self) {
        self.maps.retain(|_, m| std::mem::take(&mut m.read_in_scrape));
    }
}

fn check_size(path: &Path, len: u64) -> Result<(), AbiError> {
    if len == vgpu_config::FILE_SIZE as u64 {
        Ok(())
    } else {
        Err(AbiError::Size {
            path: path.to_path_buf(),
            expected: vgpu_config::FILE_SIZE,
            actual: usize::try_from(len).unwrap_or(usize::MAX),
        })
    }
}

/// Copies the mapped bytes out (after checking the file still has its full size), decodes them, and retries
/// while a device slot is mid-update or a writer changed a sequence word during the copy.
fn decode(path: &Path, mapping: &Mapping) -> Result<VgpuConfig, AbiError> {
    let mut last_busy = None;
    for _ in 0..vgpu_config::READ_ATTEMPTS {
        let meta = mapping.file.metadata().map_err(|source| AbiError::Io {
            path: path.to_path_buf(),
            action: "stat",
            source,
        })?;
        check_size(path, meta.len())?;
        let bytes = mapping.map.to_vec();
        let config = VgpuConfig::decode(&bytes, path)?;
        let odd = config.devices.iter().enumerate().find(|(_, d)| d.seq % 2 == 1);
        if let Some((index, d)) = odd {
            last_busy = Some((index, d.seq));
            std::thread::yield_now();
            continue;
        }
        if sequence_words(&mapping.map, config.devices.len()) == sequence_words(&bytes, config.devices.len())
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
        let mut maps = MappedConfigs::new();
        assert_eq!(maps.read(&path).unwrap().pod_uid, "a");
        assert_eq!(maps.len(), 1);
        // Same inode: served from the mapping.
        assert_eq!(maps.read(&path).unwrap().devices[0].total_memory, 1 << 30);
        // Replaced by rename (what our writers do): a new inode, re-mapped.
        vgpu_config::write(&path, &config("b", 2 << 30)).unwrap();
        let read = maps.read(&path).unwrap();
        assert_eq!((read.pod_uid.as_str(), read.devices[0].total_memory), ("b", 2 << 30));
        assert_eq!(maps.len(), 1);
    }

    #[test]
    fn in_place_edits_are_seen_and_truncation_is_refused_before_touching_the_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vgpu.config");
        vgpu_config::write(&path, &config("a", 1 << 30)).unwrap();
        let mut maps = MappedConfigs::new();
        maps.read(&path).unwrap();
        // An in-place write through the same inode shows through the shared mapping.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[vgpu_config::offsets::POD_UID] = b'z';
        std::fs::write(&path, &bytes).unwrap(); // O_TRUNC + write: the same inode

        assert_eq!(maps.read(&path).unwrap().pod_uid, "z");
        // Truncated in place: the size check fails, the mapping is dropped, no SIGBUS.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
        let err = maps.read(&path).unwrap_err();
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
        let mut maps = MappedConfigs::new();
        let err = maps.read(&small).unwrap_err();
        assert!(matches!(err, AbiError::Size { .. }) && err.to_string().contains("small"), "{err}");
        let err = maps.read(&zero).unwrap_err();
        assert!(matches!(err, AbiError::Magic { .. }), "{err}");
        let err = maps.read(&dir.path().join("missing")).unwrap_err();
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
        let err = MappedConfigs::new().read(&path).unwrap_err();
        assert!(matches!(err, AbiError::Busy { index: 0, seq: 3, .. }), "{err}");
    }

    #[test]
    fn files_not_read_in_a_round_are_unmapped() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        vgpu_config::write(&a, &config("a", 1)).unwrap();
        vgpu_config::write(&b, &config("b", 1)).unwrap();
        let mut maps = MappedConfigs::new();
        maps.read(&a).unwrap();
        maps.read(&b).unwrap();
        maps.retain_read();
        assert_eq!(maps.len(), 2);
        maps.read(&a).unwrap();
        maps.retain_read();
        assert_eq!(maps.len(), 1);
        maps.retain_read();
        assert!(maps.is_empty());
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
            let mapped = MappedConfigs::new().read(&path);
            prop_assert_eq!(plain.is_ok(), mapped.is_ok());
            if let (Ok(a), Ok(b)) = (plain, mapped) {
                prop_assert_eq!(a, b);
            }
        }
    }
}
