//! `vgpu-scheduler-extender`: the kube-scheduler extender for vGPU placement (contract §1.2, §3).
//!
//! Thin wiring: parse flags → validate gates → Kubernetes client → watch-driven cache, optional leader
//! election, HTTP(S) server until SIGTERM/SIGINT.
//!
//! Callers: by default the server listens on `0.0.0.0` but answers callers beyond loopback only on `/healthz`
//! and `/readyz` (the kubelet's probes on the pod IP, which vgpu-manager's chart declares for this container;
//! the verbs, `/metrics` and `/version` stay loopback-only, as kube-scheduler calls them from the same pod).
//! `--enable-tls` with `--client-ca-file` serves every caller on `0.0.0.0`, every route but `/healthz` and
//! `/readyz` needing a client certificate of that CA; `--server-bind-address` binds exactly that address
//! (`127.0.0.1`: loopback only; another one: every route open to whoever reaches it, logged as a warning
//! over plain HTTP).
//! `--enable-rbac` authorizes `/metrics` by bearer token (TokenReview + SubjectAccessReview, `get` on the
//! non-resource URL `/metrics`), as vgpu-manager's device monitor does; the extender's identity then needs
//! `create` on `tokenreviews` and `subjectaccessreviews` (ClusterRole `system:auth-delegator`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use vgpu_bins::{CoreGateArgs, configure_gates, parse_go_duration, shutdown_signal};
use vgpu_core::clock::SystemClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_gates::{CoreGate, FeatureGates};
use vgpu_lease::{LeaderConfig, LeaderMode, Readiness, leader};
use vgpu_scheduler::event_queue::DeferConfig;
use vgpu_scheduler::metrics::Metrics;
use vgpu_scheduler::server::{AppState, ServerConfig};
use vgpu_scheduler::work::WorkLimits;
use vgpu_scheduler::{BindWrites, CacheDriver, Extender, ExtenderConfig, KubeCluster};
use vgpu_serve::authz::Authorizer;
use vgpu_serve::tls::ClientAuth;

