//! `vgpu-kubelet-plugin`: the DRA kubelet plugin for vGPU claims (contract §1.5, §9).
//!
//! Thin wiring: parse flags → validate gates (conflicts and gates this build cannot honour exit 2) →
//! validate the flags (exit 2 naming the flag) → open the backend and the Kubernetes client → hand them to
//! [`vgpu_dra::daemon::Daemon`], which installs the claim modes and starts the components in their order
//! (devices, Prepare state with checkpoint recovery, health, slices, client-mode registry, NRI, the
//! registration and DRA sockets, HTTP, gRPC health) → serve until SIGTERM/SIGINT. With `--http-endpoint`, `/healthz`, `/readyz` and the metrics path
//! ([`vgpu_dra::metrics`]: claims, prepare latency, device health, slice publishing); `--enable-rbac` guards
//! the metrics path by TokenReview + SubjectAccessReview (`get` on it; 401/403), probes stay open.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use anyhow::Context;
use clap::Parser;
use vgpu_bins::{DraGateArgs, configure_gates};
use vgpu_dra::{
    claims::KubeClaims,
    config::{
        DEFAULT_CDI_ROOT, DEFAULT_MANAGER_DIR, DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, DriverConfig,
    },
    daemon::{Daemon, DaemonCluster, DaemonConfig, HttpConfig},
    devices::{ConsumableShares, DeviceConfig},
    slices::{SliceConfig, store::KubeSliceStore},
};
use vgpu_gates::{DraGate, FeatureGates};
use vgpu_nvml::select::{BackendChoice, SelectOptions, open_backend};

const BIN: &str = "vgpu-kubelet-plugin";

