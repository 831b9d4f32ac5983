//! The plugin's link to the runtime and its health: unhealthy once disconnected for longer than a limit
//! (2 minutes by default, as upstream's kubelet plugin), with an injectable clock.
//!
//! | link | healthy |
//! |---|---|
//! | connected (registered and configured) | yes |
//! | disconnected since `t` (start-up counts as a disconnect) | while `now - t` ≤ the limit |

use std::{
    fmt::Debug,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::watch;

/// How long the plugin may stay disconnected before it reports unhealthy.
pub const UNHEALTHY_AFTER: Duration = Duration::from_secs(120);

/// Where "now" comes from (injectable for tests).
pub trait Clock: Send + Sync + Debug {
    /// Now.
    fn now(&self) -> Instant;
}

/// The monotonic system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset: Mutex<Duration>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self { base: Instant::now(), offset: Mutex::new(Duration::ZERO) }
    }
}

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *offset += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The plugin's link to the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Registered and configured.
    Connected,
    /// Not connected since this instant.
    Disconnected {
        /// When the link went down (or the plugin started).
        since: Instant,
    },
}

/// Shared view of the link (cheap to clone): what `/healthz` and the gRPC health check ask.
#[derive(Debug, Clone)]
pub struct NriHealth {
    link: Arc<watch::Sender<Link>>,
    clock: Arc<dyn Clock>,
    unhealthy_after: Duration,
}

impl NriHealth {
    /// Disconnected from now on `clock`, unhealthy after `unhealthy_after` of it.
    pub fn new(clock: Arc<dyn Clock>, unhealthy_after: Duration) -> Self {
        let (link, _) = watch::channel(Link::Disconnected { since: clock.now() });
        Self { link: Arc::new(link), clock, unhealthy_after }
    }

    /// The link now.
    pub fn link(&self) -> Link {
        *self.link.borrow()
    }

    /// Connected, or disconnected for at most the limit.
    pub fn is_healthy(&self) -> bool {
        match self.link() {
            Link::Connected => true,
            Link::Disconnected { since } => {
                self.clock.now().saturating_duration_since(since) <= self.unhealthy_after
            }
        }
    }

    /// A message for probes: `None` when healthy.
    pub fn problem(&self) -> Option<String> {
        match self.link() {
            Link::Connected => None,
            Link::Disconnected { since } => {
                let down = self.clock.now().saturating_duration_since(since);
                (down > self.unhealthy_after).then(|| {
                    format!(
                        "NRI plugin disconnected from the runtime for {}s (limit {}s)",
                        down.as_secs(),
                        self.unhealthy_after.as_secs()
                    )
                })
            }
        }
    }

    /// Link changes, for waiting on them.
    pub fn subscribe(&self) -> watch::Receiver<Link> {
        self.link.subscribe()
    }

    /// The plugin registered and was configured.
    pub fn set_connected(&self) {
        self.link.send_replace(Link::Connected);
    }

    /// The link went down now (a link already down keeps its first instant).
    pub fn set_disconnected(&self) {
        let now = self.clock.now();
        self.link.send_if_modified(|link| match link {
            Link::Connected => {
                *link = Link::Disconnected { since: now };
                true
            }
            Link::Disconnected { .. } => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_only_after_the_limit_disconnected() {
        let clock = Arc::new(ManualClock::default());
        let health = NriHealth::new(clock.clone(), UNHEALTHY_AFTER);
        assert!(health.is_healthy(), "start-up grace");
        clock.advance(Duration::from_secs(120));
        assert!(health.is_healthy());
        clock.advance(Duration::from_secs(1));
        assert!(!health.is_healthy());
        assert!(health.problem().is_some_and(|p| p.contains("121s (limit 120s)")));
        health.set_connected();
        assert!(health.is_healthy() && health.problem().is_none());
        clock.advance(Duration::from_secs(600));
        assert!(health.is_healthy(), "connected stays healthy");
        health.set_disconnected();
        clock.advance(Duration::from_secs(60));
        health.set_disconnected();
        clock.advance(Duration::from_secs(61));
        assert!(!health.is_healthy(), "the first disconnect instant counts");
    }
}
