//! Live reload of the node configuration file (`--node-config-path`): [`NodeConfigSource`] polls the file,
//! [`plan_reload`] decides what a new version changes in the running plugin.
//!
//! A ConfigMap volume is updated by the kubelet with an atomic swap of its `..data` symlink, so the file's
//! path names new content without ever being written in place; an inotify watch on the path would follow
//! the old target. The source therefore reads the path (following the symlinks) every
//! [`NodeConfigSource::interval`] and compares the settings it resolves to with the last ones it saw: a
//! file swapped, rewritten or replaced in any way is seen within one period, and a rewrite that changes
//! nothing (comments, order) changes nothing.
//!
//! A new version that cannot be read, parsed or validated is logged as an error naming the file and the
//! problem, and the running settings are kept; the next valid version is applied.
//!
//! What a change does ([`plan_reload`]):
//!
//! * `deviceSplitCount`, `deviceCoresScaling`, `excludeDevices`: the advertised device lists are rebuilt
//!   ([`crate::inventory::DeviceState::reconfigure`]): every open `ListAndWatch` stream sends the new list at
//!   once and the node annotations are republished; the plugins keep serving.
//! * `deviceMemoryScaling`, `deviceMemoryFactor`, `gdsEnabled`, `mofedEnabled`, `gdrcopyEnabled`,
//!   `openKernelModules` (read by `Allocate`): the same, then the plugins are served and registered again
//!   with the new configuration (as on SIGHUP), still in the same process.
//! * `migStrategy`, `deviceListStrategy`, `cgroupDriver`, `imex` ([`RESTART_ONLY`]): resolved once at start
//!   (the MIG instances and GPU feature labels, the node CDI spec, the cgroup driver detection, the IMEX
//!   device nodes); a change is logged as a warning and takes effect when the plugin restarts. The chart
//!   passes these as arguments, so changing them there rolls the plugin's pods.

use std::{future::Future, path::PathBuf, time::Duration};

use tokio::sync::mpsc;
use vgpu_core::node_config::{NodeConfigError, NodeConfigFile, NodeSettings};

/// The settings read once at start: a change in the file waits for a restart of the plugin.
pub const RESTART_ONLY: [&str; 4] = ["migStrategy", "deviceListStrategy", "cgroupDriver", "imex"];

/// Default poll period of [`NodeConfigSource`].
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);

/// The node configuration file of a running plugin and how to resolve it.
#[derive(Debug, Clone)]
pub struct NodeConfigSource {
    /// The file (`.json`, `.yaml` or `.yml`), usually a ConfigMap volume's key.
    pub path: PathBuf,
    /// This node's name (which spec of the file applies).
    pub node_name: String,
    /// The settings from the flags, which the file overrides.
    pub flags: NodeSettings,
    /// Poll period (default [`DEFAULT_INTERVAL`]).
    pub interval: Duration,
}

impl NodeConfigSource {
    /// The file at `path` for `node_name` over the flag settings `flags`, polled every [`DEFAULT_INTERVAL`].
    pub fn new(path: impl Into<PathBuf>, node_name: impl Into<String>, flags: NodeSettings) -> Self {
        Self { path: path.into(), node_name: node_name.into(), flags, interval: DEFAULT_INTERVAL }
    }

    /// Sets the poll period.
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Reads, parses and resolves the file as it is now: the flags overridden by this node's spec.
    pub fn load(&self) -> Result<NodeSettings, NodeConfigError> {
        NodeConfigFile::load(&self.path)?.resolve(&self.node_name, self.flags.clone())
    }

    /// Polls the file until `stop` completes, sending the resolved settings of every valid version that
    /// differs from the last one seen (starting from `current`, the settings the plugin started with).
    /// Invalid versions are logged (once per distinct error) and skipped. Ends early when `tx` is closed.
    pub async fn watch(
        self,
        mut current: NodeSettings,
        tx: mpsc::Sender<NodeSettings>,
        stop: impl Future<Output = ()>,
    ) {
        let mut stop = std::pin::pin!(stop);
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tx.closed() => return,
                _ = ticks.tick() => {}
            }
            match self.load() {
                Ok(next) => {
                    if last_error.take().is_some() {
                        tracing::info!(file = %self.path.display(), "node configuration readable again");
                    }
                    if next != current {
                        tracing::info!(file = %self.path.display(), "node configuration changed");
                        current = next.clone();
                        if tx.send(next).await.is_err() {
                            return;
                        }
                    }
                }
                Err(err) => {
                    let text = err.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::error!(
                            file = %self.path.display(),
                            error = %text,
                            "the node configuration file is invalid; keeping the running configuration"
                        );
                        last_error = Some(text);
                    }
                }
            }
        }
    }
}

