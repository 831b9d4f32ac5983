//! The extender's success events: rate-limited, and held back while scheduling is busy.
//!
//! A pod scheduled without trouble gets two `Normal` events from the extender (`FilteringSucceed`,
//! `BindingSucceed`), as upstream sends them. Each is one API write, and kube-scheduler records its own
//! `Scheduled` event for the same pod; on a busy control plane those writes compete with the writes that
//! actually schedule pods (bindings) for the API server's CPU. Two mechanisms keep them out of the way:
//!
//! * a [`TokenBucket`] (`--event-qps` / `--event-burst`, the kubelet's defaults 50 / 100): over the limit
//!   an event is dropped and counted;
//! * [`DeferredEvents`] (`--event-quiet-period`, `--event-max-delay`): an event waits in a bounded queue
//!   until no filter or bind has started for the quiet period, or until it is older than the maximum delay,
//!   and only then takes a token and is sent. A burst of pods is scheduled first and described after; under
//!   steady load the events still go out, each at most the maximum delay late. Events keep the time they
//!   happened ([`Event::at_ns`]), not the time they were sent.
//!
//! Warnings never wait and are never limited. Both types are clock-driven (nanoseconds passed in), so they
//! are tested without sleeping.
//!
//! ```
//! use vgpu_scheduler::cluster::{Event, EventType};
//! use vgpu_scheduler::event_queue::{DeferConfig, DeferredEvents, TokenBucket};
//!
//! let ms = 1_000_000;
//! let queue = DeferredEvents::new(DeferConfig { quiet_ns: 250 * ms, max_delay_ns: 10_000 * ms, capacity: 8 });
//! let mut tokens = TokenBucket::new(50, 100);
//! let event = |at_ns| Event {
//!     namespace: "ns".into(),
//!     pod: "p".into(),
//!     kind: EventType::Normal,
//!     reason: "BindingSucceed",
//!     message: "bound".into(),
//!     at_ns,
//! };
//! queue.busy(0);
//! assert!(queue.push(event(0)));
//! assert!(queue.due(100 * ms, &mut tokens).is_empty()); // a bind started 100 ms ago: wait
//! assert_eq!(queue.due(250 * ms, &mut tokens).len(), 1); // quiet for 250 ms: send
//! ```

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::cluster::Event;

/// A token bucket: `qps` tokens per second on average, at most `burst` at once. `qps` 0 means no limit.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    qps: u32,
    burst: f64,
    tokens: f64,
    /// When `tokens` was last brought up to date (`None`: never; the bucket starts full).
    last_ns: Option<i64>,
}

impl TokenBucket {
    /// A full bucket (`burst` is at least 1).
    pub fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self { qps, burst, tokens: burst, last_ns: None }
    }

    /// Takes a token at `now_ns` if there is one. A clock that goes back refills nothing.
    pub fn take(&mut self, now_ns: i64) -> bool {
        if self.qps == 0 {
            return true;
        }
        self.refill(now_ns);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whole tokens available at `now_ns` (`u64::MAX` without a limit).
    pub fn available(&mut self, now_ns: i64) -> u64 {
        if self.qps == 0 {
            return u64::MAX;
        }
        self.refill(now_ns);
        // `tokens` lies in 0..=burst, and burst fits a u32.
        self.tokens.floor() as u64
    }

    fn refill(&mut self, now_ns: i64) {
        if let Some(last) = self.last_ns {
            let elapsed = now_ns.saturating_sub(last).max(0) as f64 * 1e-9;
            self.tokens = (self.tokens + elapsed * f64::from(self.qps)).min(self.burst);
        }
        self.last_ns = Some(self.last_ns.map_or(now_ns, |last| last.max(now_ns)));
    }
}

/// Settings of [`DeferredEvents`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferConfig {
    /// Events wait until no filter or bind has started for this long, ns.
    pub quiet_ns: i64,
    /// ... or until they are this old, ns (then they go out even while scheduling is busy).
    pub max_delay_ns: i64,
    /// Events held at most; more are refused (and counted by the caller as dropped).
    pub capacity: usize,
}

