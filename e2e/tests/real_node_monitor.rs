//! `vgpu-device-monitor` on the real node (issue #31): a vGPU pod placed by kube-scheduler + our extender
//! and started by the upstream kubelet and containerd; the monitor finds the container's real PIDs in the
//! kubelet's own cgroup tree (cgroupfs driver, the node's `cgroupRoot`, given as `--kubelet-cgroup-root`),
//! matches them with the GPU processes the mock backend reports for those PIDs (its live file), reads the
//! `vgpu.config` the device plugin wrote at Allocate, and a real Prometheus scrapes the per-container series:
//! memory used vs the pod's limit, core utilization, the pre-allocated GPU's UUID.
//!
//! Needs the control plane, the real node, root and `prometheus`: `e2e/run.sh real_node_monitor`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use vgpu_core::{abi::runtime_files, codec::pod_devices, domain::ResourceDomain};
use vgpu_e2e::{
    fixtures::{VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER},
    free_port,
    plugin_node::{DEVICE_PLUGIN, mock_description, start_vgpu_scheduling},
    probe,
    prometheus::Prometheus,
    real_node::{self, RealNode},
    vgpu_binary, wait_ready,
};

const TIMEOUT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = "default";
const MONITOR: &str = "vgpu-device-monitor";
const MIB: f64 = 1048576.0;

