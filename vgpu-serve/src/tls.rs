//! TLS for the vgpu servers (`--enable-tls`, `--tls-cert-file`, `--tls-key-file`, `--cert-refresh-interval`,
//! `--client-ca-file`): rustls with the ring provider, ALPN `h2` then `http/1.1` (both served by
//! [`crate::http::serve`]), a certificate that is reloaded while the server runs, and optional
//! client-certificate verification.
//!
//! [`CertReloader`] is a rustls [`ResolvesServerCert`]: every handshake takes the current certificate and key.
//! [`CertReloader::spawn_refresher`] re-reads both PEM files every refresh interval (default 5 s) and swaps in
//! the new pair when their content changed and it is valid (the key matches the certificate). A bad new pair
//! (unreadable file, no PEM block, key of another certificate — e.g. while a rotation has written only one of
//! the two files) keeps the previous certificate and logs a warning naming the files; the same bad content is
//! reported once, not on every tick.
//!
//! # Client certificates
//!
//! [`ClientCaReloader`] is a rustls [`ClientCertVerifier`] over a PEM CA bundle (`--client-ca-file`, e.g. the
//! cluster CA that signs kube-scheduler's client certificate): a certificate the client presents must chain to
//! one of the bundle's CAs, be valid now and allow client authentication (extended key usage `clientAuth`, when
//! the certificate lists extended key usages at all), or the handshake fails. The bundle is reloaded like the
//! server certificate ([`ClientCaReloader::spawn_refresher`]); a bad new bundle keeps the previous one.
//!
//! [`ClientAuth::Required`] refuses a client without a certificate during the handshake.
//! [`ClientAuth::Optional`] lets it finish the handshake without one, so that kubelet probes (which present no
//! certificate) still reach `/healthz`: the server then looks at [`VerifiedClientCert::from_connection`] and
//! refuses the other routes itself. No CA names are sent in the certificate request (clients with one
//! certificate send it, as Go's `crypto/tls` and rustls do), so the bundle can change without a restart.
//!
//! [`TlsFiles::start`] does it all: it loads the files, spawns the refreshers and returns a [`ReloadingTls`]
//! whose acceptor serves with the current files; dropping it stops the refreshers.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// Default `--cert-refresh-interval`.
pub const DEFAULT_CERT_REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// The ALPN protocols offered, in the server's order of preference: `h2` (a Go client such as kube-scheduler
/// or kube-apiserver then multiplexes all its calls on one connection; [`crate::http::serve`] serves it), then
/// `http/1.1` (vgpu-manager offers only this one; clients that ask for it alone get it).
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Whether a client must present a certificate during the handshake (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client without a certificate fails the handshake.
    Required,
    /// A client without a certificate finishes the handshake (the server decides per route); a certificate
    /// that is presented must still verify.
    Optional,
}

/// Where the certificate and key live, and how often to look for a new pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--tls-cert-file`: PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// `--tls-key-file`: PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// `--cert-refresh-interval` (also for the client CA bundle).
    pub refresh_interval: Duration,
    /// `--client-ca-file`: verify client certificates against this PEM CA bundle; `None`: no client
    /// authentication.
    pub client_ca: Option<ClientCa>,
}

/// The CA bundle client certificates must chain to, and whether one is required.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCa {
    /// PEM file with one or more `CERTIFICATE` blocks.
    pub ca_file: PathBuf,
    /// Required in the handshake, or optional.
    pub mode: ClientAuth,
}

impl TlsFiles {
    /// The two files, refreshed every [`DEFAULT_CERT_REFRESH_INTERVAL`], without client authentication.
    pub fn new(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        Self {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            refresh_interval: DEFAULT_CERT_REFRESH_INTERVAL,
            client_ca: None,
        }
    }

    /// Verifies client certificates against `ca_file`.
    #[must_use]
    pub fn with_client_ca(mut self, ca_file: impl Into<PathBuf>, mode: ClientAuth) -> Self {
        self.client_ca = Some(ClientCa { ca_file: ca_file.into(), mode });
        self
    }

