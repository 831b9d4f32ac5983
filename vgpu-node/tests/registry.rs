//! The client-mode device registry over a real unix socket. The caller is this test process or a helper
//! process (this test binary run again in a helper mode, see [`helper_process`]): its `SO_PEERCRED` PID is
//! looked up under a fake `/proc` whose `cgroup` file puts it in a pod, and that pod's fake cgroup lists
//! the PIDs that end up in `pids.config` (with fake `status` files naming their uids). The process handle
//! and the caller's own uids come from the real `/proc`. Register UUIDs (DRA claim partitions) go through a
//! resolver given to the server, as the DRA kubelet plugin gives its prepared claims.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tonic::Code;
use vgpu_core::node_config::CgroupDriver;
use vgpu_kubelet::socket::connect_unix;
use vgpu_node::{
    api::registry::{ContainerDeviceRequest, v_device_registry_client::VDeviceRegistryClient},
    registry::{
        RegisterResolver, RegisterTarget, RegistryConfig, serve_registry, serve_registry_with,
        serve_registry_with_guard,
    },
};

const UID: &str = "0b1a22cd-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const CGROUP: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1a22cd_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-c0ffee.scope";

fn request(uid: &str, ctr: &str) -> ContainerDeviceRequest {
    ContainerDeviceRequest { pod_uid: uid.into(), container_name: ctr.into(), register_uuid: String::new() }
}

/// This process's effective uid (the owner of its `/proc/self`).
fn own_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

/// This process's effective gid.
fn own_gid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().gid()
}

/// Puts process `pid` into `cgroup` in the fake `/proc`.
fn put_in_cgroup(root: &Path, pid: u32, cgroup: &str) {
    let proc = root.join("proc").join(pid.to_string());
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
}

/// The fake `/proc/<pid>/status` of a container process running as `uid`.
fn fake_status(root: &Path, pid: u32, uid: u32) {
    let proc = root.join("proc").join(pid.to_string());
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join("status"), format!("Name:\tapp\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")).unwrap();
}

