//! `vgpu-node-agent`: the GPU module's node agent (issue #20; see the `vgpu_node_agent` crate docs).
//!
//! Thin wiring: parse and validate flags (exit 2 naming the flag) → Kubernetes client → refuse a
//! control-plane node unless `--allow-control-plane` → scan sysfs every `--scan-interval`, keeping one
//! PhysicalGPU per GPU and the node's vendor labels, until SIGTERM/SIGINT. It has no feature gates.
//!
//! `vgpu-node-agent vfio-switch --pci <addr> --to vfio-pci|nvidia` (issue #34 item 3) is the `switch`
//! container of the GPU module's `vfio-switch-<NODE_NAME>-<PCI>` Job ([`vgpu_dra::vfio_switch`]): it moves
//! one PCI function to the driver named, through `--sysfs-root` (the host's `/sys` mounted in), and exits 0
//! (already there counts), 1 naming the file and what was expected there, or 2 on a bad flag. It needs no
//! cluster access.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use vgpu_bins::{parse_go_duration, shutdown_signal};
use vgpu_core::discovery::PciAddress;
use vgpu_dra::vfio_switch::{Outcome, SwitchTarget, Switcher};
use vgpu_node_agent::{AgentConfig, KubeCluster, NodeAgent, agent::parse_config_map_ref};

/// The GPU module's node agent: one PhysicalGPU per GPU found in sysfs, and the vendor node labels.
#[derive(Debug, Parser)]
#[command(name = "vgpu-node-agent", version, about, subcommand_negates_reqs = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME", required = true)]
    node_name: Option<String>,
    /// The host's sysfs mount.
    #[arg(long, default_value = vgpu_core::discovery::DEFAULT_SYSFS_ROOT)]
    sysfs_root: PathBuf,
    /// A pci.ids file; repeat for fallbacks (first readable wins). Default: the usual distribution paths.
    #[arg(long = "pci-ids", value_name = "FILE")]
    pci_ids: Vec<PathBuf>,
    /// Time between scans (Go duration, e.g. 30s, 1m).
    #[arg(long, default_value = "60s", value_parser = parse_go_duration)]
    scan_interval: Duration,
    /// API group of PhysicalGPU.
    #[arg(long, default_value = vgpu_api::DEFAULT_GROUP)]
    group: String,
    /// Domain of the node and PhysicalGPU labels (`<domain>/vendor`); default: the --group.
    #[arg(long)]
    label_domain: Option<String>,
    /// The gpu-supported-vendors ConfigMap, `<namespace>/<name>`; empty: the built-in vendor table only.
    #[arg(long, env = "VENDORS_CONFIGMAP", default_value = "d8-gpu/gpu-supported-vendors")]
    vendors_configmap: String,
    /// Run on a control-plane node too (refused by default).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    allow_control_plane: bool,
    /// Do not watch the kernel's PCI uevents (scan on --scan-interval only).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    disable_pci_uevents: bool,
    #[command(flatten)]
    kube: vgpu_bins::KubeClientArgs,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
    #[command(flatten)]
    pprof: vgpu_bins::PprofArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Move one PCI function between the nvidia and vfio-pci drivers through sysfs (the `switch` container of
    /// a vfio-switch Job); a function already on the target is left alone.
    VfioSwitch(VfioSwitchArgs),
}

#[derive(Debug, Args)]
struct VfioSwitchArgs {
    /// The PCI address, dddd:bb:dd.f (lower-case hex, e.g. 0000:3b:00.0).
    #[arg(long, env = "PCI_ADDRESS", value_parser = parse_pci)]
    pci: PciAddress,
    /// The driver to move it to: vfio-pci or nvidia.
    #[arg(long, value_parser = parse_target)]
    to: SwitchTarget,
    /// Where the host's sysfs is mounted.
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// The host's root file system (`modprobe vfio-pci` runs chroot'ed there when vfio-pci is not loaded).
    #[arg(long, default_value = "/host-root")]
    host_root: PathBuf,
    /// How long to wait for the kernel after each write (Go duration).
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    timeout: Duration,
}