/// The kube-scheduler extender for vGPU placement.
#[derive(Debug, Parser)]
#[command(name = "vgpu-scheduler-extender", version, about)]
struct Cli {
    /// Scheduler name, also the source of the events the extender records.
    #[arg(long, default_value = vgpu_scheduler::DEFAULT_SCHEDULER_NAME)]
    scheduler_name: String,
    /// Port of the HTTP(S) server.
    #[arg(long, default_value_t = vgpu_scheduler::DEFAULT_PORT)]
    server_bind_port: u16,
    /// Address of the HTTP(S) server, every route served there. Default: 0.0.0.0 with only `/healthz` and
    /// `/readyz` answered beyond loopback (with --enable-tls and --client-ca-file: every route, behind client
    /// certificates). An explicit non-loopback address without client certificates lets anyone who reaches
    /// the port call the verbs.
    #[arg(long, value_name = "IP")]
    server_bind_address: Option<IpAddr>,
    // --enable-tls, --tls-key-file, --tls-cert-file, --cert-refresh-interval.
    #[command(flatten)]
    tls: vgpu_bins::TlsFileArgs,
    /// Verify client certificates against this PEM CA bundle (reloaded when it changes): every route but
    /// /healthz and /readyz then needs a client certificate signed by it (kube-scheduler's extender
    /// `tlsConfig.certFile`/`keyFile`). Requires --enable-tls.
    #[arg(long, value_name = "FILE", display_order = HELP_AFTER_ENABLE_TLS)]
    client_ca_file: Option<PathBuf>,
    /// Authorize /metrics by bearer token: the API server must authenticate the token (TokenReview) and
    /// allow its user `get` on the non-resource URL /metrics (SubjectAccessReview); 401/403 otherwise.
    /// Decisions are cached 10s (allowed) / 2s (refused).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set, display_order = HELP_AFTER_ENABLE_TLS)]
    enable_rbac: bool,
    /// How long a pre-allocation holds GPUs before the pod must be bound (Go duration, ≥ 1s).
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    stuck_grace_period: Duration,
    /// Follow the co-located kube-scheduler's Lease: ready only while it is held by our identity prefix. Not with
    /// --leader-elect (`--watch-lease=false --leader-elect` is fine, as in Go).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    watch_lease: bool,
    /// Elect a leader among the extender replicas on a Lease; followers are not ready.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Identity prefix in the Lease (default: $POD_NAME, else $HOSTNAME, else the host name).
    #[arg(long)]
    leader_identity_prefix: Option<String>,
    /// Name of the Lease (required with --leader-elect or --watch-lease).
    #[arg(long)]
    leader_elect_resource_name: Option<String>,
    /// Namespace of the Lease (default: $POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE")]
    leader_elect_resource_namespace: Option<String>,
    /// Filter, filter-dryrun, prioritize and preempt calls computed at once, each on its own thread
    /// (default: the CPUs this process may use, at most 16).
    #[arg(long, value_name = "N")]
    max_running_verbs: Option<usize>,
    /// Verb calls (bind included) inside the server at once: reading their body, waiting for a worker or
    /// running; more are refused before their body is read (default: 4 × --max-running-verbs, at least 16).
    /// Request bodies held at once are at most this × 7 MiB.
    #[arg(long, value_name = "N")]
    max_admitted_verbs: Option<usize>,
    /// Longest wait of an admitted call for a free worker before it is refused as busy (Go duration).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    verb_queue_timeout: Duration,
    /// Async worker threads serving HTTP, the watches and the API calls (0: one per CPU this process may
    /// use, or TOKIO_WORKER_THREADS). One by default: kube-scheduler calls filter, prioritize and preempt one
    /// pod at a time, binds wait on the API server, and large bodies are computed on threads of their own
    /// (--max-running-verbs), so a second worker adds cross-thread wake-ups, not throughput (a sixth less CPU
    /// per pod with one on 2 cores, issue #35).
    #[arg(long, default_value_t = 1, value_name = "N")]
    worker_threads: usize,
    /// Resource and annotation domain.
    #[arg(long, default_value = "nvidia.com")]
    domain: String,
    /// Send the Normal events of a pod scheduled without trouble (FilteringSucceed, BindingSucceed), as
    /// vgpu-manager does; `false` saves two API writes per pod (warnings are always sent).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_name = "BOOL", value_parser = vgpu_bins::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    success_events: bool,
    /// Success events sent per second at most on average (0: no limit); the rest wait their turn (see
    /// --event-quiet-period; with 0 there they are dropped). Warnings are never limited.
    #[arg(long, default_value_t = vgpu_scheduler::extender::DEFAULT_EVENT_QPS, value_name = "N")]
    event_qps: u32,
    /// Burst of --event-qps.
    #[arg(long, default_value_t = vgpu_scheduler::extender::DEFAULT_EVENT_BURST, value_name = "N")]
    event_burst: u32,
    /// Success events wait until no filter or bind has started for this long, so a burst of pods is bound
    /// before its events compete with the bindings for the API server (Go duration; 0: sent at once).
    #[arg(long, default_value = "250ms", value_parser = parse_go_duration)]
    event_quiet_period: Duration,
    /// ... but no longer than this: under steady load, success events go out this late at most (Go duration).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    event_max_delay: Duration,
    /// How a bind writes the pre-allocation onto the pod: `binding` (one write: the binding carries the
    /// labels and annotations; needs kube-apiserver 1.35+ with PodTopologyLabelsAdmission, on by default),
    /// `patch` (a merge patch, then the binding: any version), `auto` (binding from 1.35 on, the first bound
    /// pod read back and, if its labels were dropped, repaired and patch from then on; patch before 1.35).
    #[arg(long, value_enum, default_value_t = BindWritesArg::Auto)]
    bind_writes: BindWritesArg,
    #[command(flatten)]
    kube: vgpu_bins::KubeClientArgs,
    #[command(flatten)]
    log: vgpu_bins::LogArgs,
    #[command(flatten)]
    pprof: vgpu_bins::PprofArgs,
    #[command(flatten)]
    gates: CoreGateArgs,
}

/// `--help` lists `--client-ca-file` and `--enable-rbac` between `--enable-tls` and `--tls-key-file`, as before
/// the TLS flags were shared: the position of `--tls-key-file` (the 5th flag declared; clap numbers the flags
/// from 0 in declaration order and sorts a tie by name, `client-ca-file` < `enable-rbac` < `tls-key-file`).
const HELP_AFTER_ENABLE_TLS: usize = 4;

