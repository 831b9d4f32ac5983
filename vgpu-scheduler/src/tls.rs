//! Optional TLS for the extender server (`--enable-tls`, `--tls-cert-file`, `--tls-key-file`,
//! `--cert-refresh-interval`): rustls with the ring provider, HTTP/1.1 only (ALPN `http/1.1`), and a
//! certificate that is reloaded while the server runs.
//!
//! [`CertReloader`] is a rustls [`ResolvesServerCert`]: every handshake takes the current certificate and key.
//! [`CertReloader::spawn_refresher`] re-reads both PEM files every refresh interval (default 5 s) and swaps in
//! the new pair when their content changed and it is valid (the key matches the certificate). A bad new pair
//! (unreadable file, no PEM block, key of another certificate — e.g. while a rotation has written only one of
//! the two files) keeps the previous certificate and logs a warning naming the files; the same bad content is
//! reported once, not on every tick.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Default `--cert-refresh-interval`.
pub const DEFAULT_CERT_REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// The ALPN protocols offered: HTTP/1.1 only, as vgpu-manager.
pub const ALPN_PROTOCOLS: [&[u8]; 1] = [b"http/1.1"];

/// Where the certificate and key live, and how often to look for a new pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--tls-cert-file`: PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// `--tls-key-file`: PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// `--cert-refresh-interval`.
    pub refresh_interval: Duration,
}

impl TlsFiles {
    /// The two files, refreshed every [`DEFAULT_CERT_REFRESH_INTERVAL`].
    pub fn new(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        Self {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            refresh_interval: DEFAULT_CERT_REFRESH_INTERVAL,
        }
    }
}

/// Why a certificate/key pair could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The certificate file holds no usable certificate.
    #[error("{}: {reason}; expected one or more PEM \"CERTIFICATE\" blocks, leaf first", path.display())]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The key file holds no usable private key.
    #[error("{}: {reason}; expected a PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" block", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The key cannot sign for the certificate.
    #[error("{} does not match the certificate in {}: {reason}", key.display(), cert.display())]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        reason: String,
    },
    /// rustls rejected the server configuration.
    #[error("building the TLS server configuration: {0}")]
    Config(String),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

/// Parses a PEM certificate chain and private key into a rustls [`CertifiedKey`], checking that they match.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    files: (&Path, &Path),
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let (cert_path, key_path) = files;
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate { path: cert_path.to_owned(), reason: e.to_string() })?;
    if chain.is_empty() {
        return Err(TlsError::Certificate {
            path: cert_path.to_owned(),
            reason: "no certificate found".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::Key { path: key_path.to_owned(), reason: e.to_string() })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            TlsError::Mismatch { cert: cert_path.to_owned(), key: key_path.to_owned(), reason: e.to_string() }
        }
        other => TlsError::Key { path: key_path.to_owned(), reason: other.to_string() },
    })
}

/// The ring crypto provider every TLS piece of this crate uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate resolver that reloads its PEM files (module docs).
pub struct CertReloader {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The content last looked at (good or bad), to act only on changes.
    seen: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for CertReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertReloader")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl CertReloader {
    /// Loads the pair; fails when it is not usable (the server must not start without a certificate).
    pub fn load(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Result<Self, TlsError> {
        let (cert_file, key_file) = (cert_file.into(), key_file.into());
        let provider = provider();
        let (cert, key) = (read(&cert_file)?, read(&key_file)?);
        let ck = certified_key(&cert, &key, (&cert_file, &key_file), &provider)?;
        Ok(Self {
            cert_file,
            key_file,
            provider,
            current: RwLock::new(Arc::new(ck)),
            seen: Mutex::new((cert, key)),
        })
    }

    /// The certificate file.
    pub fn cert_file(&self) -> &Path {
        &self.cert_file
    }

    /// The key file.
    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    /// The certificate and key presented now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Re-reads both files. `Ok(true)`: a new valid pair is now presented; `Ok(false)`: nothing changed since
    /// the last look; `Err`: changed but unusable (the previous pair stays).
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (cert, key) = (read(&self.cert_file)?, read(&self.key_file)?);
        {
            let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.0 == cert && seen.1 == key {
                return Ok(false);
            }
            *seen = (cert.clone(), key.clone());
        }
        let ck = certified_key(&cert, &key, (&self.cert_file, &self.key_file), &self.provider)?;
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(ck);
        Ok(true)
    }

    /// Reloads every `interval` until the task is aborted (or the runtime stops), logging swaps at info and
    /// bad pairs at warn.
    pub fn spawn_refresher(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let interval = interval.max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut last_error: Option<String> = None;
            loop {
                tick.tick().await;
                match this.reload() {
                    Ok(true) => {
                        last_error = None;
                        tracing::info!(
                            cert_file = %this.cert_file.display(),
                            key_file = %this.key_file.display(),
                            "TLS certificate reloaded"
                        );
                    }
                    Ok(false) => {}
                    Err(e) => {
                        let text = e.to_string();
                        // A file that stays unreadable is reported once, like bad content.
                        if last_error.as_deref() != Some(text.as_str()) {
                            tracing::warn!(
                                cert_file = %this.cert_file.display(),
                                key_file = %this.key_file.display(),
                                error = %text,
                                "new TLS certificate not usable; keeping the previous one"
                            );
                            last_error = Some(text);
                        }
                    }
                }
            }
        })
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls server configuration over a resolver: ring provider, safe default protocol versions, no client
/// authentication, ALPN `http/1.1` only.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A TLS acceptor over a reloading certificate.
pub fn acceptor(reloader: Arc<CertReloader>) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    Ok(tokio_rustls::TlsAcceptor::from(server_config(reloader)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn load_reload_and_bad_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, k1) = pair("one");
        std::fs::write(&cert, &c1).unwrap();
        std::fs::write(&key, &k1).unwrap();
        let r = CertReloader::load(&cert, &key).unwrap();
        let first = r.current();
        assert!(!r.reload().unwrap(), "unchanged");

        // Half a rotation: new certificate, old key.
        let (c2, k2) = pair("two");
        std::fs::write(&cert, &c2).unwrap();
        let e = r.reload().unwrap_err();
        assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains("tls.key does not match the certificate in"), "{e}");
        assert!(Arc::ptr_eq(&r.current(), &first), "old pair kept");
        assert!(!r.reload().unwrap(), "same bad content is not re-reported");

        std::fs::write(&key, &k2).unwrap();
        assert!(r.reload().unwrap());
        assert_ne!(r.current().cert, first.cert);

        std::fs::write(&cert, "garbage").unwrap();
        let e = r.reload().unwrap_err();
        assert!(e.to_string().contains("tls.crt: no certificate found"), "{e}");
        std::fs::remove_file(&key).unwrap();
        let e = r.reload().unwrap_err();
        assert!(e.to_string().starts_with("reading ") && e.to_string().contains("tls.key"), "{e}");
        assert!(CertReloader::load(&cert, &key).is_err());
    }

    #[test]
    fn server_config_offers_http11_only() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = pair("x");
        std::fs::write(dir.path().join("c"), c).unwrap();
        std::fs::write(dir.path().join("k"), k).unwrap();
        let r = Arc::new(CertReloader::load(dir.path().join("c"), dir.path().join("k")).unwrap());
        let cfg = server_config(r).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
