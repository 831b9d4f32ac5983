//! The resolved configuration the plugins run with (built once by the binary from flags, env and the node
//! config file).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use vgpu_core::{abi::vgpu_config::CudaVersion, domain::ResourceDomain, node_config::NodeSettings};
use vgpu_gates::{CoreGate, FeatureGates};

/// Default `HOST_MANAGER_DIR`.
pub const DEFAULT_MANAGER_DIR: &str = "/etc/vgpu-manager";

/// The cgroup bit of `MANAGER_COMPATIBILITY_MODE` (contract §7.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupMode {
    /// Host PID namespace (0).
    Host,
    /// cgroup v1 (1).
    V1,
    /// cgroup v2 (2).
    #[default]
    V2,
}

impl CgroupMode {
    /// The bit value.
    pub fn bits(self) -> i32 {
        match self {
            Self::Host => 0,
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }
}

/// Everything the device plugins need, resolved and validated.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// `--device-plugin-path`: where our sockets and `kubelet.sock` live.
    pub device_plugin_path: PathBuf,
    /// Where this process writes the per-container files (the manager dir as mounted into the plugin).
    pub manager_dir: PathBuf,
    /// `HOST_MANAGER_DIR`: the same directory as seen by the host (mount sources in Allocate).
    pub host_manager_dir: PathBuf,
    /// `--node-name` / `NODE_NAME`.
    pub node_name: String,
    /// `--domain`.
    pub domain: ResourceDomain,
    /// Effective node settings.
    pub settings: NodeSettings,
    /// Core feature gates.
    pub gates: FeatureGates<'static, CoreGate>,
    /// Cgroup bit of `MANAGER_COMPATIBILITY_MODE`.
    pub cgroup_mode: CgroupMode,
    /// Version suffix of `libvgpu-control.so.<version>` on the host.
    pub library_version: String,
    /// CUDA driver API version written to `vgpu.config`.
    pub cuda_version: CudaVersion,
    /// Driver version written to `vgpu.config`.
    pub driver_version: String,
    /// Root under which the optional control device nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
    /// `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`) are looked for; only those present become
    /// `DeviceSpecs` (default `/`).
    pub device_root: PathBuf,
    /// GPU index → minor number of `/dev/nvidia<minor>` (from the backend); a GPU missing here uses its
    /// index.
    pub device_minors: BTreeMap<u32, u32>,
    /// How often `kubelet.sock` and our sockets are checked for re-creation (upstream uses fsnotify).
    pub watch_interval: Duration,
    /// Limit for dialing our own socket and for the `Register` call (upstream 5 s).
    pub dial_timeout: Duration,
    /// A serve loop may crash this many times, each within [`Self::crash_window`] of the previous.
    pub max_crashes: usize,
    /// See [`Self::max_crashes`].
    pub crash_window: Duration,
}

impl PluginConfig {
    /// Defaults for a node: upstream paths, default domain and settings, gates at their defaults.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            device_plugin_path: PathBuf::from(crate::DEFAULT_DEVICE_PLUGIN_PATH),
            manager_dir: PathBuf::from(DEFAULT_MANAGER_DIR),
            host_manager_dir: PathBuf::from(DEFAULT_MANAGER_DIR),
            node_name: node_name.into(),
            domain: ResourceDomain::default(),
            settings: NodeSettings::default(),
            gates: crate::feature_gates().defaults(),
            cgroup_mode: CgroupMode::default(),
            library_version: "v1.0.0".to_owned(),
            cuda_version: CudaVersion::default(),
            driver_version: String::new(),
            device_root: PathBuf::from("/"),
            device_minors: BTreeMap::new(),
            watch_interval: Duration::from_secs(1),
            dial_timeout: Duration::from_secs(5),
            max_crashes: 5,
            crash_window: Duration::from_secs(3600),
        }
    }

    /// `MANAGER_COMPATIBILITY_MODE`: the cgroup bit (or ClientReg 200 in client mode) OR OpenKernel 100.
    pub fn compatibility_mode(&self) -> i32 {
        let base =
            if self.gates.enabled(CoreGate::DevicePluginClientMode) { 200 } else { self.cgroup_mode.bits() };
        if self.settings.open_kernel_modules { base | 100 } else { base }
    }

    /// `<device-plugin-path>/kubelet.sock`.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.device_plugin_path.join(crate::KUBELET_SOCKET)
    }
}
