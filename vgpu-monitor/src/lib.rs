//! vgpu-monitor: the device monitor of vgpu (contract §1.3, §8): per-container and physical GPU metrics
//! read at scrape time, the readers of the shared SM-utilization file and the virtual-memory ledger.
//!
//! # Module map
//!
//! | module | what it holds |
//! |---|---|
//! | [`pods`] | [`PodSource`](pods::PodSource): the node's pods (label `<domain>/metrics-node=<node>`) — [`KubePods`](pods::KubePods) (kube-runtime reflector), [`InMemoryPods`](pods::InMemoryPods) |
//! | [`cgroup`] | container PIDs from `cgroup.procs` (v1/v2, systemd/cgroupfs) |
//! | [`dra`] | `--enable-dra-monitor`: [`DraSource`](dra::DraSource) (ResourceSlices and ResourceClaims: [`KubeDra`](dra::KubeDra) reflectors, [`InMemoryDra`](dra::InMemoryDra)) and the claim → container → device resolution |
//! | [`collect`] | [`NodeCollector`](collect::NodeCollector): one [`Snapshot`](collect::Snapshot) per scrape from the backend, the pods and the per-container files |
//! | [`podres`] | which container holds which MIG device: the kubelet pod-resources API ([`KubeletPodResources`](podres::KubeletPodResources), [`InMemoryPodResources`](podres::InMemoryPodResources)) |
//! | [`metrics`] | the families of contract §8 (table there), `service="vGPU"` on every series |
//! | [`server`] | `/healthz`, `/readyz`, `/version`, `/metrics` (min scrape interval, OpenMetrics or Prometheus text, `--enable-rbac`) as an `axum::Router` |
//!
//! Files are read with plain reads (`vgpu_core::abi`), not memory maps: `memmap2::Mmap::map` is `unsafe`
//! and the workspace forbids `unsafe_code`; see the bench (`cargo bench -p vgpu-monitor --bench monitor`)
//! for the cost of a scrape.
//!
//! # Example
//!
//! A mock GPU, one pod with one container using 40 % of it, its `vgpu.config` and cgroup in a temp tree:
//!
//! ```
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::Pod;
//! use vgpu_core::{abi::vgpu_config::{self, DeviceConfig, VgpuConfig}, backend::mock::MockBackend};
//! use vgpu_monitor::{
//!     cgroup::CgroupLayout, collect::{MonitorConfig, NodeCollector}, metrics, pods::InMemoryPods,
//!     server::{MonitorServer, ServerConfig},
//! };
//!
//! let root = std::env::temp_dir().join(format!("vgpu-mon-doc-{}", std::process::id()));
//! let yaml = "gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034, processes: [{ pid: 4242, usedMemoryMiB: 1024 }] }\n\
//!             utilization:\n  - { gpu: 0, pid: 4242, timestampUs: 5, smPercent: 40 }\n";
//! let backend = Arc::new(MockBackend::from_yaml_str(yaml)?);
//! // The pod, as the device plugin leaves it.
//! let pod: Pod = serde_json::from_value(serde_json::json!({
//!     "metadata": { "name": "p", "namespace": "ns", "uid": "u1",
//!                   "annotations": { "nvidia.com/real-allocated": "main[0_GPU-a_50_4096]" } },
//!     "spec": { "containers": [{ "name": "main" }] },
//!     "status": { "qosClass": "Guaranteed",
//!                 "containerStatuses": [{ "name": "main", "containerID": "containerd://c1", "image": "i",
//!                                         "imageID": "", "ready": true, "restartCount": 0 }] }
//! }))?;
//! let mut config = VgpuConfig::default();
//! config.devices[0] = DeviceConfig { uuid: "GPU-a".into(), total_memory: 4096 << 20, real_memory: 4096 << 20,
//!                                    activate: 1, ..DeviceConfig::default() };
//! std::fs::create_dir_all(root.join("manager/u1_main/config"))?;
//! vgpu_config::write(&root.join("manager/u1_main/config/vgpu.config"), &config)?;
//! let cgroup = root.join("cgroup/kubepods/podu1/c1"); // cgroup v2, cgroupfs driver, Guaranteed pod
//! std::fs::create_dir_all(&cgroup)?;
//! std::fs::write(root.join("cgroup/cgroup.controllers"), "memory")?;
//! std::fs::write(cgroup.join("cgroup.procs"), "4242\n")?;
//!
//! let mut monitor = MonitorConfig::new("node-1");
//! monitor.manager_dir = root.join("manager");
//! monitor.cgroup = CgroupLayout { root: root.join("cgroup"), ..CgroupLayout::default() };
//! let pods = Arc::new(InMemoryPods::new([pod]));
//! let collector = Arc::new(NodeCollector::new(monitor, backend, pods.clone()));
//! let mut registry = metrics::new_registry();
//! metrics::register(&mut registry, collector);
//! let server = MonitorServer::new(registry, pods, ServerConfig::default());
//! let page = server.render(false)?;
//! assert!(page.contains(r#"container_vgpu_device_physical_memory_usage_in_bytes{service="vGPU",pod_namespace="ns",pod_name="p",container_name="main",vdevice_idx="0",device_uuid="GPU-a",node="node-1"} 1073741824.0"#), "{page}");
//! assert!(page.contains(r#"container_vgpu_device_core_utilization_percent{service="vGPU",pod_namespace="ns",pod_name="p",container_name="main",vdevice_idx="0",device_uuid="GPU-a",node="node-1"} 40.0"#), "{page}");
//! let _router = server.router(); // serve with vgpu_serve::http::serve
//! # std::fs::remove_dir_all(&root)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod cgroup;
pub mod collect;
pub mod dra;
pub mod mapped;
pub mod metrics;
pub mod podres;
pub mod pods;
pub mod server;
