//! `vgpu-device-client` against the device plugin's real client-mode registry on a unix socket: the binary
//! is the caller, so the registry authenticates its own PID (under a fake `/proc` whose `cgroup` puts it in
//! a pod) and writes that pod's `pids.config`; refusals and bad flags exit with the documented codes. The
//! container's processes run as this test's user (fake `status` files), so the registry's uid rule holds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use vgpu_core::node_config::CgroupDriver;
use vgpu_node::registry::{RegistryConfig, serve_registry};

const UID: &str = "0b1a22cd-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const CGROUP: &str = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b1a22cd_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-c0ffee.scope";
const BIN: &str = env!("CARGO_BIN_EXE_vgpu-device-client");

fn registry(root: &Path) -> RegistryConfig {
    let cgroup = root.join("cgroup").join(CGROUP.trim_start_matches('/'));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), "311\n27\n").unwrap();
    // A unified (cgroup v2) host: `0::<path>` of /proc/<pid>/cgroup names the caller's cgroup.
    std::fs::write(root.join("cgroup/cgroup.controllers"), "cpu memory\n").unwrap();
    std::fs::create_dir_all(root.join(format!("manager/{UID}_main/config"))).unwrap();
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    };
    std::fs::create_dir_all(root.join("proc/311")).unwrap();
    std::fs::write(root.join("proc/311/status"), format!("Name:\tapp\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"))
        .unwrap();
    RegistryConfig {
        manager_dir: root.join("manager"),
        proc_root: root.join("proc"),
        cgroup_root: root.join("cgroup"),
        cgroup_driver: CgroupDriver::Systemd,
        poll_interval: Duration::from_millis(10),
        poll_timeout: Duration::from_millis(500),
        socket_group: None,
    }
}

/// Runs the client under `sh`, which writes its PID and waits for a go file before `exec`-ing the
/// binary (so the PID the registry sees is known): the fake `/proc/<pid>/cgroup` is written in between.
fn run_as_pod_member(root: &Path, args: &[&str]) -> Output {
    let (pid_file, go) = (root.join("pid"), root.join("go"));
    let script = r#"pid="$1"; go="$2"; shift 2; echo $$ > "$pid"; while [ ! -e "$go" ]; do sleep 0.02; done; exec "$@""#;
    let child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(&pid_file)
        .arg(&go)
        .arg(BIN)
        .args(args)
        .env_remove("VGPU_POD_UID")
        .env_remove("VGPU_CONTAINER_NAME")
        .env_remove("MANAGER_CLIENT_REGISTER_UUID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && text.ends_with('\n')
        {
            break text.trim().to_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the shell never wrote its PID");
        std::thread::sleep(Duration::from_millis(10));
    };
    let proc = root.join("proc").join(&pid);
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join("cgroup"), format!("0::{CGROUP}\n")).unwrap();
    std::fs::write(&go, "").unwrap();
    child.wait_with_output().unwrap()
}

fn socket(root: &Path) -> PathBuf {
    root.join("manager/registry/socket.sock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_its_container_and_reports_refusals() {
    let root = tempfile::tempdir().unwrap();
    let running = serve_registry(registry(root.path())).unwrap();
    let address = socket(root.path());
    let address = address.to_str().unwrap().to_owned();

    let r = root.path().to_path_buf();
    let a = address.clone();
    let out = tokio::task::spawn_blocking(move || {
        run_as_pod_member(
            &r,
            &["--address", &a, "--pod-uid", UID, "--container-name", "main", "--timeout", "10s"],
        )
    })
    .await
    .unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let pids = root.path().join(format!("manager/{UID}_main/config/pids.config"));
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), "27\n311\n");

    // Another pod's container: the registry refuses, the client exits 1 with the server's reason.
    std::fs::remove_file(root.path().join("go")).unwrap();
    std::fs::remove_file(root.path().join("pid")).unwrap();
    let r = root.path().to_path_buf();
    let a = address.clone();
    let out = tokio::task::spawn_blocking(move || {
        run_as_pod_member(&r, &["--address", &a, "--pod-uid", "someone-else", "--container-name", "main"])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("PermissionDenied") && stderr.contains("is not authorized"), "{stderr}");

    running.stop().await;
}

#[test]
fn bad_flags_exit_2_with_the_flag_named() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("nothing.sock");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .env_remove("VGPU_POD_UID")
            .env_remove("VGPU_CONTAINER_NAME")
            .env_remove("MANAGER_CLIENT_REGISTER_UUID")
            .output()
            .unwrap()
    };
    let out = run(&["--address", missing.to_str().unwrap(), "--container-name", "main"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pod-uid is required unless --register-uuid"));

    let out = run(&["--address", missing.to_str().unwrap(), "--pod-uid", UID, "--container-name", "main"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--address") && stderr.contains("does not exist"), "{stderr}");

    let out = run(&["--pod-uid", UID, "--container-name", "main", "--timeout", "0s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--timeout"));
    // vgpu-manager's form, whole seconds: accepted (the missing socket is what fails), 0 refused.
    let a = missing.to_str().unwrap();
    let out = run(&["--address", a, "--pod-uid", UID, "--container-name", "main", "--timeout", "12"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not exist") && !stderr.contains("--timeout"), "{stderr}");
    let out = run(&["--address", a, "--pod-uid", UID, "--container-name", "main", "--timeout=0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--timeout"));

    // The env names the plugin sets in vGPU containers are read too.
    let out = Command::new(BIN)
        .args(["--address", missing.to_str().unwrap()])
        .env("VGPU_POD_UID", UID)
        .env("VGPU_CONTAINER_NAME", "main")
        .env("MANAGER_CLIENT_REGISTER_UUID", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}