fn bad_flag(flag: &str, err: impl std::fmt::Display) -> ExitCode {
    eprintln!("vgpu-scheduler-extender: invalid value for --{flag}: {err}");
    ExitCode::from(2)
}

/// The leader-election settings from the flags (names required when a lease mode is on).
fn leader_config(cli: &Cli) -> Result<LeaderConfig, ExitCode> {
    let mode =
        LeaderMode::from_flags(cli.leader_elect, cli.watch_lease).map_err(|e| bad_flag("leader-elect", e))?;
    if mode == LeaderMode::Off {
        return Ok(LeaderConfig::off());
    }
    let name = cli.leader_elect_resource_name.clone().unwrap_or_default();
    let namespace = cli.leader_elect_resource_namespace.clone().unwrap_or_default();
    let mut config = LeaderConfig::new(mode, namespace, name);
    if let Some(prefix) = cli.leader_identity_prefix.clone().filter(|p| !p.trim().is_empty()) {
        config.identity_prefix = prefix;
    }
    config.validate().map_err(|e| bad_flag("leader-elect-resource-name", e))?;
    Ok(config)
}

fn server_config(cli: &Cli) -> Result<ServerConfig, ExitCode> {
    // Checked here rather than by clap: `--enable-tls=false` is given but off.
    if cli.client_ca_file.is_some() && !cli.tls.enable_tls {
        return Err(bad_flag("client-ca-file", "requires --enable-tls"));
    }
    let tls = cli.tls.files().map_err(|e| e.exit("vgpu-scheduler-extender"))?.map(|files| {
        // Optional in the handshake, so that kubelet probes (no certificate) reach /healthz and /readyz;
        // the server refuses every other route without one.
        match &cli.client_ca_file {
            Some(ca) => files.with_client_ca(ca, ClientAuth::Optional),
            None => files,
        }
    });
    let client_auth = tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    // Without an explicit address: all of them, the verbs behind loopback (or client certificates).
    let bind_ip = cli.server_bind_address.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let probes_only_beyond_loopback = cli.server_bind_address.is_none() && !client_auth;
    let mut work = match cli.max_running_verbs {
        Some(0) => return Err(bad_flag("max-running-verbs", "0 (expected at least 1)")),
        Some(n) => WorkLimits::with_workers(n),
        None => WorkLimits::default(),
    };
    match cli.max_admitted_verbs {
        Some(n) if n < work.max_running => {
            return Err(bad_flag(
                "max-admitted-verbs",
                format!("{n} (expected at least --max-running-verbs, {})", work.max_running),
            ));
        }
        Some(n) => work.max_admitted = n,
        None => {}
    }
    work.queue_timeout = cli.verb_queue_timeout;
    Ok(ServerConfig {
        bind_address: SocketAddr::new(bind_ip, cli.server_bind_port),
        tls,
        work,
        probes_only_beyond_loopback,
        ..ServerConfig::default()
    })
}

