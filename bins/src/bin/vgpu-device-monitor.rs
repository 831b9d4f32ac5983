//! `vgpu-device-monitor`: the per-node vGPU metrics exporter (contract §1.3, §8).
//!
//! Thin wiring: parse flags → validate gates → open the backend → watch the node's pods → serve
//! `vgpu_monitor`'s router (`/healthz`, `/readyz`, `/version`, `/metrics`) with `vgpu_serve::http::serve`
//! until SIGTERM/SIGINT. Gates: `SharedSMUtilizationWatcher` (read `watcher/sm_util.config`),
//! `VirtualMemoryTracking` (add the containers' ledgers to memory usage; not on the DRA path).
//!
//! | collector | pods watched | limits and assignments | `/readyz` |
//! |---|---|---|---|
//! | device plugin (default) | label `<domain>/metrics-node=<node>` | `vgpu.config`, pod annotations | pod cache synced |
//! | DRA (`--enable-dra-monitor`) | field `spec.nodeName=<node>` | ResourceSlices of `--driver-name` for the node's pool, ResourceClaims (`vgpu_monitor::dra`) | pod, slice and claim caches synced |
//!
//! With a GPU in MIG mode at start-up (device-plugin path), `container_mig_device_allocation_info` comes
//! from the kubelet's pod-resources API (`--pod-resources-socket`).

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates, parse_go_duration};
use vgpu_core::{
    domain::ResourceDomain,
    node_config::{CgroupDriver, NodeConfigFile, NodeSettings},
};
use vgpu_gates::{CoreGate, FeatureGates};
use vgpu_monitor::{
    cgroup::CgroupLayout,
    collect::{MonitorConfig, NodeCollector},
    dra::{DraPods, DraSource, KubeDra},
    metrics,
    podres::KubeletPodResources,
    pods::{KubePods, PodSource},
    server::{MIN_SCRAPE_INTERVAL, MonitorServer, ServerConfig},
};
use vgpu_nvml::select::{BackendChoice, SelectOptions, open_backend};
use vgpu_serve::{authz::Authorizer, tls::TlsFiles};

/// The per-node vGPU metrics exporter.
#[derive(Debug, Parser)]
#[command(name = "vgpu-device-monitor", version, about)]
#[command(mut_arg("cert_refresh_interval", |a| a.help(
    "How often the TLS files are checked for changes (Go duration; taken as is, not multiplied)"
)))]
struct Cli {
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The node's cgroup driver: cgroupfs or systemd; empty tries both.
    #[arg(long, env = "CGROUP_DRIVER", default_value = "")]
    cgroup_driver: String,
    /// The node configuration file (JSON or YAML; split count and scaling shown in the metrics); empty for none.
    #[arg(long, default_value = "")]
    node_config_path: String,
    /// Port of the HTTP(S) server.
    #[arg(long, default_value_t = 3456)]
    server_bind_port: u16,
    /// Authorize /metrics by bearer token: TokenReview, then SubjectAccessReview for `get` on /metrics;
    /// 401/403 otherwise (decisions cached 10s allowed / 2s refused).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    enable_rbac: bool,
    // --enable-tls, --tls-key-file, --tls-cert-file, --cert-refresh-interval (its help text is this binary's own,
    // set by `mut_arg` above).
    #[command(flatten)]
    tls: vgpu_bins::TlsFileArgs,
    /// At most one scrape per this interval (Go duration, ≥ 1s); others get the last page with
    /// `X-Rate-Limited: true`, or 429 when there is none.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration)]
    min_scrape_interval: Duration,
    /// A pod with only a scheduler pre-allocation counts as assigned this long after Filter (Go duration).
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    stuck_grace_period: Duration,
    /// Where the host's driver root is mounted in this container: NVML (`libnvidia-ml.so.1`) is loaded from
    /// its library folders when present there, else from the loader path.
    #[arg(long, env = "DRIVER_ROOT_CTR_PATH", default_value = "/driver-root")]
    container_driver_root: PathBuf,
    /// Collect from DRA ResourceSlices and ResourceClaims of --driver-name (pods by spec.nodeName) instead of
    /// the device-plugin files and annotations.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    enable_dra_monitor: bool,
    /// The kubelet pod-resources socket: which container holds which MIG device
    /// (`container_mig_device_allocation_info`), polled every 5s when a GPU is in MIG mode at start-up
    /// (device-plugin path only).
    #[arg(long, default_value = vgpu_kubelet::podresources::POD_RESOURCES_SOCKET)]
    pod_resources_socket: PathBuf,
    /// The DRA driver whose slices and claims --enable-dra-monitor reads.
    #[arg(long, default_value = vgpu_dra::DRIVER_NAME)]
    driver_name: String,
    /// Where this process sees the manager directory (`<podUID>_<ctr>/config/vgpu.config`, `watcher/`).
    #[arg(long, env = "MANAGER_DIR", default_value = "/etc/vgpu-manager")]
    manager_dir: PathBuf,
    /// Where the host's cgroup hierarchy is mounted in this container.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    host_cgroup_root: PathBuf,
    /// The kubelet's `cgroupRoot` (its `--cgroup-root`): the cgroup `kubepods` sits under, in the cgroup
    /// driver's form (`/node` with cgroupfs, `/node.slice` with systemd); `/` is the top of the hierarchy.
    #[arg(long, default_value = "/")]
    kubelet_cgroup_root: String,
    /// Resource and annotation domain.
    #[arg(long, default_value = "nvidia.com")]
    domain: String,
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
    gates: CoreGateArgs,
}

