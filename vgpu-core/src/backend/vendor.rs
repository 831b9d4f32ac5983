//! The vendor seam of container edits: [`VendorAdapter`] says what a container needs to use one vendor's
//! GPUs, so the device plugin's `Allocate` and its CDI spec never name a vendor themselves.
//!
//! | what | [`NvidiaAdapter`] | [`MetaxAdapter`] |
//! |---|---|---|
//! | per-GPU device nodes | `/dev/nvidia<minor>` | the GPU's DRM nodes `/dev/dri/cardN`, `/dev/dri/renderDM` (from `<sysfs>/bus/pci/devices/<bdf>/drm/`) |
//! | control / shared nodes (passed when present) | `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset` | `/dev/mxcd` |
//! | visible-devices env (`envvar` strategy) | `NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>` | none: visibility is the device nodes |
//! | `volume-mounts` root | `/var/run/nvidia-container-devices` | none |
//! | CDI kind (`vendor/class`) | `k8s.device-plugin.nvidia.com/gpu` | `k8s.device-plugin.metax-tech.com/gpu` |
//! | feature env | `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY` = `enabled` | none |
//! | IMEX channels | yes | no |
//!
//! A backend hands out its adapter through [`DeviceBackend::vendor_adapter`](super::DeviceBackend::vendor_adapter);
//! the default is [`NvidiaAdapter`], which the mock backend keeps whatever its GPUs' `vendor` field says. All
//! paths here are container paths (`/dev/...`); the device plugin puts them under its driver roots.
//!
//! The MetaX facts come from MetaX's public container instructions (`docker run --device=/dev/dri
//! --device=/dev/mxcd`, e.g. the vLLM-MetaX and MACA PyTorch image guides): a MetaX GPU is its DRM card and
//! render nodes plus the shared control device `/dev/mxcd`. MetaX documents no visible-devices variable for
//! its runtime, so none is set; the CDI kind is our own name (the spec is written by this plugin).
//!
//! ```
//! use std::collections::BTreeMap;
//! use vgpu_core::backend::{MetaxAdapter, NvidiaAdapter, VendorAdapter};
//!
//! let nvidia = NvidiaAdapter;
//! assert_eq!(nvidia.gpu_device_nodes(0, 3), ["/dev/nvidia3"]);
//! assert_eq!(nvidia.visible_devices_env(), Some("NVIDIA_VISIBLE_DEVICES"));
//! assert_eq!(nvidia.cdi_device("GPU-a"), "k8s.device-plugin.nvidia.com/gpu=GPU-a");
//!
//! let metax = MetaxAdapter::new(BTreeMap::from([(0, vec!["/dev/dri/card1".into(), "/dev/dri/renderD129".into()])]));
//! assert_eq!(metax.gpu_device_nodes(0, 0), ["/dev/dri/card1", "/dev/dri/renderD129"]);
//! assert_eq!(metax.control_device_nodes(), ["/dev/mxcd"]);
//! assert!(metax.visible_devices_env().is_none() && !metax.supports_imex());
//! ```

use std::{collections::BTreeMap, fmt};

use crate::{model::Vendor, node_config::NodeSettings};

/// NVIDIA control device nodes, passed to every GPU container when present (contract §5.2).
pub const NVIDIA_CONTROL_DEVICES: [&str; 4] =
    ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"];
/// The env var nvidia-container-runtime reads the visible GPUs from.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Container-side root of NVIDIA's `volume-mounts` device list.
pub const NVIDIA_VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// CDI kind of the NVIDIA GPUs the device plugin hands out.
pub const NVIDIA_CDI_KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
/// The MetaX control device, shared by every MetaX GPU.
pub const METAX_CONTROL_DEVICE: &str = "/dev/mxcd";
/// CDI kind of the MetaX GPUs the device plugin hands out (our name: MetaX publishes none).
pub const METAX_CDI_KIND: &str = "k8s.device-plugin.metax-tech.com/gpu";

/// What a container needs to use GPUs of one vendor (see the module docs for both implementations).
///
/// Paths are container paths under `/dev`; where the device plugin finds them on the host is its business
/// (`--host-driver-root`, `--container-driver-root`).
pub trait VendorAdapter: Send + Sync + fmt::Debug {
    /// The vendor.
    fn vendor(&self) -> Vendor;

    /// The device nodes of GPU `index`. `minor` is the backend's
    /// [`minor_number`](super::DeviceBackend::minor_number) of that GPU (its index when the backend has
    /// none); adapters whose nodes are not numbered by it ignore it.
    fn gpu_device_nodes(&self, index: u32, minor: u32) -> Vec<String>;

