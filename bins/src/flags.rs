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
//!
//! The serving flags, each group taken by the binaries that serve that way:
//!
//! | flags | struct | binaries |
//! |---|---|---|
//! | `--server-bind-address`, `--cert-dir`, `--tls-cert-name`, `--tls-key-name` | [`WebhookServerArgs`] | controller, webhook (controller-runtime's webhook server flags) |
//! | `--enable-tls`, `--tls-key-file`, `--tls-cert-file`, `--cert-refresh-interval` | [`TlsFileArgs`] | scheduler extender, device monitor |
//!
//! `--server-bind-port` stays with each binary: its default or help differs between them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use vgpu_kube::ClientOptions;
use vgpu_serve::tls::TlsFiles;

/// A flag value that a group's check refuses: the flag, and the message the binary prints before exiting 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlagError {
    /// The refused flag, without its dashes (`enable-tls`).
    pub flag: &'static str,
    message: String,
}

impl FlagError {
    /// `invalid value for --<flag>: <reason>`.
    fn invalid_value(flag: &'static str, reason: impl std::fmt::Display) -> Self {
        Self { flag, message: format!("invalid value for --{flag}: {reason}") }
    }

    /// Prints `<bin>: <message>` to stderr and returns exit status 2, which the binary returns before doing
    /// anything else.
    pub fn exit(&self, bin: &str) -> std::process::ExitCode {
        eprintln!("{bin}: {self}");
        std::process::ExitCode::from(2)
    }
}

impl std::fmt::Display for FlagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FlagError {}

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

/// `--server-bind-address`, `--cert-dir`, `--tls-cert-name`, `--tls-key-name`: an HTTPS server on
/// controller-runtime's webhook server flags, its certificate and key read from `<--cert-dir>/<name>` (the
/// controller's and the webhook's). `--server-bind-port` is each binary's own (its help differs).
#[derive(Clone, Debug, clap::Args)]
pub struct WebhookServerArgs {
    /// Address of the HTTPS server.
    #[arg(long, value_name = "IP", default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    pub server_bind_address: IpAddr,
    /// Directory holding the serving certificate and key.
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs")]
    pub cert_dir: PathBuf,
    /// Certificate file name in --cert-dir (PEM chain, leaf first).
    #[arg(long, default_value = "tls.crt")]
    pub tls_cert_name: String,
    /// Key file name in --cert-dir (PEM).
    #[arg(long, default_value = "tls.key")]
    pub tls_key_name: String,
}

impl WebhookServerArgs {
    /// Refuses a blank `--tls-cert-name` or `--tls-key-name` (the error names the flag).
    pub fn check(&self) -> Result<(), FlagError> {
        for (flag, name) in [("tls-cert-name", &self.tls_cert_name), ("tls-key-name", &self.tls_key_name)] {
            if name.trim().is_empty() {
                return Err(FlagError {
                    flag,
                    message: format!("invalid --{flag} \"\": expected a file name in --cert-dir"),
                });
            }
        }
        Ok(())
    }

    /// `<--cert-dir>/<--tls-cert-name>`.
    pub fn cert_file(&self) -> PathBuf {
        self.cert_dir.join(&self.tls_cert_name)
    }

    /// `<--cert-dir>/<--tls-key-name>`.
    pub fn key_file(&self) -> PathBuf {
        self.cert_dir.join(&self.tls_key_name)
    }

    /// The certificate and key files, re-read at [`vgpu_serve::tls`]'s default interval.
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles::new(self.cert_file(), self.key_file())
    }

    /// `<--server-bind-address>:<port>`, the port being the binary's `--server-bind-port`.
    pub fn bind_address(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.server_bind_address, port)
    }
}

/// `--enable-tls`, `--tls-key-file`, `--tls-cert-file`, `--cert-refresh-interval`: HTTPS with certificate and
/// key files re-read when they change, plain HTTP without `--enable-tls` (the scheduler extender's and the
/// device monitor's).
#[derive(Clone, Debug, clap::Args)]
pub struct TlsFileArgs {
    /// Serve HTTPS with --tls-cert-file and --tls-key-file (reloaded when they change).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_name = "BOOL", value_parser = crate::go_flags::parse_go_bool, action = clap::ArgAction::Set)]
    pub enable_tls: bool,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// TLS certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// How often the TLS files are checked for changes (Go duration).
    #[arg(long, default_value = "5s", value_parser = crate::parse_go_duration)]
    pub cert_refresh_interval: Duration,
}

