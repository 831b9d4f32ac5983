//! Our own binaries under test (`vgpu-scheduler-extender`, `vgpu-device-plugin`, …).

use std::path::{Path, PathBuf};

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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let extra: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
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
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match http_get(port, "/readyz").await {
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