    /// Loads the certificate (and the client CA bundle, if any), spawns their refreshers on the current tokio
    /// runtime and returns the acceptor; fails when a file is not usable (a server must not start without).
    pub fn start(&self) -> Result<ReloadingTls, TlsError> {
        let reloader = Arc::new(CertReloader::load(&self.cert_file, &self.key_file)?);
        let verifier = match &self.client_ca {
            None => None,
            Some(ca) => Some(Arc::new(ClientCaReloader::load(&ca.ca_file, ca.mode)?)),
        };
        let config = match &verifier {
            None => server_config(reloader.clone())?,
            Some(v) => server_config_with_client_auth(reloader.clone(), v.clone())?,
        };
        let mut refreshers = vec![reloader.spawn_refresher(self.refresh_interval)];
        if let Some(v) = &verifier {
            refreshers.push(v.spawn_refresher(self.refresh_interval));
        }
        Ok(ReloadingTls {
            acceptor: tokio_rustls::TlsAcceptor::from(config),
            client_auth: self.client_ca.as_ref().map(|c| c.mode),
            refreshers,
        })
    }
}

/// A TLS acceptor over reloading files ([`TlsFiles::start`]); dropping it stops the reloads.
pub struct ReloadingTls {
    acceptor: tokio_rustls::TlsAcceptor,
    client_auth: Option<ClientAuth>,
    refreshers: Vec<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for ReloadingTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingTls").field("client_auth", &self.client_auth).finish_non_exhaustive()
    }
}

impl ReloadingTls {
    /// The acceptor (cheap to clone; every handshake sees the current files).
    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    /// The client authentication configured, if any.
    pub fn client_auth(&self) -> Option<ClientAuth> {
        self.client_auth
    }
}

impl Drop for ReloadingTls {
    fn drop(&mut self) {
        for r in &self.refreshers {
            r.abort();
        }
    }
}

/// Why a certificate/key pair or a CA bundle could not be used.
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
    /// The client CA bundle holds no usable CA certificate.
    #[error("client CA bundle {}: {reason}; expected one or more PEM \"CERTIFICATE\" blocks of CAs", path.display())]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What was wrong.
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

/// Builds a client-certificate verifier from a PEM CA bundle (`path` names it in errors).
pub fn client_verifier(
    ca_pem: &[u8],
    path: &Path,
    mode: ClientAuth,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let bad = |reason: String| TlsError::ClientCa { path: path.to_owned(), reason };
    let certs = CertificateDer::pem_slice_iter(ca_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate found".into()));
    }
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| bad(format!("certificate {} is not a usable CA: {e}", i + 1)))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = match mode {
        ClientAuth::Required => builder,
        ClientAuth::Optional => builder.allow_unauthenticated(),
    };
    builder.build().map_err(|e| bad(e.to_string()))
}

/// The ring crypto provider every TLS piece of this crate uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Something the refresher re-reads.
trait Reload: Send + Sync + 'static {
    fn reload(&self) -> Result<bool, TlsError>;
    fn describe(&self) -> String;
    const WHAT: &'static str;
}

fn spawn_refresher<R: Reload>(this: Arc<R>, interval: Duration) -> tokio::task::JoinHandle<()> {
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
                    tracing::info!(files = %this.describe(), "{} reloaded", R::WHAT);
                }
                Ok(false) => {}
                Err(e) => {
                    let text = e.to_string();
                    // A file that stays unreadable is reported once, like bad content.
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(
                            files = %this.describe(),
                            error = %text,
                            "new {} not usable; keeping the previous one",
                            R::WHAT
                        );
                        last_error = Some(text);
                    }
                }
            }
        }
    })
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
        spawn_refresher(self.clone(), interval)
    }
}

impl Reload for CertReloader {
    const WHAT: &'static str = "TLS certificate";

    fn reload(&self) -> Result<bool, TlsError> {
        CertReloader::reload(self)
    }

