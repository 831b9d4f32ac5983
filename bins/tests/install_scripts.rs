//! The image's init-container scripts, run with bash against temporary directories: `scripts/install_files.sh`
//! (vgpu-manager's charts run it as `bash -c /usr/bin/install_files.sh` / `/scripts/install_files.sh`; its
//! source and destination come from `INSTALLED_DIR` and `HOST_MANAGER_DIR`) and
//! `scripts/kubelet-plugin-prestart.sh` (`DRIVER_ROOT_PARENT` / `DRIVER_ROOT_LINK` stand for
//! `/driver-root-parent` / `/driver-root`). The install's result is what the plugins check before they admit a
//! vGPU container ([`runtime_files::check`]), and the Containerfile's `/installed/ld.so.preload` and limiter
//! version are the ones the plugins mount.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt, symlink},
    path::{Path, PathBuf},
    process::{Command, Output},
};

use vgpu_core::abi::runtime_files::{self, CONTAINER_LIBRARY, PRELOAD_FILE, RuntimeFileError};

const VERSION: &str = "v1.0.0";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(name)
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// `/installed` and the host manager directory, in a temporary directory.
struct Install {
    dir: tempfile::TempDir,
}

impl Install {
    /// A source tree as the image's `/installed/`: the control library only `with_library`.
    fn new(with_library: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let install = Self { dir };
        fs::create_dir_all(install.dest()).unwrap();
        install.write_src("registry/device-client", b"\x7fELF device client", 0o755);
        install.write_src("tools/mem_view_tool", b"\x7fELF tool", 0o755);
        install.write_src(PRELOAD_FILE, format!("{CONTAINER_LIBRARY}\n").as_bytes(), 0o644);
        if with_library {
            install.write_src(&runtime_files::library_file_name(VERSION), b"\x7fELF control library", 0o755);
        }
        install
    }

    fn src(&self) -> PathBuf {
        self.dir.path().join("installed")
    }

    fn dest(&self) -> PathBuf {
        self.dir.path().join("host/etc/vgpu-manager")
    }