impl Default for DeferConfig {
    /// 250 ms quiet, 10 s at most, 4,096 events.
    fn default() -> Self {
        Self { quiet_ns: 250_000_000, max_delay_ns: 10_000_000_000, capacity: 4096 }
    }
}

/// Success events waiting for a quiet moment (module docs). Shared by the verbs that push and mark
/// activity and the task that sends ([`Extender::flush_events`](crate::extender::Extender::flush_events)).
#[derive(Debug)]
pub struct DeferredEvents {
    config: DeferConfig,
    queue: Mutex<VecDeque<Event>>,
    /// When the last filter or bind started (`i64::MIN`: never).
    last_busy_ns: AtomicI64,
}

impl DeferredEvents {
    /// An empty queue.
    pub fn new(config: DeferConfig) -> Self {
        Self { config, queue: Mutex::new(VecDeque::new()), last_busy_ns: AtomicI64::new(i64::MIN) }
    }

    /// The settings.
    pub fn config(&self) -> &DeferConfig {
        &self.config
    }

    /// A filter or bind started at `now_ns`.
    pub fn busy(&self, now_ns: i64) {
        self.last_busy_ns.fetch_max(now_ns, Ordering::Relaxed);
    }

    /// Queues an event; `false` when the queue is full (the event is not kept).
    pub fn push(&self, event: Event) -> bool {
        let mut queue = self.lock();
        if queue.len() >= self.config.capacity {
            return false;
        }
        queue.push_back(event);
        true
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The events that may be sent at `now_ns`, oldest first, each having taken a token from `tokens`: all
    /// that the tokens allow once scheduling has been quiet for the quiet period, otherwise those older than
    /// the maximum delay. The rest keep waiting.
    pub fn due(&self, now_ns: i64, tokens: &mut TokenBucket) -> Vec<Event> {
        let quiet = now_ns.saturating_sub(self.last_busy_ns.load(Ordering::Relaxed)) >= self.config.quiet_ns;
        self.take(now_ns, tokens, |event| {
            quiet || now_ns.saturating_sub(event.at_ns) >= self.config.max_delay_ns
        })
    }

    /// Every waiting event the tokens allow, quiet or not (shutting down); the rest stay queued.
    pub fn drain(&self, now_ns: i64, tokens: &mut TokenBucket) -> Vec<Event> {
        self.take(now_ns, tokens, |_| true)
    }

    fn take(&self, now_ns: i64, tokens: &mut TokenBucket, may_go: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut queue = self.lock();
        let mut out = Vec::new();
        // Events are queued in time order (near enough: pushes race by microseconds), so the first one that
        // may not go yet ends the run.
        while let Some(front) = queue.front() {
            if !may_go(front) || !tokens.take(now_ns) {
                break;
            }
            out.extend(queue.pop_front());
        }
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Event>> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::EventType;
    use proptest::prelude::*;

    const MS: i64 = 1_000_000;

    fn event(at_ns: i64) -> Event {
        Event {
            namespace: "ns".into(),
            pod: format!("p{at_ns}"),
            kind: EventType::Normal,
            reason: "BindingSucceed",
            message: String::new(),
            at_ns,
        }
    }

    fn queue(capacity: usize) -> DeferredEvents {
        DeferredEvents::new(DeferConfig { quiet_ns: 250 * MS, max_delay_ns: 10_000 * MS, capacity })
    }

    #[test]
    fn bucket_allows_the_burst_then_the_rate() {
        let mut b = TokenBucket::new(10, 3);
        assert!((0..3).all(|_| b.take(0)));
        assert!(!b.take(0));
        assert!(!b.take(99 * MS));
        assert!(b.take(100 * MS));
        assert_eq!(b.available(10_000 * MS), 3);
    }

    #[test]
    fn bucket_without_a_limit_always_gives() {
        let mut b = TokenBucket::new(0, 0);
        assert!((0..10_000).all(|i| b.take(i)));
        assert_eq!(b.available(0), u64::MAX);
    }

    #[test]
    fn a_clock_going_back_refills_nothing() {
        let mut b = TokenBucket::new(1, 1);
        assert!(b.take(10_000 * MS));
        assert!(!b.take(0));
        assert!(!b.take(10_500 * MS));
        assert!(b.take(11_000 * MS));
    }

    #[test]
    fn events_wait_while_busy_and_go_when_quiet() {
        let q = queue(16);
        let mut tokens = TokenBucket::new(50, 100);
        for t in 0..5 {
            q.busy(t * 100 * MS);
            assert!(q.push(event(t * 100 * MS)));
        }
        assert!(q.due(500 * MS, &mut tokens).is_empty());
        assert!(q.due(649 * MS, &mut tokens).is_empty());
        let sent = q.due(650 * MS, &mut tokens);
        assert_eq!(sent.iter().map(|e| e.at_ns / MS).collect::<Vec<_>>(), [0, 100, 200, 300, 400]);
        assert!(q.is_empty());
    }

    #[test]
    fn old_events_go_even_while_busy() {
        let q = queue(16);
        let mut tokens = TokenBucket::new(50, 100);
        q.push(event(0));
        q.push(event(5_000 * MS));
        q.busy(10_000 * MS);
        let sent = q.due(10_000 * MS, &mut tokens);
        assert_eq!(sent.len(), 1, "only the event 10 s old");
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_full_queue_refuses() {
        let q = queue(2);
        assert!(q.push(event(0)));
        assert!(q.push(event(1)));
        assert!(!q.push(event(2)));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn tokens_limit_what_goes_and_the_rest_waits() {
        let q = queue(16);
        let mut tokens = TokenBucket::new(1, 2);
        for t in 0..4 {
            q.push(event(t));
        }
        assert_eq!(q.drain(1_000 * MS, &mut tokens).len(), 2);
        assert_eq!(q.len(), 2);
        assert_eq!(q.due(2_000 * MS, &mut tokens).len(), 1);
    }

    proptest! {
        /// Whatever the pushes, activity and flush times: every event is sent at most once, in the order it
        /// was pushed, never before its maximum delay unless the last activity is a quiet period ago, and
        /// never above the bucket's allowance (burst + qps × elapsed).
        #[test]
        fn sends_in_order_within_the_rules(
            steps in proptest::collection::vec((0u8..3, 0i64..400), 1..200),
            qps in 0u32..30,
            burst in 1u32..20,
        ) {
            let q = DeferredEvents::new(DeferConfig { quiet_ns: 250 * MS, max_delay_ns: 2_000 * MS, capacity: 50 });
            let mut tokens = TokenBucket::new(qps, burst);
            let (mut now, mut next, mut last_busy) = (0i64, 0i64, i64::MIN);
            let (mut pushed, mut sent) = (Vec::new(), Vec::new());
            for (kind, dt) in steps {
                now += dt * MS;
                match kind {
                    0 => {
                        q.busy(now);
                        last_busy = now;
                    }
                    1 => {
                        let mut e = event(now);
                        e.pod = format!("p{next}");
                        next += 1;
                        if q.push(e.clone()) {
                            pushed.push(e);
                        }
                    }
                    _ => {
                        let quiet = now.saturating_sub(last_busy) >= 250 * MS;
                        for e in q.due(now, &mut tokens) {
                            prop_assert!(quiet || now - e.at_ns >= 2_000 * MS, "sent early: {e:?} at {now}");
                            sent.push(e);
                        }
                    }
                }
                if qps > 0 {
                    let allowed = f64::from(burst) + f64::from(qps) * now as f64 * 1e-9;
                    prop_assert!(sent.len() as f64 <= allowed + 1e-6);
                }
            }
            prop_assert_eq!(&sent[..], &pushed[..sent.len()]);
            prop_assert_eq!(q.len(), pushed.len() - sent.len());
        }
    }
}
