//! Running the plugins: serve each on its socket, prove it answers, register it with the kubelet, and start
//! over when the kubelet restarts (its `kubelet.sock` is re-created, or our sockets are removed) or a serve
//! loop crashes (bounded by a [`CrashBudget`]).

use std::{
    future::Future,
    os::unix::fs::MetadataExt,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    config::PluginConfig,
    error::ServerError,
    inventory::DeviceState,
    plugin::PluginHandler,
    registration::{register, register_request, wait_ready},
    server::{RunningServer, serve},
};

/// Counts serve-loop crashes: more than `max` crashes, each within `window` of the previous, exhaust it.
#[derive(Debug, Clone)]
pub struct CrashBudget {
    max: usize,
    window: Duration,
    count: usize,
    last: Option<Instant>,
}

impl CrashBudget {
    /// A fresh budget.
    pub fn new(max: usize, window: Duration) -> Self {
        Self { max, window, count: 0, last: None }
    }

    /// Records a crash at `now`; returns `false` once the budget is exhausted.
    pub fn record(&mut self, now: Instant) -> bool {
        let chained = self.last.is_some_and(|last| now.saturating_duration_since(last) <= self.window);
        self.count = if chained { self.count + 1 } else { 1 };
        self.last = Some(now);
        self.count <= self.max
    }

    /// Crashes in the current chain.
    pub fn count(&self) -> usize {
        self.count
    }
}

/// `(device, inode, ctime)` of a socket file, `None` when absent. The change time tells a re-created
/// socket apart even when the file system reuses the inode number at once.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Why the plugins are started again.
#[derive(Debug)]
enum Restart {
    Kubelet,
    SocketRemoved(String),
    Crash(String, Result<(), ServerError>),
}

/// Serves and registers a set of plugins until shutdown.
pub struct PluginManager {
    config: PluginConfig,
    state: DeviceState,
    handlers: Vec<Arc<dyn PluginHandler>>,
}

impl PluginManager {
    /// The plugins in `handlers` share `state`.
    pub fn new(config: PluginConfig, state: DeviceState, handlers: Vec<Arc<dyn PluginHandler>>) -> Self {
        Self { config, state, handlers }
    }

    /// Starts every plugin that has at least one device: serve, probe, register. On failure the ones
    /// already started are stopped.
    pub async fn start_all(&self) -> Result<Vec<RunningServer>, ServerError> {
        let mut running = Vec::new();
        let gpus = self.state.devices();
        for handler in &self.handlers {
            if handler.devices(&gpus).is_empty() {
                tracing::info!(plugin = handler.name(), "no devices, not serving");
                continue;
            }
            let socket = self.config.device_plugin_path.join(handler.socket_name());
            let started = async {
                let server = serve(Arc::clone(handler), socket.clone(), self.state.subscribe())?;
                running.push(server);
                wait_ready(&socket, self.config.dial_timeout).await?;
                let request =
                    register_request(handler.socket_name(), handler.resource_name(), handler.options());
                register(&self.config.kubelet_socket(), request, self.config.dial_timeout).await
            }
            .await;
            if let Err(err) = started {
                stop_all(running).await;
                return Err(err);
            }
            tracing::info!(
                plugin = handler.name(),
                resource = handler.resource_name(),
                "registered with kubelet"
            );
        }
        Ok(running)
    }

    /// Runs until `shutdown` completes. Start failures are retried every watch interval; the kubelet
    /// restarting re-serves and re-registers; a crashing serve loop restarts everything until a plugin's
    /// [`CrashBudget`] is exhausted, which ends the run with [`ServerError::CrashBudget`].
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut budgets: std::collections::HashMap<String, CrashBudget> = Default::default();
        let kubelet = self.config.kubelet_socket();
        let tick = self.config.watch_interval;
        loop {
            let mut seen = identity(&kubelet);
            let mut servers = match self.start_all().await {
                Ok(servers) => servers,
                Err(err) => {
                    tracing::warn!(%err, "starting device plugins failed; retrying");
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(tick) => continue,
                    }
                }
            };
            let restart = loop {
                tokio::select! {
                    () = &mut shutdown => {
                        stop_all(servers).await;
                        return Ok(());
                    }
                    () = tokio::time::sleep(tick) => {}
                }
                let now = identity(&kubelet);
                if now.is_some() && now != seen {
                    break Restart::Kubelet;
                }
                seen = now;
                if let Some(s) = servers.iter().find(|s| !s.socket.exists()) {
                    break Restart::SocketRemoved(s.socket.display().to_string());
                }
                if let Some(i) = servers.iter().position(|s| s.handle.is_finished()) {
                    let crashed = servers.swap_remove(i);
                    let name = crashed.socket.display().to_string();
                    break Restart::Crash(name, crashed.stop().await);
                }
            };
            stop_all(servers).await;
            match restart {
                Restart::Kubelet => tracing::info!("kubelet.sock re-created; restarting device plugins"),
                Restart::SocketRemoved(s) => tracing::info!(socket = %s, "plugin socket removed; restarting"),
                Restart::Crash(name, result) => {
                    tracing::error!(plugin = %name, ?result, "serve loop ended; restarting");
                    let budget = budgets.entry(name.clone()).or_insert_with(|| {
                        CrashBudget::new(self.config.max_crashes, self.config.crash_window)
                    });
                    if !budget.record(Instant::now()) {
                        return Err(ServerError::CrashBudget {
                            plugin: name,
                            crashes: budget.count(),
                            window: self.config.crash_window,
                        });
                    }
                }
            }
        }
    }
}

/// Stops servers, logging (not failing on) their errors.
pub async fn stop_all(servers: Vec<RunningServer>) {
    for server in servers {
        let socket = server.socket.clone();
        if let Err(err) = server.stop().await {
            tracing::warn!(socket = %socket.display(), %err, "plugin server ended with an error");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_budget_counts_chained_crashes() {
        let mut b = CrashBudget::new(2, Duration::from_secs(10));
        let t = Instant::now();
        assert!(b.record(t));
        assert!(b.record(t + Duration::from_secs(5)));
        assert!(!b.record(t + Duration::from_secs(9)));
        // A crash long after the previous starts a new chain.
        assert!(b.record(t + Duration::from_secs(100)));
        assert_eq!(b.count(), 1);
    }
}
