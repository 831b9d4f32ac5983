//! Our own binaries under test (`vgpu-scheduler-extender`, `vgpu-device-plugin`, …).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};

/// Environment variable naming the folder holding our binaries (default: `<target>/debug`).
pub const VGPU_BIN_DIR_ENV: &str = "VGPU_E2E_VGPU_BIN_DIR";

/// The path of one of our binaries: `$VGPU_E2E_VGPU_BIN_DIR/<name>`, or `$CARGO_TARGET_DIR/debug/<name>`,
/// or `<workspace>/target/debug/<name>`. `e2e/run.sh` builds them first (`cargo build -p vgpu-bins --bins`).
pub fn vgpu_binary(name: &str) -> Result<PathBuf> {
    let dir = match std::env::var_os(VGPU_BIN_DIR_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
            Some(target) => PathBuf::from(target).join("debug"),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug"),
        },
    };
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} not found: build it with `cargo build -p vgpu-bins --bins` (or set {VGPU_BIN_DIR_ENV})",
            path.display()
        );
    }
    Ok(path)
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16> {
    let ports = crate::net::free_ports(1)?;
    ports.first().copied().ok_or_else(|| anyhow::anyhow!("free_ports returned no port"))
}

/// `GET http://127.0.0.1:<port><path>`: the status code and body, or an error when nothing answers.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    http_get_with_headers(port, path, &[]).await
}

/// [`http_get`] with extra request headers (e.g. `("Authorization", "Bearer …")`).
pub async fn http_get_with_headers(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    get_on(stream, port, path, headers).await
}

/// `GET https://127.0.0.1:<port><path>` over HTTP/1.1, the server's certificate verified against the CA in
/// `ca_file` for the address 127.0.0.1: the status code and body, or an error when nothing answers or the
/// handshake fails.
pub async fn https_get(port: u16, path: &str, ca_file: &Path) -> Result<(u16, String)> {
    use anyhow::Context as _;
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(ca_file).with_context(|| format!("reading {}", ca_file.display()))?
    {
        roots.add(cert.with_context(|| format!("a certificate of {}", ca_file.display()))?)?;
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    get_on(tls, port, path, &[]).await
}

/// One `GET` with `Connection: close` on `stream`, read to its end.
async fn get_on<S>(mut stream: S, port: u16, path: &str, headers: &[(&str, &str)]) -> Result<(u16, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let extra: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    // A TLS peer may close without close_notify once it has answered: what was read is the answer.
    if let Err(e) = stream.read_to_end(&mut response).await
        && (response.is_empty() || e.kind() != std::io::ErrorKind::UnexpectedEof)
    {
        return Err(e.into());
    }
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response from port {port}: {text:.200}"))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// Polls `GET /readyz` on `port` until it answers 200, or fails after `timeout` with the last answer.
pub async fn wait_ready(port: u16, timeout: std::time::Duration) -> Result<()> {
    wait_ready_on(port, None, timeout).await
}

/// [`wait_ready`] over HTTPS ([`https_get`] with the CA in `ca_file`).
pub async fn wait_ready_tls(port: u16, ca_file: &Path, timeout: std::time::Duration) -> Result<()> {
    wait_ready_on(port, Some(ca_file), timeout).await
}

async fn wait_ready_on(port: u16, ca_file: Option<&Path>, timeout: std::time::Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let answer = match ca_file {
            None => http_get(port, "/readyz").await,
            Some(ca) => https_get(port, "/readyz", ca).await,
        };
        let last = match answer {
            Ok((200, _)) => return Ok(()),
            Ok((code, body)) => format!("{code} {body}"),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            bail!("127.0.0.1:{port}/readyz not ready after {timeout:?}; last answer: {last}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_names_the_build_command() {
        let err = vgpu_binary("no-such-vgpu-binary").unwrap_err().to_string();
        assert!(err.contains("cargo build -p vgpu-bins --bins"), "{err}");
        assert!(free_port().unwrap() > 0);
    }
}
