//! `vgpu-device-monitor` against the real API server and a real Prometheus server (Debian package
//! `prometheus`, started on loopback with a scrape config pointing at the monitor):
//!
//! * two pods labelled `nvidia.com/metrics-node=node-1` with `real-allocated` claims, their container
//!   statuses (container IDs) set through the status subresource; each container's `vgpu.config` and
//!   `cgroup.procs` in a temp tree; the mock backend's processes carry those PIDs. Prometheus' HTTP API then
//!   returns the per-container series with the expected values (memory used vs limit, core utilization
//!   capped at 100), every one with `service="vGPU"`.
//! * `--enable-rbac`: no token 401; a ServiceAccount token without RBAC 403; one bound to a ClusterRole
//!   allowing `get` on `/metrics` 200.
//!
//! Skipped, saying so, where `prometheus` is not installed (.ci/run installs it). Run with
//! `e2e/run.sh monitor`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use vgpu_core::abi::vgpu_config::{self, DeviceConfig, VgpuConfig};
use vgpu_e2e::rbac::{allow_metrics, assert_metrics_rbac, service_account_token};
use vgpu_e2e::{TestEnv, free_port, prometheus::Prometheus, vgpu_binary, wait_ready};

const MONITOR: &str = "vgpu-device-monitor";
const NODE: &str = "node-1";

const MOCK: &str = "\
gpus:
  - uuid: GPU-0000
    name: NVIDIA L4
    memoryMiB: 24576
    processes:
      - { pid: 4100, usedMemoryMiB: 1024 }
      - { pid: 4101, usedMemoryMiB: 512 }
      - { pid: 4200, usedMemoryMiB: 2048 }
  - uuid: GPU-0001
    name: NVIDIA L4
    memoryMiB: 24576
    processes:
      - { pid: 4100, usedMemoryMiB: 256 }
utilization:
  - { gpu: 0, pid: 4100, timestampUs: 1700000000000000, smPercent: 70, encoderPercent: 20 }
  - { gpu: 0, pid: 4101, timestampUs: 1700000000000000, smPercent: 30 }
  - { gpu: 0, pid: 4200, timestampUs: 1700000000000000, smPercent: 25 }
  - { gpu: 1, pid: 4100, timestampUs: 1700000000000000, smPercent: 10 }
";