async fn run(
    cli: Cli,
    gates: FeatureGates<'static, CoreGate>,
    leader_config: LeaderConfig,
    server: ServerConfig,
) -> anyhow::Result<()> {
    let domain = ResourceDomain::new(&cli.domain).map_err(|e| anyhow::anyhow!("--domain: {e}"))?;
    let client = cli.kube.client(vgpu_bins::COMPONENT_RATE).await?;
    let bind_writes = match cli.bind_writes {
        BindWritesArg::Binding => BindWrites::Binding,
        BindWritesArg::Patch => BindWrites::PatchThenBinding,
        BindWritesArg::Auto => match client.apiserver_version().await {
            Ok(v) => BindWrites::auto_for(&v.major, &v.minor),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the API server version: --bind-writes=auto patches before binding");
                BindWrites::PatchThenBinding
            }
        },
    };
    tracing::info!(bind_writes = bind_writes.as_str(), "pre-allocation writes");
    let clock = Arc::new(SystemClock);
    let stuck_grace_ns = flag_ns(cli.stuck_grace_period, "stuck-grace-period")?;
    let config = ExtenderConfig {
        domain: domain.clone(),
        scheduler_name: cli.scheduler_name.clone(),
        stuck_grace_ns,
        success_events: cli.success_events,
        success_event_qps: cli.event_qps,
        success_event_burst: cli.event_burst,
        defer_success_events: defer_config(&cli)?,
        bind_writes,
        ..ExtenderConfig::from_gates(&gates)
    };
    let metrics_authz = cli.enable_rbac.then(|| Arc::new(Authorizer::kube(client.clone())));
    let cluster = KubeCluster::new(client.clone(), cli.scheduler_name.clone()).with_domain(domain);
    let metrics = Arc::new(Metrics::new());
    let extender = Arc::new(Extender::new(cluster, clock.clone(), config).with_observer(metrics.clone()));
    let readiness = Readiness::new(leader_config.initial_role());

    let stop = tokio_util::sync::CancellationToken::new();
    let cache = CacheDriver::new(client.clone(), extender.cache().clone(), readiness.clone())
        .with_clock(clock)
        .spawn(stop.clone().cancelled_owned());
    let elector =
        tokio::spawn(leader::run(client, leader_config, readiness.clone(), stop.clone().cancelled_owned()));
    let events =
        tokio::spawn(extender.clone().run_event_flusher(EVENT_FLUSH_TICK, stop.clone().cancelled_owned()));

    let shutdown = shutdown_signal()?;
    let stop_all = {
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    };
    tracing::info!(
        address = %server.bind_address,
        probes_only_beyond_loopback = server.probes_only_beyond_loopback,
        tls = server.tls.is_some(),
        client_ca = server.client_auth(),
        metrics_rbac = metrics_authz.is_some(),
        max_running_verbs = server.work.max_running,
        max_admitted_verbs = server.work.max_admitted,
        "serving the extender"
    );
    let mut state = AppState::new(extender, readiness, metrics);
    if let Some(authz) = metrics_authz {
        state = state.with_metrics_authz(authz);
    }
    let served = vgpu_scheduler::server::run(server, state, stop_all).await;
    // The server only returns early on a start-up error: stop the background tasks either way.
    stop.cancel();
    cache.await.context("the cache driver panicked")?;
    elector.await.context("the leader elector panicked")?.context("leader election")?;
    events.await.context("the event flusher panicked")?;
    served.context("the HTTP server")?;
    Ok(())
}

/// How often deferred success events are looked at (`--event-quiet-period`).
const EVENT_FLUSH_TICK: Duration = Duration::from_millis(50);

/// `--event-quiet-period` and `--event-max-delay` as the extender's deferral (`None`: quiet period 0).
fn defer_config(cli: &Cli) -> anyhow::Result<Option<DeferConfig>> {
    if cli.event_quiet_period.is_zero() {
        return Ok(None);
    }
    Ok(Some(DeferConfig {
        quiet_ns: flag_ns(cli.event_quiet_period, "event-quiet-period")?,
        max_delay_ns: flag_ns(cli.event_max_delay, "event-max-delay")?,
        ..DeferConfig::default()
    }))
}

/// A duration flag in nanoseconds, as the extender's settings hold them.
fn flag_ns(d: Duration, flag: &str) -> anyhow::Result<i64> {
    i64::try_from(d.as_nanos()).with_context(|| format!("--{flag} is too large"))
}

/// `--bind-writes` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BindWritesArg {
    /// By the API server's version (see --help).
    Auto,
    /// The binding carries the pre-allocation.
    Binding,
    /// Patch, then bind.
    Patch,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        eprintln!("vgpu-scheduler-extender: {e}");
        return ExitCode::from(2);
    }
    let gates = match configure_gates(vgpu_gates::scheduler_extender(), &cli.gates.feature_gates) {
        Ok(g) => g,
        Err(code) => return code,
    };
    if cli.stuck_grace_period < Duration::from_secs(1) {
        return bad_flag(
            "stuck-grace-period",
            format!("{:?} (expected at least 1s)", cli.stuck_grace_period),
        );
    }
    let leader_config = match leader_config(&cli) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let server = match server_config(&cli) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if cli.worker_threads > 0 {
        runtime.worker_threads(cli.worker_threads);
    }
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vgpu-scheduler-extender: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let pprof = cli.pprof.clone();
    let main = async move {
        pprof.start().await?;
        run(cli, gates, leader_config, server).await
    };
    match runtime.block_on(main) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-scheduler-extender: {e:#}");
            ExitCode::FAILURE
        }
    }
}
