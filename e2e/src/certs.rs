//! Key material for the test API server: a CA, a serving certificate for 127.0.0.1, and a
//! service-account signing key. All ECDSA P-256, generated fresh for every environment.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// First address of the service CIDR given to kube-apiserver (`--service-cluster-ip-range`).
/// The `kubernetes` Service's ClusterIP: only a name in the certificate, unless kube-proxy runs on a
/// real node ([`crate::TestEnvBuilder::cluster_services`]).
pub(crate) const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// PEM-encoded material, ready to be written to files.
pub(crate) struct Pki {
    pub(crate) ca_cert: String,
    pub(crate) serving_cert: String,
    pub(crate) serving_key: String,
    pub(crate) sa_private_key: String,
    pub(crate) sa_public_key: String,
}

/// `extra_ips`: more addresses the serving certificate names (the host's, when pods reach the API server).
pub(crate) fn generate(extra_ips: &[Ipv4Addr]) -> Result<Pki> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "vgpu-e2e-ca");
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?).context("self-signing the test CA")?;

    let mut serving = CertificateParams::new(vec![
        "localhost".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default".to_owned(),
        "kubernetes.default.svc".to_owned(),
    ])?;
    serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(SERVICE_IP)));
    for ip in extra_ips {
        serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(*ip)));
    }
    serving.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate()?;
    let serving_cert = serving.signed_by(&serving_key, &ca).context("signing the API server certificate")?;

    let sa_key = KeyPair::generate()?;
    Ok(Pki {
        ca_cert: ca.pem(),
        serving_cert: serving_cert.pem(),
        serving_key: serving_key.serialize_pem(),
        sa_private_key: sa_key.serialize_pem(),
        sa_public_key: sa_key.public_key_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_pem_material() {
        let pki = generate(&[Ipv4Addr::new(192, 0, 2, 7)]).unwrap();
        assert!(pki.ca_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.serving_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_ne!(pki.ca_cert, pki.serving_cert);
        assert!(pki.serving_key.contains("PRIVATE KEY"));
        assert!(pki.sa_private_key.contains("PRIVATE KEY"));
        assert!(pki.sa_public_key.starts_with("-----BEGIN PUBLIC KEY-----"));
    }
}
