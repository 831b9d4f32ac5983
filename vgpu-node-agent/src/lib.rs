//! The GPU module's node agent: finds the GPUs of one node in sysfs and the PCI ID database
//! ([`vgpu_core::discovery`]), keeps one `PhysicalGPU` ([`vgpu_api`]) per GPU, and labels the Node with the
//! vendors present. It runs on every node except the control plane (a DaemonSet).
//!
//! | module | what |
//! |---|---|
//! | [`agent`] | [`AgentConfig`], the scan loop [`NodeAgent`] (`scan_once`, `run`), the control-plane refusal |
//! | [`desired`] | the pure step: PhysicalGPU names, objects, node labels |
//! | [`fake_sysfs`] | a fake sysfs tree and `pci.ids` for tests, benches and demos |
//! | [`vendors`] | the `gpu-supported-vendors` ConfigMap format and its fallback to the built-in table |
//! | [`cluster`] | the seam [`AgentCluster`] and [`InMemoryCluster`] |
//! | [`kube_cluster`] | [`KubeCluster`]: the API server (server-side apply, field manager `vgpu-node-agent`) |
//! | [`uevent`] | kernel PCI uevents (netlink), so a hot-plugged or removed GPU is scanned at once |
//!
//! What the agent writes (domain and group default to `gpu.deckhouse.io`, both configurable):
//!
//! | object | fields | owner |
//! |---|---|---|
//! | `PhysicalGPU <node>-<vendor>-<device id>-<pci address>` | labels `<domain>/vendor`, `<domain>/node`; the whole `spec` | agent |
//! | its `status` | `driver`, condition `DriverBound` | agent (adapters and the controller own the rest) |
//! | `Node` | `<domain>/vendor=<vendor>`, `<domain>/vendor.<vendor>=true` | agent |
//!
//! A GPU that disappears from sysfs loses its PhysicalGPU at the next scan; a vendor that leaves loses its
//! labels (server-side apply removes fields the manager stops sending). Scans run every
//! [`AgentConfig::scan_interval`], and about a second after each kernel PCI uevent ([`uevent`]; where the
//! netlink socket cannot be opened, on the period only).
//!
//! ```
//! use std::sync::Arc;
//! use vgpu_node_agent::{AgentConfig, InMemoryCluster, NodeAgent};
//!
//! # let sys = tempfile::tempdir()?;
//! # std::fs::create_dir_all(sys.path().join("bus/pci/devices"))?;
//! let cluster = Arc::new(InMemoryCluster::new());
//! cluster.put_node("w1", Default::default());
//! let mut config = AgentConfig::new("w1");
//! config.sysfs_root = sys.path().to_path_buf(); // an empty fake sysfs: no GPUs
//! let mut agent = NodeAgent::new(cluster.clone(), config);
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! agent.check_node().await?;
//! let outcome = agent.scan_once().await?;
//! assert!(outcome.gpus.is_empty() && outcome.node_labels.is_empty());
//! # Ok::<(), vgpu_node_agent::AgentError>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod agent;
pub mod cluster;
pub mod desired;
pub mod fake_sysfs;
pub mod kube_cluster;
pub mod uevent;
pub mod vendors;

pub use agent::{AgentConfig, AgentError, NodeAgent, ScanOutcome};
pub use cluster::{AgentCluster, GpuObject, InMemoryCluster};
pub use kube_cluster::KubeCluster;