/// The DRA kubelet plugin for vGPU claims.
#[derive(Debug, Parser)]
#[command(name = "vgpu-kubelet-plugin", version, about)]
struct Cli {
    /// This node's name (the pool of every published device).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The DRA driver name.
    #[arg(long, default_value = vgpu_dra::DRIVER_NAME)]
    driver_name: String,
    /// Where the per-claim CDI specs are written.
    #[arg(long, env = "CDI_ROOT", default_value = DEFAULT_CDI_ROOT)]
    cdi_root: PathBuf,
    /// The driver root on the host (host side of the device nodes); `HOST_DRIVER_ROOT` is read when
    /// `NVIDIA_DRIVER_ROOT` is not set.
    #[arg(long = "nvidia-driver-root", visible_aliases = ["host-driver-root", "host_driver-root"], env = "NVIDIA_DRIVER_ROOT")]
    nvidia_driver_root: Option<PathBuf>,
    /// Where the host's driver root is mounted in this container (control device nodes are looked for there).
    #[arg(long, env = "DRIVER_ROOT_CTR_PATH", default_value = "/driver-root")]
    container_driver_root: PathBuf,
    /// The host's root file system in this container: PassthroughSupport loads vfio-pci chroot'ed into it and
    /// reads its /proc, /dev/iommu and /sys/module; FabricManagerPartitioning looks for NVSwitches under it.
    #[arg(long, env = "HOST_ROOT", default_value = "/host-root")]
    host_root: PathBuf,
    /// Path of nvidia-cdi-hook (CDI hooks are not written by this build: accepted for chart compatibility).
    #[arg(long, env = "NVIDIA_CDI_HOOK_PATH", default_value = "")]
    nvidia_cdi_hook_path: String,
    /// The kubelet's plugin-registration directory.
    #[arg(long, env = "KUBELET_REGISTRAR_DIRECTORY_PATH", default_value = DEFAULT_REGISTRY_DIR)]
    kubelet_registrar_directory_path: PathBuf,
    /// The kubelet's plugins directory (the plugin's socket, checkpoint and lock go to `<dir>/<driver>/`).
    #[arg(long, env = "KUBELET_PLUGINS_DIRECTORY_PATH", default_value = DEFAULT_PLUGINS_DIR)]
    kubelet_plugins_directory_path: PathBuf,
    /// Port of the gRPC health service (-1 = off, 0 = any free port).
    #[arg(long, env = "HEALTHCHECK_PORT", default_value_t = -1, allow_negative_numbers = true)]
    healthcheck_port: i64,
    /// Xids treated as application errors (taint effect None), comma separated, in addition to 13, 31, 43,
    /// 45, 68, 109.
    #[arg(long, env = "ADDITIONAL_XIDS_TO_IGNORE", default_value = "")]
    additional_xids_to_ignore: String,
    /// Address of the metrics HTTP server ("" = none).
    #[arg(long, env = "HTTP_ENDPOINT", default_value = "")]
    http_endpoint: String,
    /// Path of the metrics endpoint.
    #[arg(long, env = "METRICS_PATH", default_value = "/metrics")]
    metrics_path: String,
    /// Authorize the metrics path by bearer token: the API server must authenticate the token
    /// (TokenReview) and allow its user `get` on the non-resource URL <--metrics-path> (SubjectAccessReview);
    /// 401/403 otherwise. /healthz and /readyz stay open. Decisions are cached 10s (allowed) / 2s (refused).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    enable_rbac: bool,
    /// Consumable shares of whole GPUs (needs gate ConsumableShares): disabled, memory, unlimited or a
    /// positive integer.
    #[arg(long, env = "CONSUMABLE_SHARES", default_value = "disabled")]
    consumable_shares: String,
    /// The manager directory on the host (CDI mount sources).
    #[arg(long, env = "HOST_MANAGER_DIR", default_value = DEFAULT_MANAGER_DIR)]
    host_manager_dir: PathBuf,
    /// The version suffix of the control library the vGPU claims' CDI specs mount:
    /// `<manager-dir>/libvgpu-control.so.<version>`.
    #[arg(long, env = "LIBRARY_VERSION", default_value = vgpu_core::abi::runtime_files::DEFAULT_LIBRARY_VERSION, value_parser = vgpu_core::abi::runtime_files::parse_library_version)]
    library_version: String,
    /// Where this process sees the manager directory (claim directories are created there, the runtime files
    /// checked there). Default: the host manager directory when this process sees a directory at that path
    /// (run on the host, or our charts, which mount it at its host path), else `/etc/vgpu-manager` when that is
    /// a directory (where vgpu-manager's chart mounts it, whatever its `managerRoot`), else the host manager
    /// directory (created as needed).
    #[arg(long)]
    manager_dir: Option<PathBuf>,
    /// The node's cgroup driver (cgroupfs or systemd; empty detects it).
    #[arg(long, env = "CGROUP_DRIVER", default_value = "")]
    cgroup_driver: String,
    /// Where the host's cgroup hierarchy is mounted (cgroup version → MANAGER_COMPATIBILITY_MODE;
    /// client-mode registry: a caller's `cgroup.procs`).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    host_cgroup_root: PathBuf,
    /// Where the host's `/proc` is mounted in this container (client-mode registry, gate
    /// DevicePluginClientMode: a caller's PID → its cgroup).
    #[arg(long, default_value = "/proc")]
    host_proc_root: PathBuf,
    /// Group of the client-mode registry socket (`<manager-dir>/registry/socket.sock`, mode 0660): a numeric
    /// gid, or a group name of this image's `/etc/group`; default: this process's gid.
    #[arg(long, value_name = "NAME|GID", value_parser = parse_socket_group)]
    registry_socket_group: Option<u32>,
    /// The `cores` capacity of each vGPU device.
    #[arg(long, env = "DEVICE_CORES_RATIO", default_value_t = 100, allow_negative_numbers = true)]
    device_cores_ratio: i64,
    /// Percent of each GPU's memory offered as the `memory` capacity (> 100 oversells).
    #[arg(long, env = "DEVICE_MEMORY_RATIO", default_value_t = 100, allow_negative_numbers = true)]
    device_memory_ratio: i64,
    /// NRI socket directory: with NRISupport the plugin dials `<dir>/nri.sock`.
    #[arg(long, env = "NRI_ROOT", default_value = "/var/run/nri")]
    nri_root: PathBuf,
    /// NRI plugin index, two digits (NRISupport).
    #[arg(long, env = "NRI_PLUGIN_IDX", default_value = "00")]
    nri_plugin_idx: String,
    /// How often prepared claims are compared with the API (claims gone from it are unprepared).
    #[arg(long, default_value = "10m", value_parser = vgpu_bins::parse_go_duration)]
    stale_claim_sweep_interval: Duration,
    /// Write the driver version and the `HardwareHealthy` condition of this node's PhysicalGPUs (GPU module;
    /// nothing is written while the cluster has no PhysicalGPU resource).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    physical_gpu_status: bool,
    /// How often this node's PhysicalGPUs are listed again for `--physical-gpu-status` (besides every health
    /// change).
    #[arg(long, default_value = "30s", value_parser = vgpu_bins::parse_go_duration)]
    physical_gpu_resync_interval: Duration,
    /// Gate PassthroughSupport (GPU module): namespace of the `vfio-switch-<node>-<pci>` Jobs that move this
    /// node's NVIDIA GPUs between nvidia and vfio-pci as their PhysicalGPU asks (spec.passthrough, else the
    /// GPUClass policy in status.classPassthrough).
    #[arg(long, env = "VFIO_SWITCH_NAMESPACE", default_value = "")]
    vfio_switch_namespace: String,
    /// Gate PassthroughSupport: the image of those Jobs (it holds /usr/bin/vgpu-node-agent); empty: no Jobs,
    /// no passthrough wish is acted on.
    #[arg(long, env = "VFIO_SWITCH_IMAGE", default_value = "")]
    vfio_switch_image: String,
    /// The host's sysfs, mounted into the vfio-switch Jobs.
    #[arg(long, default_value = "/sys")]
    vfio_switch_host_sysfs: PathBuf,
    #[command(flatten)]
    kube: vgpu_bins::KubeClientArgs,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
    #[command(flatten)]
    pprof: vgpu_bins::PprofArgs,
    /// Device backend: auto, nvml, metax or mock. Also env `VGPU_BACKEND`: a chart whose command line is
    /// fixed (vgpu-manager's own) selects the backend through its containers' extra env.
    #[arg(long, env = "VGPU_BACKEND", default_value = "auto")]
    backend: BackendChoice,
    /// The mock backend's description file (`--backend mock`); also env `VGPU_MOCK_CONFIG`.
    #[arg(long, env = "VGPU_MOCK_CONFIG", value_name = "FILE")]
    mock_config: Option<PathBuf>,
    #[command(flatten)]
    gates: DraGateArgs,
}

