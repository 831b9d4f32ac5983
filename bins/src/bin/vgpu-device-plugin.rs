//! `vgpu-device-plugin`: the kubelet device plugin for vGPU resources (contract §1.1, §5).
//!
//! Thin wiring: parse flags → validate gates → build the configuration → open the backend and the
//! Kubernetes client → run [`Daemon`] until SIGTERM/SIGINT (SIGHUP restarts the plugins).

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates};
use vgpu_core::{
    domain::ResourceDomain,
    node_config::{
        CgroupDriver, DeviceListStrategy, ExcludeDevices, ImexSettings, MigStrategy, NodeConfigFile,
        NodeSettings,
    },
};
use vgpu_deviceplugin::{
    config::{
        CgroupMode, DEFAULT_CDI_ANNOTATION_PREFIX, DEFAULT_MANAGER_DIR, PluginConfig, resolve_cgroup_driver,
    },
    daemon::Daemon,
    feature_file::{FeatureFileConfig, GfdOutput},
    kube_cluster::KubeCluster,
    node_config_watch::NodeConfigSource,
};
use vgpu_nvml::select::{BackendChoice, SelectOptions, open_backend};

/// The kubelet device plugin for vGPU resources.
#[derive(Debug, Parser)]
#[command(name = "vgpu-device-plugin", version, about)]
struct Cli {
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// vGPU slots per physical GPU.
    #[arg(long, default_value_t = 10)]
    device_split_count: u32,
    /// Multiplier of the 100 cores per GPU.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    device_cores_scaling: f64,
    /// Multiplier of each GPU's memory (> 1 = virtual memory).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    device_memory_scaling: f64,
    /// MiB per `vgpu-memory` unit.
    #[arg(long, default_value_t = 1)]
    device_memory_factor: u32,
    /// The node configuration file (JSON or YAML); empty for none. Watched while running: a valid change is
    /// applied without a restart (split count, scaling, exclusions, Allocate's settings); `migStrategy`,
    /// `deviceListStrategy`, `cgroupDriver` and `imex` take effect at the next start.
    #[arg(long, default_value = "")]
    node_config_path: String,
    /// Seconds between two reads of `--node-config-path` (changes are applied within one period).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    node_config_poll_interval: u64,
    /// GPUs to advertise as unhealthy: indices, `a..b` / `a-b` ranges or UUIDs, comma separated.
    #[arg(long, default_value = "")]
    exclude_devices: String,
    /// The kubelet's device-plugin directory.
    #[arg(long, default_value = vgpu_deviceplugin::DEFAULT_DEVICE_PLUGIN_PATH)]
    device_plugin_path: PathBuf,
    /// How devices reach containers: envvar, volume-mounts, cdi-annotations, cdi-cri (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "envvar")]
    device_list_strategy: Vec<String>,
    /// MIG strategy: none, single or mixed.
    #[arg(long, default_value = "mixed")]
    mig_strategy: String,
    /// Resource and annotation domain.
    #[arg(long, default_value = "nvidia.com")]
    domain: String,
    #[command(flatten)]
    kube: vgpu_bins::KubeClientArgs,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
    #[command(flatten)]
    pprof: vgpu_bins::PprofArgs,
    /// Host path of the manager directory (the mount sources handed to containers).
    #[arg(long, env = "HOST_MANAGER_DIR", default_value = DEFAULT_MANAGER_DIR)]
    host_manager_dir: PathBuf,
    /// The version suffix of the control library the vGPU containers mount:
    /// `<manager-dir>/libvgpu-control.so.<version>`.
    #[arg(long, env = "LIBRARY_VERSION", default_value = vgpu_core::abi::runtime_files::DEFAULT_LIBRARY_VERSION, value_parser = vgpu_core::abi::runtime_files::parse_library_version)]
    library_version: String,
    /// Where this process sees the manager directory (the per-container files are written there).
    #[arg(long, default_value = DEFAULT_MANAGER_DIR)]
    manager_dir: PathBuf,
    /// Limit of each Kubernetes API request in seconds (connect, read and write); 0 = no limit.
    #[arg(long, default_value_t = 0)]
    kube_timeout: u64,
    /// The node's cgroup driver: cgroupfs or systemd; anything else detects it.
    #[arg(long, env = "CGROUP_DRIVER", default_value = "")]
    cgroup_driver: String,
    /// Pass `NVIDIA_GDS=enabled` to vGPU containers.
    #[arg(long, env = "GDS_ENABLED", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool_env, action = clap::ArgAction::Set)]
    gds_enabled: bool,
    /// Pass `NVIDIA_MOFED=enabled` to vGPU containers.
    #[arg(long, env = "MOFED_ENABLED", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool_env, action = clap::ArgAction::Set)]
    mofed_enabled: bool,
    /// Pass `NVIDIA_GDRCOPY=enabled` to vGPU containers.
    #[arg(long, env = "GDRCOPY_ENABLED", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool_env, action = clap::ArgAction::Set)]
    gdrcopy_enabled: bool,
    /// The driver uses the open kernel modules (OpenKernel bit of `MANAGER_COMPATIBILITY_MODE`).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    open_kernel_modules: bool,
    /// IMEX channels every GPU container gets (comma separated ids; each only when
    /// `/dev/nvidia-caps-imex-channels/channel<id>` exists under the container driver root).
    #[arg(long, env = "IMEX_CHANNEL_IDS", value_delimiter = ',')]
    imex_channel_ids: Vec<u32>,
    /// Refuse to start when a configured IMEX channel's device node is missing.
    #[arg(long, env = "IMEX_REQUIRED", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool_env, action = clap::ArgAction::Set)]
    imex_required: bool,
    /// Where the node's CDI spec is written when a CDI device-list strategy is selected.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    cdi_root: PathBuf,
    /// Prefix of the `cdi-annotations` keys.
    #[arg(long, default_value = DEFAULT_CDI_ANNOTATION_PREFIX)]
    cdi_annotation_prefix: String,
    /// The driver root on the host (host side of the device nodes handed to containers).
    #[arg(long, env = "NVIDIA_DRIVER_ROOT", default_value = "/")]
    host_driver_root: PathBuf,
    /// Where the host's driver root is mounted in this container (device nodes are looked for there).
    #[arg(long, env = "DRIVER_ROOT_CTR_PATH", default_value = "/driver-root")]
    container_driver_root: PathBuf,
    /// The kubelet pod-resources socket (PreStartContainer finds containers through it).
    #[arg(long, default_value = vgpu_kubelet::podresources::POD_RESOURCES_SOCKET)]
    pod_resources_socket: PathBuf,
    /// The kubelet's root directory (its config.yaml / kubeadm-flags.env tell the cgroup driver).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_root: PathBuf,
    /// Where the host's `/proc` is mounted in this container (client-mode registry: a caller's PID → its
    /// cgroup).
    #[arg(long, default_value = "/proc")]
    host_proc_root: PathBuf,
    /// Where the host's cgroup hierarchy is mounted in this container (cgroup version and driver detection;
    /// client-mode registry: a caller's `cgroup.procs`).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    host_cgroup_root: PathBuf,
    /// Group of the client-mode registry socket (`<manager-dir>/registry/socket.sock`, mode 0660): a numeric
    /// gid, or a group name of this image's `/etc/group`; default: this process's gid. Containers that run
    /// `vgpu-device-client` need this group (e.g. in the pod's `supplementalGroups`) to connect.
    #[arg(long, value_name = "NAME|GID", value_parser = parse_socket_group)]
    registry_socket_group: Option<u32>,
    /// Device backend: auto, nvml, metax or mock. Also env `VGPU_BACKEND`: a chart whose command line is
    /// fixed (vgpu-manager's own) selects the backend through its containers' extra env.
    #[arg(long, env = "VGPU_BACKEND", default_value = "auto")]
    backend: BackendChoice,
    /// The mock backend's description file (`--backend mock`); also env `VGPU_MOCK_CONFIG`.
    #[arg(long, env = "VGPU_MOCK_CONFIG", value_name = "FILE")]
    mock_config: Option<PathBuf>,
    /// Seconds between two publications of the node annotations.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    node_publish_interval: u64,
    /// Publish GPU feature labels compatible with gpu-feature-discovery (`nvidia.com/gpu.product`,
    /// `gpu.memory`, `gpu.count`, `cuda.driver.*`, `mig.*` …) on the node (the GPU module's device-plugin
    /// mode, in place of GFD).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    gfd_labels: bool,
    /// Where the GPU feature labels go: `node-labels` (patched onto the Node) or `nfd-feature-file` (written
    /// to node-feature-discovery's local feature file `--nfd-feature-file`, from which NFD labels the Node;
    /// implies `--gfd-labels`).
    #[arg(long, value_enum, default_value_t = GfdOutputFlag::NodeLabels)]
    gfd_output: GfdOutputFlag,
    /// The NFD local feature file written with `--gfd-output=nfd-feature-file` (its directory must exist).
    #[arg(long, default_value = vgpu_core::nfd::DEFAULT_FEATURE_FILE)]
    nfd_feature_file: PathBuf,
    /// How often the NFD feature file is rewritten (a Go duration; each write expires after 3 periods).
    #[arg(long, default_value = "60s", value_parser = parse_interval)]
    nfd_feature_interval: Duration,
    /// Serve whole GPUs as `<domain>/gpu`, placed by kube-scheduler alone, instead of `<domain>/vgpu-number`
    /// (which needs the scheduler extender): the GPU module's device-plugin mode.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    whole_gpus: bool,
    #[command(flatten)]
    gates: CoreGateArgs,
}

