//! The Kubernetes client of a vgpu binary: where its configuration comes from and its rate limit.
//!
//! | flags | configuration (client-go `clientcmd.BuildConfigFromFlags`) |
//! |---|---|
//! | neither | in-cluster service account, else `$KUBECONFIG`, else `~/.kube/config` (`kube::Config::infer`) |
//! | `--kubeconfig F` | the current context of `F` |
//! | `--kubeconfig F --master U` | the current context of `F`, with the API server URL `U` |
//! | `--master U` | only the URL `U`: no credentials, system trust roots (as client-go, which reads no file then) |
//!
//! `U` is an `http(s)://host[:port][/path]` URL or a bare `host:port`, read as `https://host:port` (client-go's
//! `rest.DefaultServerURL`). The client's outermost layer is the [`crate::rate_limit`] token bucket of
//! `--kube-api-qps` / `--kube-api-burst`.

use std::path::{Path, PathBuf};

use crate::rate_limit::{RateLimitError, RateLimitLayer, TokenBucket};

/// A Kubernetes configuration or client that could not be made; each variant names the flag or file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// `--kubeconfig` could not be read or parsed.
    #[error("reading --kubeconfig {}", path.display())]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// `--kubeconfig` was read but names no usable context, cluster or user.
    #[error("loading --kubeconfig {}", path.display())]
    LoadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither flag was given and no configuration was found.
    #[error(
        "no Kubernetes configuration (not in a cluster, no --kubeconfig, no $KUBECONFIG or ~/.kube/config)"
    )]
    Infer(#[source] kube::config::InferConfigError),
    /// `--master` is not a URL.
    #[error(
        "--master {value:?} is not an API server URL (expected https://host[:port] or host:port): {reason}"
    )]
    Master {
        /// The flag's value.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// `--kube-api-qps` / `--kube-api-burst` make no token bucket.
    #[error(transparent)]
    RateLimit(#[from] RateLimitError),
    /// kube could not build the client (TLS material, proxy, ...).
    #[error("building the Kubernetes client")]
    Build(#[source] kube::Error),
}

/// Everything a binary's flags say about its Kubernetes client.
///
/// ```
/// use vgpu_kube::ClientOptions;
///
/// let options = ClientOptions::new(20.0, 30).master("127.0.0.1:6443");
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// let config = rt.block_on(options.config())?;
/// assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
/// let bad = rt.block_on(ClientOptions::new(20.0, 30).master("https://").config()).unwrap_err();
/// assert!(bad.to_string().starts_with("--master \"https://\" is not an API server URL"), "{bad}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ClientOptions {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--master`.
    pub master: Option<String>,
    /// `--kube-api-qps` (client-go's reading: `< 0` no limit, `0` its default 5).
    pub qps: f32,
    /// `--kube-api-burst` (`0`: client-go's default 10).
    pub burst: u32,
}

impl ClientOptions {
    /// Options with this QPS and burst, the configuration found as with no flags.
    pub fn new(qps: f32, burst: u32) -> Self {
        Self { kubeconfig: None, master: None, qps, burst }
    }

    /// With `--kubeconfig`.
    #[must_use]
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    /// With `--master`.
    #[must_use]
    pub fn master(mut self, url: impl Into<String>) -> Self {
        self.master = Some(url.into());
        self
    }

    /// The configuration the flags select (see the [module table](self)).
    pub async fn config(&self) -> Result<kube::Config, ClientError> {
        let master = self.master.as_deref().filter(|m| !m.is_empty()).map(parse_master).transpose()?;
        let mut config = match (&self.kubeconfig, &master) {
            (Some(path), _) => from_kubeconfig(path).await?,
            (None, Some(url)) => kube::Config::new(url.clone()),
            (None, None) => kube::Config::infer().await.map_err(ClientError::Infer)?,
        };
        if let Some(url) = master {
            config.cluster_url = url;
        }
        Ok(config)
    }

    /// The token bucket of `qps` and `burst`.
    pub fn bucket(&self) -> Result<TokenBucket, ClientError> {
        Ok(TokenBucket::new(self.qps, self.burst)?)
    }

    /// A client of [`ClientOptions::config`] behind [`ClientOptions::bucket`].
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        let bucket = self.bucket()?;
        client_with_bucket(self.config().await?, bucket)
    }
}

