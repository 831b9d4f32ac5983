//! Container images the e2e tests make from files on this host, written as OCI image-layout archives for
//! [`crate::RealNode::import_image_archive`] (`ctr images import`): nothing is pulled.
//!
//! [`single_binary_image`] packs one statically linked binary (e.g. the control plane's `kube-scheduler`,
//! built with `CGO_ENABLED=0`) as the one layer of an image, the way `e2e/build-node.sh` packs busybox:
//! a reproducible tar (sorted, owned by root, dated 1970) made by GNU tar, digests by `sha256sum`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

/// Where [`single_binary_image`] puts the binary in the image (on the image's `PATH`).
pub const BIN_DIR: &str = "usr/local/bin";

/// Writes `<dir>/<file name of binary>.oci.tar`: an OCI image named `reference` (e.g.
/// `localhost/kube-scheduler:e2e`, as containerd names it after the import) whose one layer holds `binary` at
/// `/usr/local/bin/<name>` (mode 0755), with `PATH` set and `/tmp` (mode 1777); its entrypoint is the
/// binary. Returns the archive's path.
pub fn single_binary_image(reference: &str, binary: &Path, dir: &Path) -> Result<PathBuf> {
    let name = binary
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no file name", binary.display()))?;
    let Some((_, tag)) = reference.rsplit_once(':').filter(|(_, tag)| !tag.is_empty() && !tag.contains('/'))
    else {
        bail!("image reference {reference:?} has no tag");
    };
    let work = tempfile::Builder::new().prefix("image-").tempdir_in(dir)?;
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join(BIN_DIR))?;
    std::fs::create_dir_all(rootfs.join("tmp"))?;
    set_mode(&rootfs.join("tmp"), 0o1777)?;
    let target = rootfs.join(BIN_DIR).join(name);
    std::fs::copy(binary, &target).with_context(|| format!("copying {}", binary.display()))?;
    set_mode(&target, 0o755)?;

    let layout = work.path().join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let layer = work.path().join("layer.tar");
    det_tar(&rootfs, &layer, &["."])?;
    let (layer_digest, layer_size) = blob(&layer, &blobs)?;

    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Entrypoint": [format!("/{BIN_DIR}/{name}")],
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        "history": [{"created_by": "vgpu_e2e::images::single_binary_image"}],
    });
    let (config_digest, config_size) = json_blob(&config, work.path(), &blobs)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{config_digest}"), "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{layer_digest}"), "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = json_blob(&manifest, work.path(), &blobs)?;
    // containerd names an imported image after io.containerd.image.name; the OCI annotation holds the tag.
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": reference, "org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(layout.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let archive = dir.join(format!("{name}.oci.tar"));
    det_tar(&layout, &archive, &["oci-layout", "index.json", "blobs"])?;
    Ok(archive)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// A reproducible tar of `entries` of `dir`: sorted, owned by root, dated 1970.
fn det_tar(dir: &Path, out: &Path, entries: &[&str]) -> Result<()> {
    let output = Command::new("tar")
        .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "--format=gnu"])
        .arg("-C")
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .args(entries)
        .output()
        .context("running tar")?;
    if !output.status.success() {
        bail!("tar of {} failed: {}", dir.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Moves `file` into `blobs` under its digest; returns the digest (hex) and size.
fn blob(file: &Path, blobs: &Path) -> Result<(String, u64)> {
    let output = Command::new("sha256sum").arg(file).output().context("running sha256sum")?;
    if !output.status.success() {
        bail!("sha256sum {} failed: {}", file.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    let digest = String::from_utf8(output.stdout)?
        .split_whitespace()
        .next()
        .filter(|d| d.len() == 64)
        .with_context(|| format!("sha256sum printed no digest for {}", file.display()))?
        .to_owned();
    let size = std::fs::metadata(file)?.len();
    std::fs::rename(file, blobs.join(&digest))?;
    Ok((digest, size))
}

fn json_blob(value: &serde_json::Value, work: &Path, blobs: &Path) -> Result<(String, u64)> {
    let file = work.join("blob.json");
    std::fs::write(&file, serde_json::to_vec(value)?)?;
    blob(&file, blobs)
}

/// The name our image has in the archive [`vgpu_image_archive`] returns (and in containerd after the import).
pub const VGPU_IMAGE: &str = "localhost/vgpu:e2e";

/// An already built archive of our image to use instead of building one (e.g. to rerun a chart test quickly).
pub const VGPU_IMAGE_ARCHIVE_ENV: &str = "VGPU_E2E_IMAGE_ARCHIVE";

/// Our image ([`VGPU_IMAGE`]) as an OCI archive: `$VGPU_E2E_IMAGE_ARCHIVE` when set, else built once per test
/// binary by `scripts/build-image.sh` from the binaries this run uses ([`crate::vgpu_binary`]) into
/// `<work>/vgpu.oci.tar` (later calls return the first call's answer).
pub fn vgpu_image_archive(work: &Path) -> Result<PathBuf> {
    static ARCHIVE: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    ARCHIVE
        .get_or_init(|| build_vgpu_image_archive(work).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_vgpu_image_archive(work: &Path) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(VGPU_IMAGE_ARCHIVE_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let plugin = crate::vgpu_binary("vgpu-kubelet-plugin")?;
    let bins = plugin.parent().with_context(|| format!("{} has no folder", plugin.display()))?;
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let archive = work.join("vgpu.oci.tar");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(repo.join("scripts/build-image.sh"))
        .arg(VGPU_IMAGE)
        .current_dir(&repo)
        .env("PREBUILT", bins)
        .env("OCI_ARCHIVE", &archive)
        .output()
        .context("running scripts/build-image.sh")?;
    if !output.status.success() || !archive.is_file() {
        bail!(
            "scripts/build-image.sh failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(archive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_one_binary_as_an_oci_layout() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("tool");
        std::fs::write(&bin, b"#!/bin/sh\n").unwrap();
        let archive = single_binary_image("localhost/tool:e2e", &bin, dir.path()).unwrap();
        let out = dir.path().join("x");
        std::fs::create_dir_all(&out).unwrap();
        let status = Command::new("tar").arg("-C").arg(&out).arg("-xf").arg(&archive).status().unwrap();
        assert!(status.success());
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("index.json")).unwrap()).unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(entry["annotations"]["io.containerd.image.name"], "localhost/tool:e2e");
        assert_eq!(entry["annotations"]["org.opencontainers.image.ref.name"], "e2e");
        let digest = entry["digest"].as_str().unwrap().strip_prefix("sha256:").unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("blobs/sha256").join(digest)).unwrap()).unwrap();
        let layer = manifest["layers"][0]["digest"].as_str().unwrap().strip_prefix("sha256:").unwrap();
        let listing =
            Command::new("tar").arg("-tvf").arg(out.join("blobs/sha256").join(layer)).output().unwrap();
        let listing = String::from_utf8(listing.stdout).unwrap();
        assert!(
            listing.lines().any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with("usr/local/bin/tool")),
            "{listing}"
        );
        assert!(single_binary_image("no-tag", &bin, dir.path()).is_err());
    }
}
