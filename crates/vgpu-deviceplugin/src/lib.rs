//! vgpu-deviceplugin: the kubelet device plugin of vgpu.
//!
//! This crate will hold the kubelet device-plugin gRPC server (`v1beta1` Registration and
//! DevicePlugin, pod-resources `v1`), registration and re-registration when kubelet restarts,
//! `ListAndWatch` health streaming, `Allocate` (environment, mounts, device nodes, CDI devices and
//! the per-container `vgpu.config`), and node publishing. The server is tracked in issue #6; for
//! now the crate holds the well-known paths and names of the contract
//! (`shared/reference/vgpu-manager-contract.md` §1, §5, §13) and the component's gate registry.
//!
//! ```
//! use vgpu_deviceplugin::{DEFAULT_DEVICE_PLUGIN_PATH, VGPU_SOCKET, feature_gates};
//! use vgpu_gates::CoreGate;
//!
//! assert_eq!(format!("{DEFAULT_DEVICE_PLUGIN_PATH}{VGPU_SOCKET}"), "/var/lib/kubelet/device-plugins/nvidia-vgpu.sock");
//! let gates = feature_gates().configure(["GPUCoreResourcePlugin=true"])?;
//! assert!(gates.enabled(CoreGate::GPUCoreResourcePlugin));
//! # Ok::<(), vgpu_gates::Error>(())
//! ```

pub mod api;

/// Default `--device-plugin-path`: the kubelet's device-plugin directory.
pub const DEFAULT_DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins/";
/// The kubelet's registration socket, inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Socket of the `<domain>/vgpu-number` plugin.
pub const VGPU_SOCKET: &str = "nvidia-vgpu.sock";
/// Socket of the `<domain>/vgpu-cores` plugin (gate `GPUCoreResourcePlugin`).
pub const VGPU_CORE_SOCKET: &str = "nvidia-vgpu-core.sock";
/// Socket of the `<domain>/vgpu-memory` plugin (gate `GPUMemoryResourcePlugin`).
pub const VGPU_MEMORY_SOCKET: &str = "nvidia-vgpu-memory.sock";
/// The kubelet pod-resources socket.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The device-plugin's feature-gate registry (Core).
pub fn feature_gates() -> &'static vgpu_gates::Registry<vgpu_gates::CoreGate> {
    vgpu_gates::device_plugin()
}