/// Creates pod `name` with one container `main` claiming `claims` (`(gpu, cores, MiB)`), marks its
/// container running with ID `ctr_id`, and writes its `vgpu.config` and `cgroup.procs` (`pids`).
async fn vgpu_pod(
    client: &kube::Client,
    root: &Path,
    name: &str,
    ctr_id: &str,
    claims: &[(u32, u64, u64)],
    pids: &[u32],
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claim: Vec<String> = claims.iter().map(|(g, c, m)| format!("{g}_GPU-000{g}_{c}_{m}")).collect();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": { "nvidia.com/metrics-node": NODE },
            "annotations": { "nvidia.com/real-allocated": format!("main[{}]", claim.join(",")) }
        },
        "spec": { "nodeName": NODE, "containers": [{ "name": "main", "image": "busybox" }] }
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let qos = pod.status.as_ref().and_then(|s| s.qos_class.clone()).unwrap_or_default();
    assert_eq!(qos, "BestEffort", "no requests or limits");
    let status = serde_json::json!({ "status": {
        "phase": "Running",
        "containerStatuses": [{
            "name": "main", "containerID": format!("containerd://{ctr_id}"), "image": "busybox", "imageID": "",
            "ready": true, "restartCount": 0, "state": { "running": {} }
        }]
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    let mut config = VgpuConfig {
        pod_uid: uid.clone(),
        pod_name: name.into(),
        container_name: "main".into(),
        ..VgpuConfig::default()
    };
    for (gpu, cores, mib) in claims {
        config.devices[*gpu as usize] = DeviceConfig {
            uuid: format!("GPU-000{gpu}"),
            total_memory: mib << 20,
            real_memory: mib << 20,
            hard_core: *cores as i32,
            activate: 1,
            ..DeviceConfig::default()
        };
    }
    let dir = root.join(format!("manager/{uid}_main/config"));
    std::fs::create_dir_all(&dir).unwrap();
    vgpu_config::write(&dir.join("vgpu.config"), &config).unwrap();
    let cgroup = root.join(format!("cgroup/kubepods/besteffort/pod{uid}/{ctr_id}"));
    std::fs::create_dir_all(&cgroup).unwrap();
    let procs: String = pids.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(cgroup.join("cgroup.procs"), procs).unwrap();
}

fn start_monitor(env: &mut TestEnv, name: &str, root: &Path, port: u16, extra: &[&str]) {
    let mock = root.join("mock.yaml");
    std::fs::write(&mock, MOCK).unwrap();
    let mut args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--node-name={NODE}"),
        format!("--server-bind-port={port}"),
        format!("--manager-dir={}", root.join("manager").display()),
        format!("--host-cgroup-root={}", root.join("cgroup").display()),
        "--cgroup-driver=cgroupfs".to_owned(),
        "--backend=mock".to_owned(),
        format!("--mock-config={}", mock.display()),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    env.start_process(name, &vgpu_binary(MONITOR).unwrap(), &args, &[]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn monitor_series_reach_prometheus() {
    let mut env = TestEnv::builder("monitor_series_reach_prometheus").start().await.unwrap();
    let client = env.client().await.unwrap();
    let root = env.workdir().join("node");
    std::fs::create_dir_all(root.join("cgroup")).unwrap();
    std::fs::write(root.join("cgroup/cgroup.controllers"), "cpu memory\n").unwrap();
    vgpu_pod(&client, &root, "train", "c-train", &[(0, 50, 4096), (1, 30, 2048)], &[4100, 4101]).await;
    vgpu_pod(&client, &root, "infer", "c-infer", &[(0, 50, 8192)], &[4200]).await;

    let port = free_port().unwrap();
    start_monitor(&mut env, MONITOR, &root, port, &[]);
    if let Err(e) = wait_ready(port, Duration::from_secs(60)).await {
        panic!("{e}\n{MONITOR} log:\n{}", env.log_tail(MONITOR, 30));
    }

    // Prometheus scrapes the monitor every second.
    let Some(prometheus) = Prometheus::start(&mut env, &[port]).unwrap() else {
        eprintln!("SKIPPED: prometheus is not installed (Debian package `prometheus`; .ci/run installs it)");
        return;
    };

    let q = r#"container_vgpu_device_physical_memory_usage_in_bytes{pod_name="train",vdevice_idx="0"}"#;
    let series = env
        .poll("Prometheus has the monitor's per-container series", Duration::from_secs(60), || async {
            prometheus.query(q).await.filter(|r| !r.is_empty())
        })
        .await
        .unwrap();
    let (labels, value) = &series[0];
    assert_eq!(*value, 1536.0 * 1048576.0, "{labels}");
    assert_eq!(labels["service"], "vGPU");
    assert_eq!(labels["node"], NODE);
    assert_eq!(labels["pod_namespace"], "default");
    assert_eq!(labels["container_name"], "main");
    assert_eq!(labels["device_uuid"], "GPU-0000");
    let one = |q: &'static str| async move {
        let r = prometheus.query(q).await.unwrap();
        assert_eq!(r.len(), 1, "{q}: {r:?}");
        r[0].1
    };
    // 70 + 0.85 × 20 + 30 = 117 → capped at 100.
    assert_eq!(
        one(r#"container_vgpu_device_core_utilization_percent{pod_name="train",vdevice_idx="0"}"#).await,
        100.0
    );
    assert_eq!(
        one(r#"container_vgpu_device_core_utilization_percent{pod_name="train",vdevice_idx="1"}"#).await,
        10.0
    );
    assert_eq!(
        one(r#"container_vgpu_device_memory_limit_in_bytes{pod_name="infer"}"#).await,
        8192.0 * 1048576.0
    );
    assert_eq!(one(r#"container_vgpu_device_memory_utilization_percent{pod_name="infer"}"#).await, 25.0);
    assert_eq!(one(r#"container_vgpu_device_core_utilization_percent{pod_name="infer"}"#).await, 25.0);
    assert_eq!(one(r#"vgpu_device_current_shared_containers_number{device_uuid="GPU-0000"}"#).await, 2.0);
    assert_eq!(one(r#"node_vgpu_device_assigned_memory_in_bytes"#).await, 14336.0 * 1048576.0);
    // Every series the monitor sent carries service="vGPU".
    let unlabelled =
        prometheus.query(r#"{job="vgpu-monitor",service!="vGPU",__name__!~"up|scrape_.*"}"#).await.unwrap();
    assert!(unlabelled.is_empty(), "{unlabelled:?}");
    env.check_process(MONITOR).unwrap();
    env.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn monitor_metrics_rbac_401_403_200() {
    let mut env = TestEnv::builder("monitor_metrics_rbac_401_403_200").start().await.unwrap();
    let client = env.client().await.unwrap();
    // RBAC first, so that no refusal of the scraper is cached (2 s) before its binding exists.
    allow_metrics(&client, "scraper").await.unwrap();
    let scraper = service_account_token(&client, "scraper").await.unwrap();
    let nobody = service_account_token(&client, "nobody").await.unwrap();

    let root = env.workdir().join("node");
    std::fs::create_dir_all(root.join("manager")).unwrap();
    let port = free_port().unwrap();
    start_monitor(&mut env, MONITOR, &root, port, &["--enable-rbac"]);
    if let Err(e) = wait_ready(port, Duration::from_secs(60)).await {
        panic!("{e}\n{MONITOR} log:\n{}", env.log_tail(MONITOR, 30));
    }
    let body = assert_metrics_rbac(&env, port, &nobody, &scraper).await.unwrap();
    assert!(body.contains("exporter_build_info{service=\"vGPU\",node=\"node-1\""), "{body:.400}");
    env.check_process(MONITOR).unwrap();
    env.finish();
}