/// `--registry-socket-group`: a gid, or a name of this image's `/etc/group`.
fn parse_socket_group(value: &str) -> Result<u32, String> {
    vgpu_node::registry::resolve_socket_group(value, std::path::Path::new("/etc/group"))
        .map_err(|e| e.to_string())
}

/// A bad flag value: the message names the flag; exit 2.
fn bad(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("{BIN}: {message}");
    ExitCode::from(2)
}

/// `--device-cores-ratio` / `--device-memory-ratio`: each message names its own flag and value (upstream
/// printed the cores value for the memory ratio).
fn ratio(flag: &str, value: i64) -> Result<u32, String> {
    if value < 0 {
        return Err(format!("invalid --{flag} {value}: must be greater than or equal to 0"));
    }
    u32::try_from(value).map_err(|_| format!("invalid --{flag} {value}: must be at most {}", u32::MAX))
}

/// `--consumable-shares`, which needs gate ConsumableShares unless it is `disabled`.
fn consumable_shares(
    value: &str,
    gates: &FeatureGates<'static, DraGate>,
) -> Result<ConsumableShares, String> {
    let shares: ConsumableShares =
        value.parse().map_err(|e: vgpu_dra::devices::DeviceError| e.to_string())?;
    if shares.is_enabled() && !gates.enabled(DraGate::ConsumableShares) {
        return Err("--consumable-shares requires feature gate ConsumableShares to be enabled".to_owned());
    }
    Ok(shares)
}

/// Everything the flags say, validated.
#[derive(Debug)]
struct Resolved {
    config: DriverConfig,
    devices: DeviceConfig,
    xids: Vec<u64>,
    /// `--healthcheck-port` unless -1.
    healthcheck: Option<std::net::SocketAddr>,
    /// `--http-endpoint` unless empty.
    http_endpoint: Option<std::net::SocketAddr>,
    /// The vfio-switch Jobs (gate PassthroughSupport with `--vfio-switch-image`).
    vfio_switch: Option<vgpu_dra::vfio_switch::controller::SwitchConfig>,
}

/// `--manager-dir`'s default (its doc): `host` when this process sees a directory there, else
/// [`DEFAULT_MANAGER_DIR`] when that is a directory (the container path vgpu-manager's chart mounts the host
/// manager directory on), else `host` (created as needed).
fn default_manager_dir(host: &Path) -> PathBuf {
    default_manager_dir_in(host, Path::new(DEFAULT_MANAGER_DIR))
}

fn default_manager_dir_in(host: &Path, chart_mount: &Path) -> PathBuf {
    if !host.is_dir() && chart_mount.is_dir() { chart_mount.to_owned() } else { host.to_owned() }
}