    fn describe(&self) -> String {
        format!("{} {}", self.cert_file.display(), self.key_file.display())
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A client-certificate verifier over a PEM CA bundle that is reloaded while the server runs (module docs).
pub struct ClientCaReloader {
    ca_file: PathBuf,
    mode: ClientAuth,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<dyn ClientCertVerifier>>,
    /// The content last looked at (good or bad).
    seen: Mutex<Vec<u8>>,
}

impl fmt::Debug for ClientCaReloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCaReloader")
            .field("ca_file", &self.ca_file)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl ClientCaReloader {
    /// Loads the bundle; fails when it holds no usable CA certificate.
    pub fn load(ca_file: impl Into<PathBuf>, mode: ClientAuth) -> Result<Self, TlsError> {
        let ca_file = ca_file.into();
        let provider = provider();
        let pem = read(&ca_file)?;
        let verifier = client_verifier(&pem, &ca_file, mode, &provider)?;
        Ok(Self { ca_file, mode, provider, current: RwLock::new(verifier), seen: Mutex::new(pem) })
    }

    /// The CA bundle file.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// Whether a client certificate is required in the handshake.
    pub fn mode(&self) -> ClientAuth {
        self.mode
    }

    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Re-reads the bundle. `Ok(true)`: a new valid bundle is now used; `Ok(false)`: unchanged; `Err`: changed
    /// but unusable (the previous bundle stays).
    pub fn reload(&self) -> Result<bool, TlsError> {
        let pem = read(&self.ca_file)?;
        {
            let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if *seen == pem {
                return Ok(false);
            }
            seen.clone_from(&pem);
        }
        let verifier = client_verifier(&pem, &self.ca_file, self.mode, &self.provider)?;
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = verifier;
        Ok(true)
    }

    /// Reloads every `interval` until the task is aborted, logging swaps at info and bad bundles at warn.
    pub fn spawn_refresher(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        spawn_refresher(self.clone(), interval)
    }
}

impl Reload for ClientCaReloader {
    const WHAT: &'static str = "client CA bundle";

    fn reload(&self) -> Result<bool, TlsError> {
        ClientCaReloader::reload(self)
    }

    fn describe(&self) -> String {
        self.ca_file.display().to_string()
    }
}

impl ClientCertVerifier for ClientCaReloader {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mode == ClientAuth::Required
    }

    /// Empty: no CA names in the certificate request (module docs), so the bundle can be swapped.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

/// The certificate chain a client presented and the verifier accepted, for the request handlers (set per
/// connection by the server; absent on plain HTTP and for clients without a certificate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedClientCert {
    /// The chain, leaf first.
    pub chain: Arc<Vec<CertificateDer<'static>>>,
}

impl VerifiedClientCert {
    /// The verified chain of a finished handshake, if the client presented one. rustls only records a peer
    /// chain after its verifier accepted it, so a chain here is a verified one.
    pub fn from_connection(conn: &rustls::ServerConnection) -> Option<Self> {
        conn.peer_certificates()
            .filter(|c| !c.is_empty())
            .map(|c| Self { chain: Arc::new(c.iter().map(|d| d.clone().into_owned()).collect()) })
    }
}

/// A rustls server configuration over a resolver: ring provider, safe default protocol versions, no client
/// authentication, ALPN [`ALPN_PROTOCOLS`].
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    Ok(with_alpn(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver),
    ))
}

/// Like [`server_config`], with client certificates checked by `verifier` (e.g. a [`ClientCaReloader`]).
pub fn server_config_with_client_auth(
    resolver: Arc<dyn ResolvesServerCert>,
    verifier: Arc<dyn ClientCertVerifier>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    Ok(with_alpn(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(resolver),
    ))
}

fn with_alpn(mut config: rustls::ServerConfig) -> Arc<rustls::ServerConfig> {
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS acceptor over a reloading certificate, without client authentication.
pub fn acceptor(reloader: Arc<CertReloader>) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    Ok(tokio_rustls::TlsAcceptor::from(server_config(reloader)?))
}

/// A TLS acceptor over a reloading certificate that verifies client certificates with `verifier`.
pub fn acceptor_with_client_auth(
    reloader: Arc<CertReloader>,
    verifier: Arc<ClientCaReloader>,
) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    Ok(tokio_rustls::TlsAcceptor::from(server_config_with_client_auth(reloader, verifier)?))
}

#[cfg(test)]
#[path = "../tests/support/test_ca.rs"]
mod test_ca;