    fn write_src(&self, rel: &str, content: &[u8], mode: u32) {
        let path = self.src().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Runs the script as the device-plugin chart does (`bash -c <script>`: executed by its shebang).
    fn run(&self) -> Output {
        let out = Command::new("bash")
            .arg("-c")
            .arg(script("install_files.sh"))
            .env("INSTALLED_DIR", self.src())
            .env("HOST_MANAGER_DIR", self.dest())
            .output()
            .unwrap();
        eprintln!("{}", text(&out));
        out
    }

    fn run_ok(&self) -> String {
        let out = self.run();
        assert!(out.status.success(), "install_files.sh failed: {}", text(&out));
        text(&out)
    }

    /// (inode, mtime, ctime) of every file under the destination, by relative path.
    fn stamps(&self) -> Vec<(String, u64, i64, i64, i64)> {
        let mut stamps = Vec::new();
        walk(&self.dest(), &mut |path| {
            let meta = fs::symlink_metadata(path).unwrap();
            let rel = path.strip_prefix(self.dest()).unwrap().display().to_string();
            stamps.push((rel, meta.ino(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec()));
        });
        stamps.sort();
        stamps
    }
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            walk(&path, f);
        } else {
            f(&path);
        }
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// No temporary file of the script is left anywhere under `dir`.
fn assert_no_temporaries(dir: &Path) {
    walk(dir, &mut |path| {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.contains(".install."), "temporary file left behind: {}", path.display());
    });
}

#[test]
fn first_install_copies_everything_and_a_rerun_changes_nothing() {
    let install = Install::new(true);
    let log = install.run_ok();
    assert!(log.contains("4 file(s) written, 0 unchanged"), "{log}");
    let library = runtime_files::library_file_name(VERSION);
    for rel in ["registry/device-client", "tools/mem_view_tool", PRELOAD_FILE, library.as_str()] {
        let (src, dest) = (install.src().join(rel), install.dest().join(rel));
        assert_eq!(fs::read(&dest).unwrap(), fs::read(&src).unwrap(), "{rel}");
        assert_eq!(mode(&dest), mode(&src), "{rel}: the source's mode");
        assert!(fs::symlink_metadata(&dest).unwrap().file_type().is_file(), "{rel}");
    }
    for dir in ["registry", "tools"] {
        assert_eq!(mode(&install.dest().join(dir)), 0o755, "{dir}");
    }
    // What the device plugin and the kubelet plugin check before they admit a vGPU container.
    runtime_files::check(&install.dest(), VERSION, true).unwrap();
    assert_eq!(
        fs::read_to_string(install.dest().join(PRELOAD_FILE)).unwrap(),
        format!("{CONTAINER_LIBRARY}\n")
    );
    // The library is in place before the preload file that names it.
    let written: Vec<&str> = log.lines().filter(|l| l.starts_with("install_files: copy ")).collect();
    let at = |name: &str| written.iter().position(|l| l.ends_with(name)).unwrap();
    assert!(at(&library) < at(PRELOAD_FILE), "{written:?}");

    let before = install.stamps();
    let log = install.run_ok();
    assert!(log.contains("0 file(s) written, 4 unchanged"), "{log}");
    assert_eq!(install.stamps(), before, "a rerun rewrote a file (inode, mtime or ctime changed)");
    assert_no_temporaries(&install.dest());
}

#[test]
fn a_changed_source_file_is_replaced_by_rename() {
    let install = Install::new(true);
    install.run_ok();
    let dest = install.dest().join("registry/device-client");
    let old_inode = fs::metadata(&dest).unwrap().ino();
    // A reader that has the old file open (a container starting meanwhile) keeps reading the old content.
    let reader = fs::File::open(&dest).unwrap();

    install.write_src("registry/device-client", b"\x7fELF device client, next version", 0o755);
    let log = install.run_ok();
    assert!(log.contains("replace registry/device-client"), "{log}");
    assert!(log.contains("1 file(s) written, 3 unchanged"), "{log}");
    assert_eq!(fs::read(&dest).unwrap(), b"\x7fELF device client, next version");
    assert_ne!(fs::metadata(&dest).unwrap().ino(), old_inode, "written in place, not renamed over");
    assert_eq!(mode(&dest), 0o755);
    let mut old = Vec::new();
    std::io::Read::read_to_end(&mut &reader, &mut old).unwrap();
    assert_eq!(old, b"\x7fELF device client");
    assert_no_temporaries(&install.dest());
}

#[test]
fn a_symlink_at_the_destination_is_replaced_not_followed() {
    let install = Install::new(true);
    let victim = install.dir.path().join("victim");
    fs::write(&victim, b"host file").unwrap();
    fs::create_dir_all(install.dest().join("registry")).unwrap();
    symlink(&victim, install.dest().join("registry/device-client")).unwrap();
    // A dangling one as well.
    symlink(install.dir.path().join("nowhere"), install.dest().join(PRELOAD_FILE)).unwrap();

    let log = install.run_ok();
    assert!(log.contains("replace symlink registry/device-client"), "{log}");
    assert_eq!(fs::read(&victim).unwrap(), b"host file", "the symlink's target was written");
    for rel in ["registry/device-client", PRELOAD_FILE] {
        let dest = install.dest().join(rel);
        assert!(fs::symlink_metadata(&dest).unwrap().file_type().is_file(), "{rel} is still a symlink");
        assert_eq!(fs::read(&dest).unwrap(), fs::read(install.src().join(rel)).unwrap());
    }
    assert!(!install.dir.path().join("nowhere").exists(), "the dangling symlink was followed");
    runtime_files::check(&install.dest(), VERSION, true).unwrap();
}

#[test]
fn a_symlinked_destination_directory_is_refused_the_other_files_installed() {
    let install = Install::new(true);
    let elsewhere = install.dir.path().join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    symlink(&elsewhere, install.dest().join("tools")).unwrap();

    let out = install.run();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let log = text(&out);
    assert!(log.contains("tools is a symlink, not a directory: refusing to follow it"), "{log}");
    assert!(log.contains("1 file(s) could not be installed"), "{log}");
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0, "written through the symlink");
    runtime_files::check(&install.dest(), VERSION, true).unwrap();
    assert!(install.dest().join("registry/device-client").is_file());
}

