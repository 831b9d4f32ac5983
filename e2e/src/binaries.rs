//! Locating the control-plane binaries built by `e2e/build-controlplane.sh`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// `k8s.io/kubernetes` version of kube-apiserver and kube-scheduler (see `e2e/controlplane/go.mod`).
pub const K8S_VERSION: &str = "v1.37.2";
/// `go.etcd.io/etcd/server/v3` version of etcd (see `e2e/controlplane/go.mod`).
pub const ETCD_VERSION: &str = "v3.7.3";
/// Environment variable naming the folder that holds `etcd`, `kube-apiserver`, `kube-scheduler`,
/// `kube-controller-manager`.
pub const BIN_DIR_ENV: &str = "VGPU_E2E_BIN_DIR";
/// Environment variable overriding the build cache root (default `~/.cache/vgpu-e2e`).
pub const CACHE_ENV: &str = "VGPU_E2E_CACHE";

/// The folder `e2e/build-controlplane.sh` builds into by default:
/// `${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e}/k8s-<ver>_etcd-<ver>`.
///
/// `None` when neither `VGPU_E2E_CACHE`, `XDG_CACHE_HOME` nor `HOME` is set.
pub fn default_bin_dir() -> Option<PathBuf> {
    let root = non_empty_env(CACHE_ENV)
        .map(PathBuf::from)
        .or_else(|| non_empty_env("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("vgpu-e2e")))
        .or_else(|| non_empty_env("HOME").map(|h| PathBuf::from(h).join(".cache/vgpu-e2e")))?;
    Some(root.join(format!("k8s-{K8S_VERSION}_etcd-{ETCD_VERSION}")))
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Paths of the four upstream binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-scheduler`.
    pub kube_scheduler: PathBuf,
    /// `kube-controller-manager` (started only by [`crate::TestEnvBuilder::cluster_services`]).
    pub kube_controller_manager: PathBuf,
}

impl Binaries {
    /// Finds the binaries in `$VGPU_E2E_BIN_DIR`, or else in [`default_bin_dir`].
    pub fn locate() -> Result<Self> {
        let dir = match non_empty_env(BIN_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => default_bin_dir().context(
                "cannot find the control-plane binaries: set VGPU_E2E_BIN_DIR (or HOME/VGPU_E2E_CACHE)",
            )?,
        };
        Self::in_dir(&dir)
    }

    /// The binaries in `dir`; fails if one is missing.
    pub fn in_dir(dir: &Path) -> Result<Self> {
        let found = Self {
            etcd: dir.join("etcd"),
            kube_apiserver: dir.join("kube-apiserver"),
            kube_scheduler: dir.join("kube-scheduler"),
            kube_controller_manager: dir.join("kube-controller-manager"),
        };
        for path in
            [&found.etcd, &found.kube_apiserver, &found.kube_scheduler, &found.kube_controller_manager]
        {
            if !path.is_file() {
                bail!(
                    "control-plane binary {} is missing; build it with e2e/build-controlplane.sh \
                     (k8s {K8S_VERSION}, etcd {ETCD_VERSION}) or point {BIN_DIR_ENV} at a folder holding \
                     etcd, kube-apiserver, kube-scheduler and kube-controller-manager",
                    path.display()
                );
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants must name the versions that `e2e/controlplane/go.mod` pins, because the
    /// build script derives its output folder from go.mod and this crate from the constants.
    #[test]
    fn versions_match_go_mod() {
        let go_mod = include_str!("../controlplane/go.mod");
        let version_of = |module: &str| {
            go_mod
                .lines()
                .map(str::split_whitespace)
                .find_map(|mut words| (words.next() == Some(module)).then(|| words.next().map(str::to_owned)))
                .flatten()
        };
        assert_eq!(version_of("k8s.io/kubernetes").as_deref(), Some(K8S_VERSION));
        assert_eq!(version_of("go.etcd.io/etcd/server/v3").as_deref(), Some(ETCD_VERSION));
        // Every staging module is pinned to the matching v0.x release.
        let staging = format!("v0.{}", K8S_VERSION.trim_start_matches("v1."));
        let replaces: Vec<&str> = go_mod.lines().filter(|l| l.contains(" => k8s.io/")).collect();
        assert!(replaces.len() >= 30, "expected the staging replaces, got {replaces:?}");
        for line in replaces {
            assert!(line.trim_end().ends_with(&staging), "{line} is not pinned to {staging}");
        }
    }

    #[test]
    fn missing_binaries_are_reported_with_the_build_hint() {
        let dir = tempfile::tempdir().unwrap();
        let err = Binaries::in_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("build-controlplane.sh"), "{err}");
    }
}