/// The PIDs in the `cgroup.procs` of container `container_id` of pod `uid` (QoS `qos`) under the real
/// node's cgroupfs tree: `<hierarchy>/<cgroupRoot>/kubepods/[<qos>/]pod<uid>/<id>`, the hierarchy being
/// the `devices` controller on cgroup v1.
fn container_pids(node: &RealNode, uid: &str, qos: &str, container_id: &str) -> Vec<u32> {
    let root = Path::new("/sys/fs/cgroup");
    let hierarchy =
        if root.join("cgroup.controllers").exists() { root.to_path_buf() } else { root.join("devices") };
    let mut dir = hierarchy.join(node.cgroup_root().trim_start_matches('/')).join("kubepods");
    match qos {
        "Guaranteed" => {}
        other => dir.push(other.to_ascii_lowercase()),
    }
    dir.push(format!("pod{uid}"));
    dir.push(container_id);
    let text = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_monitor_reports_real_containers_to_prometheus() {
    let Some((mut env, mut node)) =
        real_node::start_env_and_node("real_node_monitor_reports_real_containers_to_prometheus")
            .await
            .unwrap()
    else {
        return;
    };
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    // Four L40S (one unhealthy) split 4 ways, with a live file the test writes the container's PIDs to.
    let work = env.workdir().join("gpu-host");
    let host = probe::GpuHost::create(&work, 4).unwrap();
    let live = work.join("live.yaml");
    let mock = work.join("mock.yaml");
    let description = std::fs::read_to_string(mock_description()).unwrap();
    std::fs::write(&mock, format!("{}\nliveFile: {}\n", description.trim_end(), live.display())).unwrap();
    let mut args = host.device_plugin_args(&env, &node, &mock);
    args.extend([
        "--device-split-count=4".to_owned(),
        "--node-publish-interval=2".to_owned(),
        "--feature-gates=HonorPreAllocatedDeviceIDs=true".to_owned(),
    ]);
    env.start_process(DEVICE_PLUGIN, &vgpu_binary(DEVICE_PLUGIN).unwrap(), &args, &[]).unwrap();
    // Scheduled only once the Node advertises the plugin's devices (3 healthy GPUs × 4): a pod kube-scheduler
    // finds no vgpu-number for waits as unschedulable far longer than this test does.
    node.wait_allocatable(&env, VGPU_NUMBER, 12, DEVICE_PLUGIN, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    start_vgpu_scheduling(&mut env).await.unwrap();
    runtime_files::install(&host.manager_dir, "v1.0.0", b"not a real library: busybox is static").unwrap();

    // A vGPU pod: 50 % of a GPU and 4 GiB.
    let limits = json!({"limits": {VGPU_NUMBER: "1", VGPU_CORES: "50", VGPU_MEMORY: "4096"}});
    let pod = probe::pod(NAMESPACE, "train", "main", node.busybox_image(), limits, json!({})).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let (pod, _) = probe::running(&env, &node, &pods, "train", DEVICE_PLUGIN, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let uid = pod.metadata.uid.clone().unwrap();
    let status = pod.status.clone().unwrap();
    let qos = status.qos_class.clone().unwrap();
    let container_id = status.container_statuses.unwrap()[0].container_id.clone().unwrap();
    let container_id = container_id.rsplit_once("://").map_or(container_id.as_str(), |(_, id)| id).to_owned();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let pre =
        pod_devices::decode_pre_allocated(&annotations[&ResourceDomain::default().pre_allocated()]).unwrap();
    let device = pre.containers[0].devices[0].clone();

    // The container's real PIDs, as the kubelet's cgroup tree holds them.
    let pids = container_pids(&node, &uid, &qos, &container_id);
    assert!(!pids.is_empty(), "no PIDs for container {container_id} of pod {uid} ({qos})");
    println!("container {container_id} ({qos}) PIDs {pids:?} on {}", device.uuid);

    // The GPU reports the container's first PID using 1 GiB and 40 % of the SMs; a process of no container
    // uses 512 MiB more (it counts for the GPU, not for the pod).
    let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros();
    let index = device.index;
    let text = format!(
        "processes:\n  {index}: [{{ pid: {pid}, usedMemoryMiB: 1024 }}, {{ pid: 1, usedMemoryMiB: 512 }}]\nutilization:\n  - {{ gpu: {index}, pid: {pid}, timestampUs: {now_us}, smPercent: 40 }}\n",
        pid = pids[0]
    );
    let tmp = work.join("live.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &live).unwrap();

    // The monitor, reading the kubelet's tree under the node's cgroup root.
    let port = free_port().unwrap();
    let path = |p: &Path| p.display().to_string();
    let monitor_args = vec![
        format!("--kubeconfig={}", path(env.kubeconfig_path())),
        format!("--node-name={}", node.node_name()),
        format!("--server-bind-port={port}"),
        format!("--manager-dir={}", path(&host.manager_dir)),
        "--host-cgroup-root=/sys/fs/cgroup".to_owned(),
        "--cgroup-driver=cgroupfs".to_owned(),
        format!("--kubelet-cgroup-root={}", node.cgroup_root()),
        format!("--pod-resources-socket={}", path(&node.pod_resources_socket())),
        "--backend=mock".to_owned(),
        format!("--mock-config={}", path(&mock)),
    ];
    env.start_process(MONITOR, &vgpu_binary(MONITOR).unwrap(), &monitor_args, &[]).unwrap();
    if let Err(e) = wait_ready(port, Duration::from_secs(60)).await {
        panic!("{e}\n{MONITOR} log:\n{}", env.log_tail(MONITOR, 30));
    }
    let Some(prometheus) = Prometheus::start(&mut env, &[port]).unwrap() else {
        eprintln!("SKIPPED: prometheus is not installed (Debian package `prometheus`; .ci/run installs it)");
        return;
    };

    let used = r#"container_vgpu_device_physical_memory_usage_in_bytes{pod_name="train"}"#;
    let series = env
        .poll("Prometheus has the real container's memory series", TIMEOUT, || async {
            prometheus.query(used).await.filter(|r| !r.is_empty())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{MONITOR} log:\n{}", env.log_tail(MONITOR, 30)));
    assert_eq!(series.len(), 1, "{series:?}");
    let (labels, value) = &series[0];
    assert_eq!(*value, 1024.0 * MIB, "{labels}");
    assert_eq!(labels["container_name"], "main", "{labels}");
    assert_eq!(labels["pod_namespace"], NAMESPACE, "{labels}");
    assert_eq!(labels["device_uuid"], device.uuid.as_str(), "{labels}");
    assert_eq!(labels["node"], node.node_name(), "{labels}");
    let one = |q: String| async move {
        let r = prometheus.query(&q).await.unwrap();
        assert_eq!(r.len(), 1, "{q}: {r:?}");
        r[0].1
    };
    let uuid = &device.uuid;
    assert_eq!(
        one(r#"container_vgpu_device_memory_limit_in_bytes{pod_name="train"}"#.into()).await,
        4096.0 * MIB
    );
    assert_eq!(
        one(r#"container_vgpu_device_memory_utilization_percent{pod_name="train"}"#.into()).await,
        25.0
    );
    let cores = env
        .poll("the container's core utilization", TIMEOUT, || async {
            let q = r#"container_vgpu_device_core_utilization_percent{pod_name="train"}"#;
            prometheus.query(q).await.and_then(|r| r.first().map(|s| s.1)).filter(|v| *v > 0.0)
        })
        .await
        .unwrap();
    assert_eq!(cores, 40.0);
    assert_eq!(
        one(format!(r#"vgpu_device_current_shared_containers_number{{device_uuid="{uuid}"}}"#)).await,
        1.0
    );
    env.check_process(MONITOR).unwrap();

    pods.delete("train", &DeleteParams::default()).await.unwrap();
    env.poll("the pod gone", TIMEOUT, || async { pods.get_opt("train").await.ok()?.is_none().then_some(()) })
        .await
        .unwrap();
    node.stop().unwrap();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    env.finish();
}