fn setup(root: &Path, driver: CgroupDriver) -> RegistryConfig {
    put_in_cgroup(root, std::process::id(), CGROUP);
    let cgroup = root.join("cgroup").join(CGROUP.trim_start_matches('/'));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), "4242\n17\n4242\n").unwrap();
    // A unified (cgroup v2) host: `0::<path>` of /proc/<pid>/cgroup names the caller's cgroup.
    std::fs::write(root.join("cgroup/cgroup.controllers"), "cpu memory\n").unwrap();
    // The container's processes run as this test's user (the uid rule).
    fake_status(root, 4242, own_uid());
    std::fs::create_dir_all(root.join(format!("manager/{UID}_main/config"))).unwrap();
    RegistryConfig {
        manager_dir: root.join("manager"),
        proc_root: root.join("proc"),
        cgroup_root: root.join("cgroup"),
        cgroup_driver: driver,
        poll_interval: Duration::from_millis(10),
        poll_timeout: Duration::from_millis(200),
        socket_group: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_the_callers_container_pids() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Systemd);
    let running = serve_registry(config.clone()).unwrap();
    let socket = root.path().join("manager/registry/socket.sock");
    assert_eq!(running.socket, socket);
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), own_gid(), "default group: the process's own");
    assert_eq!(std::fs::metadata(socket.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o711);
    let mut client = VDeviceRegistryClient::new(connect_unix(&socket, Duration::from_secs(5)).await.unwrap());

    client.register_container_device(request(UID, "main")).await.unwrap();
    let pids = root.path().join(format!("manager/{UID}_main/config/pids.config"));
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), "17\n4242\n");

    // Another pod's container: refused.
    let err = client.register_container_device(request("someone-else", "main")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(err.message(), format!("caller pod {UID:?} is not authorized for this register request"));
    // A container that was never allocated.
    let err = client.register_container_device(request(UID, "sidecar")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // Bad input.
    let err = client.register_container_device(request(UID, "")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = client.register_container_device(request(UID, "../x")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut with_uuid = request(UID, "main");
    with_uuid.register_uuid = "claim-1".into();
    assert_eq!(client.register_container_device(with_uuid).await.unwrap_err().code(), Code::Unimplemented);

    // A symlink in place of pids.config is refused.
    std::fs::remove_file(&pids).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &pids).unwrap();
    let err = client.register_container_device(request(UID, "main")).await.unwrap_err();
    assert!(err.message().contains("is a symlink"), "{}", err.message());
    std::fs::remove_file(&pids).unwrap();

    // No process in the cgroup within the poll timeout.
    let procs = config.cgroup_root.join(CGROUP.trim_start_matches('/')).join("cgroup.procs");
    std::fs::write(&procs, "").unwrap();
    let err = client.register_container_device(request(UID, "main")).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);

    running.stop().await;
    assert!(!socket.exists(), "socket removed on stop");
}

/// A client that sends the socket's path as the HTTP/2 `:authority`, as grpc-go clients dialing a bare path
/// do (issue #31), is answered, not reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_authority_reaches_the_registry() {
    use prost::Message as _;
    let root = tempfile::tempdir().unwrap();
    let running = serve_registry(setup(root.path(), CgroupDriver::Systemd)).unwrap();
    let answer = vgpu_kubelet::authority::call::call(
        &running.socket,
        &running.socket.display().to_string(),
        "/registry.VDeviceRegistry/RegisterContainerDevice",
        &request(UID, "main").encode_to_vec(),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!((answer.reset, answer.grpc_status()), (None, Some(0)), "{answer:?}");
    let pids = root.path().join(format!("manager/{UID}_main/config/pids.config"));
    assert_eq!(std::fs::read_to_string(pids).unwrap(), "17\n4242\n");
    running.stop().await;
}

/// A resolver of fixed register UUIDs (the DRA kubelet plugin provides one from its prepared claims).
#[derive(Debug)]
struct Fixed(Vec<(&'static str, RegisterTarget)>);

impl RegisterResolver for Fixed {
    fn resolve(&self, uuid: &str) -> Option<RegisterTarget> {
        self.0.iter().find(|(u, _)| *u == uuid).map(|(_, t)| t.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_uuids_go_through_the_resolver() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Systemd);
    let part = root.path().join("manager/claims/claim-1/pod-abc-app/main/config");
    std::fs::create_dir_all(&part).unwrap();
    let target = |dir: PathBuf, pod: &str| RegisterTarget { config_dir: dir, pod_uids: vec![pod.to_owned()] };
    let resolver = Fixed(vec![
        ("11111111-2222-4333-8444-555555555555", target(part.clone(), UID)),
        ("22222222-2222-4333-8444-555555555555", target(part.clone(), "another-pod")),
        ("33333333-2222-4333-8444-555555555555", target(root.path().join("gone/config"), UID)),
    ]);
    let running =
        serve_registry_with(config, Duration::from_millis(50), Some(std::sync::Arc::new(resolver))).unwrap();
    let mut client =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    let by_uuid = |uuid: &str| ContainerDeviceRequest {
        pod_uid: String::new(),
        container_name: String::new(),
        register_uuid: uuid.into(),
    };

    client.register_container_device(by_uuid("11111111-2222-4333-8444-555555555555")).await.unwrap();
    assert_eq!(std::fs::read_to_string(part.join("pids.config")).unwrap(), "17\n4242\n");
    let err =
        client.register_container_device(by_uuid("22222222-2222-4333-8444-555555555555")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(err.message(), format!("caller pod {UID:?} is not authorized for this register request"));
    let err =
        client.register_container_device(by_uuid("33333333-2222-4333-8444-555555555555")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("partition directory"), "{}", err.message());
    let err =
        client.register_container_device(by_uuid("99999999-2222-4333-8444-555555555555")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("names no prepared claim partition on this node"), "{}", err.message());
    let err = client.register_container_device(by_uuid("a/b")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // Pod and container requests are still served beside UUIDs.
    client.register_container_device(request(UID, "main")).await.unwrap();
    running.stop().await;
}

#[tokio::test]
async fn the_cgroup_driver_decides_how_the_pod_is_read() {
    let root = tempfile::tempdir().unwrap();
    // A cgroupfs node cannot read a systemd path: the caller has no pod.
    let config = setup(root.path(), CgroupDriver::Cgroupfs);
    let running = serve_registry(config).unwrap();
    let mut client =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    let err = client.register_container_device(request(UID, "main")).await.unwrap_err();
    assert_eq!(err.message(), "caller pod \"\" is not authorized for this register request");
    running.stop().await;
}

#[tokio::test]
async fn a_world_writable_socket_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Auto);
    let dir = root.path().join("manager/registry");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = serve_registry(config).unwrap_err().to_string();
    assert!(err.contains("group- or world-writable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_socket_is_republished_and_a_foreign_one_is_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Auto);
    let running = serve_registry_with_guard(config, Duration::from_millis(20)).unwrap();
    let socket = running.socket.clone();
    std::fs::remove_file(&socket).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !socket.exists() {
        assert!(std::time::Instant::now() < deadline, "socket not republished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut client = VDeviceRegistryClient::new(connect_unix(&socket, Duration::from_secs(5)).await.unwrap());
    client.register_container_device(request(UID, "main")).await.unwrap();
    drop(client);
    running.stop().await;
    assert!(!socket.exists());

    // Someone else's socket at the path is not removed on stop.
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Auto);
    let running = serve_registry_with_guard(config, Duration::from_secs(3600)).unwrap();
    let socket = running.socket.clone();
    std::fs::remove_file(&socket).unwrap();
    std::fs::write(&socket, b"someone else").unwrap();
    running.stop().await;
    assert_eq!(std::fs::read(&socket).unwrap(), b"someone else");
}

// ---------------------------------------------------------------------------------------------------
// Accept-time identity, liveness and the uid rule, with real processes.

const OTHER_UID: &str = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a";
const OTHER_CGROUP: &str = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9d8c7b6a_5f4e_4d3c_8b2a_1f0e9d8c7b6a.slice/cri-containerd-beef.scope";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caller_is_identified_when_the_connection_is_accepted() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Systemd);
    std::fs::create_dir_all(root.path().join(format!("manager/{OTHER_UID}_main/config"))).unwrap();
    let other = config.cgroup_root.join(OTHER_CGROUP.trim_start_matches('/'));
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("cgroup.procs"), "4242\n").unwrap();
    let running = serve_registry(config).unwrap();
    let mut client =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    // A first call: the connection is accepted, and its caller identified.
    client.register_container_device(request(UID, "main")).await.unwrap();

    // The PID now reads as a process of another pod (as after an exit and a reuse of the PID): the
    // connection keeps the identity it was accepted with.
    put_in_cgroup(root.path(), std::process::id(), OTHER_CGROUP);
    client.register_container_device(request(UID, "main")).await.unwrap();
    let err = client.register_container_device(request(OTHER_UID, "main")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(err.message(), format!("caller pod {UID:?} is not authorized for this register request"));
    assert!(!root.path().join(format!("manager/{OTHER_UID}_main/config/pids.config")).exists());

    // A new connection is identified anew.
    let mut fresh =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    fresh.register_container_device(request(OTHER_UID, "main")).await.unwrap();
    let err = fresh.register_container_device(request(UID, "main")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caller_may_be_a_listed_process_whatever_the_owners() {
    let root = tempfile::tempdir().unwrap();
    let config = setup(root.path(), CgroupDriver::Systemd);
    // Nobody in the container runs as this user, but the caller itself is listed.
    fake_status(root.path(), 4242, own_uid().wrapping_add(1));
    let procs = config.cgroup_root.join(CGROUP.trim_start_matches('/')).join("cgroup.procs");
    let running = serve_registry(config).unwrap();
    let mut client =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    let err = client.register_container_device(request(UID, "main")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains(&format!("caller uid {} (pid {})", own_uid(), std::process::id())));
    assert!(err.message().contains("owns none of its processes"), "{}", err.message());
    std::fs::write(&procs, format!("4242\n{}\n", std::process::id())).unwrap();
    client.register_container_device(request(UID, "main")).await.unwrap();
    running.stop().await;
}

/// Where a helper process finds its orders and leaves its result.
struct Helper {
    dir: PathBuf,
}

impl Helper {
    /// A world-accessible folder for helpers running as another user.
    fn new(root: &Path) -> Self {
        let dir = root.join("helper");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        Self { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Runs this test binary as a helper in `mode`; `tune` sets its uid/gid.
    fn spawn(&self, mode: &str, socket: &Path, pod: &str, tune: impl FnOnce(&mut Command)) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["helper_process", "--exact", "--test-threads=1", "-q"])
            .env(HELPER_ENV, mode)
            .env("HELPER_SOCKET", socket)
            .env("HELPER_DIR", &self.dir)
            .env("HELPER_POD", pod)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        tune(&mut cmd);
        cmd.spawn().unwrap()
    }

    fn go(&self, name: &str) {
        std::fs::write(self.file(name), "").unwrap();
    }

    /// The helper's `result` line.
    async fn result(&self) -> String {
        let path = self.file("result");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path)
                && text.ends_with('\n')
            {
                std::fs::remove_file(&path).unwrap();
                return text.trim_end().to_owned();
            }
            assert!(Instant::now() < deadline, "the helper left no result");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Runs a `call` helper as `uid`/`gid`, placed in `CGROUP` of the fake `/proc` before it connects.
async fn call_as(root: &Path, helper: &Helper, socket: &Path, uid: u32, gid: u32) -> String {
    let mut child = helper.spawn("call", socket, UID, |cmd| {
        std::os::unix::process::CommandExt::uid(cmd, uid);
        std::os::unix::process::CommandExt::gid(cmd, gid);
    });
    put_in_cgroup(root, child.id(), CGROUP);
    helper.go("go");
    let result = helper.result().await;
    tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    std::fs::remove_file(helper.file("go")).unwrap();
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_of_another_uid_is_refused_and_the_socket_group_is_applied() {
    if own_uid() != 0 {
        eprintln!("skipped: needs root to run a helper as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut config = setup(root.path(), CgroupDriver::Systemd);
    config.socket_group = Some(NOBODY);
    let running = serve_registry(config).unwrap();
    let socket = running.socket.clone();
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!((meta.permissions().mode() & 0o777, meta.gid()), (0o660, NOBODY));
    let helper = Helper::new(root.path());

    // Not in the socket's group: cannot even connect.
    let result = call_as(root.path(), &helper, &socket, NOBODY, NOBODY - 1).await;
    assert!(result.starts_with("connect:") && result.contains("ermission denied"), "{result}");

    // In the group, in the pod's cgroup, but the container's processes all run as root: refused.
    let result = call_as(root.path(), &helper, &socket, NOBODY, NOBODY).await;
    assert!(result.starts_with("PermissionDenied:"), "{result}");
    assert!(result.contains(&format!("caller uid {NOBODY}")) && result.contains("owns none"), "{result}");
    let pids = root.path().join(format!("manager/{UID}_main/config/pids.config"));
    assert!(!pids.exists());

    // Once a process of the container runs as that user, the same caller is accepted.
    fake_status(root.path(), 17, NOBODY);
    let result = call_as(root.path(), &helper, &socket, NOBODY, NOBODY).await;
    assert_eq!(result, "ok");
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), "17\n4242\n");
    running.stop().await;
}

/// A connection made by a helper (`handoff`) that passes it to a child (`call-fd`, its stdin) and then
/// exits or not (`hold`); the child sends the request on `go2`. Returns the child's result.
async fn handed_off(root: &Path, helper: &Helper, socket: &Path, hold: bool) -> String {
    let mut child = helper.spawn("handoff", socket, UID, |cmd| {
        if hold {
            cmd.env("HELPER_HOLD", "1");
        }
    });
    let pid = child.id();
    put_in_cgroup(root, pid, CGROUP);
    helper.go("go");
    if !hold {
        // The connecting process exits and is reaped: its PID is free for reuse.
        tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
        // Whatever runs under that PID now, the fake /proc still places it in the pod.
        helper.go("go2");
        let result = helper.result().await;
        std::fs::remove_file(helper.file("go")).unwrap();
        std::fs::remove_file(helper.file("go2")).unwrap();
        return result;
    }
    helper.go("go2");
    let result = helper.result().await;
    helper.go("done");
    tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    for f in ["go", "go2", "done"] {
        std::fs::remove_file(helper.file(f)).unwrap();
    }
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_exits_after_connecting_is_refused() {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = setup(root.path(), CgroupDriver::Systemd);
    let running = serve_registry(config).unwrap();
    let socket = running.socket.clone();
    let helper = Helper::new(root.path());
    let pids = root.path().join(format!("manager/{UID}_main/config/pids.config"));

    // Control: the connecting process still runs when its child sends the request.
    assert_eq!(handed_off(root.path(), &helper, &socket, true).await, "ok");
    assert!(pids.exists());
    std::fs::remove_file(&pids).unwrap();

    // The connecting process has exited: the request on its connection is refused.
    let result = handed_off(root.path(), &helper, &socket, false).await;
    assert!(result.starts_with("PermissionDenied:") && result.contains("exited"), "{result}");
    assert!(!pids.exists());
    running.stop().await;
}

const HELPER_ENV: &str = "VGPU_REGISTRY_TEST_HELPER";

/// Not a test: the body of the helper processes (modes `call`, `handoff`, `call-fd`) when this binary is
/// run with `VGPU_REGISTRY_TEST_HELPER` set; does nothing otherwise.
#[test]
fn helper_process() {
    let Ok(mode) = std::env::var(HELPER_ENV) else { return };
    let var = |name: &str| std::env::var(name).unwrap();
    let dir = PathBuf::from(var("HELPER_DIR"));
    let socket = PathBuf::from(var("HELPER_SOCKET"));
    let wait_for = |name: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !dir.join(name).exists() {
            assert!(Instant::now() < deadline, "helper: no {name}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let report = |line: String| {
        let tmp = dir.join(format!("result.{}", std::process::id()));
        std::fs::write(&tmp, format!("{line}\n")).unwrap();
        std::fs::rename(&tmp, dir.join("result")).unwrap();
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let call = |channel: tonic::transport::Channel| async {
        match VDeviceRegistryClient::new(channel)
            .register_container_device(request(&var("HELPER_POD"), "main"))
            .await
        {
            Ok(_) => "ok".to_owned(),
            Err(status) => format!("{:?}: {}", status.code(), status.message()),
        }
    };
    match mode.as_str() {
        "call" => {
            wait_for("go");
            let line = runtime.block_on(async {
                match connect_unix(&socket, Duration::from_secs(5)).await {
                    Ok(channel) => call(channel).await,
                    Err(e) => {
                        let mut line = format!("connect: {e}");
                        let mut source = std::error::Error::source(&e);
                        while let Some(cause) = source {
                            line.push_str(&format!(": {cause}"));
                            source = cause.source();
                        }
                        line
                    }
                }
            });
            report(line);
        }
        "handoff" => {
            wait_for("go");
            let stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
            // Orphaned on purpose: this process exits (or not) independently of its child, which init reaps.
            #[allow(clippy::zombie_processes)]
            Command::new(std::env::current_exe().unwrap())
                .args(["helper_process", "--exact", "--test-threads=1", "-q"])
                .env(HELPER_ENV, "call-fd")
                .stdin(Stdio::from(std::os::fd::OwnedFd::from(stream)))
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            if std::env::var_os("HELPER_HOLD").is_some() {
                wait_for("done");
            }
        }
        "call-fd" => {
            use std::os::fd::AsFd;
            let fd = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
            let stream = std::os::unix::net::UnixStream::from(fd);
            stream.set_nonblocking(true).unwrap();
            wait_for("go2");
            let line = runtime.block_on(async {
                let stream = std::sync::Mutex::new(Some(tokio::net::UnixStream::from_std(stream).unwrap()));
                let connector = tower::service_fn(move |_: tonic::transport::Uri| {
                    let next = stream.lock().unwrap().take();
                    async move {
                        next.map(hyper_util::rt::TokioIo::new)
                            .ok_or_else(|| std::io::Error::other("the inherited connection is used up"))
                    }
                });
                let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
                    .connect_with_connector(connector)
                    .await
                    .unwrap();
                call(channel).await
            });
            report(line);
        }
        other => panic!("unknown helper mode {other}"),
    }
}
