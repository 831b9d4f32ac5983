//! `vgpu-device-monitor --enable-dra-monitor` against the real API server and kube-scheduler: our
//! ResourceSlices (the DRA plugin's builder over a mock backend, memory ratio 200) created in the API, the
//! DeviceClasses of `deploy/dra/deviceclasses.yaml`, two ResourceClaims of class `vgpu-manager`
//! (`{cores: 30, memory: 4Gi}` and `{cores: 50, memory: 8Gi}`) allocated by the real kube-scheduler and
//! their pods bound (pods are found by `spec.nodeName`, they carry no metrics-node label); the pods' container
//! statuses set through the status subresource, their `cgroup.procs` in a temp tree, the mock backend's
//! processes carry those PIDs. The monitor binary, reading slices, claims and pods through its reflectors,
//! reports per-claim container limits from the consumed capacity (physical limit halved by the ratio),
//! usage from the container's processes, and the assigned totals of the device each claim landed on.
//!
//! Needs the control-plane binaries and ours: run `e2e/run.sh monitor_dra`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, time::Duration};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use vgpu_core::backend::mock::MockBackend;
use vgpu_dra::{
    devices::{AllocatableDevices, DeviceConfig},
    health::HealthSnapshot,
    slices::{SliceConfig, build_slices},
};
use vgpu_e2e::{
    SCHEDULER_NAME, TestEnv, fixtures, free_port, http_get, scheduler_configuration, vgpu_binary, wait_ready,
};

const MONITOR: &str = "vgpu-device-monitor";
const NODE: &str = "dra-mon-node";
const NAMESPACE: &str = "default";
const TIMEOUT: Duration = Duration::from_secs(60);
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// Each pod's process runs on both GPUs, so its usage is known whichever device its claim lands on.
const MOCK: &str = "\
driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - uuid: GPU-MON-0
    name: NVIDIA A30
    memoryMiB: 24576
    processes:
      - { pid: 5100, usedMemoryMiB: 1024 }
      - { pid: 5200, usedMemoryMiB: 2048 }
  - uuid: GPU-MON-1
    name: NVIDIA A30
    memoryMiB: 24576
    processes:
      - { pid: 5100, usedMemoryMiB: 1024 }
      - { pid: 5200, usedMemoryMiB: 2048 }
utilization:
  - { gpu: 0, pid: 5100, timestampUs: 1700000000000000, smPercent: 40 }
  - { gpu: 1, pid: 5100, timestampUs: 1700000000000000, smPercent: 40 }
  - { gpu: 0, pid: 5200, timestampUs: 1700000000000000, smPercent: 70, encoderPercent: 20 }
  - { gpu: 1, pid: 5200, timestampUs: 1700000000000000, smPercent: 70, encoderPercent: 20 }
";

async fn setup_node_classes_and_slices(client: &kube::Client) {
    fixtures::create_dra_node_and_classes(client, NODE).await.unwrap();
    let backend = MockBackend::from_yaml_str(MOCK).unwrap();
    let config = DeviceConfig { cores_ratio: 100, memory_ratio: 200, ..DeviceConfig::default() };
    let devices = AllocatableDevices::from_backend(&backend, &config).unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for slice in build_slices(&SliceConfig::new(NODE), &devices, &HealthSnapshot::default(), 1).unwrap() {
        slices.create(&PostParams::default(), &slice).await.unwrap();
    }
}

/// Claim `name` of class `vgpu-manager` for `cores` and `memory`, and its pod `name` whose container `main`
/// uses it (kube-scheduler allocates and binds).
async fn claim_and_pod(client: &kube::Client, name: &str, cores: &str, memory: &str) {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": { "devices": { "requests": [{ "name": "vgpu", "exactly": {
            "deviceClassName": "vgpu-manager", "allocationMode": "ExactCount", "count": 1,
            "capacity": { "requests": { "cores": cores, "memory": memory } }
        } }] } }
    }))
    .unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [{ "name": "main", "image": "example.invalid/cuda:never-pulled",
                             "resources": { "claims": [{ "name": "gpu" }] } }],
            "resourceClaims": [{ "name": "gpu", "resourceClaimName": name }]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NAMESPACE).create(&PostParams::default(), &pod).await.unwrap();
}

/// Marks pod `name`'s container running as `ctr_id` and writes its cgroup (BestEffort, cgroupfs) with `pid`;
/// returns the device its claim was allocated.
async fn run_pod(client: &kube::Client, root: &Path, name: &str, ctr_id: &str, pid: u32) -> String {
    let node = fixtures::wait_for_pod_node(client, NAMESPACE, name, TIMEOUT).await.unwrap();
    assert_eq!(node, NODE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let status = json!({ "status": {
        "phase": "Running",
        "containerStatuses": [{
            "name": "main", "containerID": format!("containerd://{ctr_id}"), "image": "i", "imageID": "",
            "ready": true, "restartCount": 0, "state": { "running": {} }
        }]
    }});
    let pod = pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    let uid = pod.metadata.uid.unwrap();
    let cgroup = root.join(format!("cgroup/kubepods/besteffort/pod{uid}/{ctr_id}"));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), format!("{pid}\n")).unwrap();
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE).get(name).await.unwrap();
    let results = claim.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap();
    assert_eq!(results.len(), 1);
    results[0].device.clone()
}