fn resolve(cli: &Cli, gates: FeatureGates<'static, DraGate>) -> Result<Resolved, String> {
    let node = cli
        .node_name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| "--node-name (or NODE_NAME) is required".to_owned())?;
    if cli.host_manager_dir.as_os_str().is_empty() {
        return Err("--host-manager-dir (or HOST_MANAGER_DIR) is required".to_owned());
    }
    if cli.driver_name.is_empty() || !cli.driver_name.contains('.') {
        return Err(format!(
            "invalid --driver-name {:?}: expected a DNS subdomain such as manager.nvidia.com",
            cli.driver_name
        ));
    }
    let cores_ratio = ratio("device-cores-ratio", cli.device_cores_ratio)?;
    let memory_ratio = ratio("device-memory-ratio", cli.device_memory_ratio)?;
    let shares = consumable_shares(&cli.consumable_shares, &gates)?;
    if gates.enabled(DraGate::NRISupport)
        && !(cli.nri_plugin_idx.len() == 2 && cli.nri_plugin_idx.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("invalid --nri-plugin-idx {:?}: must be two digits", cli.nri_plugin_idx));
    }
    if gates.enabled(DraGate::PassthroughSupport) {
        if cli.host_root.as_os_str().is_empty() {
            return Err(
                "host root is required when PassthroughSupport feature gate is enabled (--host-root)"
                    .to_owned(),
            );
        }
        if !cli.host_root.is_dir() {
            return Err(format!(
                "host root is not mounted at {:?} (--host-root)",
                cli.host_root.display().to_string()
            ));
        }
    }
    let vfio_switch = vfio_switch_config(cli, &node, &gates)?;
    let http_endpoint = vgpu_dra::endpoint::parse_http_endpoint(&cli.http_endpoint)?;
    vgpu_serve::probes::check_metrics_path(&cli.metrics_path).map_err(|e| e.to_string())?;
    if cli.stale_claim_sweep_interval.is_zero() {
        return Err("invalid --stale-claim-sweep-interval 0s: must be greater than 0".to_owned());
    }
    if cli.physical_gpu_resync_interval.is_zero() {
        return Err("invalid --physical-gpu-resync-interval 0s: must be greater than 0".to_owned());
    }
    let healthcheck = match cli.healthcheck_port {
        -1 => None,
        port => Some(u16::try_from(port).map(|p| std::net::SocketAddr::from(([0, 0, 0, 0], p))).map_err(|_| {
            format!("invalid --healthcheck-port {port}: expected -1 (off), 0 (any free port) or a port up to 65535")
        })?),
    };
    let xids = vgpu_dra::health::parse_xid_list(&cli.additional_xids_to_ignore).map_err(|e| e.to_string())?;
    let host_driver_root = cli
        .nvidia_driver_root
        .clone()
        .or_else(|| std::env::var_os("HOST_DRIVER_ROOT").filter(|v| !v.is_empty()).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/"));

    let mut config = DriverConfig::new(node);
    config.driver_name.clone_from(&cli.driver_name);
    config.registry_dir.clone_from(&cli.kubelet_registrar_directory_path);
    config.plugins_dir.clone_from(&cli.kubelet_plugins_directory_path);
    config.cdi_root.clone_from(&cli.cdi_root);
    config.host_manager_dir.clone_from(&cli.host_manager_dir);
    config.library_version.clone_from(&cli.library_version);
    config.manager_dir =
        cli.manager_dir.clone().unwrap_or_else(|| default_manager_dir(&cli.host_manager_dir));
    config.host_driver_root = host_driver_root;
    config.container_driver_root.clone_from(&cli.container_driver_root);
    config.cores_ratio = cores_ratio;
    config.memory_ratio = memory_ratio;
    config.compatibility_mode = vgpu_deviceplugin::config::CgroupMode::detect(&cli.host_cgroup_root).bits();
    config.stale_sweep_interval = cli.stale_claim_sweep_interval;
    let devices = DeviceConfig {
        cores_ratio,
        memory_ratio,
        vgpu_support: gates.enabled(DraGate::VGPUSupport),
        consumable_shares: shares,
    };
    config.gates = gates;
    Ok(Resolved { config, devices, xids, healthcheck, http_endpoint, vfio_switch })
}

/// `--vfio-switch-*`: the switch controller's configuration, `None` when it does not run (no image).
fn vfio_switch_config(
    cli: &Cli,
    node: &str,
    gates: &FeatureGates<'static, DraGate>,
) -> Result<Option<vgpu_dra::vfio_switch::controller::SwitchConfig>, String> {
    let image = cli.vfio_switch_image.trim();
    if image.is_empty() {
        return Ok(None);
    }
    if !gates.enabled(DraGate::PassthroughSupport) {
        return Err("--vfio-switch-image requires feature gate PassthroughSupport to be enabled".to_owned());
    }
    let namespace = cli.vfio_switch_namespace.trim();
    if namespace.is_empty() {
        return Err(
            "--vfio-switch-namespace (or VFIO_SWITCH_NAMESPACE) is required with --vfio-switch-image"
                .to_owned(),
        );
    }
    let mut config = vgpu_dra::vfio_switch::controller::SwitchConfig::new(node, namespace, image);
    config.host_sys.clone_from(&cli.vfio_switch_host_sysfs);
    config.validate().map_err(|e| format!("--vfio-switch-*: {e}"))?;
    Ok(Some(config))
}

