//! Changing a host path's permissions without following a symbolic link.
//!
//! The plugins create directories under the manager directory that containers bind-mount read-write (the
//! per-container `config`/`vmem_node`/`sm_node` directories, a claim's MPS pipe directory) and then widen
//! their mode. `chmod(2)` follows symbolic links: had a container planted `config -> /etc` before the
//! plugin's `create_dir_all` (which accepts an existing directory, or a link to one), a plain
//! `std::fs::set_permissions` would make the host's `/etc` world-writable.
//!
//! [`set_mode_nofollow`] never changes the mode of anything but the path's own inode:
//!
//! 1. `lstat` the path: a symbolic link is refused ([`PermsError::Symlink`]), and so is anything but a
//!    directory or a regular file ([`PermsError::NotFileOrDirectory`]);
//! 2. open it with `O_NOFOLLOW | O_NONBLOCK` (a link swapped in since step 1 fails the open instead of being
//!    followed; a FIFO swapped in does not block);
//! 3. `fstat` the handle and require the inode `lstat` saw ([`PermsError::Replaced`] otherwise);
//! 4. `fchmod` the handle.
//!
//! The mode is thus set on the inode that was verified to be the path's own, however the path changes
//! meanwhile. Only the last component is checked: the parent directories are the plugin's own.
//!
//! The crate has no `libc`/`rustix` dependency, so the two open flags are the Linux ABI values of the
//! supported architectures (checked by this module's tests); elsewhere they are 0 and steps 1 and 3 still
//! keep `fchmod` off anything but the verified inode. The open is read-only, so a caller without
//! `CAP_DAC_OVERRIDE` needs read permission on the path (the plugins run as root).

use std::fs::{Metadata, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `open(2)` flags of the generic Linux ABI (x86, RISC-V, s390x, LoongArch).
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "riscv64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    )
))]
mod flags {
    /// `O_NOFOLLOW`.
    pub const O_NOFOLLOW: i32 = 0o400000;
    /// `O_NONBLOCK`.
    pub const O_NONBLOCK: i32 = 0o4000;
}

/// `open(2)` flags of Linux on Arm and PowerPC.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "aarch64", target_arch = "arm", target_arch = "powerpc64")
))]
mod flags {
    /// `O_NOFOLLOW`.
    pub const O_NOFOLLOW: i32 = 0o100000;
    /// `O_NONBLOCK`.
    pub const O_NONBLOCK: i32 = 0o4000;
}

/// Elsewhere: no extra flags (the `lstat` and inode checks still apply).
#[cfg(not(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "riscv64",
        target_arch = "s390x",
        target_arch = "loongarch64",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "powerpc64"
    )
)))]
mod flags {
    /// Not used.
    pub const O_NOFOLLOW: i32 = 0;
    /// Not used.
    pub const O_NONBLOCK: i32 = 0;
}

use flags::{O_NOFOLLOW, O_NONBLOCK};

/// The permissions of a path could not be set safely.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PermsError {
    /// The path is a symbolic link; its target is left alone.
    #[error("{}: is a symbolic link; refusing to change its permissions", path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// The path is neither a directory nor a regular file (a FIFO, socket or device node).
    #[error("{}: is a {kind}, not a directory or regular file; refusing to change its permissions", path.display())]
    NotFileOrDirectory {
        /// The path.
        path: PathBuf,
        /// What it is (`FIFO`, `socket`, `block device`, `character device`).
        kind: &'static str,
    },
    /// The path named another file by the time it was opened (it was replaced meanwhile).
    #[error("{}: was replaced while its permissions were being changed; refusing to change them", path.display())]
    Replaced {
        /// The path.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("{}: {action}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done (`lstat`, `open`, `fstat`, `chmod`, `create directory`).
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl PermsError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Symlink { path }
            | Self::NotFileOrDirectory { path, .. }
            | Self::Replaced { path }
            | Self::Io { path, .. } => path,
        }
    }
}

fn io<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> PermsError + 'a {
    move |source| PermsError::Io { path: path.to_path_buf(), action, source }
}

/// Refuses what [`set_mode_nofollow`] never changes: a symbolic link, a FIFO, a socket, a device node.
fn check_type(path: &Path, meta: &Metadata) -> Result<(), PermsError> {
    let t = meta.file_type();
    let kind = if t.is_symlink() {
        return Err(PermsError::Symlink { path: path.to_path_buf() });
    } else if t.is_dir() || t.is_file() {
        return Ok(());
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_char_device() {
        "character device"
    } else {
        "special file"
    };
    Err(PermsError::NotFileOrDirectory { path: path.to_path_buf(), kind })
}

/// Sets the permission bits of the directory or regular file at `path` to `mode` (`chmod`, but never
/// through a symbolic link: see the [module docs](self)). The process umask does not apply.
///
/// Fails with [`PermsError::Symlink`] when `path` is a symbolic link, whatever it points at; the link's
/// target keeps its mode.
pub fn set_mode_nofollow(path: &Path, mode: u32) -> Result<(), PermsError> {
    let before = std::fs::symlink_metadata(path).map_err(io(path, "lstat"))?;
    check_type(path, &before)?;
    let file = match OpenOptions::new().read(true).custom_flags(O_NOFOLLOW | O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) => {
            // ELOOP from O_NOFOLLOW: a link was swapped in since the lstat. Name it as such.
            if let Ok(now) = std::fs::symlink_metadata(path)
                && now.file_type().is_symlink()
            {
                return Err(PermsError::Symlink { path: path.to_path_buf() });
            }
            return Err(io(path, "open")(e));
        }
    };
    let opened = file.metadata().map_err(io(path, "fstat"))?;
    if (opened.dev(), opened.ino()) != (before.dev(), before.ino()) {
        return Err(PermsError::Replaced { path: path.to_path_buf() });
    }
    check_type(path, &opened)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io(path, "chmod"))
}

