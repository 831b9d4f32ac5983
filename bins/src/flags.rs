//! The flags every vgpu-manager component takes besides its own (its charts always pass some of them), with
//! the same names and meanings, shared by our binaries:
//!
//! | flag (env) | struct | meaning |
//! |---|---|---|
//! | `--kubeconfig`, `--master` | [`KubeClientArgs`] | client-go's `BuildConfigFromFlags` ([`vgpu_kube::client`]) |
//! | `--kube-api-qps` (`KUBE_API_QPS`), `--kube-api-burst` (`KUBE_API_BURST`) | [`KubeClientArgs`] | client-go's token bucket on every request of the binary's client ([`vgpu_kube::rate_limit`]); defaults per component ([`ApiRate`]) |
//! | `-v` / `--v N` | [`LogArgs`] | verbosity: 0–1 info, 2–3 debug, 4–5 trace (our crates), ≥ 6 trace everywhere |
//! | `--vmodule PATTERN=N,...` | [`LogArgs`] | per-module verbosity; `PATTERN` is a Rust module path prefix (`vgpu_dra::state`, `vgpu_dra`), a trailing `*` allowed |
//! | `--logging-format text\|json` | [`LogArgs`] | one line per event, human-readable or JSON |
//! | `--pprof-bind-port N` | [`PprofArgs`] | CPU profiles on `127.0.0.1:N` (`/debug/pprof/profile?seconds=S`); `0` off, the default |
//!
//! `RUST_LOG`, when set, wins over `-v` and `--vmodule` (its `EnvFilter` syntax).

use std::path::PathBuf;

use anyhow::Context;
use vgpu_kube::ClientOptions;

/// A component's default `--kube-api-qps` / `--kube-api-burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApiRate {
    /// Requests per second.
    pub qps: f32,
    /// Requests at once.
    pub burst: u32,
}

/// vgpu-manager's device-plugin, device-scheduler, device-monitor and device-webhook default: 20 QPS, burst
/// 30. Our components without an upstream twin (controller, node agent, MIG manager) use it too.
pub const COMPONENT_RATE: ApiRate = ApiRate { qps: 20.0, burst: 30 };
/// vgpu-manager's kubelet-plugin default (the DRA driver's `pkgflags.KubeClientConfig`): 5 QPS, burst 10.
pub const KUBELET_PLUGIN_RATE: ApiRate = ApiRate { qps: 5.0, burst: 10 };

/// `--kubeconfig`, `--master`, `--kube-api-qps`, `--kube-api-burst`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KubeClientArgs {
    /// Kubeconfig file; default: in-cluster config, then `$KUBECONFIG` / `~/.kube/config`.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's URL (`https://host:port` or `host:port`); overrides the kubeconfig's. Alone, a
    /// client of that URL with no credentials (client-go's meaning).
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// Client-side rate limit of requests to the API server, per second (token bucket; < 0 no limit, 0
    /// client-go's 5). Default 20; the kubelet plugin 5.
    #[arg(long = "kube-api-qps", env = "KUBE_API_QPS", value_name = "QPS")]
    pub kube_api_qps: Option<f32>,
    /// Requests the rate limit lets through at once (0: client-go's 10). Default 30; the kubelet plugin 10.
    #[arg(long = "kube-api-burst", env = "KUBE_API_BURST", value_name = "N")]
    pub kube_api_burst: Option<u32>,
}

impl KubeClientArgs {
    /// The client options of these flags, `default` for the rate flags not given.
    pub fn options(&self, default: ApiRate) -> ClientOptions {
        ClientOptions {
            kubeconfig: self.kubeconfig.clone(),
            master: self.master.clone(),
            qps: self.kube_api_qps.unwrap_or(default.qps),
            burst: self.kube_api_burst.unwrap_or(default.burst),
        }
    }

    /// The rate-limited client of these flags.
    pub async fn client(&self, default: ApiRate) -> anyhow::Result<kube::Client> {
        let options = self.options(default);
        let bucket = options.bucket()?;
        tracing::info!(
            qps = options.qps,
            burst = options.burst,
            limited = bucket.rate().is_some(),
            "Kubernetes client rate limit"
        );
        let config = options.config().await?;
        vgpu_kube::client::client_with_bucket(config, bucket).context("building the Kubernetes client")
    }
}

/// `--logging-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `-v` / `--v`, `--vmodule`, `--logging-format` (klog's flags).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct LogArgs {
    /// Log verbosity: 0–1 info, 2–3 debug, 4–5 trace of our own modules, 6 and above trace of everything.
    /// `RUST_LOG` wins when set.
    #[arg(short = 'v', long = "v", value_name = "N")]
    pub verbosity: Option<u8>,
    /// Per-module verbosity, `PATTERN=N` separated by commas; `PATTERN` is a module path prefix (e.g.
    /// `vgpu_dra::state=4`), a trailing `*` allowed.
    #[arg(long, value_name = "PATTERN=N,...")]
    pub vmodule: Option<String>,
    /// Log line format.
    #[arg(long = "logging-format", value_enum, default_value_t = LogFormat::Text)]
    pub logging_format: LogFormat,
}

/// The `tracing` level of a klog verbosity.
fn level(v: u8) -> &'static str {
    match v {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    }
}