async fn run(cli: Cli, resolved: Resolved) -> anyhow::Result<()> {
    let Resolved { config, devices, xids, healthcheck, http_endpoint, vfio_switch } = resolved;
    let mut options = SelectOptions::default();
    options.mock_config.clone_from(&cli.mock_config);
    // TimeSlicingSettings sets the time slice through nvidia-smi: the driver root's, when it is mounted.
    let smi = cli.container_driver_root.join("usr/bin/nvidia-smi");
    if smi.exists() {
        options.nvml.nvidia_smi = smi;
    }
    let opened = open_backend(cli.backend, &options).context("opening the device backend")?;
    for w in &opened.warnings {
        tracing::warn!("{w}");
    }
    let backend: Arc<dyn vgpu_core::backend::DeviceBackend> = Arc::from(opened.backend);
    let nri = if config.nri() {
        let index: vgpu_dra::nri::PluginIndex = cli
            .nri_plugin_idx
            .parse()
            .map_err(|e| anyhow::anyhow!("invalid --nri-plugin-idx {:?}: {e}", cli.nri_plugin_idx))?;
        Some(vgpu_dra::nri::NriConfig { root: cli.nri_root.clone(), index })
    } else {
        None
    };
    let registry = config.client_mode().then(|| {
        let setting = vgpu_core::node_config::CgroupDriver::parse(&cli.cgroup_driver);
        vgpu_node::registry::RegistryConfig {
            manager_dir: config.manager_dir.clone(),
            proc_root: cli.host_proc_root.clone(),
            cgroup_root: cli.host_cgroup_root.clone(),
            cgroup_driver: vgpu_deviceplugin::config::resolve_cgroup_driver(
                setting,
                std::path::Path::new("/var/lib/kubelet"),
                &cli.host_cgroup_root,
            ),
            poll_interval: Duration::from_millis(40),
            poll_timeout: Duration::from_secs(60),
            socket_group: cli.registry_socket_group,
        }
    });
    let daemon_config = DaemonConfig {
        driver: config,
        devices,
        xids,
        host_root: cli.host_root.clone(),
        http: http_endpoint.map(|addr| HttpConfig { addr, metrics_path: cli.metrics_path.clone() }),
        healthcheck,
        nri,
        registry,
        physical_gpu_resync: cli.physical_gpu_status.then_some(cli.physical_gpu_resync_interval),
        vfio_switch,
    };
    let mut daemon = Daemon::new(daemon_config, backend)?;
    let driver_root = cli.container_driver_root.clone();
    daemon = daemon.with_fabric_manager(Box::new(move || open_fabric_manager(&driver_root)));
    // Test only (VGPU_DRA_TEST_PAUSE_AT): hang at a fault point so a test can SIGKILL the process there.
    if let Some(hook) = vgpu_dra::state::fault::test_pause_hook_from_env().map_err(anyhow::Error::msg)? {
        daemon = daemon.with_fault_hook(hook);
    }
    if !cli.nvidia_cdi_hook_path.is_empty() {
        tracing::info!(path = %cli.nvidia_cdi_hook_path, "--nvidia-cdi-hook-path: this build writes no CDI hooks");
    }
    let client = cli.kube.client(vgpu_bins::KUBELET_PLUGIN_RATE).await?;
    let authorizer = cli.enable_rbac.then(|| Arc::new(vgpu_serve::authz::Authorizer::kube(client.clone())));
    if cli.enable_rbac && http_endpoint.is_none() {
        tracing::warn!("--enable-rbac has no effect without --http-endpoint");
    }
    let node_name = daemon.config().driver.node_name.clone();
    let driver_name = daemon.config().driver.driver_name.clone();
    // ResourceSlices of this node's pool, owned by the Node when it can be read.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let slice_owner = match nodes.get_opt(&node_name).await {
        Ok(Some(node)) => node.metadata.uid.map(|uid| SliceConfig::node_owner(&node_name, &uid)),
        Ok(None) => {
            tracing::warn!(node = %node_name, "node not found; ResourceSlices get no owner");
            None
        }
        Err(error) => {
            tracing::warn!(node = %node_name, %error, "cannot read the node; ResourceSlices get no owner");
            None
        }
    };
    let cluster = DaemonCluster {
        claims: Arc::new(KubeClaims::new(client.clone())),
        slices: KubeSliceStore::new(client.clone(), &node_name, &driver_name),
        slice_owner,
        physical_gpus: Some(Arc::new(vgpu_dra::physical_gpu::KubePhysicalGpus::new(client.clone()))),
        switch_cluster: Some(Arc::new(vgpu_dra::vfio_switch::controller::KubeSwitchCluster::new(client))),
        authorizer,
    };
    let running = daemon.start(cluster).await?;
    if let Some(driver) = running.driver() {
        tracing::info!(
            registration = %driver.registration_socket.display(),
            endpoint = %driver.dra_socket.display(),
            "serving"
        );
    }
    running.run_until(vgpu_bins::shutdown_signal()?).await?;
    Ok(())
}

