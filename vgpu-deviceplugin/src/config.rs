//! The resolved configuration the plugins run with (built once by the binary from flags, env and the node
//! config file).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use vgpu_core::{
    abi::vgpu_config::CudaVersion,
    backend::{NvidiaAdapter, VendorAdapter},
    domain::ResourceDomain,
    node_config::{CgroupDriver, ImexSettings, NodeSettings},
};
use vgpu_gates::{CoreGate, FeatureGates};

/// Default `HOST_MANAGER_DIR`.
pub const DEFAULT_MANAGER_DIR: &str = "/etc/vgpu-manager";
/// Default `--cdi-annotation-prefix`.
pub const DEFAULT_CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// The kubelet's device-manager checkpoint, inside the device-plugin directory.
pub const KUBELET_CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// Where the IMEX channel device nodes live (`channel<id>` inside).
pub const IMEX_CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";

/// One MIG instance as the plugins advertise it ([`crate::mig::mig_devices`] finds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// Index of the parent GPU.
    pub parent_index: u32,
    /// The instance's UUID (`MIG-...`), its kubelet device ID.
    pub uuid: String,
    /// Profile name, e.g. `1g.10gb` or `1g.10gb+me`.
    pub profile: String,
    /// GPU instance ID.
    pub gpu_instance_id: u32,
    /// Compute instance ID.
    pub compute_instance_id: u32,
}

/// The device node of IMEX channel `id`: `/dev/nvidia-caps-imex-channels/channel<id>`.
pub fn imex_channel_node(id: u32) -> String {
    format!("{IMEX_CHANNEL_DIR}/channel{id}")
}

/// The IMEX channels containers get (`--imex-channel-ids`, `--imex-required`, node config `imex`), as the
/// upstream NVIDIA device plugin resolves them: each configured channel whose device node
/// ([`imex_channel_node`]) exists under `device_root` (`--container-driver-root`), in the configured
/// order, each once. A missing channel is skipped, unless `required`: then the plugin must not start.
/// IMEX is NVIDIA's: for a vendor whose adapter does not support it, configured channels are an error when
/// required and ignored otherwise (the caller logs the returned note).
pub fn resolve_imex_channels(
    imex: &ImexSettings,
    device_root: &Path,
    vendor: &dyn VendorAdapter,
) -> Result<(Vec<u32>, Vec<String>), String> {
    let mut notes = Vec::new();
    if imex.channel_ids.is_empty() {
        return Ok((Vec::new(), notes));
    }
    if !vendor.supports_imex() {
        let msg = format!(
            "IMEX channels {:?} are configured but IMEX applies only to NVIDIA GPUs, not {}",
            imex.channel_ids,
            vendor.vendor()
        );
        if imex.required {
            return Err(format!("{msg} (imex required)"));
        }
        notes.push(format!("{msg}; ignored"));
        return Ok((Vec::new(), notes));
    }
    let mut channels = Vec::new();
    for &id in &imex.channel_ids {
        if channels.contains(&id) {
            continue;
        }
        let node = imex_channel_node(id);
        let path = device_root.join(node.trim_start_matches('/'));
        if path.exists() {
            channels.push(id);
        } else if imex.required {
            return Err(format!(
                "IMEX channel {id} is required (--imex-required) but its device node {} does not exist",
                path.display()
            ));
        } else {
            notes.push(format!(
                "IMEX channel {id}: {} does not exist; not passed to containers",
                path.display()
            ));
        }
    }
    Ok((channels, notes))
}

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
    /// cgroup v2 when `<cgroup_root>/cgroup.controllers` exists (the unified hierarchy), else v1.
    pub fn detect(cgroup_root: &Path) -> Self {
        if cgroup_root.join("cgroup.controllers").exists() { Self::V2 } else { Self::V1 }
    }

    /// The bit value.
    pub fn bits(self) -> i32 {
        match self {
            Self::Host => 0,
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }
}

