//! The vgpu domain model: devices, node inventories, node vGPU settings, requests, claims and policies.
//!
//! These are plain typed values with no I/O. The wire encodings that vgpu-manager writes into Kubernetes
//! annotations live in [`crate::codec`]; the resource/annotation key names live in [`crate::domain`].

mod claim;
mod device;
mod node;
mod policy;
mod request;

pub use claim::{ContainerDeviceClaim, DeviceClaim, PodDeviceClaim};
pub use device::{ComputeCapability, DeviceHealth, GpuDevice, NodeDeviceInventory, Vendor};
pub use node::NodeVgpuConfig;
pub use policy::{
    AssignedPhase, ComputePolicy, MemoryPolicy, ParsePolicyError, SchedulingPolicy, TopologyMode,
};
pub use request::{ContainerKind, ContainerVgpuRequest, MAX_VGPU_NUMBER, RequestError, VgpuRequest};
