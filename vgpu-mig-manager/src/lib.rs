//! The MIG manager of vgpu's device-plugin mode: reads the desired MIG layout of a node from its
//! `nvidia.com/mig.config` label (profiles in the mig-parted format), and applies it through the backend
//! with the node in maintenance.
//!
//! ```
//! assert_eq!(vgpu_mig_manager::CONFIG_LABEL, "nvidia.com/mig.config");
//! ```

/// The node label that names the desired MIG configuration.
pub const CONFIG_LABEL: &str = "nvidia.com/mig.config";