/// Gate FabricManagerPartitioning: `vgpu_nvml`'s Fabric Manager client (libnvfm ships with the driver: the
/// mounted driver root is looked in first, then the loader's path).
fn open_fabric_manager(
    driver_root: &Path,
) -> Result<Arc<dyn vgpu_dra::fabric::FabricManager>, Box<dyn std::error::Error + Send + Sync>> {
    let target = match vgpu_dra::fabric::FmAddress::from_env(|k| std::env::var(k).ok()) {
        vgpu_dra::fabric::FmAddress::Tcp(host) => vgpu_nvml::fabric_ffi::FmTarget::Tcp(host),
        vgpu_dra::fabric::FmAddress::Unix(path) => vgpu_nvml::fabric_ffi::FmTarget::Unix(path),
    };
    let library = driver_root.join("usr/lib/x86_64-linux-gnu/libnvfm.so.1");
    let library = library.exists().then_some(library);
    let client = vgpu_nvml::fabric_ffi::NvFm::open(library.as_deref(), target, 5000)?;
    Ok(Arc::new(NvFmClient(client)))
}

/// Gates `LoggingBetaOptions` / `LoggingAlphaOptions`: the logging options used must be permitted, checked
/// before logging starts (as upstream's `logsapi.ValidateAndApply`). A bad gate value is left to
/// `configure_gates`, which reports it once logging runs.
fn logging_permitted(cli: &Cli) -> Result<(), String> {
    let Ok(gates) = vgpu_gates::kubelet_plugin().configure(&cli.gates.feature_gates) else {
        return Ok(());
    };
    let format = clap::ValueEnum::to_possible_value(&cli.log.logging_format)
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    // This build has no alpha logging options (see vgpu_dra::gates).
    vgpu_dra::gates::check_logging(&gates, &format, &[])
}