impl TlsFileArgs {
    /// The files to serve HTTPS with, re-read every `--cert-refresh-interval`: `None` without `--enable-tls`
    /// (the file flags are then ignored, as in Go); with it, both `--tls-cert-file` and `--tls-key-file` are
    /// required, else the error names `--enable-tls` and both file flags.
    pub fn files(&self) -> Result<Option<TlsFiles>, FlagError> {
        if !self.enable_tls {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            return Err(FlagError::invalid_value(
                "enable-tls",
                "--tls-cert-file and --tls-key-file are both required",
            ));
        };
        Ok(Some(TlsFiles { refresh_interval: self.cert_refresh_interval, ..TlsFiles::new(cert, key) }))
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

    #[derive(Parser, Debug)]
    struct ServeCli {
        #[command(flatten)]
        webhook: WebhookServerArgs,
        #[command(flatten)]
        tls: TlsFileArgs,
    }

    fn serve(args: &[&str]) -> ServeCli {
        ServeCli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn webhook_server_files_and_address() {
        let d = serve(&[]).webhook;
        d.check().unwrap();
        assert_eq!(d.cert_file(), PathBuf::from("/tmp/k8s-webhook-server/serving-certs/tls.crt"));
        assert_eq!(d.key_file(), PathBuf::from("/tmp/k8s-webhook-server/serving-certs/tls.key"));
        assert_eq!(d.bind_address(9443), "0.0.0.0:9443".parse().unwrap());
        let w = serve(&[
            "--server-bind-address=127.0.0.1",
            "--cert-dir=/c",
            "--tls-cert-name=a",
            "--tls-key-name=b",
        ])
        .webhook;
        let files = w.tls_files();
        assert_eq!((files.cert_file, files.key_file), (PathBuf::from("/c/a"), PathBuf::from("/c/b")));
        assert_eq!(files.refresh_interval, vgpu_serve::tls::DEFAULT_CERT_REFRESH_INTERVAL);
        assert_eq!(w.bind_address(1), "127.0.0.1:1".parse().unwrap());
        assert!(ServeCli::try_parse_from(["x", "--server-bind-address=host"]).is_err());
    }

    #[test]
    fn webhook_server_refuses_blank_file_names_naming_the_flag() {
        for (args, flag) in [
            (&["--tls-cert-name="][..], "tls-cert-name"),
            (&["--tls-key-name= "], "tls-key-name"),
            (&["--tls-cert-name=", "--tls-key-name="], "tls-cert-name"),
        ] {
            let err = serve(args).webhook.check().unwrap_err();
            assert_eq!(err.flag, flag, "{args:?}");
            assert_eq!(err.to_string(), format!("invalid --{flag} \"\": expected a file name in --cert-dir"));
        }
    }

    #[test]
    fn tls_files_need_both_files_with_enable_tls() {
        let off = serve(&["--tls-cert-file=c", "--enable-tls=false"]).tls;
        assert_eq!(off.files().unwrap(), None);
        assert_eq!(off.cert_refresh_interval, Duration::from_secs(5));
        for args in [
            &["--enable-tls"][..],
            &["--enable-tls=true", "--tls-cert-file=c"],
            &["--enable-tls=T", "--tls-key-file=k"],
        ] {
            let err = serve(args).tls.files().unwrap_err();
            assert_eq!(err.flag, "enable-tls", "{args:?}");
            assert_eq!(
                err.to_string(),
                "invalid value for --enable-tls: --tls-cert-file and --tls-key-file are both required"
            );
        }
        let on = serve(&[
            "--enable-tls",
            "--tls-cert-file=c",
            "--tls-key-file=k",
            "--cert-refresh-interval=1m30s",
        ])
        .tls
        .files()
        .unwrap()
        .unwrap();
        assert_eq!((on.cert_file, on.key_file), (PathBuf::from("c"), PathBuf::from("k")));
        assert_eq!(on.refresh_interval, Duration::from_secs(90));
        assert!(on.client_ca.is_none());
        assert!(ServeCli::try_parse_from(["x", "--cert-refresh-interval=5"]).is_err());
        assert!(ServeCli::try_parse_from(["x", "--enable-tls", "yes"]).is_err());
    }
}