#[cfg(test)]
mod tests {
    use super::test_ca::TestCa;
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
    fn server_config_offers_h2_then_http11() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = pair("x");
        std::fs::write(dir.path().join("c"), c).unwrap();
        std::fs::write(dir.path().join("k"), k).unwrap();
        let r = Arc::new(CertReloader::load(dir.path().join("c"), dir.path().join("k")).unwrap());
        let cfg = server_config(r).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn client_verifier_accepts_the_cas_certificates_only() {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        let (ca, other) = (TestCa::new("client CA"), TestCa::new("other CA"));
        std::fs::write(&ca_file, &ca.pem).unwrap();
        let now = UnixTime::now();

        let required = ClientCaReloader::load(&ca_file, ClientAuth::Required).unwrap();
        assert!(required.offer_client_auth() && required.client_auth_mandatory());
        assert!(required.root_hint_subjects().is_empty());
        required.verify_client_cert(&ca.client("kube-scheduler"), &[], now).unwrap();
        let e = required.verify_client_cert(&other.client("intruder"), &[], now).unwrap_err();
        assert!(matches!(e, rustls::Error::InvalidCertificate(_)), "{e:?}");

        let optional = ClientCaReloader::load(&ca_file, ClientAuth::Optional).unwrap();
        assert!(optional.offer_client_auth() && !optional.client_auth_mandatory());
        optional.verify_client_cert(&ca.client("kube-scheduler"), &[], now).unwrap();
        assert!(optional.verify_client_cert(&other.client("intruder"), &[], now).is_err());

        // Reload: the other CA replaces the first; a bad bundle keeps the current one.
        std::fs::write(&ca_file, &other.pem).unwrap();
        assert!(required.reload().unwrap());
        required.verify_client_cert(&other.client("new"), &[], now).unwrap();
        assert!(required.verify_client_cert(&ca.client("old"), &[], now).is_err());
        std::fs::write(&ca_file, "not pem").unwrap();
        let e = required.reload().unwrap_err();
        assert!(
            matches!(e, TlsError::ClientCa { .. }) && e.to_string().contains("no certificate found"),
            "{e}"
        );
        required.verify_client_cert(&other.client("still"), &[], now).unwrap();
        assert!(!required.reload().unwrap(), "same bad content is not re-reported");

        let e = ClientCaReloader::load(&ca_file, ClientAuth::Required).unwrap_err();
        assert!(e.to_string().starts_with(&format!("client CA bundle {}: ", ca_file.display())), "{e}");
        let e = ClientCaReloader::load(dir.path().join("missing"), ClientAuth::Required).unwrap_err();
        assert!(matches!(e, TlsError::Read { .. }), "{e}");
    }

    /// Real handshakes over loopback: the CA's client certificate passes, another CA's and none fail with
    /// [`ClientAuth::Required`]; with [`ClientAuth::Optional`] none passes (and is seen as none).
    #[tokio::test]
    async fn handshakes_with_client_certificates() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let server_ca = TestCa::new("server CA");
        let (server_cert, server_key) = server_ca.leaf("localhost", true);
        let (ca, other) = (TestCa::new("client CA"), TestCa::new("other CA"));
        std::fs::write(dir.path().join("tls.crt"), server_cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), server_key).unwrap();
        std::fs::write(dir.path().join("ca.crt"), &ca.pem).unwrap();

        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(
            CertificateDer::pem_slice_iter(server_ca.pem.as_bytes()).map(Result::unwrap),
        );
        let client_config = |issuer: Option<&TestCa>| {
            let builder = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots.clone());
            let config = match issuer {
                None => builder.with_no_client_auth(),
                Some(ca) => {
                    let (cert, key) = ca.leaf("client", false);
                    let cert = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
                    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
                    builder.with_client_auth_cert(vec![cert], key).unwrap()
                }
            };
            tokio_rustls::TlsConnector::from(Arc::new(config))
        };

        for mode in [ClientAuth::Required, ClientAuth::Optional] {
            let files = TlsFiles::new(dir.path().join("tls.crt"), dir.path().join("tls.key"))
                .with_client_ca(dir.path().join("ca.crt"), mode);
            let tls = files.start().unwrap();
            assert_eq!(tls.client_auth(), Some(mode));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let acceptor = tls.acceptor().clone();
            // The server answers each accepted connection with whether it saw a verified client certificate.
            let server = tokio::spawn(async move {
                loop {
                    let (tcp, _) = listener.accept().await.unwrap();
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        if let Ok(mut stream) = acceptor.accept(tcp).await {
                            let seen = VerifiedClientCert::from_connection(stream.get_ref().1).is_some();
                            let _ = stream.write_all(if seen { b"cert" } else { b"none" }).await;
                            let _ = stream.shutdown().await;
                        }
                    });
                }
            });
            let talk = |connector: tokio_rustls::TlsConnector| async move {
                let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                // TLS 1.3: a refused client certificate shows on the first read, not in `connect`.
                let mut stream = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
                let mut answer = String::new();
                stream.read_to_string(&mut answer).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(answer)
            };
            assert_eq!(talk(client_config(Some(&ca))).await.unwrap(), "cert", "{mode:?}");
            let e = talk(client_config(Some(&other))).await.unwrap_err();
            assert!(e.contains("UnknownCA") || e.contains("BadCertificate"), "{mode:?}: {e}");
            match mode {
                ClientAuth::Required => {
                    let e = talk(client_config(None)).await.unwrap_err();
                    assert!(e.contains("CertificateRequired") || e.contains("HandshakeFailure"), "{e}");
                }
                ClientAuth::Optional => assert_eq!(talk(client_config(None)).await.unwrap(), "none"),
            }
            server.abort();
        }
    }
}