/// The value of the one series of `name` whose labels include every `labels` pair.
fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = page
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    (found.len() == 1).then(|| found[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn monitor_dra_reports_claims_allocated_by_the_scheduler() {
    let mut env =
        TestEnv::builder("monitor_dra_reports_claims_allocated_by_the_scheduler").start().await.unwrap();
    let client = env.client().await.unwrap();
    env.start_scheduler_with_config(&scheduler_configuration(env.kubeconfig_path(), &[])).await.unwrap();
    setup_node_classes_and_slices(&client).await;
    claim_and_pod(&client, "share-a", "30", "4Gi").await;
    claim_and_pod(&client, "share-b", "50", "8Gi").await;

    let root = env.workdir().join("node");
    std::fs::create_dir_all(root.join("cgroup")).unwrap();
    std::fs::write(root.join("cgroup/cgroup.controllers"), "cpu memory\n").unwrap();
    let device_a = run_pod(&client, &root, "share-a", "c-a", 5100).await;
    let device_b = run_pod(&client, &root, "share-b", "c-b", 5200).await;
    let gpu = |device: &str| match device {
        "vgpu-0" => ("0", "GPU-MON-0"),
        "vgpu-1" => ("1", "GPU-MON-1"),
        other => panic!("unexpected device {other}"),
    };

    let mock = root.join("mock.yaml");
    std::fs::write(&mock, MOCK).unwrap();
    let port = free_port().unwrap();
    let args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--node-name={NODE}"),
        format!("--server-bind-port={port}"),
        format!("--manager-dir={}", root.join("manager").display()),
        format!("--host-cgroup-root={}", root.join("cgroup").display()),
        "--cgroup-driver=cgroupfs".to_owned(),
        "--backend=mock".to_owned(),
        format!("--mock-config={}", mock.display()),
        "--enable-dra-monitor".to_owned(),
        "--feature-gates=VirtualMemoryTracking=true".to_owned(),
    ];
    env.start_process(MONITOR, &vgpu_binary(MONITOR).unwrap(), &args, &[]).unwrap();
    if let Err(e) = wait_ready(port, TIMEOUT).await {
        panic!("{e}\n{MONITOR} log:\n{}", env.log_tail(MONITOR, 30));
    }

    let (idx_a, uuid_a) = gpu(&device_a);
    let a =
        [("pod_name", "share-a"), ("container_name", "main"), ("vdevice_idx", "0"), ("device_uuid", uuid_a)];
    let page = env
        .poll("the monitor shows share-a's container", TIMEOUT, || async {
            let (status, body) = http_get(port, "/metrics").await.ok()?;
            (status == 200 && value(&body, "container_vgpu_device_memory_limit_in_bytes", &a).is_some())
                .then_some(body)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{MONITOR} log:\n{}", env.log_tail(MONITOR, 30)));
    let get = |name: &str, labels: &[(&str, &str)]| {
        value(&page, name, labels).unwrap_or_else(|| panic!("{name} {labels:?} in\n{page}"))
    };
    assert_eq!(get("container_vgpu_device_memory_limit_in_bytes", &a), 4.0 * GIB);
    assert_eq!(get("container_vgpu_device_physical_memory_limit_in_bytes", &a), 2.0 * GIB);
    assert_eq!(get("container_vgpu_device_memory_usage_in_bytes", &a), 1024.0 * MIB);
    assert_eq!(get("container_vgpu_device_memory_utilization_percent", &a), 25.0);
    assert_eq!(get("container_vgpu_device_core_utilization_percent", &a), 40.0);
    let (idx_b, uuid_b) = gpu(&device_b);
    let b =
        [("pod_name", "share-b"), ("container_name", "main"), ("vdevice_idx", "0"), ("device_uuid", uuid_b)];
    assert_eq!(get("container_vgpu_device_memory_limit_in_bytes", &b), 8.0 * GIB);
    assert_eq!(get("container_vgpu_device_memory_usage_in_bytes", &b), 2048.0 * MIB);
    assert_eq!(get("container_vgpu_device_core_utilization_percent", &b), 87.0);

    // Assigned totals of each device from the claims that landed on it.
    for (idx, uuid) in [("0", "GPU-MON-0"), ("1", "GPU-MON-1")] {
        let (mut cores, mut memory) = (0.0, 0.0);
        if idx == idx_a {
            (cores, memory) = (cores + 30.0, memory + 4.0 * GIB);
        }
        if idx == idx_b {
            (cores, memory) = (cores + 50.0, memory + 8.0 * GIB);
        }
        let d = [("device_idx", idx), ("device_uuid", uuid)];
        assert_eq!(get("vgpu_device_assigned_cores_number", &d), cores, "{idx}");
        assert_eq!(get("vgpu_device_assigned_memory_in_bytes", &d), memory, "{idx}");
        assert_eq!(get("vgpu_device_total_memory_in_bytes", &d), 48.0 * GIB);
    }
    for line in page.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        assert!(line.contains(r#"service="vGPU""#), "{line}");
    }
    env.finish();
}