/// `--gfd-output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum GfdOutputFlag {
    /// Patched onto the Node with the other node labels.
    NodeLabels,
    /// Written to node-feature-discovery's local feature file.
    NfdFeatureFile,
}

/// `--nfd-feature-interval`: a Go duration of at least one second.
fn parse_interval(value: &str) -> Result<Duration, String> {
    let d = vgpu_bins::parse_go_duration(value)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{value:?} is shorter than 1s"));
    }
    Ok(d)
}

/// Where the GPU feature labels go, from `--gfd-output`, `--nfd-feature-file` and `--nfd-feature-interval`.
fn gfd_output(cli: &Cli) -> GfdOutput {
    match cli.gfd_output {
        GfdOutputFlag::NodeLabels => GfdOutput::NodeLabels,
        GfdOutputFlag::NfdFeatureFile => GfdOutput::NfdFeatureFile(FeatureFileConfig {
            path: cli.nfd_feature_file.clone(),
            interval: cli.nfd_feature_interval,
        }),
    }
}

/// `--registry-socket-group`: a gid, or a name from `/etc/group`.
fn parse_socket_group(value: &str) -> Result<u32, String> {
    vgpu_node::registry::resolve_socket_group(value, std::path::Path::new("/etc/group"))
        .map_err(|e| e.to_string())
}