fn main() -> ExitCode {
    // vgpu-manager's kubelet plugin also reads its logging flags from the environment (its chart sets env, not
    // flags): `V`, `VMODULE`, `LOGGING_FORMAT`.
    let command = <Cli as clap::CommandFactory>::command()
        .mut_arg("verbosity", |arg| arg.env("V"))
        .mut_arg("vmodule", |arg| arg.env("VMODULE"))
        .mut_arg("logging_format", |arg| arg.env("LOGGING_FORMAT"));
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if let Err(e) = logging_permitted(&cli) {
        return bad(e);
    }
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-kubelet-plugin: {e}");
        return ExitCode::from(2);
    }
    let gates = match configure_gates(vgpu_gates::kubelet_plugin(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    // A gate whose behaviour is not built is refused, never accepted and ignored.
    if let Err(e) = vgpu_dra::gates::check_gates(&gates) {
        return bad(e);
    }
    // IMEXDaemonsWithDNSNames on by default only (an explicit true was refused just above): inert, said once.
    for inert in vgpu_dra::gates::inert_defaults(&gates) {
        tracing::info!(
            gate = %inert.gate,
            "gate {}=true (the default) does nothing in this build: {}",
            inert.gate,
            inert.reason
        );
    }
    let resolved = match resolve(&cli, gates) {
        Ok(r) => r,
        Err(e) => return bad(e),
    };
    vgpu_bins::run_async(BIN, &cli.pprof.clone(), run(cli, resolved))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::Path;

    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once(BIN).chain(args.iter().copied())).unwrap()
    }

    fn defaults() -> FeatureGates<'static, DraGate> {
        vgpu_gates::kubelet_plugin().defaults()
    }

    #[test]
    fn ratio_messages_name_their_own_flag_and_value() {
        let cli = parse(&["--node-name=n", "--device-cores-ratio=50", "--device-memory-ratio=-7"]);
        assert_eq!(
            resolve(&cli, defaults()).unwrap_err(),
            "invalid --device-memory-ratio -7: must be greater than or equal to 0"
        );
        let cli = parse(&["--node-name=n", "--device-cores-ratio=-3"]);
        assert_eq!(
            resolve(&cli, defaults()).unwrap_err(),
            "invalid --device-cores-ratio -3: must be greater than or equal to 0"
        );
        let r = resolve(
            &parse(&["--node-name=n", "--device-cores-ratio=200", "--device-memory-ratio=150"]),
            defaults(),
        )
        .unwrap();
        assert_eq!((r.config.cores_ratio, r.config.memory_ratio), (200, 150));
        assert_eq!((r.devices.cores_ratio, r.devices.memory_ratio), (200, 150));
        assert!(r.config.memory_oversold());
    }

    #[test]
    fn consumable_shares_matrix() {
        let err = |v: &str| {
            resolve(&parse(&["--node-name=n", &format!("--consumable-shares={v}")]), defaults()).unwrap_err()
        };
        assert_eq!(err("memory"), "--consumable-shares requires feature gate ConsumableShares to be enabled");
        assert_eq!(err("4"), "--consumable-shares requires feature gate ConsumableShares to be enabled");
        assert!(err("lots").contains("invalid value for --consumable-shares: \"lots\" (must be 'disabled', 'memory', 'unlimited', or a positive integer)"));
        assert!(err("0").contains("invalid value for --consumable-shares: \"0\""));
        let ok = resolve(&parse(&["--node-name=n", "--consumable-shares=disabled"]), defaults()).unwrap();
        assert_eq!(ok.devices.consumable_shares, ConsumableShares::Disabled);
        let mut gates = vgpu_gates::kubelet_plugin().defaults();
        gates.set_gate(DraGate::VGPUSupport, false).unwrap();
        gates.set_gate(DraGate::ConsumableShares, true).unwrap();
        let r = resolve(&parse(&["--node-name=n", "--consumable-shares=unlimited"]), gates).unwrap();
        assert_eq!(r.devices.consumable_shares, ConsumableShares::Unlimited);
        assert!(!r.devices.vgpu_support);
    }

    /// Without `--manager-dir`: the host path where this process sees it, else vgpu-manager's container path
    /// where that is mounted, else the host path.
    #[test]
    fn manager_dir_defaults_to_the_host_path_when_visible_else_the_charts_mount_point() {
        let dir = tempfile::tempdir().unwrap();
        let (host, mount) = (dir.path().join("host"), dir.path().join("etc-vgpu-manager"));
        // Neither there: the host path, to be created.
        assert_eq!(default_manager_dir_in(&host, &mount), host);
        // vgpu-manager's chart: the host path is not seen in the container, its mount point is.
        std::fs::create_dir(&mount).unwrap();
        assert_eq!(default_manager_dir_in(&host, &mount), mount);
        // Ours (mounted at the host path), or on the host: the host path.
        std::fs::create_dir(&host).unwrap();
        assert_eq!(default_manager_dir_in(&host, &mount), host);
        let visible = format!("--host-manager-dir={}", host.display());
        assert_eq!(
            resolve(&parse(&["--node-name=n1", &visible]), defaults()).unwrap().config.manager_dir,
            host
        );
        let given = parse(&["--node-name=n1", &visible, "--manager-dir=/m"]);
        assert_eq!(resolve(&given, defaults()).unwrap().config.manager_dir, Path::new("/m"));
    }

    #[test]
    fn flags_reach_the_configuration() {
        let cli = parse(&[
            "--node-name=n1",
            "--cdi-root=/var/run/cdi",
            "--host-driver-root=/run/nvidia/driver",
            "--container-driver-root=/drv",
            "--kubelet-registrar-directory-path=/r",
            "--kubelet-plugins-directory-path=/p",
            "--host-manager-dir=/var/lib/vgpu",
            "--additional-xids-to-ignore=48, 79",
            "--stale-claim-sweep-interval=30s",
        ]);
        let r = resolve(&cli, defaults()).unwrap();
        let c = &r.config;
        assert_eq!(c.node_name, "n1");
        assert_eq!(c.cdi_root, Path::new("/var/run/cdi"));
        assert_eq!(c.host_driver_root, Path::new("/run/nvidia/driver"));
        assert_eq!(c.container_driver_root, Path::new("/drv"));
        assert_eq!(c.registration_socket(), Path::new("/r/manager.nvidia.com-reg.sock"));
        assert_eq!(c.dra_socket(), Path::new("/p/manager.nvidia.com/dra.sock"));
        assert_eq!(c.host_manager_dir, Path::new("/var/lib/vgpu"));
        assert_eq!(c.manager_dir, default_manager_dir(Path::new("/var/lib/vgpu")));
        assert_eq!(r.xids, [48, 79]);
        assert_eq!(c.stale_sweep_interval, Duration::from_secs(30));
        assert!(r.devices.vgpu_support);
        let alias = parse(&["--node-name=n1", "--host_driver-root=/x"]);
        assert_eq!(alias.nvidia_driver_root.as_deref(), Some(Path::new("/x")));
    }

    /// `--enable-rbac` takes Go's bool forms (as the charts render it), off by default.
    #[test]
    fn enable_rbac_flag_forms() {
        assert!(!parse(&["--node-name=n"]).enable_rbac);
        assert!(parse(&["--node-name=n", "--enable-rbac"]).enable_rbac);
        assert!(parse(&["--node-name=n", "--enable-rbac=true"]).enable_rbac);
        assert!(!parse(&["--node-name=n", "--enable-rbac=false"]).enable_rbac);
        assert!(parse(&["--node-name=n", "--enable-rbac=1"]).enable_rbac);
        let bad = Cli::try_parse_from([BIN, "--node-name=n", "--enable-rbac=maybe"]).unwrap_err().to_string();
        assert!(bad.contains("--enable-rbac"), "{bad}");
    }

    #[test]
    fn vfio_switch_flags() {
        let passthrough = || {
            vgpu_gates::kubelet_plugin()
                .configure(["PassthroughSupport=true,VGPUSupport=false,NVMLDeviceHealthCheck=false"])
                .unwrap()
        };
        let cli = parse(&["--node-name=n", "--host-root=/", "--vfio-switch-image=img:1"]);
        assert_eq!(
            resolve(&cli, defaults()).unwrap_err(),
            "--vfio-switch-image requires feature gate PassthroughSupport to be enabled"
        );
        assert!(resolve(&cli, passthrough()).unwrap_err().starts_with("--vfio-switch-namespace"));
        let cli = parse(&[
            "--node-name=n",
            "--host-root=/",
            "--vfio-switch-image=img:1",
            "--vfio-switch-namespace=d8-gpu",
            "--vfio-switch-host-sysfs=/host/sys",
        ]);
        let switch = resolve(&cli, passthrough()).unwrap().vfio_switch.unwrap();
        assert_eq!(
            (switch.node_name.as_str(), switch.namespace.as_str(), switch.image.as_str()),
            ("n", "d8-gpu", "img:1")
        );
        assert_eq!(switch.host_sys, Path::new("/host/sys"));
        assert!(switch.recheck <= Duration::from_secs(5) && switch.resync <= Duration::from_secs(60));
        let off = parse(&["--node-name=n", "--host-root=/", "--vfio-switch-namespace=d8-gpu"]);
        assert!(resolve(&off, passthrough()).unwrap().vfio_switch.is_none(), "no image: no controller");
    }

    #[test]
    fn bad_flags_are_named() {
        let err = |args: &[&str]| resolve(&parse(args), defaults()).unwrap_err();
        assert_eq!(err(&[]), "--node-name (or NODE_NAME) is required");
        assert!(
            err(&["--node-name=n", "--additional-xids-to-ignore=48,x"])
                .contains("invalid --additional-xids-to-ignore")
        );
        assert!(
            err(&["--node-name=n", "--http-endpoint=8080"]).starts_with("invalid --http-endpoint \"8080\"")
        );
        assert!(err(&["--node-name=n", "--metrics-path=/readyz"]).contains("must differ from /healthz"));
        let r = resolve(&parse(&["--node-name=n", "--http-endpoint=:8080"]), defaults()).unwrap();
        assert_eq!(r.http_endpoint, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(resolve(&parse(&["--node-name=n"]), defaults()).unwrap().http_endpoint, None);
        assert!(err(&["--node-name=n", "--metrics-path=metrics"]).contains("--metrics-path"));
        assert!(err(&["--node-name=n", "--driver-name=nodots"]).contains("--driver-name"));
        assert!(
            err(&["--node-name=n", "--stale-claim-sweep-interval=0s"])
                .contains("--stale-claim-sweep-interval")
        );
        assert!(
            err(&["--node-name=n", "--physical-gpu-resync-interval=0s"])
                .contains("--physical-gpu-resync-interval")
        );
        assert!(parse(&["--node-name=n"]).physical_gpu_status, "on by default");
        assert!(!parse(&["--node-name=n", "--physical-gpu-status=false"]).physical_gpu_status);
        assert!(Cli::try_parse_from([BIN, "--physical-gpu-status=maybe"]).is_err());
    }
}