/// What applying a new version of the node configuration does ([`plan_reload`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Reload {
    /// The settings to run with: the new version's, except [`RESTART_ONLY`] ones, kept from the running
    /// settings.
    pub settings: NodeSettings,
    /// The plugins must be served and registered again (a setting `Allocate` reads changed); otherwise
    /// rebuilding the device lists is enough.
    pub restart_plugins: bool,
    /// The [`RESTART_ONLY`] settings the new version changes (not applied).
    pub deferred: Vec<&'static str>,
}

impl Reload {
    /// Whether anything is applied at all.
    pub fn changes(&self, running: &NodeSettings) -> bool {
        &self.settings != running
    }
}

/// Plans the move from `running` (the settings in effect) to `next` (the file's new version, resolved),
/// given `previous` (the file's version before it, resolved: what tells a restart-only setting changed in
/// the file rather than being resolved at start, as the cgroup driver is).
pub fn plan_reload(running: &NodeSettings, previous: &NodeSettings, next: &NodeSettings) -> Reload {
    let mut deferred = Vec::new();
    if next.mig_strategy != previous.mig_strategy {
        deferred.push("migStrategy");
    }
    if next.device_list_strategy != previous.device_list_strategy {
        deferred.push("deviceListStrategy");
    }
    if next.cgroup_driver != previous.cgroup_driver {
        deferred.push("cgroupDriver");
    }
    if next.imex != previous.imex {
        deferred.push("imex");
    }
    let settings = NodeSettings {
        mig_strategy: running.mig_strategy,
        device_list_strategy: running.device_list_strategy.clone(),
        cgroup_driver: running.cgroup_driver,
        imex: running.imex.clone(),
        ..next.clone()
    };
    let restart_plugins = settings.device_memory_scaling != running.device_memory_scaling
        || settings.device_memory_factor != running.device_memory_factor
        || settings.gds_enabled != running.gds_enabled
        || settings.mofed_enabled != running.mofed_enabled
        || settings.gdrcopy_enabled != running.gdrcopy_enabled
        || settings.open_kernel_modules != running.open_kernel_modules;
    Reload { settings, restart_plugins, deferred }
}

#[cfg(test)]
mod tests {
    use vgpu_core::node_config::{CgroupDriver, MigStrategy};

    use super::*;

    #[test]
    fn device_list_settings_apply_without_a_plugin_restart() {
        let running = NodeSettings { cgroup_driver: CgroupDriver::Systemd, ..NodeSettings::default() };
        let previous = NodeSettings::default();
        let mut next = NodeSettings { device_split_count: 4, device_cores_scaling: 2.0, ..previous.clone() };
        next.exclude_devices.push_entry("1").unwrap();
        let plan = plan_reload(&running, &previous, &next);
        assert!(plan.changes(&running) && !plan.restart_plugins && plan.deferred.is_empty(), "{plan:?}");
        assert_eq!(plan.settings.device_split_count, 4);
        assert_eq!(plan.settings.cgroup_driver, CgroupDriver::Systemd, "the resolved driver is kept");
        assert!(plan.settings.exclude_devices.contains(1, ""));
        // Nothing changed: nothing to apply.
        assert!(!plan_reload(&running, &previous, &previous).changes(&running));
    }

    #[test]
    fn allocate_settings_restart_the_plugins() {
        let running = NodeSettings::default();
        for next in [
            NodeSettings { device_memory_scaling: 2.0, ..running.clone() },
            NodeSettings { device_memory_factor: 1024, ..running.clone() },
            NodeSettings { gds_enabled: true, ..running.clone() },
            NodeSettings { open_kernel_modules: true, ..running.clone() },
        ] {
            let plan = plan_reload(&running, &running, &next);
            assert!(plan.restart_plugins && plan.changes(&running), "{next:?}");
            assert_eq!(plan.settings, next);
        }
    }

    #[test]
    fn restart_only_settings_are_deferred_and_kept() {
        let running = NodeSettings::default();
        let next = NodeSettings {
            mig_strategy: MigStrategy::Single,
            cgroup_driver: CgroupDriver::Cgroupfs,
            device_split_count: 3,
            ..running.clone()
        };
        let plan = plan_reload(&running, &running, &next);
        assert_eq!(plan.deferred, ["migStrategy", "cgroupDriver"]);
        assert_eq!(plan.settings.mig_strategy, running.mig_strategy);
        assert_eq!(plan.settings.cgroup_driver, running.cgroup_driver);
        assert_eq!(plan.settings.device_split_count, 3, "the rest applies");
        // Only a restart-only change: nothing to apply.
        let next = NodeSettings { mig_strategy: MigStrategy::None, ..running.clone() };
        let plan = plan_reload(&running, &running, &next);
        assert!(!plan.changes(&running) && plan.deferred == ["migStrategy"]);
    }
}