impl LogArgs {
    /// The `EnvFilter` directives of `-v` and `--vmodule` (without `RUST_LOG`); errors name `--vmodule`.
    pub fn directives(&self) -> Result<String, String> {
        let v = self.verbosity.unwrap_or(0);
        let mut directives = if v >= 6 {
            vec!["trace".to_owned()]
        } else if v >= 2 {
            // Our crates' targets all start with `vgpu` (`vgpu_dra::...`, `vgpu_device_plugin`).
            vec!["info".to_owned(), format!("vgpu={}", level(v))]
        } else {
            vec!["info".to_owned()]
        };
        for entry in self.vmodule.iter().flat_map(|m| m.split(',')).map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |why: &str| {
                format!(
                    "invalid --vmodule entry {entry:?}: {why} (expected PATTERN=N, e.g. vgpu_dra::state=4)"
                )
            };
            let (pattern, n) = entry.split_once('=').ok_or_else(|| bad("no '='"))?;
            let n: u8 = n.trim().parse().map_err(|_| bad("N is not a number 0-255"))?;
            let pattern = pattern.trim().strip_suffix('*').unwrap_or(pattern.trim());
            let valid = !pattern.is_empty()
                && pattern
                    .split("::")
                    .all(|seg| !seg.is_empty() && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            if !valid {
                return Err(bad("PATTERN is not a module path"));
            }
            directives.push(format!("{pattern}={}", level(n)));
        }
        Ok(directives.join(","))
    }

    /// Installs the global subscriber: `RUST_LOG` if set, else [`LogArgs::directives`]; text or JSON lines on
    /// stderr. A second call (tests) keeps the first subscriber.
    pub fn init(&self) -> Result<(), String> {
        use tracing_subscriber::EnvFilter;
        let directives = self.directives()?;
        let filter = match std::env::var("RUST_LOG") {
            Ok(env) if !env.trim().is_empty() => {
                EnvFilter::try_new(&env).map_err(|e| format!("invalid RUST_LOG {env:?}: {e}"))?
            }
            _ => EnvFilter::try_new(&directives)
                .map_err(|e| format!("invalid -v/--vmodule ({directives}): {e}"))?,
        };
        let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
        // A second initialisation (e.g. in tests) is harmless; ignore its error.
        let _ = match self.logging_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        };
        Ok(())
    }
}

/// `--pprof-bind-port`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PprofArgs {
    /// Serve CPU profiles (pprof format, `go tool pprof` reads them) on 127.0.0.1:PORT at
    /// `/debug/pprof/profile?seconds=S`; 0 turns it off.
    #[arg(long = "pprof-bind-port", value_name = "PORT", default_value_t = 0)]
    pub pprof_bind_port: u16,
}

impl PprofArgs {
    /// Binds `127.0.0.1:PORT` and serves CPU profiles for the rest of the process's life ([`vgpu_serve::pprof`]);
    /// nothing for port 0. A port that cannot be bound fails start-up, naming the flag.
    pub async fn start(&self) -> anyhow::Result<()> {
        let Some(addr) = vgpu_serve::pprof::listen_addr(self.pprof_bind_port) else {
            return Ok(());
        };
        let server = vgpu_serve::pprof::PprofServer::bind(addr)
            .await
            .with_context(|| format!("--pprof-bind-port {}", self.pprof_bind_port))?;
        tokio::spawn(server.serve(std::future::pending()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        kube: KubeClientArgs,
        #[command(flatten)]
        log: LogArgs,
        #[command(flatten)]
        pprof: PprofArgs,
    }

    #[test]
    fn upstream_forms_parse() {
        for args in
            [&["x", "-v=4"][..], &["x", "-v", "4"], &["x", "--v=4"], &["x", "--v", "4"], &["x", "-v4"]]
        {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(cli.log.verbosity, Some(4), "{args:?}");
        }
        let cli = Cli::try_parse_from([
            "x",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
            "--master=https://10.0.0.1:6443",
            "--vmodule=vgpu_dra::state=4,hyper*=2",
            "--logging-format=json",
            "--pprof-bind-port=6060",
        ])
        .unwrap();
        let options = cli.kube.options(COMPONENT_RATE);
        assert_eq!(
            (options.qps, options.burst, options.master.as_deref()),
            (50.0, 100, Some("https://10.0.0.1:6443"))
        );
        assert_eq!(cli.log.logging_format, LogFormat::Json);
        assert_eq!(cli.pprof.pprof_bind_port, 6060);
        assert_eq!(cli.log.directives().unwrap(), "info,vgpu_dra::state=trace,hyper=debug");
        let defaults = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(defaults.kube.options(KUBELET_PLUGIN_RATE).qps, 5.0);
        assert_eq!(defaults.pprof.pprof_bind_port, 0);
        assert!(Cli::try_parse_from(["x", "--v=-1"]).is_err());
        assert!(Cli::try_parse_from(["x", "--logging-format=xml"]).is_err());
    }

    #[test]
    fn verbosity_levels() {
        let at = |v| LogArgs { verbosity: Some(v), ..LogArgs::default() }.directives().unwrap();
        assert_eq!(at(0), "info");
        assert_eq!(at(1), "info");
        assert_eq!(at(2), "info,vgpu=debug");
        assert_eq!(at(5), "info,vgpu=trace");
        assert_eq!(at(6), "trace");
        for bad in ["vgpu_dra", "=4", "vgpu dra=4", "x=y", "a::=1", "x=300"] {
            let err = LogArgs { vmodule: Some(bad.into()), ..LogArgs::default() }.directives().unwrap_err();
            assert!(err.starts_with("invalid --vmodule entry"), "{bad}: {err}");
        }
    }
}
