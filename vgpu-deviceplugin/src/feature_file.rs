//! Where the GPU feature labels ([`vgpu_core::gfd`]) go: patched onto the Node by the
//! [`NodePublisher`](crate::publisher::NodePublisher) ([`GfdOutput::NodeLabels`], the default), or written to
//! node-feature-discovery's local feature file ([`GfdOutput::NfdFeatureFile`], `--gfd-output=nfd-feature-file`),
//! from which `nfd-worker` and `nfd-master` put the same `nvidia.com/*` labels on the Node.
//!
//! | step | feature-file mode |
//! |---|---|
//! | start | the file is written at once ([`FeatureFileWriter::write_once`]) |
//! | every [`FeatureFileConfig::interval`] (60 s) | rewritten atomically, with a fresh `# +expiry-time=` of now + [`EXPIRY_INTERVALS`] intervals |
//! | a write fails | logged, retried at the next interval |
//! | shutdown | the file stays, as the labels stay in node-labels mode: a restart or rolling update does not make the labels flap; a plugin gone for good loses them when the expiry passes |

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use vgpu_core::{
    clock::{Clock, SystemClock},
    nfd::{self, FeatureFile, NfdError},
};

/// Where the GPU feature labels are published.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GfdOutput {
    /// Patched onto the Node with the other node labels (`--gfd-output=node-labels`).
    #[default]
    NodeLabels,
    /// Written to node-feature-discovery's feature file (`--gfd-output=nfd-feature-file`).
    NfdFeatureFile(FeatureFileConfig),
}

/// The feature file and its rewrite period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureFileConfig {
    /// The file (`--nfd-feature-file`, default [`nfd::DEFAULT_FEATURE_FILE`]); its directory must exist
    /// (the chart mounts NFD's `features.d` host directory).
    pub path: PathBuf,
    /// The rewrite period (`--nfd-feature-interval`, default 60 s).
    pub interval: Duration,
}

impl Default for FeatureFileConfig {
    fn default() -> Self {
        Self { path: PathBuf::from(nfd::DEFAULT_FEATURE_FILE), interval: Duration::from_secs(60) }
    }
}

/// How many rewrite periods a written file stays valid (`# +expiry-time=`): two missed rewrites are
/// tolerated.
pub const EXPIRY_INTERVALS: u32 = 3;

/// Keeps the feature file written.
pub struct FeatureFileWriter {
    config: FeatureFileConfig,
    labels: std::collections::BTreeMap<String, String>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for FeatureFileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureFileWriter")
            .field("config", &self.config)
            .field("labels", &self.labels.len())
            .finish_non_exhaustive()
    }
}

impl FeatureFileWriter {
    /// A writer of `labels` (on the wall clock).
    pub fn new(config: FeatureFileConfig, labels: std::collections::BTreeMap<String, String>) -> Self {
        Self { config, labels, clock: Arc::new(SystemClock) }
    }

    /// Uses `clock` for the expiry (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The file as it is written now: the labels, expiring [`EXPIRY_INTERVALS`] intervals from now
    /// (at least one second).
    pub fn feature_file(&self) -> FeatureFile {
        let now = self.clock.now_ns().div_euclid(1_000_000_000);
        let valid = self.config.interval.saturating_mul(EXPIRY_INTERVALS).as_secs().max(1);
        let expiry = now.saturating_add(i64::try_from(valid).unwrap_or(i64::MAX)).min(nfd::MAX_EXPIRY);
        FeatureFile { labels: self.labels.clone(), expiry: Some(expiry) }
    }

    /// Writes the file once.
    pub fn write_once(&self) -> Result<(), NfdError> {
        nfd::write(&self.config.path, &self.feature_file())
    }

    /// Writes at once and every interval until `shutdown` completes; never fails (errors are logged and
    /// the next interval tries again). The file is left in place at shutdown (module docs).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut failing = false;
        loop {
            match self.write_once() {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(file = %self.config.path.display(), labels = self.labels.len(), "NFD feature file written again");
                }
                Ok(()) => {
                    tracing::debug!(file = %self.config.path.display(), labels = self.labels.len(), "NFD feature file written")
                }
                Err(err) => {
                    failing = true;
                    tracing::warn!(%err, retry_in = ?self.config.interval, "writing the NFD feature file failed");
                }
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(self.config.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use vgpu_core::clock::ManualClock;

    #[test]
    fn expiry_is_three_intervals_ahead() {
        let clock = Arc::new(ManualClock::new(1_700_000_000_500_000_000));
        let config = FeatureFileConfig { path: PathBuf::from("/x"), interval: Duration::from_secs(60) };
        let writer = FeatureFileWriter::new(config, BTreeMap::new()).with_clock(clock);
        assert_eq!(writer.feature_file().expiry, Some(1_700_000_180));
    }
}