#[test]
fn an_empty_directory_left_by_a_container_runtime_is_replaced() {
    let install = Install::new(true);
    // containerd creates a missing bind-mount source as a directory.
    fs::create_dir(install.dest().join(PRELOAD_FILE)).unwrap();
    fs::write(install.dest().join(runtime_files::library_file_name(VERSION)), b"\x7fELF control library")
        .unwrap();
    let err = runtime_files::check(&install.dest(), VERSION, true).unwrap_err();
    assert!(matches!(err, RuntimeFileError::NotAFile { found: "directory", .. }), "{err}");
    let log = install.run_ok();
    assert!(log.contains("replace empty directory ld.so.preload"), "{log}");
    runtime_files::check(&install.dest(), VERSION, true).unwrap();

    // A non-empty one is not removed: the script says so and fails.
    let install = Install::new(true);
    fs::create_dir_all(install.dest().join(PRELOAD_FILE).join("data")).unwrap();
    let out = install.run();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("ld.so.preload is a non-empty directory, not a file"), "{}", text(&out));
    assert!(install.dest().join(PRELOAD_FILE).join("data").is_dir());
    let err = runtime_files::check(&install.dest(), VERSION, true).unwrap_err();
    assert!(matches!(err, RuntimeFileError::NotAFile { found: "directory", .. }), "{err}");
}

#[test]
fn without_the_limiter_no_preload_file_is_written_and_the_plugins_refuse() {
    let install = Install::new(false);
    let out = install.run();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = text(&out);
    assert!(log.contains("not installing ld.so.preload: it would name a library that is not there"), "{log}");
    assert!(
        log.contains("holds no vGPU control library (libvgpu-control.so.<version>)")
            && log.contains("will refuse vGPU containers")
            && log.contains("LIMITER_IMAGE"),
        "{log}"
    );
    assert!(!install.dest().join(PRELOAD_FILE).exists(), "ld.so.preload naming a missing library");
    assert!(install.dest().join("registry/device-client").is_file());

    // The plugins' check refuses, with the message the script quotes.
    let err = runtime_files::check(&install.dest(), VERSION, true).unwrap_err();
    assert!(
        matches!(err, RuntimeFileError::Missing { ref path } if path.ends_with("libvgpu-control.so.v1.0.0"))
    );
    let message = err.to_string();
    assert!(message.starts_with("vGPU runtime file ") && message.contains(" is missing"), "{message}");
    assert!(log.contains("(\"vGPU runtime file ... is missing\")"), "{log}");

    // Once the library is in the image, the next run completes the install.
    install.write_src(&runtime_files::library_file_name(VERSION), b"\x7fELF control library", 0o755);
    let log = install.run_ok();
    assert!(log.contains("2 file(s) written, 2 unchanged"), "{log}");
    runtime_files::check(&install.dest(), VERSION, true).unwrap();
}

#[test]
fn missing_source_or_destination_directory_fails() {
    let install = Install::new(true);
    fs::remove_dir_all(install.dest()).unwrap();
    let out = install.run();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("destination directory") && text(&out).contains("does not exist"),
        "{}",
        text(&out)
    );
    assert!(!install.dest().exists(), "created the destination instead of failing");

    let install = Install::new(true);
    fs::remove_dir_all(install.src()).unwrap();
    let out = install.run();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("source directory") && text(&out).contains("(INSTALLED_DIR)"),
        "{}",
        text(&out)
    );
}

/// The DRA chart's init container: `bash /usr/bin/kubelet-plugin-prestart.sh`.
fn prestart(root: &Path, driver_root: &str, max_attempts: u32) -> Output {
    let out = Command::new("bash")
        .arg(script("kubelet-plugin-prestart.sh"))
        .env("NVIDIA_DRIVER_ROOT", driver_root)
        .env("DRIVER_ROOT_PARENT", root.join("driver-root-parent"))
        .env("DRIVER_ROOT_LINK", root.join("driver-root"))
        .env("PRESTART_RETRY_INTERVAL", "0.05")
        .env("PRESTART_MAX_ATTEMPTS", max_attempts.to_string())
        .output()
        .unwrap();
    eprintln!("{}", text(&out));
    out
}