fn bad_flag(flag: &str, err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-device-monitor: invalid value for --{flag}: {err}");
    ExitCode::from(2)
}

/// Everything checkable before the runtime starts.
#[derive(Debug)]
struct Checked {
    node: String,
    domain: ResourceDomain,
    settings: NodeSettings,
    tls: Option<TlsFiles>,
}

fn check(cli: &Cli) -> Result<Checked, ExitCode> {
    if cli.driver_name.is_empty() || !cli.driver_name.contains('.') {
        return Err(bad_flag(
            "driver-name",
            format!("{:?} (expected a DNS subdomain such as manager.nvidia.com)", cli.driver_name),
        ));
    }
    if cli.min_scrape_interval < MIN_SCRAPE_INTERVAL {
        return Err(bad_flag(
            "min-scrape-interval",
            format!("{:?} (expected ≥ 1s)", cli.min_scrape_interval),
        ));
    }
    if cli.tls.cert_refresh_interval.is_zero() {
        return Err(bad_flag("cert-refresh-interval", "0s (expected a duration > 0)"));
    }
    // vgpu-manager's charts render `--cgroup-driver=auto` by default; it reads the value in any case and
    // detects the driver for anything but systemd / cgroupfs.
    let cgroup_driver = cli.cgroup_driver.trim().to_ascii_lowercase();
    if !matches!(cgroup_driver.as_str(), "" | "auto" | "systemd" | "cgroupfs") {
        return Err(bad_flag(
            "cgroup-driver",
            format!("{:?} (expected systemd, cgroupfs, auto or empty)", cli.cgroup_driver),
        ));
    }
    let root = &cli.kubelet_cgroup_root;
    let segments: Vec<&str> = root.split('/').filter(|s| !s.is_empty()).collect();
    if !root.starts_with('/') || segments.iter().any(|s| *s == "." || *s == "..") {
        return Err(bad_flag(
            "kubelet-cgroup-root",
            format!("{root:?} (expected an absolute cgroup path such as / or /kubelet, without . or ..)"),
        ));
    }
    if cgroup_driver == "systemd" && segments.iter().any(|s| !s.ends_with(".slice")) {
        return Err(bad_flag(
            "kubelet-cgroup-root",
            format!("{root:?} (the systemd driver names slices: expected / or a path such as /node.slice)"),
        ));
    }
    let domain = ResourceDomain::new(&cli.domain).map_err(|e| bad_flag("domain", e))?;
    let tls = cli.tls.files().map_err(|e| e.exit("vgpu-device-monitor"))?;
    let Some(node) = cli.node_name.clone().filter(|n| !n.trim().is_empty()) else {
        eprintln!("vgpu-device-monitor: --node-name (or NODE_NAME) is required");
        return Err(ExitCode::from(2));
    };
    let mut settings =
        NodeSettings { cgroup_driver: CgroupDriver::parse(&cgroup_driver), ..NodeSettings::default() };
    if !cli.node_config_path.is_empty() {
        settings = NodeConfigFile::load(&cli.node_config_path)
            .and_then(|f| f.resolve(&node, settings))
            .map_err(|e| bad_flag("node-config-path", e))?;
    }
    Ok(Checked { node, domain, settings, tls })
}