/// `vgpu_nvml`'s Fabric Manager client as the DRA plugin's [`vgpu_dra::fabric::FabricManager`].
#[derive(Debug)]
struct NvFmClient(vgpu_nvml::fabric_ffi::NvFm);

impl vgpu_dra::fabric::FabricManager for NvFmClient {
    fn partitions(&self) -> Result<Vec<vgpu_dra::fabric::Partition>, vgpu_dra::fabric::FabricError> {
        let partitions = self.0.partitions().map_err(|e| vgpu_dra::fabric::FabricError::Fm {
            op: "fmGetSupportedFabricPartitions".to_owned(),
            message: e.to_string(),
        })?;
        Ok(partitions
            .into_iter()
            .map(|p| vgpu_dra::fabric::Partition {
                id: p.id,
                active: p.active,
                gpus: p
                    .gpus
                    .into_iter()
                    .map(|g| vgpu_dra::fabric::PartitionGpu {
                        physical_id: g.physical_id,
                        uuid: g.uuid,
                        pci_bus_id: g.pci_bus_id,
                    })
                    .collect(),
            })
            .collect())
    }

    fn activate(&self, id: u32) -> Result<(), vgpu_dra::fabric::FabricError> {
        self.0.activate(id).map_err(|e| vgpu_dra::fabric::FabricError::Fm {
            op: format!("fmActivateFabricPartition({id})"),
            message: e.to_string(),
        })
    }

    fn deactivate(&self, id: u32) -> Result<(), vgpu_dra::fabric::FabricError> {
        self.0.deactivate(id).map_err(|e| vgpu_dra::fabric::FabricError::Fm {
            op: format!("fmDeactivateFabricPartition({id})"),
            message: e.to_string(),
        })
    }
}
