//! The GPU module's controller: turns each `GPUClass` ([`vgpu_api`]) into a DRA `DeviceClass`, keeps the
//! occupancy of every `PhysicalGPU` from the ResourceClaims the scheduler allocated, and validates GPUClass,
//! DeviceClass and ResourceClaim objects at admission.
//!
//! ```
//! assert_eq!(vgpu_controller::FIELD_MANAGER, "vgpu-controller");
//! ```

/// The field manager of the controller's server-side applies.
pub const FIELD_MANAGER: &str = "vgpu-controller";
