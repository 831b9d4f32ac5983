//! The clock seam: Unix-nanosecond time for predicate times, reservation expiry, stuck grace periods and cleanup
//! periods, with a manual clock for tests and the simulator.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// Now, in Unix nanoseconds.
    fn now_ns(&self) -> i64;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told (tests, simulator).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock at `now_ns`.
    pub fn new(now_ns: i64) -> Self {
        Self(AtomicI64::new(now_ns))
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: i64) {
        self.0.fetch_add(ns, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, now_ns: i64) {
        self.0.store(now_ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_ns(&self) -> i64 {
        (**self).now_ns()
    }
}
