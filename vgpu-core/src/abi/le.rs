//! Little-endian field access shared by the fixed-layout files ([`super::vmem_node`], [`super::sm_util`],
//! [`super::sm_node`]), and [`Source`]: a file image read either from memory or from an open file by
//! offset (`pread`), so a reader fetches only the parts of a large file it needs.

use std::{fs::File, os::unix::fs::FileExt, path::Path};

use super::AbiError;

/// Something a fixed-layout image is read from by offset.
pub(crate) trait Source {
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Fills `buf` from offset `at`; the range is inside [`Source::len`] (callers check the size first).
    fn read_at(&self, at: usize, buf: &mut [u8]) -> Result<(), AbiError>;

    fn u32_at(&self, at: usize) -> Result<u32, AbiError> {
        let mut b = [0u8; 4];
        self.read_at(at, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

impl Source for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn read_at(&self, at: usize, buf: &mut [u8]) -> Result<(), AbiError> {
        match self.get(at..at + buf.len()) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => {
                buf.fill(0);
                Ok(())
            }
        }
    }
}

/// An open file and its name (for errors) and length (taken once, when opened).
pub(crate) struct FileSource<'a> {
    pub(crate) file: &'a File,
    pub(crate) path: &'a Path,
    pub(crate) len: usize,
}

impl<'a> FileSource<'a> {
    /// Wraps `file`, reading its current length.
    pub(crate) fn new(file: &'a File, path: &'a Path) -> Result<Self, AbiError> {
        let len = file.metadata().map_err(|source| AbiError::Io {
            path: path.to_path_buf(),
            action: "stat",
            source,
        })?;
        let len = usize::try_from(len.len()).unwrap_or(usize::MAX);
        Ok(Self { file, path, len })
    }
}

impl Source for FileSource<'_> {
    fn len(&self) -> usize {
        self.len
    }
    fn read_at(&self, at: usize, buf: &mut [u8]) -> Result<(), AbiError> {
        self.file.read_exact_at(buf, at as u64).map_err(|source| AbiError::Io {
            path: self.path.to_path_buf(),
            action: "read",
            source,
        })
    }
}

/// Opens `path` read-only, naming it in the error.
pub(crate) fn open(path: &Path) -> Result<File, AbiError> {
    File::open(path).map_err(|source| AbiError::Io { path: path.to_path_buf(), action: "open", source })
}

/// Decodes twice with `decode` until two consecutive results agree (a writer that updates the file in
/// place between the two reads makes them differ), up to `attempts` times; then a named error.
pub(crate) fn read_stable<T: PartialEq>(
    path: &Path,
    attempts: usize,
    mut decode: impl FnMut() -> Result<T, AbiError>,
) -> Result<T, AbiError> {
    let mut last = decode()?;
    for _ in 0..attempts {
        let next = decode()?;
        if next == last {
            return Ok(next);
        }
        last = next;
        std::thread::yield_now();
    }
    Err(AbiError::Invalid {
        path: path.to_path_buf(),
        message: format!(
            "content kept changing across {} consecutive reads (a writer is busy)",
            attempts + 1
        ),
    })
}

pub(crate) fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(dst) = b.get_mut(at..at + v.len()) {
        dst.copy_from_slice(v);
    }
}
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    put(b, at, &v.to_le_bytes());
}
pub(crate) fn put_i32(b: &mut [u8], at: usize, v: i32) {
    put(b, at, &v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    put(b, at, &v.to_le_bytes());
}
pub(crate) fn put_i64(b: &mut [u8], at: usize, v: i64) {
    put(b, at, &v.to_le_bytes());
}
fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b.get(at..at + N).and_then(|s| s.try_into().ok()).unwrap_or([0; N])
}
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(get(b, at))
}
pub(crate) fn get_i32(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(get(b, at))
}
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(get(b, at))
}
pub(crate) fn get_i64(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(get(b, at))
}