/// A flag value that parses but is not valid: exit 2 naming the flag.
fn bad_flag(flag: &str, err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-device-plugin: invalid value for --{flag}: {err}");
    ExitCode::from(2)
}

fn settings(cli: &Cli) -> Result<NodeSettings, ExitCode> {
    let mut s = NodeSettings {
        device_split_count: cli.device_split_count,
        device_cores_scaling: cli.device_cores_scaling,
        device_memory_scaling: cli.device_memory_scaling,
        device_memory_factor: cli.device_memory_factor,
        // Read in any case, as vgpu-manager does (`strings.ToLower`); anything else detects (e.g. `auto`).
        cgroup_driver: CgroupDriver::parse(&cli.cgroup_driver.to_ascii_lowercase()),
        gds_enabled: cli.gds_enabled,
        mofed_enabled: cli.mofed_enabled,
        gdrcopy_enabled: cli.gdrcopy_enabled,
        open_kernel_modules: cli.open_kernel_modules,
        imex: ImexSettings { channel_ids: cli.imex_channel_ids.clone(), required: cli.imex_required },
        ..NodeSettings::default()
    };
    if cli.cdi_annotation_prefix.is_empty() || !cli.cdi_annotation_prefix.ends_with('/') {
        return Err(bad_flag(
            "cdi-annotation-prefix",
            format!("{:?} (expected a prefix ending in '/', e.g. cdi.k8s.io/)", cli.cdi_annotation_prefix),
        ));
    }
    if !cli.exclude_devices.trim().is_empty() {
        s.exclude_devices =
            cli.exclude_devices.parse::<ExcludeDevices>().map_err(|e| bad_flag("exclude-devices", e))?;
    }
    s.device_list_strategy = cli
        .device_list_strategy
        .iter()
        .map(|v| DeviceListStrategy::parse(v.trim()))
        .collect::<Result<_, _>>()
        .map_err(|e| bad_flag("device-list-strategy", e))?;
    s.mig_strategy = MigStrategy::parse(&cli.mig_strategy).map_err(|e| bad_flag("mig-strategy", e))?;
    for (flag, value) in
        [("device-cores-scaling", s.device_cores_scaling), ("device-memory-scaling", s.device_memory_scaling)]
    {
        if !value.is_finite() || value < 0.0 {
            return Err(bad_flag(flag, format!("{value} (expected a finite number ≥ 0)")));
        }
    }
    if s.device_memory_factor == 0 {
        return Err(bad_flag("device-memory-factor", "0 (expected an integer > 0)"));
    }
    Ok(s)
}

