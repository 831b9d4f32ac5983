//! vgpu-dra: the DRA kubelet plugin of vgpu.
//!
//! This crate will hold the DRA kubelet plugin: ResourceSlice publishing, NodePrepareResources /
//! NodeUnprepareResources, CDI spec generation, checkpoints, and device health taints, as the
//! contract describes (`shared/reference/vgpu-manager-contract.md` §9). No issue tracks the plugin
//! yet; for now the crate holds the driver's well-known names and its gate registry, whose
//! start-up validation (Requires and Mutually-exclusive rules) is complete.
//!
//! ```
//! use vgpu_dra::{DRIVER_NAME, feature_gates};
//!
//! assert_eq!(DRIVER_NAME, "manager.nvidia.com");
//! assert!(feature_gates().configure(["DynamicMIG=true"]).is_err(), "NVMLDeviceHealthCheck is on by default");
//! assert!(feature_gates().configure(["DynamicMIG=true,NVMLDeviceHealthCheck=false"]).is_ok());
//! ```

pub mod api;
pub mod cdi;
pub mod checkpoint;
pub mod claims;
pub mod config;
pub mod devices;
pub mod driver;
pub mod gates;
pub mod health;
pub mod lock;
pub mod registration;
pub mod service;
pub mod slices;
pub mod state;

/// The DRA driver name.
pub const DRIVER_NAME: &str = "manager.nvidia.com";
/// CDI vendor of the DRA plugin's devices.
pub const CDI_VENDOR: &str = "k8s.manager.nvidia.com";
/// CDI class of the DRA plugin's devices.
pub const CDI_CLASS: &str = "claim";
/// Environment variable the plugin reads its gates from.
pub const FEATURE_GATES_ENV: &str = vgpu_gates::FEATURE_GATES_ENV;

/// The kubelet-plugin's feature-gate registry (DRA).
pub fn feature_gates() -> &'static vgpu_gates::Registry<vgpu_gates::DraGate> {
    vgpu_gates::kubelet_plugin()
}
