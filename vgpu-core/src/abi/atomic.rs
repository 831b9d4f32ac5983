//! Atomic file replacement: write a temporary file in the same directory, `fsync` it, `rename` it over the
//! target, then `fsync` the directory. Readers see either the old or the new content, never a mix.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use super::AbiError;

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn io<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> AbiError + 'a {
    move |source| AbiError::Io { path: path.to_path_buf(), action, source }
}

/// Writes `bytes` to `path` atomically, creating the file with `mode` (before the process umask, like
/// `open(2)`). The parent directory must exist. On failure the temporary file is removed and `path` is
/// untouched.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AbiError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let file_name = path.file_name().ok_or_else(|| AbiError::Invalid {
        path: path.to_path_buf(),
        message: "the path has no file name".to_owned(),
    })?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}-{n}", std::process::id()));
    let tmp: PathBuf = dir.join(tmp_name);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io(&tmp, "create temporary file"))?;
        file.write_all(bytes).map_err(io(&tmp, "write temporary file"))?;
        file.sync_all().map_err(io(&tmp, "fsync temporary file"))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(io(path, "rename temporary file over"))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // Make the rename durable; a directory that cannot be opened for fsync is not an error of the write.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"one", 0o644).unwrap();
        write_atomic(&path, b"two", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn missing_directory_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope/f");
        let err = write_atomic(&path, b"x", 0o644).unwrap_err();
        assert!(err.to_string().contains("create temporary file"), "{err}");
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