/// `config` with kube's default retry layer off, for a client that evicts pods.
///
/// kube 5 retries every 429 up to 15 times with a delay growing to 1000 s (`Config::default_retry`). An
/// eviction's 429 is not overload but a PodDisruptionBudget's refusal: retried inside the client, it would
/// never come back as one, and the caller (which has its own backoff: `kubectl drain` waits 5 s) would hang
/// until its timeout. client-go returns it at once (it retries a 429 only with a `Retry-After` header, which
/// an eviction's refusal does not send).
pub fn without_retry(mut config: kube::Config) -> kube::Config {
    config.default_retry = false;
    config
}

/// A client of `config` whose every request first takes a token of `bucket`.
pub fn client_with_bucket(config: kube::Config, bucket: TokenBucket) -> Result<kube::Client, ClientError> {
    tracing::debug!(url = %config.cluster_url, rate = ?bucket.rate(), "Kubernetes client");
    let builder = kube::client::ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder.with_layer(&RateLimitLayer::new(bucket)).build())
}

async fn from_kubeconfig(path: &Path) -> Result<kube::Config, ClientError> {
    let file = kube::config::Kubeconfig::read_from(path)
        .map_err(|source| ClientError::ReadKubeconfig { path: path.to_owned(), source })?;
    kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|source| ClientError::LoadKubeconfig { path: path.to_owned(), source })
}

/// `--master`: a URL with scheme `http` or `https` and a host, or `host:port` read as `https://host:port`.
pub fn parse_master(value: &str) -> Result<http::Uri, ClientError> {
    let refuse = |reason: &str| ClientError::Master { value: value.to_owned(), reason: reason.to_owned() };
    let text = value.trim();
    let with_scheme = if text.contains("://") { text.to_owned() } else { format!("https://{text}") };
    let uri: http::Uri = with_scheme.parse().map_err(|e: http::uri::InvalidUri| refuse(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(refuse("the scheme must be http or https")),
    }
    match uri.host() {
        Some(host) if !host.is_empty() => {}
        _ => return Err(refuse("no host")),
    }
    // `http::Uri` keeps a port it cannot read (`host:port`) and answers `None` for it.
    let authority = uri.authority().map_or("", |a| a.as_str());
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let port = host_port.rsplit_once(':').filter(|(host, _)| !host.starts_with('[') || host.ends_with(']'));
    if let Some((_, port)) = port
        && port.parse::<u16>().is_err()
    {
        return Err(refuse("the port must be a number 0-65535"));
    }
    if uri.query().is_some() {
        return Err(refuse("a query is not allowed"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn master_forms() {
        for (value, want) in [
            ("https://10.0.0.1:6443", "https://10.0.0.1:6443/"),
            ("http://localhost:8080", "http://localhost:8080/"),
            ("api.example.com:443", "https://api.example.com:443/"),
            ("https://[::1]:6443/prefix", "https://[::1]:6443/prefix"),
        ] {
            assert_eq!(parse_master(value).unwrap().to_string(), want, "{value}");
        }
        for bad in ["ftp://host", "https://", "://x", "https://host:port", "https://h/?q=1", " "] {
            let err = parse_master(bad).unwrap_err().to_string();
            assert!(err.starts_with("--master"), "{bad}: {err}");
        }
    }

    proptest! {
        #[test]
        fn master_never_panics(value in ".{0,40}") {
            if let Ok(uri) = parse_master(&value) {
                prop_assert!(matches!(uri.scheme_str(), Some("http" | "https")));
                prop_assert!(uri.host().is_some_and(|h| !h.is_empty()));
            }
        }
    }
}
