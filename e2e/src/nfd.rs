//! node-feature-discovery for the NFD e2e test: `nfd-master`, `nfd-worker` and NFD's CRDs
//! (`nfd-api-crds.yaml`) as `e2e/build-nfd.sh` lays them out.
//!
//! | what | where |
//! |---|---|
//! | binaries | `$VGPU_E2E_NFD_DIR`, else `${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e}/nfd-v0.17.3` |
//! | feature files | the worker reads `features.d/` relative to its working directory (the build sets `source/local.featureFilesDir`), so a test starts it with [`crate::TestEnv::start_process_in`] in a scratch folder |

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::binaries::default_bin_dir;

/// The node-feature-discovery release `e2e/build-nfd.sh` builds (`e2e/nfd/go.mod`).
pub const NFD_VERSION: &str = "v0.17.3";

/// Environment variable naming a folder with NFD built by `e2e/build-nfd.sh` (CI sets it when the
/// background build finished in time).
pub const NFD_DIR_ENV: &str = "VGPU_E2E_NFD_DIR";

/// The folder `e2e/build-nfd.sh` builds into by default (`None` without `VGPU_E2E_CACHE`,
/// `XDG_CACHE_HOME` or `HOME`).
pub fn default_nfd_dir() -> Option<PathBuf> {
    Some(default_bin_dir()?.parent()?.join(format!("nfd-{NFD_VERSION}")))
}

/// The NFD programs and CRDs.
#[derive(Debug, Clone)]
pub struct NfdBinaries {
    /// `nfd-master`.
    pub master: PathBuf,
    /// `nfd-worker` (reads `features.d/` relative to its working directory).
    pub worker: PathBuf,
    /// `nfd-api-crds.yaml`: NodeFeature, NodeFeatureRule, NodeFeatureGroup.
    pub crds: PathBuf,
}

impl NfdBinaries {
    /// The files in `dir`, or `None` when one is missing.
    pub fn in_dir(dir: &Path) -> Option<Self> {
        let found = Self {
            master: dir.join("nfd-master"),
            worker: dir.join("nfd-worker"),
            crds: dir.join("nfd-api-crds.yaml"),
        };
        [&found.master, &found.worker, &found.crds].iter().all(|p| p.is_file()).then_some(found)
    }
}

/// NFD, or `Ok(None)` after printing `skipped: <reason>` on stderr when it is not built; an error when
/// `$VGPU_E2E_NFD_DIR` is set but incomplete.
pub fn locate_or_skip() -> Result<Option<NfdBinaries>> {
    if let Some(dir) = std::env::var_os(NFD_DIR_ENV).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return match NfdBinaries::in_dir(&dir) {
            Some(found) => Ok(Some(found)),
            None => bail!(
                "{NFD_DIR_ENV}={} lacks nfd-master, nfd-worker or nfd-api-crds.yaml (run e2e/build-nfd.sh)",
                dir.display()
            ),
        };
    }
    if let Some(found) = default_nfd_dir().as_deref().and_then(NfdBinaries::in_dir) {
        return Ok(Some(found));
    }
    // Straight to the stderr handle: the test harness captures `eprintln!` of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "skipped: node-feature-discovery is not built: {NFD_DIR_ENV} is unset and {} is incomplete; build it \
         with e2e/build-nfd.sh (or set {NFD_DIR_ENV})",
        default_nfd_dir().map_or_else(|| "the cache folder".to_owned(), |d| d.display().to_string())
    );
    Ok(None)
}
