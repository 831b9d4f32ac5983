//! The MIG manager of vgpu's device-plugin mode: reads the desired MIG layout of a node from its
//! `nvidia.com/mig.config` label (profiles in the mig-parted format, from a ConfigMap), and applies it
//! through the backend's MIG calls with the node in maintenance; it also publishes GPU feature labels
//! compatible with gpu-feature-discovery.
//!
//! | module | what |
//! |---|---|
//! | [`config`] | the mig-parted configuration file: typed parse, selection of one configuration's per-GPU targets |
//! | [`plan`] | targets → per-GPU plans (placements by [`vgpu_core::backend::mig::MigModel::pack`]), match check, apply |
//! | [`vgpu_core::gfd`] (used, not re-exported) | the GFD label set from backend facts (pure), and the node label patch |
//! | [`manager`] | the reconcile pass: state label, taint + cordon, evictions, apply, device plugin restart, return |
//! | [`drain`] | which pods leave the node (GPU pods, or a full drain), the backoff while evictions are refused |
//! | [`reset`] | the GPU reset that applies a pending MIG mode, the node reboot request when none is possible |
//! | [`cluster`] | [`cluster::MigCluster`] (node, ConfigMap, pods, eviction, node condition) and [`cluster::InMemoryCluster`] |
//! | [`kube_cluster`] | [`kube_cluster::KubeCluster`], the API-server implementation |
//!
//! Node keys (contract: mig-parted / GPU operator names):
//!
//! | key | kind | values |
//! |---|---|---|
//! | `nvidia.com/mig.config` | label (set by the operator) | a configuration name of the ConfigMap |
//! | `nvidia.com/mig.config.state` | label | `pending`, `success`, `failed`, `reboot-required` |
//! | `nvidia.com/mig.config.state.reason` | annotation | why the state is `failed` or `reboot-required` |
//! | `nvidia.com/mig.config.cordoned` | annotation | `true` while the manager's own cordon is in place |
//! | `nvidia.com/mig-reconfigure` | taint, `NoSchedule` | present during maintenance |
//! | `nvidia.com/mig.config.reboot-required` | annotation | the boot ID at which a reboot was requested ([`reset`]) |
//! | `MIGRebootRequired` | Node condition | `True` while a reboot is requested ([`reset`]) |
//!
//! ```
//! assert_eq!(vgpu_mig_manager::CONFIG_LABEL, "nvidia.com/mig.config");
//! ```

pub mod cluster;
pub mod config;
pub mod drain;
pub mod kube_cluster;
pub mod manager;
pub mod plan;
pub mod reset;

/// The node label that names the desired MIG configuration.
pub const CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// The node label with the manager's state (`pending`, `success`, `failed`, `reboot-required`).
pub const STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// The node annotation with the reason of a `failed` state.
pub const REASON_ANNOTATION: &str = "nvidia.com/mig.config.state.reason";
/// The node annotation recording that the manager cordoned the node.
pub const CORDONED_ANNOTATION: &str = "nvidia.com/mig.config.cordoned";
/// The taint key put on the node during maintenance (effect `NoSchedule`).
pub const TAINT_KEY: &str = "nvidia.com/mig-reconfigure";
/// The node annotation requesting a reboot (a pending MIG mode no GPU reset can apply); its value is the
/// node's boot ID when the reboot was requested ([`reset`]).
pub const REBOOT_ANNOTATION: &str = "nvidia.com/mig.config.reboot-required";
/// The Node condition type that is `True` while the manager requests a reboot ([`reset`]).
pub const REBOOT_CONDITION: &str = "MIGRebootRequired";

pub use cluster::{InMemoryCluster, MigCluster};
pub use manager::{ManagerConfig, MigManager, Outcome};
