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
