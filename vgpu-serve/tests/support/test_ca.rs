//! A throw-away certificate authority for TLS tests (included with `#[path]` by `vgpu-serve`'s unit tests and
//! `vgpu-scheduler/tests/client_auth.rs`): the CA's PEM, and leaf certificates it signs for a server
//! (`localhost`) or a client.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use rustls::pki_types::CertificateDer;

/// A self-signed CA.
pub struct TestCa {
    /// The CA certificate (PEM).
    pub pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { pem: cert.pem(), issuer: rcgen::Issuer::new(params, key) }
    }

    /// A leaf certificate and its key (PEM) with common name `name`: `server` for `localhost` with the
    /// server-auth usage, else a client certificate.
    pub fn leaf(&self, name: &str, server: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let sans = if server { vec!["localhost".to_owned()] } else { Vec::new() };
        let mut params = rcgen::CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        (params.signed_by(&key, &self.issuer).unwrap().pem(), key.serialize_pem())
    }

    /// A client certificate (DER) with common name `name`.
    pub fn client(&self, name: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(self.leaf(name, false).0.as_bytes()).unwrap()
    }
}