#[test]
fn prestart_without_the_driver_root_mount_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // PRESTART_MAX_ATTEMPTS=0: it would retry for ever, but a missing mount is not retried.
    let out = prestart(dir.path(), "/run/nvidia/driver", 0);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("driver-root-parent does not exist"), "{}", text(&out));
    assert!(text(&out).contains("NVIDIA_DRIVER_ROOT ('/run/nvidia/driver')"), "{}", text(&out));
}

#[test]
fn prestart_waits_for_a_working_driver() {
    let dir = tempfile::tempdir().unwrap();
    let driver = dir.path().join("driver-root-parent/driver");
    fs::create_dir_all(&driver).unwrap();

    // The driver root is there but empty (the GPU Operator has not mounted the driver yet).
    let out = prestart(dir.path(), "/run/nvidia/driver", 2);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let log = text(&out);
    assert!(log.contains("nvidia-smi: not found, libnvidia-ml.so.1: not found"), "{log}");
    assert!(log.contains("Check failed. Has the NVIDIA GPU driver been set up?"), "{log}");
    assert!(log.contains("Hint: NVIDIA_DRIVER_ROOT is /run/nvidia/driver"), "{log}");
    assert!(log.contains("still not usable after 2 attempt(s)"), "{log}");
    assert_eq!(fs::read_link(dir.path().join("driver-root")).unwrap(), driver);

    // A failing nvidia-smi is not a working driver.
    fs::create_dir_all(driver.join("usr/bin")).unwrap();
    fs::create_dir_all(driver.join("usr/lib64")).unwrap();
    fs::write(driver.join("usr/lib64/libnvidia-ml.so.1"), b"").unwrap();
    let smi = driver.join("usr/bin/nvidia-smi");
    fs::write(&smi, "#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n").unwrap();
    fs::set_permissions(&smi, fs::Permissions::from_mode(0o755)).unwrap();
    let out = prestart(dir.path(), "/run/nvidia/driver/", 1);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("nvidia-smi returned with exit status 9"), "{}", text(&out));

    // A working one: exit 0, /driver-root (re)linked.
    fs::write(&smi, "#!/bin/sh\necho 'fake nvidia-smi'\n").unwrap();
    let out = prestart(dir.path(), "/run/nvidia/driver", 1);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("fake nvidia-smi"), "{}", text(&out));
    assert!(text(&out).contains("the driver is set up"), "{}", text(&out));
    assert_eq!(fs::read_link(dir.path().join("driver-root")).unwrap(), driver);
}

#[test]
fn containerfile_installs_what_the_plugins_mount() {
    let containerfile =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Containerfile")).unwrap();
    // /installed/ld.so.preload names the library where the plugins mount it.
    assert!(
        containerfile.contains(&format!("printf '%s\\n' {CONTAINER_LIBRARY} >/installed/ld.so.preload")),
        "the Containerfile's ld.so.preload does not name {CONTAINER_LIBRARY}"
    );
    // The limiter is installed under the version both plugins mount.
    let version = containerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG LIMITER_VERSION="))
        .expect("ARG LIMITER_VERSION");
    assert_eq!(version, vgpu_deviceplugin::config::PluginConfig::new("n").library_version);
    assert_eq!(version, vgpu_dra::config::DriverConfig::new("n").library_version);
    assert_eq!(version, VERSION);
    // vgpu-manager's names, each a link to a binary of ours.
    for (theirs, ours) in [
        ("device-plugin", "vgpu-device-plugin"),
        ("device-monitor", "vgpu-device-monitor"),
        ("device-scheduler", "vgpu-scheduler-extender"),
        ("device-webhook", "vgpu-webhook"),
        ("kubelet-plugin", "vgpu-kubelet-plugin"),
        ("device-client", "vgpu-device-client"),
    ] {
        assert!(containerfile.contains(&format!("ln -s {ours} /usr/bin/{theirs};")), "/usr/bin/{theirs}");
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("src/bin/{ours}.rs")).is_file(),
            "{ours} is not a binary of vgpu-bins"
        );
    }
    for name in ["install_files.sh", "kubelet-plugin-prestart.sh"] {
        assert_eq!(mode(&script(name)) & 0o111, 0o111, "scripts/{name} is not executable");
    }
}
