//! Shared wiring for the vgpu binaries: start-up flags common to every binary, feature-gate
//! validation and logging set-up. No business logic lives here.

use std::process::ExitCode;

pub mod flags;
/// Go's boolean flag forms (`--flag`, `--flag=false`, `strconv.ParseBool`'s spellings) for every bool flag.
pub mod go_flags;

pub use flags::{
    ApiRate, COMPONENT_RATE, FlagError, KUBELET_PLUGIN_RATE, KubeClientArgs, LogArgs, PprofArgs, TlsFileArgs,
    WebhookServerArgs,
};

use vgpu_gates::{FeatureGate, FeatureGates, Registry};

/// `--feature-gates` for the Core components (device-plugin, scheduler-extender, device-monitor).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct CoreGateArgs {
    /// Feature gates, `Gate=true|false` separated by commas; may be repeated.
    #[arg(long = "feature-gates", value_name = "GATE=BOOL,...")]
    pub feature_gates: Vec<String>,
}

/// `--feature-gates` (or `FEATURE_GATES`; the flag wins) for the DRA kubelet-plugin.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct DraGateArgs {
    /// Feature gates, `Gate=true|false` separated by commas; may be repeated.
    #[arg(long = "feature-gates", env = "FEATURE_GATES", value_name = "GATE=BOOL,...")]
    pub feature_gates: Vec<String>,
}

/// Applies the gate values in order and validates the registry's rules.
///
/// On error prints it to stderr and returns exit status 2, which the binary returns before
/// doing anything else.
pub fn configure_gates<G: FeatureGate>(
    registry: &'static Registry<G>,
    values: &[String],
) -> Result<FeatureGates<'static, G>, ExitCode> {
    match registry.configure(values) {
        Ok(gates) => {
            for w in gates.warnings() {
                tracing::warn!("{w}");
            }
            tracing::info!(component = registry.component(), gates = ?gates.effective(), "Feature Gates");
            Ok(gates)
        }
        Err(e) => {
            eprintln!("{e}");
            Err(ExitCode::from(2))
        }
    }
}

/// A Kubernetes client from `--kubeconfig` (or the in-cluster config, `$KUBECONFIG`, `~/.kube/config`) at the
/// components' default rate ([`COMPONENT_RATE`]); `vgpuctl`'s. The components take [`KubeClientArgs`].
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let args = KubeClientArgs {
        kubeconfig: kubeconfig.map(std::path::Path::to_path_buf),
        ..KubeClientArgs::default()
    };
    args.client(COMPONENT_RATE).await
}

/// Runs a binary's async `main` on a multi-threaded tokio runtime, after starting `--pprof-bind-port`'s server: exit 0 when it returns `Ok`, exit 1 with
/// `<bin>: <error and its causes>` on stderr when it fails or the runtime cannot start.
pub fn run_async(
    bin: &str,
    pprof: &PprofArgs,
    main: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{bin}: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(async {
        pprof.start().await?;
        main.await
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{bin}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A future that completes on the first SIGTERM or SIGINT (logged). Installing the handlers can fail.
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use anyhow::Context;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

/// Parses a Go duration flag value (`30s`, `1m30s`, `500ms`, `2h`) into a [`std::time::Duration`].
///
/// Errors name the value and the expected form; negative durations are refused.
pub fn parse_go_duration(value: &str) -> Result<std::time::Duration, String> {
    let text = value.trim();
    if text.starts_with('-') {
        return Err(format!("{value:?} is negative (expected a duration ≥ 0)"));
    }
    vgpu_core::codec::go_duration::parse(text)
        .ok_or_else(|| format!("{value:?} is not a duration (expected e.g. 30s, 1m30s, 500ms)"))
}