/// Creates the directory `path` and its missing parents (`create_dir_all`; an existing directory is fine),
/// then sets its mode with [`set_mode_nofollow`]: a symbolic link at `path` (even one to a directory, which
/// `create_dir_all` accepts) is refused and its target keeps its mode.
pub fn create_dir_all_mode(path: &Path, mode: u32) -> Result<(), PermsError> {
    std::fs::create_dir_all(path).map_err(io(path, "create directory"))?;
    set_mode_nofollow(path, mode)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::symlink;

    use super::*;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn sets_the_mode_of_directories_and_files_ignoring_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("a/b/c");
        create_dir_all_mode(&d, 0o777).unwrap();
        assert_eq!(mode_of(&d), 0o777);
        // Idempotent, and narrowing works too.
        create_dir_all_mode(&d, 0o711).unwrap();
        assert_eq!(mode_of(&d), 0o711);
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        set_mode_nofollow(&f, 0o640).unwrap();
        assert_eq!(mode_of(&f), 0o640);
    }

    #[test]
    fn a_symlink_is_refused_and_its_target_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target_dir = outside.path().join("host-dir");
        std::fs::create_dir(&target_dir).unwrap();
        std::fs::set_permissions(&target_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let target_file = outside.path().join("host-file");
        std::fs::write(&target_file, b"secret").unwrap();
        std::fs::set_permissions(&target_file, std::fs::Permissions::from_mode(0o600)).unwrap();

        let to_dir = dir.path().join("config");
        symlink(&target_dir, &to_dir).unwrap();
        let e = create_dir_all_mode(&to_dir, 0o777).unwrap_err();
        assert!(matches!(&e, PermsError::Symlink { path } if *path == to_dir), "{e:?}");
        assert_eq!(e.path(), to_dir);
        let text = e.to_string();
        assert!(text.contains(&to_dir.display().to_string()), "{text}");
        assert!(text.contains("is a symbolic link; refusing to change its permissions"), "{text}");
        assert_eq!(mode_of(&target_dir), 0o700);

        let to_file = dir.path().join("pids.config");
        symlink(&target_file, &to_file).unwrap();
        let e = set_mode_nofollow(&to_file, 0o666).unwrap_err();
        assert!(matches!(e, PermsError::Symlink { .. }), "{e:?}");
        assert_eq!(mode_of(&target_file), 0o600);

        // A dangling link too.
        let dangling = dir.path().join("dangling");
        symlink(outside.path().join("nope"), &dangling).unwrap();
        assert!(matches!(set_mode_nofollow(&dangling, 0o777), Err(PermsError::Symlink { .. })));
    }

    #[test]
    fn special_files_and_missing_paths_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = set_mode_nofollow(&sock, 0o777).unwrap_err();
        assert!(matches!(e, PermsError::NotFileOrDirectory { kind: "socket", .. }), "{e:?}");
        let e = set_mode_nofollow(&dir.path().join("missing"), 0o777).unwrap_err();
        assert!(matches!(e, PermsError::Io { action: "lstat", .. }), "{e:?}");
        // A regular file in the way of a directory.
        let f = dir.path().join("f");
        std::fs::write(&f, b"").unwrap();
        let e = create_dir_all_mode(&f.join("sub"), 0o777).unwrap_err();
        assert!(matches!(e, PermsError::Io { action: "create directory", .. }), "{e:?}");
    }

    /// The hard-coded open flags are this architecture's: `O_NOFOLLOW` makes opening a link fail (`ELOOP`)
    /// where a plain open follows it; with `O_NONBLOCK` a FIFO without a writer opens at once.
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    #[test]
    fn open_flags_match_the_kernel_abi() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        std::fs::write(&target, b"").unwrap();
        let link = dir.path().join("l");
        symlink(&target, &link).unwrap();
        assert!(OpenOptions::new().read(true).open(&link).is_ok());
        let e = OpenOptions::new().read(true).custom_flags(O_NOFOLLOW).open(&link).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(40), "ELOOP: {e}");
        // O_NONBLOCK: opening a FIFO for reading with no writer returns at once instead of blocking.
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status();
        if status.is_ok_and(|s| s.success()) {
            assert!(OpenOptions::new().read(true).custom_flags(O_NONBLOCK).open(&fifo).is_ok());
            let e = set_mode_nofollow(&fifo, 0o777).unwrap_err();
            assert!(matches!(e, PermsError::NotFileOrDirectory { kind: "FIFO", .. }), "{e:?}");
        }
    }
}