/// `--kube-timeout`: every API request's connect, read and write limit (0 leaves kube's defaults).
fn apply_kube_timeout(config: &mut kube::Config, seconds: u64) {
    if seconds > 0 {
        let limit = Some(Duration::from_secs(seconds));
        config.connect_timeout = limit;
        config.read_timeout = limit;
        config.write_timeout = limit;
    }
}

/// The plugin configuration from the flags and the effective node settings.
fn plugin_config(cli: &Cli, node: String, settings: NodeSettings, domain: ResourceDomain) -> PluginConfig {
    let mut config = PluginConfig::new(node);
    config.device_plugin_path.clone_from(&cli.device_plugin_path);
    config.host_manager_dir.clone_from(&cli.host_manager_dir);
    config.library_version.clone_from(&cli.library_version);
    config.manager_dir.clone_from(&cli.manager_dir);
    config.host_driver_root.clone_from(&cli.host_driver_root);
    config.device_root.clone_from(&cli.container_driver_root);
    config.cdi_annotation_prefix.clone_from(&cli.cdi_annotation_prefix);
    config.cdi_root.clone_from(&cli.cdi_root);
    config.pod_resources_socket.clone_from(&cli.pod_resources_socket);
    config.proc_root.clone_from(&cli.host_proc_root);
    config.cgroup_root.clone_from(&cli.host_cgroup_root);
    config.registry_socket_group = cli.registry_socket_group;
    config.cgroup_mode = CgroupMode::detect(&cli.host_cgroup_root);
    config.domain = domain;
    config.settings = settings;
    config.whole_gpus = cli.whole_gpus;
    config.settings.cgroup_driver =
        resolve_cgroup_driver(config.settings.cgroup_driver, &cli.kubelet_root, &cli.host_cgroup_root);
    config
}

/// The plugin's client, and the reschedule controller's: the same configuration and rate limit, without
/// kube's retry of a 429 (a PodDisruptionBudget's refusal of an eviction comes back as one at once;
/// [`vgpu_kube::client::without_retry`]).
async fn kube_clients(
    args: &vgpu_bins::KubeClientArgs,
    timeout: u64,
) -> anyhow::Result<(kube::Client, kube::Client)> {
    let options = args.options(vgpu_bins::COMPONENT_RATE);
    let bucket = options.bucket()?;
    let mut config = options.config().await?;
    apply_kube_timeout(&mut config, timeout);
    let evicting = vgpu_kube::client::without_retry(config.clone());
    let client = vgpu_kube::client::client_with_bucket(config, bucket.clone())
        .context("building the Kubernetes client")?;
    let evicting =
        vgpu_kube::client::client_with_bucket(evicting, bucket).context("building the Kubernetes client")?;
    Ok((client, evicting))
}

