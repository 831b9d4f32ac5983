//! `vgpu-device-client` against the live client-mode registry of `vgpu-device-plugin --backend mock
//! --feature-gates=DevicePluginClientMode=true` (issue #14 §5, contract §1.6), after the real pod path:
//! our extender under the real kube-scheduler pre-allocates and binds two pods, the test kubelet admits
//! both through `Allocate`.
//!
//! Asserted: the plugin serves the registry on `<manager-dir>/registry/socket.sock`; `Allocate` hands the
//! container the registry folder (not the host's `/proc`); the client binary, run as a process of pod
//! `owner`'s container, exits 0 and the plugin writes that container's processes to
//! `<manager-dir>/<podUID>_main/config/pids.config`; the same process claiming pod `other`'s UID exits 1
//! with the registry's `PermissionDenied` reason, and `other`'s `pids.config` is not written.
//!
//! The registry authenticates a caller by the PID the socket reports (`SO_PEERCRED`) and reads
//! `<proc-root>/<pid>/cgroup`. The plugin runs with `--host-proc-root` and `--host-cgroup-root` on a fake
//! tree in the test folder (`--cgroup-driver=systemd`): the test starts the client under `sh`, which
//! writes its PID and waits for a go-file before `exec`-ing the client (same PID), and in between writes
//! `<proc-root>/<pid>/cgroup` naming `owner`'s container cgroup, whose `cgroup.procs` lists the container's
//! processes; their fake `<proc-root>/<pid>/status` says they run as this test's user, which is the
//! client's, so the registry's uid rule (a caller must own a process of the container) holds.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use vgpu_e2e::fixtures::{self, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::known_pid::run_with_known_pid;
use vgpu_e2e::plugin_node::{DEVICE_PLUGIN, MockPluginNode, start_vgpu_scheduling};
use vgpu_e2e::{TestEnv, vgpu_binary};

const NODE: &str = "dc-node";
const NS: &str = "default";
const SPLIT: u32 = 10;
const CLIENT: &str = "vgpu-device-client";
/// The processes of `owner`'s container, as its cgroup lists them.
const CONTAINER_PIDS: &str = "4242\n1717\n";

/// The systemd-driver cgroup of container `main` of the pod with `uid` (besteffort QoS).
fn container_cgroup(uid: &str) -> String {
    let slice = uid.replace('-', "_");
    format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{slice}.slice/cri-containerd-e2e.scope"
    )
}

/// Runs the client binary with `args` as a process of the cgroup `cgroup`: `<proc>/<pid>/cgroup` is written
/// before it starts.
async fn run_in_cgroup(host: &Path, cgroup: String, args: Vec<String>) -> Output {
    let (host, client) = (host.to_path_buf(), vgpu_binary(CLIENT).unwrap());
    tokio::task::spawn_blocking(move || {
        run_with_known_pid(&host, "client", &client, &args, &[], |pid| {
            let dir = host.join("proc").join(pid.to_string());
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("cgroup"), format!("0::{cgroup}\n"))?;
            Ok(())
        })
    })
    .await
    .unwrap()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn device_client_registers_with_the_live_registry() {
    let mut env = TestEnv::builder("device_client_registers_with_the_live_registry").start().await.unwrap();
    let client = env.client().await.unwrap();
    let host = env.workdir().join("host");
    for dir in ["proc", "cgroup"] {
        std::fs::create_dir_all(host.join(dir)).unwrap();
    }
    // A unified (cgroup v2) host: `0::<path>` of /proc/<pid>/cgroup names the caller's cgroup.
    std::fs::write(host.join("cgroup/cgroup.controllers"), "cpu memory\n").unwrap();
    let args = [
        "--feature-gates=DevicePluginClientMode=true".to_owned(),
        format!("--host-proc-root={}", host.join("proc").display()),
        format!("--host-cgroup-root={}", host.join("cgroup").display()),
        "--cgroup-driver=systemd".to_owned(),
    ];
    let mut node = MockPluginNode::start(&mut env, NODE, SPLIT, &args).await.unwrap();
    let socket = node.manager_dir.join("registry/socket.sock");
    env.poll("the registry socket", Duration::from_secs(30), || async { socket.exists().then_some(()) })
        .await
        .unwrap();

    // Two pods placed by our extender and admitted through Allocate.
    start_vgpu_scheduling(&mut env).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut uids = Vec::new();
    for name in ["owner", "other"] {
        let pod = fixtures::vgpu_pod_with(NS, name, &[(VGPU_NUMBER, 1), (VGPU_MEMORY, 2048)], &[]);
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let bound = fixtures::wait_for_pod_node(&client, NS, name, Duration::from_secs(60)).await.unwrap();
        assert_eq!(bound, NODE);
        let pod = pods.get(name).await.unwrap();
        let response = node
            .allocate_pre_allocated(&pod)
            .await
            .unwrap_or_else(|e| panic!("Allocate {name}: {e:#}\n{}", env.log_tail(DEVICE_PLUGIN, 30)));
        let mounts = &response.container_responses[0].mounts;
        let registry = node.manager_dir.join("registry");
        assert!(
            mounts.iter().any(|m| m.container_path == "/etc/vgpu-manager/registry"
                && Path::new(&m.host_path) == registry
                && m.read_only),
            "client mode mounts the registry folder: {mounts:?}"
        );
        assert!(
            !mounts.iter().any(|m| m.container_path == "/etc/vgpu-manager/.host_proc"),
            "client mode does not hand out the host's /proc: {mounts:?}"
        );
        let uid = pod.metadata.uid.unwrap();
        assert!(node.manager_dir.join(format!("{uid}_main/config")).is_dir());
        uids.push(uid);
    }
    let (owner, other) = (uids[0].clone(), uids[1].clone());

    // `owner`'s container cgroup with its processes.
    let cgroup = container_cgroup(&owner);
    let procs = host.join("cgroup").join(cgroup.trim_start_matches('/'));
    std::fs::create_dir_all(&procs).unwrap();
    std::fs::write(procs.join("cgroup.procs"), CONTAINER_PIDS).unwrap();
    let uid = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    };
    let status = host.join("proc/4242");
    std::fs::create_dir_all(&status).unwrap();
    std::fs::write(status.join("status"), format!("Name:\tapp\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")).unwrap();

    // The client in `owner`'s container registers it.
    let address = socket.display().to_string();
    let register = |uid: &str| {
        ["--address", &address, "--pod-uid", uid, "--container-name", "main", "--timeout", "30s"]
            .map(str::to_owned)
            .to_vec()
    };
    let out = run_in_cgroup(&host, cgroup.clone(), register(&owner)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}\n{}", out.status, env.log_tail(DEVICE_PLUGIN, 20));
    let pids = node.manager_dir.join(format!("{owner}_main/config/pids.config"));
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), "1717\n4242\n");

    // The same process claiming `other`: refused, nothing written for `other`.
    let out = run_in_cgroup(&host, cgroup, register(&other)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("PermissionDenied") && stderr.contains("is not authorized"), "{stderr}");
    assert!(!node.manager_dir.join(format!("{other}_main/config/pids.config")).exists());

    drop(node);
    env.finish();
}
