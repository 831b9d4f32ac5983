//! vgpu-nvml: the NVIDIA and MetaX device backends of vgpu.
//!
//! Both implement `vgpu-core`'s [`DeviceBackend`](vgpu_core::backend::DeviceBackend), so the device plugin,
//! DRA plugin and monitor never branch on the vendor:
//!
//! | module | what it holds |
//! |---|---|
//! | [`nvml`] | [`NvmlBackend`]: NVML through `nvml-wrapper`, loaded at run time (no driver: a typed error, never a panic); devices, memory, links, Xid/ECC health thread, processes, MIG |
//! | [`metax`] | [`MetaxBackend`]: MetaX GPUs from sysfs, plus `libmxsml.so` when installed |
//! | [`select`] | [`select_backend`] / [`open_backend`] for `--backend auto\|nvml\|metax\|mock` |
//! | [`xid`] | the pure Xid policy (`DP_DISABLE_HEALTHCHECKS`, `DP_ENABLE_HEALTHCHECKS`, application Xids) |
//! | [`topology`] | the pure link rules: PCIe level and NVLink counts to P2P codes, the NVSwitch rule, `topo -m` rendering |
//!
//! `unsafe` is denied in the whole crate except three modules (`tests/unsafe_boundary.rs` enforces it):
//! `metax::ffi`, the calls into `libmxsml.so`, `nvml::mig_ffi`, the NVML MIG calls nvml-wrapper does not wrap,
//! and [`fabric_ffi`], NVIDIA Fabric Manager's `libnvfm.so` (gate `FabricManagerPartitioning` of the DRA plugin).
//!
//! # Example
//!
//! Pick a backend the way `vgpuctl devices --backend ...` does (here the mock, which needs no GPU), and
//! render its links like `nvidia-smi topo -m`:
//!
//! ```
//! use vgpu_nvml::{select::{SelectOptions, open_backend}, topology::render_topo};
//! use vgpu_nvml::{METAX_LIBRARY_DIRS, NVML_LIBRARY};
//!
//! let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mock/dgx-h100-8gpu.yaml");
//! let opened = open_backend("mock".parse()?, &SelectOptions::default().with_mock_config(file))?;
//! let devices = opened.backend.devices()?;
//! assert_eq!(devices.len(), 8);
//! let topo = render_topo(&opened.backend.topology()?);
//! assert!(topo.lines().nth(1).is_some_and(|row| row.starts_with("GPU0") && row.contains("NV18")));
//!
//! // Without a driver, NVML says what to check instead of panicking.
//! let mut options = SelectOptions::default();
//! options.nvml.library_path = Some("/nonexistent/libnvidia-ml.so.1".into());
//! let err = open_backend("nvml".parse()?, &options).unwrap_err();
//! assert!(err.to_string().contains("NVIDIA driver library"));
//!
//! assert_eq!(NVML_LIBRARY, "libnvidia-ml.so.1");
//! assert!(METAX_LIBRARY_DIRS.contains(&"/opt/mxdriver/lib"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod error;
pub mod fabric_ffi;
pub mod metax;
pub mod nvml;
pub mod select;
pub mod topology;
pub mod xid;

pub use error::Error;
pub use metax::{MetaxBackend, MetaxOptions};
pub use nvml::{NvmlBackend, NvmlOptions};
pub use select::{BackendChoice, OpenedBackend, SelectOptions, open_backend, select_backend};

/// The NVML shared library loaded at run time.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";
/// The MetaX management library.
pub const METAX_LIBRARY: &str = "libmxsml.so";
/// Where the MetaX management library is searched, in order.
pub const METAX_LIBRARY_DIRS: &[&str] = &["/opt/mxdriver/lib", "/opt/maca/lib", "/opt/mxn100/lib"];
/// PCI vendor id of NVIDIA.
pub const NVIDIA_PCI_VENDOR: u16 = 0x10de;
/// PCI vendor id of MetaX.
pub const METAX_PCI_VENDOR: u16 = 0x9999;