async fn run(
    cli: Cli,
    gates: vgpu_gates::FeatureGates<'static, vgpu_gates::CoreGate>,
    node: String,
    settings: NodeSettings,
    flags: Option<NodeSettings>,
) -> anyhow::Result<()> {
    let domain = ResourceDomain::new(&cli.domain).map_err(|e| anyhow::anyhow!("--domain: {e}"))?;
    let mut options = SelectOptions::default();
    options.mock_config.clone_from(&cli.mock_config);
    let opened = open_backend(cli.backend, &options).context("opening the device backend")?;
    for w in &opened.warnings {
        tracing::warn!("{w}");
    }
    let (client, evicting) = kube_clients(&cli.kube, cli.kube_timeout).await?;
    let instance = format!("vgpu-device-plugin-{node}");
    let cluster = Arc::new(KubeCluster::new(client).with_instance(instance.clone()));
    let reschedule = Arc::new(KubeCluster::new(evicting).with_instance(instance));

    let mut config = plugin_config(&cli, node, settings.clone(), domain);
    config.gates = gates;
    tracing::info!(cgroup_driver = ?config.settings.cgroup_driver, cgroup = ?config.cgroup_mode, "cgroup setup");
    // Driver and CUDA versions (vgpu.config, node labels) come from the backend in Daemon::new.
    let backend: Arc<dyn vgpu_core::backend::DeviceBackend> = Arc::from(opened.backend);
    // The reschedule controller (gate AllocationFailureReschedule) evicts, deletes and recreates pods
    // through its own client (no 429 retry).
    let mut daemon =
        Daemon::new(config, backend, cluster.clone(), cluster)?.with_reschedule_client(reschedule);
    daemon.publisher.interval = Duration::from_secs(cli.node_publish_interval);
    if let Some(flags) = flags {
        // The file is watched and reapplied without a restart (a ConfigMap volume's `..data` swap included).
        let source = NodeConfigSource::new(&cli.node_config_path, daemon.config.node_name.clone(), flags)
            .with_interval(Duration::from_secs(cli.node_config_poll_interval));
        daemon = daemon.with_node_config(source, settings);
    }
    daemon.gfd_output = gfd_output(&cli);
    if cli.gfd_labels || daemon.gfd_output != GfdOutput::NodeLabels {
        let machine =
            std::fs::read_to_string("/sys/class/dmi/id/product_name").ok().map(|m| m.trim().to_owned());
        daemon = daemon.with_gfd_labels(machine.filter(|m| !m.is_empty()))?;
    }

    let shutdown = vgpu_bins::shutdown_signal()?;
    let (restart_tx, restart_rx) = tokio::sync::mpsc::channel(1);
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP received");
            let _ = restart_tx.try_send(());
        }
    });
    daemon.run(shutdown, restart_rx).await?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-device-plugin: {e}");
        return ExitCode::from(2);
    }
    let gates = match configure_gates(vgpu_gates::device_plugin(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    // A gate whose behaviour is not built is refused, never accepted and ignored.
    if let Err(e) = vgpu_deviceplugin::gates::check_gates(&gates) {
        eprintln!("vgpu-device-plugin: {e}");
        return ExitCode::from(2);
    }
    let mut settings = match settings(&cli) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let Some(node) = cli.node_name.clone().filter(|n| !n.trim().is_empty()) else {
        eprintln!("vgpu-device-plugin: --node-name (or NODE_NAME) is required");
        return ExitCode::from(2);
    };
    let mut flags = None;
    if !cli.node_config_path.is_empty() {
        flags = Some(settings.clone());
        let resolved = NodeConfigFile::load(&cli.node_config_path).and_then(|f| f.resolve(&node, settings));
        settings = match resolved {
            Ok(s) => s,
            Err(e) => return bad_flag("node-config-path", e),
        };
    }
    vgpu_bins::run_async("vgpu-device-plugin", &cli.pprof.clone(), run(cli, gates, node, settings, flags))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::Path;

    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("vgpu-device-plugin").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn flags_reach_the_plugin_configuration() {
        let kubelet = tempfile::tempdir().unwrap();
        std::fs::write(kubelet.path().join("config.yaml"), "cgroupDriver: cgroupfs\n").unwrap();
        let kubelet_root = kubelet.path().to_str().unwrap();
        let cli = parse(&[
            "--gds-enabled",
            "--mofed-enabled=true",
            "--gdrcopy-enabled=false",
            "--open-kernel-modules",
            "--host-driver-root=/run/nvidia/driver",
            "--container-driver-root=/drv",
            "--manager-dir=/mnt/mgr",
            "--host-manager-dir=/var/lib/vgpu",
            "--library-version=v2.3.0",
            "--cdi-annotation-prefix=example.com/",
            "--cdi-root=/etc/cdi",
            "--kubelet-root",
            kubelet_root,
            "--device-list-strategy=envvar,cdi-annotations",
        ]);
        let settings = settings(&cli).unwrap();
        assert!(settings.gds_enabled && settings.mofed_enabled && !settings.gdrcopy_enabled);
        assert!(settings.open_kernel_modules);
        let config = plugin_config(&cli, "n1".into(), settings, ResourceDomain::default());
        assert_eq!(config.host_driver_root, Path::new("/run/nvidia/driver"));
        assert_eq!(config.device_root, Path::new("/drv"));
        assert_eq!(config.manager_dir, Path::new("/mnt/mgr"));
        assert_eq!(config.host_manager_dir, Path::new("/var/lib/vgpu"));
        assert_eq!(config.library_version, "v2.3.0");
        assert!(Cli::try_parse_from(["vgpu-device-plugin", "--library-version=../x"]).is_err());
        assert_eq!(config.cdi_annotation_prefix, "example.com/");
        assert_eq!(config.cdi_root, Path::new("/etc/cdi"));
        assert_eq!(config.settings.cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(config.compatibility_mode() / 100, 1, "open kernel modules set the OpenKernel bit");
        // An explicit driver wins over detection.
        let cli = parse(&["--cgroup-driver=systemd", "--kubelet-root", kubelet_root]);
        let config = plugin_config(&cli, "n1".into(), settings_ok(&cli), ResourceDomain::default());
        assert_eq!(config.settings.cgroup_driver, CgroupDriver::Systemd);
        // Defaults.
        let cli = parse(&[]);
        let config = plugin_config(&cli, "n1".into(), settings_ok(&cli), ResourceDomain::default());
        assert_eq!(config.device_root, Path::new("/driver-root"));
        assert_eq!(config.host_driver_root, Path::new("/"));
        assert_eq!(config.cdi_annotation_prefix, "cdi.k8s.io/");
        assert!(!config.settings.gds_enabled);
    }

    fn settings_ok(cli: &Cli) -> NodeSettings {
        settings(cli).unwrap()
    }

    #[test]
    fn imex_flags_reach_the_settings() {
        let s = settings_ok(&parse(&["--imex-channel-ids=0,3", "--imex-required"]));
        assert_eq!(s.imex, ImexSettings { channel_ids: vec![0, 3], required: true });
        assert_eq!(settings_ok(&parse(&[])).imex, ImexSettings::default());
        assert!(Cli::try_parse_from(["vgpu-device-plugin", "--imex-channel-ids=-1"]).is_err());
    }

    #[test]
    fn bool_flags_take_go_forms() {
        let cli =
            parse(&["--gds-enabled=False", "--mofed-enabled=T", "--imex-required=1", "--gfd-labels=TRUE"]);
        assert!(!cli.gds_enabled && cli.mofed_enabled && cli.imex_required && cli.gfd_labels);
        let cli = parse(&["--open-kernel-modules", "--gdrcopy-enabled=f"]);
        assert!(cli.open_kernel_modules && !cli.gdrcopy_enabled && !cli.gfd_labels);
        // `--flag false` with a space: `false` is not the flag's value (Go), and a stray argument is refused.
        assert!(Cli::try_parse_from(["vgpu-device-plugin", "--gds-enabled", "false"]).is_err());
        assert!(Cli::try_parse_from(["vgpu-device-plugin", "--gfd-labels=yes"]).is_err());
        assert!(parse(&["--whole-gpus"]).whole_gpus && !parse(&[]).whole_gpus);
    }

    #[test]
    fn node_config_poll_interval_is_at_least_a_second() {
        assert_eq!(parse(&[]).node_config_poll_interval, 2);
        assert_eq!(parse(&["--node-config-poll-interval=5"]).node_config_poll_interval, 5);
        assert!(Cli::try_parse_from(["vgpu-device-plugin", "--node-config-poll-interval=0"]).is_err());
    }

    #[test]
    fn gfd_output_flags() {
        assert_eq!(gfd_output(&parse(&[])), GfdOutput::NodeLabels);
        assert_eq!(gfd_output(&parse(&["--gfd-output=node-labels"])), GfdOutput::NodeLabels);
        let cli = parse(&["--gfd-output=nfd-feature-file"]);
        assert_eq!(
            gfd_output(&cli),
            GfdOutput::NfdFeatureFile(FeatureFileConfig {
                path: "/etc/kubernetes/node-feature-discovery/features.d/gfd".into(),
                interval: Duration::from_secs(60),
            })
        );
        let cli = parse(&[
            "--gfd-output",
            "nfd-feature-file",
            "--nfd-feature-file=/host/gfd",
            "--nfd-feature-interval=1m30s",
        ]);
        assert_eq!(
            gfd_output(&cli),
            GfdOutput::NfdFeatureFile(FeatureFileConfig {
                path: "/host/gfd".into(),
                interval: Duration::from_secs(90),
            })
        );
        for bad in
            [&["--gfd-output=nfd"][..], &["--nfd-feature-interval=500ms"], &["--nfd-feature-interval=60"]]
        {
            assert!(
                Cli::try_parse_from(std::iter::once("vgpu-device-plugin").chain(bad.iter().copied()))
                    .is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bad_cdi_prefix_is_refused() {
        assert!(settings(&parse(&["--cdi-annotation-prefix=cdi.k8s.io"])).is_err());
    }

    #[test]
    fn registry_socket_group_flag() {
        let cli = parse(&["--registry-socket-group=4242"]);
        let config = plugin_config(&cli, "n1".into(), settings_ok(&cli), ResourceDomain::default());
        assert_eq!(config.registry().socket_group, Some(4242));
        // A name from /etc/group (root is in every image).
        assert_eq!(parse(&["--registry-socket-group", "root"]).registry_socket_group, Some(0));
        let err = Cli::try_parse_from(["vgpu-device-plugin", "--registry-socket-group=no-such-group-x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--registry-socket-group") && err.contains("no-such-group-x"), "{err}");
        assert!(Cli::try_parse_from(["vgpu-device-plugin", "--registry-socket-group="]).is_err());
    }

    #[test]
    fn kube_timeout_sets_every_request_limit() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let before = (config.connect_timeout, config.read_timeout, config.write_timeout);
        apply_kube_timeout(&mut config, 0);
        assert_eq!((config.connect_timeout, config.read_timeout, config.write_timeout), before);
        apply_kube_timeout(&mut config, 7);
        let seven = Some(Duration::from_secs(7));
        assert_eq!(
            (config.connect_timeout, config.read_timeout, config.write_timeout),
            (seven, seven, seven)
        );
    }

    #[test]
    fn host_roots_reach_the_registry_and_the_cgroup_detection() {
        let cgroup = tempfile::tempdir().unwrap();
        std::fs::write(cgroup.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        std::fs::create_dir(cgroup.path().join("kubepods")).unwrap();
        let root = cgroup.path().to_str().unwrap();
        let kubelet = tempfile::tempdir().unwrap();
        let kubelet_root = kubelet.path().to_str().unwrap();
        let cli = parse(&[
            "--host-proc-root=/host/proc",
            "--host-cgroup-root",
            root,
            "--kubelet-root",
            kubelet_root,
        ]);
        let config = plugin_config(&cli, "n1".into(), settings_ok(&cli), ResourceDomain::default());
        assert_eq!(config.proc_root, Path::new("/host/proc"));
        assert_eq!(config.cgroup_root, cgroup.path());
        assert_eq!(config.cgroup_mode, CgroupMode::V2);
        assert_eq!(
            config.settings.cgroup_driver,
            CgroupDriver::Cgroupfs,
            "detected under --host-cgroup-root"
        );
        let registry = config.registry();
        assert_eq!(
            (registry.proc_root.as_path(), registry.cgroup_root.as_path()),
            (Path::new("/host/proc"), cgroup.path())
        );
        assert_eq!(registry.socket_group, None, "default: the process's own gid");
        // Defaults.
        let config =
            plugin_config(&parse(&[]), "n1".into(), settings_ok(&parse(&[])), ResourceDomain::default());
        assert_eq!(
            (config.proc_root.as_path(), config.cgroup_root.as_path()),
            (Path::new("/proc"), Path::new("/sys/fs/cgroup"))
        );
    }
}