async fn run(cli: Cli, gates: FeatureGates<'static, CoreGate>, checked: Checked) -> anyhow::Result<()> {
    let Checked { node, domain, settings, tls } = checked;
    let mut options = SelectOptions::default();
    options.mock_config.clone_from(&cli.mock_config);
    options.nvml.library_path = nvml_under(&cli.container_driver_root);
    if let Some(lib) = &options.nvml.library_path {
        tracing::info!(library = %lib.display(), "NVML from the container driver root");
    }
    let opened = open_backend(cli.backend, &options).context("opening the device backend")?;
    for w in &opened.warnings {
        tracing::warn!("{w}");
    }
    let backend: Arc<dyn vgpu_core::backend::DeviceBackend> = Arc::from(opened.backend);
    let client = cli.kube.client(vgpu_bins::COMPONENT_RATE).await?;
    let (pods, dra): (Arc<dyn PodSource>, Option<Arc<dyn DraSource>>) = if cli.enable_dra_monitor {
        tracing::info!(selector = %KubePods::node_field_selector(&node), driver = %cli.driver_name,
            "DRA collector: watching the node's pods, ResourceSlices and ResourceClaims");
        let dra: Arc<dyn DraSource> = Arc::new(KubeDra::start(client.clone()));
        (Arc::new(KubePods::start_on_node(client.clone(), &node)), Some(dra))
    } else {
        let selector = KubePods::selector(&domain.metrics_node(), &node);
        tracing::info!(%selector, "watching the node's pods");
        (Arc::new(KubePods::start(client.clone(), selector)), None)
    };

    let mut config = MonitorConfig::new(node);
    config.dra_driver.clone_from(&cli.driver_name);
    config.domain = domain;
    config.manager_dir.clone_from(&cli.manager_dir);
    config.cgroup = CgroupLayout {
        root: cli.host_cgroup_root.clone(),
        driver: settings.cgroup_driver,
        kubelet_cgroup_root: cli.kubelet_cgroup_root.clone(),
    };
    config.settings = settings;
    config.sm_watcher = gates.enabled(CoreGate::SharedSMUtilizationWatcher);
    config.vmem_tracking = gates.enabled(CoreGate::VirtualMemoryTracking);
    config.stuck_grace_period = cli.stuck_grace_period;
    tracing::info!(
        sm_watcher = config.sm_watcher,
        vmem_tracking = config.vmem_tracking,
        manager_dir = %config.manager_dir.display(),
        "collector configured"
    );
    let (collector, ready): (NodeCollector, Arc<dyn PodSource>) = match dra {
        Some(dra) => (
            NodeCollector::new_dra(config, backend, Arc::clone(&pods), Arc::clone(&dra)),
            Arc::new(DraPods::new(pods, dra)),
        ),
        None => {
            let mig = backend.devices().is_ok_and(|d| d.iter().any(|g| g.mig_enabled));
            let mut collector = NodeCollector::new(config, backend, Arc::clone(&pods));
            if mig {
                tracing::info!(socket = %cli.pod_resources_socket.display(),
                    "MIG-enabled GPU: MIG allocations from the kubelet pod-resources API");
                let source = KubeletPodResources::start(
                    cli.pod_resources_socket.clone(),
                    Duration::from_secs(5),
                    Duration::from_secs(5),
                );
                collector = collector.with_pod_resources(Arc::new(source));
            }
            (collector, pods)
        }
    };
    let mut registry = metrics::new_registry();
    metrics::register(&mut registry, Arc::new(collector));
    let authorizer = cli.enable_rbac.then(|| Arc::new(Authorizer::kube(client)));
    let server = MonitorServer::new(
        registry,
        ready,
        ServerConfig { min_scrape_interval: cli.min_scrape_interval, authorizer },
    );
    let tls = match &tls {
        Some(files) => Some(files.start().context("loading --tls-cert-file / --tls-key-file")?),
        None => None,
    };
    let address = SocketAddr::from(([0, 0, 0, 0], cli.server_bind_port));
    let listener =
        tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
    tracing::info!(address = %listener.local_addr().unwrap_or(address), tls = tls.is_some(), rbac = cli.enable_rbac, "serving metrics");
    let shutdown = vgpu_bins::shutdown_signal()?;
    vgpu_serve::http::serve(
        listener,
        server.router(),
        tls.as_ref().map(|t| t.acceptor().clone()),
        &Default::default(),
        shutdown,
    )
    .await;
    Ok(())
}