    /// Control and shared device nodes every GPU container gets, each only when it exists on the node.
    fn control_device_nodes(&self) -> &[&'static str];

    /// The env var the container runtime reads the visible GPUs from under the `envvar` strategy (its
    /// value: the GPU UUIDs joined by `,`), or `None` when the device nodes alone make GPUs visible.
    fn visible_devices_env(&self) -> Option<&'static str>;

    /// Container-side root of the `volume-mounts` device list (`/dev/null` mounted at `<root>/<uuid>`, the
    /// visible-devices env set to `<root>`), or `None` when the vendor's runtime has no such convention.
    fn volume_mounts_root(&self) -> Option<&'static str>;

    /// The CDI kind (`vendor/class`) of the GPUs in the node's spec and the qualified device names.
    fn cdi_kind(&self) -> &'static str;

    /// Extra env vars a GPU container gets from the node settings (NVIDIA: GDS, MOFED, GDRCopy).
    fn feature_env(&self, settings: &NodeSettings) -> Vec<(&'static str, String)>;

    /// Whether IMEX channels (`--imex-channel-ids`) apply to this vendor's GPUs.
    fn supports_imex(&self) -> bool;

    /// The fully qualified CDI name `<kind>=<name>`.
    fn cdi_device(&self, name: &str) -> String {
        format!("{}={name}", self.cdi_kind())
    }

    /// File name of the node's CDI spec: the kind with `/` turned into `-`, then `.json`.
    fn cdi_spec_file(&self) -> String {
        format!("{}.json", self.cdi_kind().replace('/', "-"))
    }
}

// === impl NvidiaAdapter ===

/// NVIDIA: `/dev/nvidia<minor>`, the control nodes, `NVIDIA_VISIBLE_DEVICES` and the container-toolkit
/// conventions (contract §5.2). Byte for byte what the device plugin wrote before the seam existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NvidiaAdapter;

impl VendorAdapter for NvidiaAdapter {
    fn vendor(&self) -> Vendor {
        Vendor::Nvidia
    }

    fn gpu_device_nodes(&self, _index: u32, minor: u32) -> Vec<String> {
        vec![format!("/dev/nvidia{minor}")]
    }

    fn control_device_nodes(&self) -> &[&'static str] {
        &NVIDIA_CONTROL_DEVICES
    }

    fn visible_devices_env(&self) -> Option<&'static str> {
        Some(NVIDIA_VISIBLE_DEVICES)
    }

    fn volume_mounts_root(&self) -> Option<&'static str> {
        Some(NVIDIA_VOLUME_MOUNTS_ROOT)
    }

    fn cdi_kind(&self) -> &'static str {
        NVIDIA_CDI_KIND
    }

    fn feature_env(&self, settings: &NodeSettings) -> Vec<(&'static str, String)> {
        [
            (settings.gds_enabled, "NVIDIA_GDS"),
            (settings.mofed_enabled, "NVIDIA_MOFED"),
            (settings.gdrcopy_enabled, "NVIDIA_GDRCOPY"),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, key)| (key, "enabled".to_owned()))
        .collect()
    }

    fn supports_imex(&self) -> bool {
        true
    }
}

// === impl MetaxAdapter ===

/// MetaX: each GPU's DRM nodes (found by its backend in sysfs) and `/dev/mxcd`; no visible-devices env,
/// no `volume-mounts` convention, no IMEX.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaxAdapter {
    nodes: BTreeMap<u32, Vec<String>>,
}

impl MetaxAdapter {
    /// GPU index → its DRM device nodes as container paths (`/dev/dri/card1`, `/dev/dri/renderD129`).
    pub fn new(nodes: BTreeMap<u32, Vec<String>>) -> Self {
        Self { nodes }
    }
}

impl VendorAdapter for MetaxAdapter {
    fn vendor(&self) -> Vendor {
        Vendor::MetaX
    }

    /// The DRM nodes of GPU `index` (none for an unknown index); `minor` is not used.
    fn gpu_device_nodes(&self, index: u32, _minor: u32) -> Vec<String> {
        self.nodes.get(&index).cloned().unwrap_or_default()
    }

    fn control_device_nodes(&self) -> &[&'static str] {
        &[METAX_CONTROL_DEVICE]
    }

    fn visible_devices_env(&self) -> Option<&'static str> {
        None
    }

    fn volume_mounts_root(&self) -> Option<&'static str> {
        None
    }

    fn cdi_kind(&self) -> &'static str {
        METAX_CDI_KIND
    }

    fn feature_env(&self, _settings: &NodeSettings) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    fn supports_imex(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_feature_env_follows_the_settings() {
        let mut settings = NodeSettings::default();
        assert!(NvidiaAdapter.feature_env(&settings).is_empty());
        settings.gds_enabled = true;
        settings.gdrcopy_enabled = true;
        assert_eq!(
            NvidiaAdapter.feature_env(&settings),
            [("NVIDIA_GDS", "enabled".to_owned()), ("NVIDIA_GDRCOPY", "enabled".to_owned())]
        );
        assert!(MetaxAdapter::default().feature_env(&settings).is_empty());
    }

    #[test]
    fn spec_file_names() {
        assert_eq!(NvidiaAdapter.cdi_spec_file(), "k8s.device-plugin.nvidia.com-gpu.json");
        assert_eq!(MetaxAdapter::default().cdi_spec_file(), "k8s.device-plugin.metax-tech.com-gpu.json");
        assert!(MetaxAdapter::default().gpu_device_nodes(7, 7).is_empty());
        assert_eq!(MetaxAdapter::default().vendor(), Vendor::MetaX);
    }
}
