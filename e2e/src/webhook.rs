//! `vgpu-webhook` under the real kube-apiserver: its own throw-away CA and a serving certificate for
//! `127.0.0.1`, the binary started on a loopback port, and the webhook configurations of
//! `deploy/webhook/webhooks.yaml` registered with their `clientConfig` pointed at it (`url` +
//! `caBundle` instead of the in-cluster Service).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::Api;
use kube::api::PostParams;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::{TestEnv, free_port, vgpu_binary};

/// The process name of the webhook in a [`TestEnv`].
pub const WEBHOOK: &str = "vgpu-webhook";
/// The manifests registered by [`register_webhooks`].
pub const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/webhook/webhooks.yaml");
/// The webhook's ServiceAccount and RBAC, applied by [`service_account_kubeconfig`].
pub const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/webhook/rbac.yaml");

/// A running webhook: its port and the CA its certificate chains to.
#[derive(Debug, Clone)]
pub struct RunningWebhook {
    /// Loopback port of the HTTPS server.
    pub port: u16,
    /// PEM of the CA (the `caBundle`).
    pub ca_pem: String,
    /// Folder holding `tls.crt` and `tls.key` (`--cert-dir`).
    pub cert_dir: PathBuf,
}

/// A CA and a serving certificate for `127.0.0.1` and `localhost`: (CA PEM, certificate PEM, key PEM).
pub fn webhook_pki() -> Result<(String, String, String)> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "vgpu-e2e-webhook-ca");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)
        .context("self-signing the webhook CA")?;
    let mut serving = CertificateParams::new(vec!["localhost".to_owned()])?;
    serving.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    serving.distinguished_name.push(DnType::CommonName, WEBHOOK);
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = serving.signed_by(&key, &ca).context("signing the webhook certificate")?;
    Ok((ca.pem(), cert.pem(), key.serialize_pem()))
}

/// Writes a fresh certificate to `<workdir>/webhook-certs/`, starts `vgpu-webhook` on a free loopback port with
/// `kubeconfig` (default: the environment's admin kubeconfig) and `args`, and waits until it accepts
/// connections.
pub async fn start_webhook(
    env: &mut TestEnv,
    kubeconfig: Option<&Path>,
    args: &[&str],
) -> Result<RunningWebhook> {
    let (ca_pem, cert, key) = webhook_pki()?;
    let cert_dir = env.workdir().join("webhook-certs");
    std::fs::create_dir_all(&cert_dir).context("creating the webhook certificate folder")?;
    std::fs::write(cert_dir.join("tls.crt"), cert).context("writing tls.crt")?;
    std::fs::write(cert_dir.join("tls.key"), key).context("writing tls.key")?;
    let port = free_port()?;
    let mut all = vec![
        format!("--kubeconfig={}", kubeconfig.unwrap_or(env.kubeconfig_path()).display()),
        format!("--server-bind-port={port}"),
        "--server-bind-address=127.0.0.1".to_owned(),
        format!("--cert-dir={}", cert_dir.display()),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    env.start_process(WEBHOOK, &vgpu_binary(WEBHOOK)?, &all, &[("RUST_LOG".into(), "info".into())])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        env.check_process(WEBHOOK)?;
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{WEBHOOK} does not listen on 127.0.0.1:{port}\n{}", env.log_tail(WEBHOOK, 30));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(RunningWebhook { port, ca_pem, cert_dir })
}

fn client_config(webhook: &RunningWebhook, path: Option<&str>) -> WebhookClientConfig {
    WebhookClientConfig {
        url: Some(format!("https://127.0.0.1:{}{}", webhook.port, path.unwrap_or_default())),
        ca_bundle: Some(ByteString(webhook.ca_pem.clone().into_bytes())),
        service: None,
    }
}

/// Registers the Mutating- and ValidatingWebhookConfiguration of [`MANIFESTS`] with each hook's
/// `clientConfig` replaced by `https://127.0.0.1:<port><service path>` and the webhook's CA.
pub async fn register_webhooks(client: &kube::Client, webhook: &RunningWebhook) -> Result<()> {
    let registered = register_manifest_webhooks(client, Path::new(MANIFESTS), webhook).await?;
    if registered != 2 {
        bail!("{MANIFESTS}: expected one mutating and one validating configuration, found {registered}");
    }
    Ok(())
}

/// Registers every Mutating- and ValidatingWebhookConfiguration of `manifest` (other kinds are skipped) with
/// each hook's `clientConfig` pointed at `webhook` (`https://127.0.0.1:<port><service path>`, its CA);
/// returns how many configurations were created.
pub async fn register_manifest_webhooks(
    client: &kube::Client,
    manifest: &Path,
    webhook: &RunningWebhook,
) -> Result<usize> {
    let name = manifest.display();
    let text = std::fs::read_to_string(manifest).with_context(|| format!("reading {name}"))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {name}"))?;
    let mut registered = 0;
    for doc in docs {
        match doc["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => {
                let mut config: MutatingWebhookConfiguration = serde_json::from_value(doc)?;
                for hook in config.webhooks.iter_mut().flatten() {
                    let path = hook.client_config.service.as_ref().and_then(|s| s.path.clone());
                    hook.client_config = client_config(webhook, path.as_deref());
                }
                Api::<MutatingWebhookConfiguration>::all(client.clone())
                    .create(&PostParams::default(), &config)
                    .await
                    .with_context(|| format!("creating the MutatingWebhookConfiguration of {name}"))?;
                registered += 1;
            }
            Some("ValidatingWebhookConfiguration") => {
                let mut config: ValidatingWebhookConfiguration = serde_json::from_value(doc)?;
                for hook in config.webhooks.iter_mut().flatten() {
                    let path = hook.client_config.service.as_ref().and_then(|s| s.path.clone());
                    hook.client_config = client_config(webhook, path.as_deref());
                }
                Api::<ValidatingWebhookConfiguration>::all(client.clone())
                    .create(&PostParams::default(), &config)
                    .await
                    .with_context(|| format!("creating the ValidatingWebhookConfiguration of {name}"))?;
                registered += 1;
            }
            _ => {}
        }
    }
    Ok(registered)
}

/// Applies [`RBAC`] (creating its namespace) and writes a kubeconfig that acts as its ServiceAccount
/// ([`crate::rbac::manifest_kubeconfig`]); returns its path.
pub async fn service_account_kubeconfig(env: &TestEnv, client: &kube::Client) -> Result<PathBuf> {
    crate::rbac::manifest_kubeconfig(env, client, Path::new(RBAC), "webhook.kubeconfig").await
}
