//! `vgpu-device-client` inside a real container (issue #31): `vgpu-device-plugin` with
//! `DevicePluginClientMode` on the real node, two vGPU pods placed by kube-scheduler + our extender and
//! started by the upstream kubelet and containerd. `Allocate` mounted the registry folder (with the socket
//! and the client, installed as `<manager-dir>/registry/device-client`) into each container; the test runs
//! the client there with `ctr tasks exec`, so the registry sees a real container process: its
//! `SO_PEERCRED` PID, its `/proc/<pid>/cgroup` in the kubelet's cgroupfs tree (under the node's own
//! `cgroupRoot`), its container's `cgroup.procs`. The client registering its own container exits 0 and the
//! plugin writes that container's PIDs to `<podUID>_main/config/pids.config`; the same container claiming
//! the other pod exits 1 with `PermissionDenied`, and nothing is written for the other pod.
//!
//! The client is the workspace's debug build, linked against glibc; the image ships it statically linked
//! (`Containerfile`). Here the pods mount the host's glibc read-only instead, so that busybox can run it.
//!
//! Needs the control plane, the real node and root: `e2e/run.sh real_node_device_client`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use serde_json::json;
use vgpu_core::abi::runtime_files;
use vgpu_e2e::{
    fixtures::{VGPU_MEMORY, VGPU_NUMBER},
    plugin_node::{DEVICE_PLUGIN, mock_description, start_vgpu_scheduling},
    probe,
    real_node::{self, RealNode},
    vgpu_binary,
};

const TIMEOUT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = "default";
/// Where `Allocate` mounts the registry folder in client mode.
const REGISTRY: &str = "/etc/vgpu-manager/registry";
/// The host's dynamic loader and C library folders, mounted into the test pods.
const GLIBC: [&str; 2] = ["/lib64", "/lib/x86_64-linux-gnu"];

/// A vGPU pod running the probe, with the host's glibc folders mounted read-only.
fn client_pod(node: &RealNode, name: &str) -> Pod {
    let limits = json!({"limits": {VGPU_NUMBER: "1", VGPU_MEMORY: "2048"}});
    let volumes: Vec<_> = GLIBC
        .iter()
        .enumerate()
        .map(|(i, path)| json!({"name": format!("glibc-{i}"), "hostPath": {"path": path}}))
        .collect();
    let mut pod =
        probe::pod(NAMESPACE, name, "main", node.busybox_image(), limits, json!({"volumes": volumes}))
            .unwrap();
    let mounts = GLIBC
        .iter()
        .enumerate()
        .map(|(i, path)| {
            serde_json::from_value(json!({"name": format!("glibc-{i}"), "mountPath": path, "readOnly": true}))
                .unwrap()
        })
        .collect();
    pod.spec.as_mut().unwrap().containers[0].volume_mounts = Some(mounts);
    pod
}

/// The container ID (without `containerd://`) of pod `pod`'s first container.
fn container_id(pod: &Pod) -> String {
    let status = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).unwrap();
    let id = status[0].container_id.clone().unwrap();
    id.rsplit_once("://").map_or(id.as_str(), |(_, id)| id).to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_device_client_registers_from_a_real_container() {
    if let Some(missing) = GLIBC.iter().find(|p| !Path::new(p).exists()) {
        eprintln!("SKIPPED: {missing} does not exist on this host (the test pods mount the host's glibc)");
        return;
    }
    let Some((mut env, mut node)) =
        real_node::start_env_and_node("real_node_device_client_registers_from_a_real_container")
            .await
            .unwrap()
    else {
        return;
    };
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    // The plugin in client mode reads the host's real /proc and cgroup tree.
    let work = env.workdir().join("gpu-host");
    let host = probe::GpuHost::create(&work, 4).unwrap();
    let mut args = host.device_plugin_args(&env, &node, &mock_description());
    args.extend([
        "--device-split-count=4".to_owned(),
        "--feature-gates=HonorPreAllocatedDeviceIDs=true,DevicePluginClientMode=true".to_owned(),
        "--host-proc-root=/proc".to_owned(),
        "--host-cgroup-root=/sys/fs/cgroup".to_owned(),
        "--cgroup-driver=cgroupfs".to_owned(),
    ]);
    env.start_process(DEVICE_PLUGIN, &vgpu_binary(DEVICE_PLUGIN).unwrap(), &args, &[]).unwrap();
    let registry = host.manager_dir.join("registry");
    env.poll("the registry socket", TIMEOUT, || async {
        registry.join("socket.sock").exists().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.log_tail(DEVICE_PLUGIN, 40)));
    runtime_files::install(&host.manager_dir, "v1.0.0", b"not a real library: busybox is static").unwrap();
    std::fs::copy(vgpu_binary("vgpu-device-client").unwrap(), registry.join("device-client")).unwrap();
    node.wait_allocatable(&env, VGPU_NUMBER, 12, DEVICE_PLUGIN, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    start_vgpu_scheduling(&mut env).await.unwrap();

    let mut running = Vec::new();
    for name in ["owner", "other"] {
        pods.create(&PostParams::default(), &client_pod(&node, name)).await.unwrap();
        let (pod, probe) = probe::running(&env, &node, &pods, name, DEVICE_PLUGIN, TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(probe.mounted(REGISTRY), "{REGISTRY} not mounted:\n{}", probe.mounts.join("\n"));
        assert!(!probe.mounted("/etc/vgpu-manager/.host_proc"), "client mode hands out the host's /proc");
        running.push(pod);
    }
    let (owner, other) = (&running[0], &running[1]);
    let owner_uid = owner.metadata.uid.clone().unwrap();
    let other_uid = other.metadata.uid.clone().unwrap();
    let owner_ctr = container_id(owner);

    // The client, run in `owner`'s container, registers it.
    let exec = |id: &str, uid: &str| {
        let client = format!("{REGISTRY}/device-client");
        let address = format!("{REGISTRY}/socket.sock");
        let args = [
            "tasks",
            "exec",
            "--exec-id",
            id,
            owner_ctr.as_str(),
            client.as_str(),
            "--address",
            address.as_str(),
            "--pod-uid",
            uid,
            "--container-name",
            "main",
            "--timeout",
            "10s",
        ];
        node.ctr(&args)
    };
    exec("register-own", &owner_uid).unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tail(DEVICE_PLUGIN, 30)));
    let pids_config = |uid: &str| host.manager_dir.join(format!("{uid}_main/config/pids.config"));
    let written = std::fs::read_to_string(pids_config(&owner_uid)).unwrap();
    let written: Vec<u32> = written.lines().map(|l| l.parse().unwrap()).collect();
    // The container's init process (the probe's shell) was in its cgroup when the client registered.
    let init = probe_pid(&node, &owner_ctr);
    println!("pids.config of {owner_uid}: {written:?}; the container's init PID {init}");
    assert!(written.contains(&init), "{written:?} lacks the container's init PID {init}");

    // The same container claiming `other`: refused, nothing written for `other`.
    let refused = exec("register-other", &other_uid).expect_err("claiming another pod must fail");
    let message = format!("{refused:#}");
    assert!(message.contains("PermissionDenied") && message.contains("is not authorized"), "{message}");
    assert!(!pids_config(&other_uid).exists());

    node.stop().unwrap();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    env.finish();
}

/// The host PID of container `id`'s init process (`ctr tasks ls`: `TASK PID STATUS`).
fn probe_pid(node: &RealNode, id: &str) -> u32 {
    let tasks = node.ctr(&["tasks", "ls"]).unwrap();
    tasks
        .lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next() == Some(id)).then(|| fields.next()?.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no task {id} in:\n{tasks}"))
}