/// `libnvidia-ml.so.1` in the usual library folders under the driver root, if there.
fn nvml_under(root: &std::path::Path) -> Option<PathBuf> {
    ["usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "lib"]
        .iter()
        .map(|dir| root.join(dir).join("libnvidia-ml.so.1"))
        .find(|p| p.exists())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-device-monitor: {e}");
        return ExitCode::from(2);
    }
    let gates = match configure_gates(vgpu_gates::device_monitor(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    let checked = match check(&cli) {
        Ok(c) => c,
        Err(code) => return code,
    };
    vgpu_bins::run_async("vgpu-device-monitor", &cli.pprof.clone(), run(cli, gates, checked))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn nvml_is_found_under_the_driver_root() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(nvml_under(root.path()), None);
        let dir = root.path().join("usr/lib64");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libnvidia-ml.so.1"), b"").unwrap();
        assert_eq!(nvml_under(root.path()), Some(dir.join("libnvidia-ml.so.1")));
    }

    #[test]
    fn flags_are_checked() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("vgpu-device-monitor").chain(args.iter().copied())).unwrap()
        };
        let ok = check(&parse(&["--node-name=n1", "--cert-refresh-interval=10s"])).ok().unwrap();
        assert_eq!(ok.node, "n1");
        assert!(ok.tls.is_none());
        let cli = parse(&[
            "--node-name=n1",
            "--enable-tls",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--cert-refresh-interval=2m",
        ]);
        // The interval is taken as is (upstream multiplies a Duration by 1e9).
        assert_eq!(check(&cli).ok().unwrap().tls.unwrap().refresh_interval, Duration::from_secs(120));
        assert!(check(&parse(&["--node-name=n1", "--min-scrape-interval=999ms"])).is_err());
        assert!(check(&parse(&["--node-name=n1", "--min-scrape-interval=2s"])).is_ok());
        assert!(check(&parse(&["--node-name=n1", "--enable-dra-monitor"])).is_ok());
        // vgpu-manager's chart default, and its case-insensitive reading.
        let auto = check(&parse(&["--node-name=n1", "--cgroup-driver=auto"])).ok().unwrap();
        assert_eq!(auto.settings.cgroup_driver, CgroupDriver::Auto);
        let systemd = check(&parse(&["--node-name=n1", "--cgroup-driver=SystemD"])).ok().unwrap();
        assert_eq!(systemd.settings.cgroup_driver, CgroupDriver::Systemd);
        for good in ["--kubelet-cgroup-root=/", "--kubelet-cgroup-root=/node", "--kubelet-cgroup-root=/a/b/"]
        {
            assert!(check(&parse(&["--node-name=n1", good])).is_ok(), "{good}");
        }
        for bad in ["--kubelet-cgroup-root=node", "--kubelet-cgroup-root=/a/../b", "--kubelet-cgroup-root="] {
            assert!(check(&parse(&["--node-name=n1", bad])).is_err(), "{bad}");
        }
        let slices =
            ["--node-name=n1", "--cgroup-driver=systemd", "--kubelet-cgroup-root=/a.slice/a-b.slice"];
        assert!(check(&parse(&slices)).is_ok());
        assert!(
            check(&parse(&["--node-name=n1", "--cgroup-driver=systemd", "--kubelet-cgroup-root=/node"]))
                .is_err()
        );
        assert!(check(&parse(&["--node-name=n1", "--cgroup-driver=sytemd"])).is_err());
        assert!(check(&parse(&["--node-name=n1", "--enable-dra-monitor", "--driver-name=gpu"])).is_err());
    }
}
