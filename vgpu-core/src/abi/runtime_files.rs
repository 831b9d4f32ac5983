//! The vGPU runtime files on the host that every vGPU container bind-mounts from the manager directory:
//! the control library `libvgpu-control.so.<version>` (at [`CONTAINER_LIBRARY`]) and `ld.so.preload`
//! (at `/etc/ld.so.preload`, naming that library).
//!
//! Both plugins answer `Allocate` / `NodePrepareResources` with bind mounts of these files. When a source
//! is missing, containerd (and runc) create it **as a directory** on the host, the container starts
//! without its limits, and the directory then blocks installing the real file. So the plugins [`check`]
//! before answering and refuse the container with an error that says what to install; the kubelet turns
//! it into the pod's event. [`install`] writes both files atomically (what an install step does).

use std::path::{Path, PathBuf};

use super::{AbiError, atomic::write_atomic};

/// `ld.so.preload` under the manager directory.
pub const PRELOAD_FILE: &str = "ld.so.preload";
/// Where the control library is mounted in a container (and what `ld.so.preload` names).
pub const CONTAINER_LIBRARY: &str = "/etc/vgpu-manager/driver/libvgpu-control.so";

/// The control library's file name on the host for `version` (`libvgpu-control.so.<version>`).
pub fn library_file_name(version: &str) -> String {
    format!("libvgpu-control.so.{version}")
}

/// The library version the plugins mount by default (vgpu-manager's).
pub const DEFAULT_LIBRARY_VERSION: &str = "v1.0.0";

/// Checks a library version (`--library-version`): 1 to 64 ASCII letters, digits, `.`, `_`, `+` or `-`, not
/// starting with `.` (it becomes part of a file name in the manager directory).
///
/// ```
/// use vgpu_core::abi::runtime_files::parse_library_version;
/// assert_eq!(parse_library_version("v2.1.0-rc1").unwrap(), "v2.1.0-rc1");
/// assert!(parse_library_version("../v1").is_err());
/// ```
pub fn parse_library_version(text: &str) -> Result<String, String> {
    let ok = (1..=64).contains(&text.len())
        && !text.starts_with('.')
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'));
    if ok {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a library version (expected 1 to 64 letters, digits, '.', '_', '+' or '-', e.g. v1.0.0)"
        ))
    }
}

/// A runtime file a vGPU container would mount is not there as a regular file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeFileError {
    /// The file does not exist.
    #[error(
        "vGPU runtime file {} is missing: install the vGPU runtime files (libvgpu-control.so.<version>, ld.so.preload) into the host manager directory before vGPU containers start (the container runtime would create the missing mount source as a directory)",
        path.display()
    )]
    Missing {
        /// The file (as this process sees it).
        path: PathBuf,
    },
    /// Something other than a regular file is there (typically a directory a container runtime created
    /// when a container started before the file was installed).
    #[error(
        "vGPU runtime file {} is a {found}, not a regular file (a container runtime creates a directory there when a container starts before the file is installed): remove it and install the vGPU runtime files",
        path.display()
    )]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// What is there.
        found: &'static str,
    },
    /// The file could not be examined.
    #[error("vGPU runtime file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Checks that the control library (`library_file_name(library_version)`) and, when `preload`, the
/// `ld.so.preload` file are regular files under `manager_dir` (symlinks followed, as a bind mount does).
pub fn check(manager_dir: &Path, library_version: &str, preload: bool) -> Result<(), RuntimeFileError> {
    let mut files = vec![manager_dir.join(library_file_name(library_version))];
    if preload {
        files.push(manager_dir.join(PRELOAD_FILE));
    }
    for path in files {
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(meta) => {
                let found = if meta.is_dir() { "directory" } else { "special file" };
                return Err(RuntimeFileError::NotAFile { path, found });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RuntimeFileError::Missing { path });
            }
            Err(source) => return Err(RuntimeFileError::Io { path, source }),
        }
    }
    Ok(())
}

/// Installs the runtime files into `manager_dir` (created if missing): `library` as
/// `libvgpu-control.so.<library_version>` (mode 0755) and `ld.so.preload` naming [`CONTAINER_LIBRARY`]
/// (0644), each written atomically.
pub fn install(manager_dir: &Path, library_version: &str, library: &[u8]) -> Result<(), AbiError> {
    std::fs::create_dir_all(manager_dir).map_err(|source| AbiError::Io {
        path: manager_dir.to_path_buf(),
        action: "create directory",
        source,
    })?;
    write_atomic(&manager_dir.join(library_file_name(library_version)), library, 0o755)?;
    write_atomic(&manager_dir.join(PRELOAD_FILE), format!("{CONTAINER_LIBRARY}\n").as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_library_version_never_leaves_the_manager_directory(text in "\\PC{0,70}") {
            if let Ok(version) = parse_library_version(&text) {
                let name = library_file_name(&version);
                prop_assert!(!name.contains('/'), "{name}");
                prop_assert_eq!(std::path::Path::new(&name).components().count(), 1);
            }
        }
    }

    use super::*;

    #[test]
    fn missing_directory_and_installed_files() {
        let dir = tempfile::tempdir().unwrap();
        let err = check(dir.path(), "v1.0.0", true).unwrap_err();
        assert!(
            matches!(&err, RuntimeFileError::Missing { path } if path.ends_with("libvgpu-control.so.v1.0.0"))
        );
        assert!(err.to_string().contains("install the vGPU runtime files"), "{err}");

        // What containerd leaves behind when a container started first.
        std::fs::create_dir(dir.path().join(PRELOAD_FILE)).unwrap();
        std::fs::write(dir.path().join("libvgpu-control.so.v1.0.0"), b"\x7fELF").unwrap();
        let err = check(dir.path(), "v1.0.0", true).unwrap_err();
        assert!(matches!(err, RuntimeFileError::NotAFile { found: "directory", .. }), "{err}");
        // Without the preload file (DISABLE_VGPU_CONTROL) only the library counts.
        check(dir.path(), "v1.0.0", false).unwrap();

        std::fs::remove_dir(dir.path().join(PRELOAD_FILE)).unwrap();
        install(dir.path(), "v1.0.0", b"\x7fELF").unwrap();
        check(dir.path(), "v1.0.0", true).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(PRELOAD_FILE)).unwrap(),
            format!("{CONTAINER_LIBRARY}\n")
        );
        // Another version is not this one.
        assert!(check(dir.path(), "v2", false).is_err());
    }
}