fn parse_pci(value: &str) -> Result<PciAddress, String> {
    value.parse::<PciAddress>().map_err(|e| e.to_string())
}

fn parse_target(value: &str) -> Result<SwitchTarget, String> {
    value.parse::<SwitchTarget>().map_err(|e| e.to_string())
}

/// `vfio-switch`: 0 switched or already there, 1 on a switch error (named file, expected state).
fn vfio_switch(args: &VfioSwitchArgs) -> ExitCode {
    let roots =
        vgpu_dra::vfio::SysfsRoots { sys: args.sysfs_root.clone(), host_root: args.host_root.clone() };
    let switcher = Switcher::host(roots).with_timing(args.timeout, vgpu_dra::vfio_switch::DEFAULT_POLL);
    match switcher.switch(&args.pci, args.to) {
        Ok(Outcome::AlreadyBound(to)) => {
            println!("{} is already bound to {to}; nothing to do", args.pci);
            ExitCode::SUCCESS
        }
        Ok(Outcome::Switched { from, to }) => {
            let from = if from.is_empty() { "no driver".to_owned() } else { from };
            println!("{} switched from {from} to {to}", args.pci);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-node-agent vfio-switch: {} to {}: {e}", args.pci, args.to);
            ExitCode::FAILURE
        }
    }
}

fn bad_flag(err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-node-agent: {err}");
    ExitCode::from(2)
}

/// The resolved configuration, or the message naming the flag.
fn agent_config(cli: &Cli) -> Result<AgentConfig, String> {
    let node = cli.node_name.as_deref().unwrap_or_default().trim();
    if node.is_empty() {
        return Err("invalid --node-name \"\" (NODE_NAME): expected this node's name".to_owned());
    }
    if cli.scan_interval.is_zero() {
        return Err("invalid --scan-interval 0s: expected a positive duration, e.g. 60s".to_owned());
    }
    vgpu_api::validate_group(&cli.group).map_err(|e| format!("invalid --group: {e}"))?;
    let mut config = AgentConfig::new(node);
    config.sysfs_root = cli.sysfs_root.clone();
    if !cli.pci_ids.is_empty() {
        config.pci_ids_paths = cli.pci_ids.clone();
    }
    config.scan_interval = cli.scan_interval;
    config.group = cli.group.clone();
    config.label_domain = match &cli.label_domain {
        Some(domain) => {
            vgpu_api::validate_group(domain).map_err(|_| {
                format!("invalid --label-domain {domain:?}: expected a DNS subdomain such as gpu.example.com")
            })?;
            domain.clone()
        }
        None => cli.group.clone(),
    };
    let reference = cli.vendors_configmap.trim();
    config.vendors_config_map = if reference.is_empty() {
        None
    } else {
        Some(parse_config_map_ref(reference).map_err(|e| format!("invalid --vendors-configmap: {e}"))?)
    };
    config.allow_control_plane = cli.allow_control_plane;
    config.watch_uevents = !cli.disable_pci_uevents;
    Ok(config)
}

async fn run(cli: Cli, config: AgentConfig) -> anyhow::Result<()> {
    let client = cli.kube.client(vgpu_bins::COMPONENT_RATE).await?;
    let cluster = KubeCluster::new(client, &config.group)?;
    tracing::info!(config = ?config, "starting the node agent");
    let shutdown = shutdown_signal()?;
    NodeAgent::new(Arc::new(cluster), config).run(shutdown).await?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-node-agent: {e}");
        return ExitCode::from(2);
    }
    if let Some(Command::VfioSwitch(args)) = &cli.command {
        return vfio_switch(args);
    }
    let config = match agent_config(&cli) {
        Ok(c) => c,
        Err(e) => return bad_flag(e),
    };
    vgpu_bins::run_async("vgpu-node-agent", &cli.pprof.clone(), run(cli, config))
}