/// The cgroup driver of the node: `setting` when it is `cgroupfs` or `systemd`; otherwise (auto) the first
/// of: `cgroupDriver:` in `<kubelet_root>/config.yaml`, `--cgroup-driver=` in
/// `<kubelet_root>/kubeadm-flags.env`, the pod hierarchy under `cgroup_root` (`kubepods.slice` → systemd,
/// `kubepods` → cgroupfs; also under the v1 `memory` controller); systemd (the kubeadm default) when
/// nothing tells.
pub fn resolve_cgroup_driver(setting: CgroupDriver, kubelet_root: &Path, cgroup_root: &Path) -> CgroupDriver {
    if setting != CgroupDriver::Auto {
        return setting;
    }
    let known = |v: &str| match CgroupDriver::parse(v.trim().trim_matches(|c| c == '"' || c == '\'')) {
        CgroupDriver::Auto => None,
        d => Some(d),
    };
    if let Ok(text) = std::fs::read_to_string(kubelet_root.join("config.yaml"))
        && let Some(d) = text.lines().filter_map(|l| l.trim().strip_prefix("cgroupDriver:")).find_map(known)
    {
        return d;
    }
    if let Ok(text) = std::fs::read_to_string(kubelet_root.join("kubeadm-flags.env"))
        && let Some(d) = text
            .split(|c: char| c.is_whitespace() || c == '"' || c == '\'')
            .filter_map(|w| w.strip_prefix("--cgroup-driver="))
            .find_map(known)
    {
        return d;
    }
    for base in [cgroup_root.to_path_buf(), cgroup_root.join("memory")] {
        if base.join("kubepods.slice").is_dir() {
            return CgroupDriver::Systemd;
        }
        if base.join("kubepods").is_dir() {
            return CgroupDriver::Cgroupfs;
        }
    }
    CgroupDriver::Systemd
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
    /// `--container-driver-root` (`DRIVER_ROOT_CTR_PATH`): where the host's driver root is mounted in this
    /// process's file system. The optional control device nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
    /// `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`) are looked for under it; only those present become
    /// `DeviceSpecs` (default `/`, i.e. the plugin sees the host's `/dev`).
    pub device_root: PathBuf,
    /// `--host-driver-root` (`NVIDIA_DRIVER_ROOT`): the driver root on the host; `DeviceSpecs` host paths
    /// are `<host-driver-root>/dev/...` (default `/`).
    pub host_driver_root: PathBuf,
    /// `--cdi-annotation-prefix`: prefix of the `cdi-annotations` keys (default `cdi.k8s.io/`).
    pub cdi_annotation_prefix: String,
    /// `--cdi-root`: where the node's CDI spec is written when a CDI strategy is selected
    /// (default `/var/run/cdi`).
    pub cdi_root: PathBuf,
    /// The kubelet pod-resources socket `PreStartContainer` lists containers on.
    pub pod_resources_socket: PathBuf,
    /// Limit of the pod-resources `List` call (upstream 5 s).
    pub pod_resources_timeout: Duration,
    /// Per-container directories under the manager dir whose pod no longer exists on the node are removed
    /// once they are older than this (upstream's monitor: 2 min).
    pub stale_dir_grace: Duration,
    /// How often the per-container directories of pods that are gone from the node are swept: those last
    /// modified at least [`Self::gone_pod_grace`] before a fresh (consistent) list of the node's pods that
    /// does not hold their pod. The daemon also sweeps once at shutdown, then without the grace (no `Allocate`
    /// can be in flight any more), while it can still list pods. Zero: no periodic sweep (default 15 s).
    pub gone_pod_sweep_interval: Duration,
    /// See [`Self::gone_pod_sweep_interval`] (default 5 s). A directory is written by `Allocate` for a pod the
    /// kubelet admitted, so a list asked for after it was written holds its pod unless the pod is gone; the
    /// grace only covers file-system timestamps that lag the clock.
    pub gone_pod_grace: Duration,
    /// GPU index → minor number of `/dev/nvidia<minor>` (from the backend); a GPU missing here uses its
    /// index.
    pub device_minors: BTreeMap<u32, u32>,
    /// The container edits of the node's GPU vendor (device nodes, visible-devices env, CDI kind), from
    /// the backend's [`vgpu_core::backend::DeviceBackend::vendor_adapter`] (set by
    /// [`crate::daemon::Daemon::new`]; default [`NvidiaAdapter`]).
    pub vendor: Arc<dyn VendorAdapter>,
    /// The IMEX channels every GPU container gets (resolved by [`resolve_imex_channels`] in
    /// [`crate::daemon::Daemon::new`]; empty by default): `NVIDIA_IMEX_CHANNELS` (envvar),
    /// `<volume-mounts root>/imex/<id>` mounts, CDI devices `k8s.device-plugin.nvidia.com/imex-channel=<id>`
    /// and the device nodes `/dev/nvidia-caps-imex-channels/channel<id>`.
    pub imex_channels: Vec<u32>,
    /// The host's `/proc` as this process sees it (client-mode registry: caller PID → cgroup).
    pub proc_root: PathBuf,
    /// The host's cgroup mount (client-mode registry: the caller's `cgroup.procs`; cgroup version).
    pub cgroup_root: PathBuf,
    /// `--registry-socket-group`: the group of the client-mode registry socket (mode 0660); `None` keeps
    /// this process's effective gid. The containers that run `vgpu-device-client` need it as a
    /// supplementary group.
    pub registry_socket_group: Option<u32>,
    /// The MIG instances the MIG plugins serve (from the backend, per `migStrategy`; see
    /// [`crate::mig::mig_devices`]).
    pub mig_devices: Vec<MigDevice>,
    /// `--whole-gpus`: serve whole GPUs as `<domain>/gpu` ([`crate::whole_gpu`]) instead of
    /// `<domain>/vgpu-number` (default false).
    pub whole_gpus: bool,
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
            library_version: vgpu_core::abi::runtime_files::DEFAULT_LIBRARY_VERSION.to_owned(),
            cuda_version: CudaVersion::default(),
            driver_version: String::new(),
            device_root: PathBuf::from("/"),
            host_driver_root: PathBuf::from("/"),
            cdi_annotation_prefix: DEFAULT_CDI_ANNOTATION_PREFIX.to_owned(),
            cdi_root: PathBuf::from("/var/run/cdi"),
            pod_resources_socket: PathBuf::from(vgpu_kubelet::podresources::POD_RESOURCES_SOCKET),
            pod_resources_timeout: Duration::from_secs(5),
            stale_dir_grace: Duration::from_secs(120),
            gone_pod_sweep_interval: Duration::from_secs(15),
            gone_pod_grace: Duration::from_secs(5),
            device_minors: BTreeMap::new(),
            vendor: Arc::new(NvidiaAdapter),
            imex_channels: Vec::new(),
            mig_devices: Vec::new(),
            whole_gpus: false,
            proc_root: PathBuf::from("/proc"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            registry_socket_group: None,
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

    /// The client-mode registry's settings (gate `DevicePluginClientMode`).
    pub fn registry(&self) -> vgpu_node::registry::RegistryConfig {
        vgpu_node::registry::RegistryConfig {
            manager_dir: self.manager_dir.clone(),
            proc_root: self.proc_root.clone(),
            cgroup_root: self.cgroup_root.clone(),
            cgroup_driver: self.settings.cgroup_driver,
            poll_interval: Duration::from_millis(40),
            poll_timeout: Duration::from_secs(60),
            socket_group: self.registry_socket_group,
        }
    }

    /// The container paths of GPU `index`'s device nodes, from [`Self::vendor`] with the GPU's minor
    /// number ([`Self::device_minors`], else the index).
    pub fn gpu_device_nodes(&self, index: u32) -> Vec<String> {
        self.vendor.gpu_device_nodes(index, self.device_minors.get(&index).copied().unwrap_or(index))
    }

    /// The vendor's control device nodes that exist under [`Self::device_root`], in the vendor's order.
    pub fn present_control_nodes(&self) -> Vec<String> {
        self.vendor
            .control_device_nodes()
            .iter()
            .filter(|p| self.device_root.join(p.trim_start_matches('/')).exists())
            .map(|p| (*p).to_owned())
            .collect()
    }

    /// `<device-plugin-path>/kubelet_internal_checkpoint`.
    pub fn kubelet_checkpoint(&self) -> PathBuf {
        self.device_plugin_path.join(KUBELET_CHECKPOINT)
    }

    /// `<device-plugin-path>/kubelet.sock`.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.device_plugin_path.join(crate::KUBELET_SOCKET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imex_channels_resolve_against_the_driver_root() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev/nvidia-caps-imex-channels")).unwrap();
        std::fs::write(root.path().join("dev/nvidia-caps-imex-channels/channel2"), b"").unwrap();
        let imex = |ids: &[u32], required| ImexSettings { channel_ids: ids.to_vec(), required };
        let nvidia = NvidiaAdapter;
        let (channels, notes) =
            resolve_imex_channels(&imex(&[2, 1, 2], false), root.path(), &nvidia).unwrap();
        assert_eq!(channels, [2]);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].starts_with("IMEX channel 1: "), "{notes:?}");
        let err = resolve_imex_channels(&imex(&[2, 1], true), root.path(), &nvidia).unwrap_err();
        assert!(err.starts_with("IMEX channel 1 is required (--imex-required)"), "{err}");
        let metax = vgpu_core::backend::MetaxAdapter::default();
        let (channels, notes) = resolve_imex_channels(&imex(&[2], false), root.path(), &metax).unwrap();
        assert!(channels.is_empty() && notes[0].ends_with("not metax; ignored"), "{notes:?}");
        assert!(resolve_imex_channels(&imex(&[2], true), root.path(), &metax).is_err());
        assert_eq!(imex_channel_node(7), "/dev/nvidia-caps-imex-channels/channel7");
    }

    #[test]
    fn cgroup_mode_and_driver_detection() {
        let root = tempfile::tempdir().unwrap();
        let (kubelet, cgroup) = (root.path().join("kubelet"), root.path().join("cgroup"));
        std::fs::create_dir_all(&kubelet).unwrap();
        std::fs::create_dir_all(&cgroup).unwrap();
        assert_eq!(CgroupMode::detect(&cgroup), CgroupMode::V1);
        std::fs::write(cgroup.join("cgroup.controllers"), "cpu memory").unwrap();
        assert_eq!(CgroupMode::detect(&cgroup), CgroupMode::V2);

        let resolve = |s| resolve_cgroup_driver(s, &kubelet, &cgroup);
        assert_eq!(resolve(CgroupDriver::Cgroupfs), CgroupDriver::Cgroupfs);
        // Nothing to go by: systemd.
        assert_eq!(resolve(CgroupDriver::Auto), CgroupDriver::Systemd);
        // The pod hierarchy (v1 memory controller).
        std::fs::create_dir_all(cgroup.join("memory/kubepods")).unwrap();
        assert_eq!(resolve(CgroupDriver::Auto), CgroupDriver::Cgroupfs);
        // kubeadm flags beat the hierarchy.
        std::fs::write(
            kubelet.join("kubeadm-flags.env"),
            "KUBELET_KUBEADM_ARGS=\"--cgroup-driver=systemd --pod-infra-container-image=x\"\n",
        )
        .unwrap();
        assert_eq!(resolve(CgroupDriver::Auto), CgroupDriver::Systemd);
        // The kubelet config beats everything.
        std::fs::write(kubelet.join("config.yaml"), "kind: KubeletConfiguration\ncgroupDriver: cgroupfs\n")
            .unwrap();
        assert_eq!(resolve(CgroupDriver::Auto), CgroupDriver::Cgroupfs);
    }
}
