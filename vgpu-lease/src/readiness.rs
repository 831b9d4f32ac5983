//! Readiness of an extender replica: caches synced, and (with leader election on) leading.
//!
//! The cache driver marks [`Readiness::set_synced`] once the initial node and pod lists are in the cache; the
//! leader elector sets [`Readiness::set_role`]. The HTTP server's `/readyz` reports [`Readiness::is_ready`]
//! and the verbs refuse work until the caches are synced. Unlike vgpu-manager (which only logs leadership),
//! a follower replica is not ready, so a Service selecting ready endpoints only sends traffic to the leader.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use tokio::sync::watch;

/// The leader-election role of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Leader election is off: every replica serves.
    Standalone,
    /// This replica holds the lease.
    Leader,
    /// Another replica holds the lease (or none does yet).
    Follower,
}

impl Role {
    /// The `vgpu-manager.io/scheduler-role` label value (`leader`/`follower`); `None` when standalone.
    pub fn label_value(self) -> Option<&'static str> {
        match self {
            Role::Standalone => None,
            Role::Leader => Some("leader"),
            Role::Follower => Some("follower"),
        }
    }

    fn from_u8(v: u8) -> Role {
        match v {
            1 => Role::Leader,
            2 => Role::Follower,
            _ => Role::Standalone,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Role::Standalone => 0,
            Role::Leader => 1,
            Role::Follower => 2,
        }
    }
}

#[derive(Debug)]
struct Inner {
    synced: AtomicBool,
    role: AtomicU8,
    changes: watch::Sender<(bool, Role)>,
}

/// A cheap, cloneable readiness handle shared by the cache driver, the leader elector and the server.
#[derive(Debug, Clone)]
pub struct Readiness(Arc<Inner>);

impl Default for Readiness {
    fn default() -> Self {
        Self::new(Role::Standalone)
    }
}

impl Readiness {
    /// Not synced, with the given initial role (`Follower` when leader election is on, else `Standalone`).
    pub fn new(role: Role) -> Self {
        let (changes, _) = watch::channel((false, role));
        Self(Arc::new(Inner { synced: AtomicBool::new(false), role: AtomicU8::new(role.as_u8()), changes }))
    }

    /// Already synced and standalone (tests, the in-memory simulator).
    pub fn ready() -> Self {
        let r = Self::new(Role::Standalone);
        r.set_synced(true);
        r
    }

    /// Caches hold the initial lists.
    pub fn is_synced(&self) -> bool {
        self.0.synced.load(Ordering::Acquire)
    }

    /// The current role.
    pub fn role(&self) -> Role {
        Role::from_u8(self.0.role.load(Ordering::Acquire))
    }

    /// Synced and not a follower: `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.is_synced() && self.role() != Role::Follower
    }

    /// Marks the caches synced (or not, after a watch lost its list).
    pub fn set_synced(&self, synced: bool) {
        self.0.synced.store(synced, Ordering::Release);
        self.publish();
    }

    /// Sets the leader-election role.
    pub fn set_role(&self, role: Role) {
        self.0.role.store(role.as_u8(), Ordering::Release);
        self.publish();
    }

    fn publish(&self) {
        self.0.changes.send_replace((self.is_synced(), self.role()));
    }

    /// A receiver of `(synced, role)` changes (e.g. to patch the role label, or to wait for sync).
    pub fn subscribe(&self) -> watch::Receiver<(bool, Role)> {
        self.0.changes.subscribe()
    }

    /// Waits until the caches are synced.
    pub async fn wait_synced(&self) {
        let mut rx = self.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we hold it.
        let _ = rx.wait_for(|(synced, _)| *synced).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_synced_and_not_follower() {
        let r = Readiness::new(Role::Follower);
        assert!(!r.is_ready());
        r.set_synced(true);
        assert!(!r.is_ready());
        r.set_role(Role::Leader);
        assert!(r.is_ready());
        assert_eq!(r.role().label_value(), Some("leader"));
        r.set_synced(false);
        assert!(!r.is_ready());
        assert!(Readiness::ready().is_ready());
        assert_eq!(Role::Standalone.label_value(), None);
    }

    #[tokio::test]
    async fn wait_synced_wakes_on_sync() {
        let r = Readiness::default();
        let waiter = tokio::spawn({
            let r = r.clone();
            async move { r.wait_synced().await }
        });
        tokio::task::yield_now().await;
        r.set_synced(true);
        waiter.await.unwrap();
        assert_eq!(*r.subscribe().borrow(), (true, Role::Standalone));
    }
}
