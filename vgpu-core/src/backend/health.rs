//! Health events and the runtime-agnostic channel that carries them.
//!
//! A backend watches the hardware (a thread around `nvmlEventSetWait`, a script in the mock) and pushes
//! [`HealthEvent`]s into a [`HealthEventSender`]; the consumer reads the [`HealthEvents`] end either as a
//! [`futures_core::Stream`] (any async runtime) or as a blocking [`Iterator`] (a plain thread). The stream ends
//! when every sender is dropped.

use std::{
    collections::VecDeque,
    fmt,
    pin::Pin,
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

/// Xid codes that are application errors rather than hardware faults (as in the NVIDIA device plugin's
/// default skip list): they do not make a device unhealthy.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// What happened to a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HealthEventKind {
    /// An Xid (NVIDIA) or vendor error code was reported.
    Xid {
        /// The code.
        code: u64,
    },
    /// An uncorrectable (double-bit) memory error.
    EccUncorrectable,
    /// The device fell off the bus or stopped answering.
    DeviceLost,
    /// The device is usable again.
    Recovered,
}

impl HealthEventKind {
    /// Whether the event makes the device unhealthy: hardware Xids (not in [`APPLICATION_XIDS`]),
    /// uncorrectable ECC errors and lost devices.
    pub fn is_critical(&self) -> bool {
        match self {
            Self::Xid { code } => !APPLICATION_XIDS.contains(code),
            Self::EccUncorrectable | Self::DeviceLost => true,
            Self::Recovered => false,
        }
    }
}

impl fmt::Display for HealthEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Xid { code } => write!(f, "Xid {code}"),
            Self::EccUncorrectable => f.write_str("uncorrectable ECC error"),
            Self::DeviceLost => f.write_str("device lost"),
            Self::Recovered => f.write_str("recovered"),
        }
    }
}

/// A health event of one device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthEvent {
    /// Device index on the node.
    pub index: u32,
    /// Device UUID.
    pub uuid: String,
    /// What happened.
    pub kind: HealthEventKind,
    /// Free text from the backend (may be empty).
    pub message: String,
}

/// Why [`HealthEvents::try_recv`] or [`HealthEvents::recv_timeout`] returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// Nothing yet (or the timeout passed); more may come.
    #[error("no health event available yet")]
    Empty,
    /// Every sender is gone and the queue is drained: no more events will come.
    #[error("the health event channel is closed")]
    Closed,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<HealthEvent>,
    senders: usize,
    receiver_alive: bool,
    waker: Option<Waker>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    ready: Condvar,
}

impl Shared {
    /// Locks the state; a poisoned lock (a panicking peer) still holds consistent data here, so it is reused.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn notify(&self, mut state: MutexGuard<'_, State>) {
        let waker = state.waker.take();
        drop(state);
        self.ready.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Creates a health event channel.
///
/// ```
/// use vgpu_core::backend::health::{HealthEvent, HealthEventKind, health_channel};
///
/// let (tx, rx) = health_channel();
/// let event = HealthEvent { index: 0, uuid: "GPU-0".into(), kind: HealthEventKind::Xid { code: 79 }, message: String::new() };
/// assert!(tx.send(event.clone()));
/// drop(tx);
/// // Read as a blocking iterator here; `rx` is also a `futures_core::Stream`.
/// assert_eq!(rx.collect::<Vec<_>>(), vec![event]);
/// ```
pub fn health_channel() -> (HealthEventSender, HealthEvents) {
    let shared = Arc::new(Shared::default());
    {
        let mut state = shared.lock();
        state.senders = 1;
        state.receiver_alive = true;
    }
    (HealthEventSender { shared: Arc::clone(&shared) }, HealthEvents { shared })
}

/// The sending end of a health event channel; cloneable.
#[derive(Debug)]
pub struct HealthEventSender {
    shared: Arc<Shared>,
}

impl HealthEventSender {
    /// Queues an event. Returns `false` when the receiver is gone (the event is dropped): the producer can stop.
    pub fn send(&self, event: HealthEvent) -> bool {
        let mut state = self.shared.lock();
        if !state.receiver_alive {
            return false;
        }
        state.queue.push_back(event);
        self.shared.notify(state);
        true
    }

    /// Whether the receiver still exists.
    pub fn is_open(&self) -> bool {
        self.shared.lock().receiver_alive
    }
}

impl Clone for HealthEventSender {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl Drop for HealthEventSender {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.senders = state.senders.saturating_sub(1);
        if state.senders == 0 {
            self.shared.notify(state);
        }
    }
}

/// The receiving end: a [`futures_core::Stream`] and a blocking [`Iterator`] of [`HealthEvent`]s.
#[derive(Debug)]
pub struct HealthEvents {
    shared: Arc<Shared>,
}

impl HealthEvents {
    /// Takes an event if one is queued, without blocking.
    pub fn try_recv(&self) -> Result<HealthEvent, RecvError> {
        let mut state = self.shared.lock();
        match state.queue.pop_front() {
            Some(event) => Ok(event),
            None if state.senders == 0 => Err(RecvError::Closed),
            None => Err(RecvError::Empty),
        }
    }

    /// Waits up to `timeout` for an event.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<HealthEvent, RecvError> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.shared.lock();
        loop {
            if let Some(event) = state.queue.pop_front() {
                return Ok(event);
            }
            if state.senders == 0 {
                return Err(RecvError::Closed);
            }
            let now = Instant::now();
            let left = match deadline {
                Some(deadline) if deadline > now => deadline - now,
                Some(_) => return Err(RecvError::Empty),
                // A timeout too large to represent: wait in long slices.
                None => Duration::from_secs(3600),
            };
            state = self.shared.ready.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Waits for the next event; `None` once the channel is closed and drained.
    pub fn recv(&self) -> Option<HealthEvent> {
        let mut state = self.shared.lock();
        loop {
            if let Some(event) = state.queue.pop_front() {
                return Some(event);
            }
            if state.senders == 0 {
                return None;
            }
            state = self.shared.ready.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Iterator for HealthEvents {
    type Item = HealthEvent;

    /// Blocks until an event arrives or the channel closes.
    fn next(&mut self) -> Option<HealthEvent> {
        self.recv()
    }
}

impl futures_core::Stream for HealthEvents {
    type Item = HealthEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<HealthEvent>> {
        let mut state = self.shared.lock();
        if let Some(event) = state.queue.pop_front() {
            return Poll::Ready(Some(event));
        }
        if state.senders == 0 {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for HealthEvents {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.receiver_alive = false;
        state.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_core::Stream;
    use std::task::Wake;

    fn event(index: u32, code: u64) -> HealthEvent {
        HealthEvent {
            index,
            uuid: format!("GPU-{index}"),
            kind: HealthEventKind::Xid { code },
            message: String::new(),
        }
    }

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn stream_polls_and_wakes() {
        let (tx, mut rx) = health_channel();
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(Arc::clone(&flag));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(Pin::new(&mut rx).poll_next(&mut cx), Poll::Pending);
        assert!(tx.send(event(1, 79)));
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(Pin::new(&mut rx).poll_next(&mut cx), Poll::Ready(Some(event(1, 79))));
        drop(tx);
        assert_eq!(Pin::new(&mut rx).poll_next(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn blocking_receive_across_threads() {
        let (tx, rx) = health_channel();
        let tx2 = tx.clone();
        let handle = std::thread::spawn(move || {
            tx2.send(event(0, 48));
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(event(0, 48)));
        handle.join().unwrap();
        assert_eq!(rx.try_recv(), Err(RecvError::Empty));
        assert_eq!(rx.recv_timeout(Duration::from_millis(10)), Err(RecvError::Empty));
        drop(tx);
        assert_eq!(rx.try_recv(), Err(RecvError::Closed));
        assert_eq!(rx.recv(), None);
    }

    #[test]
    fn sender_sees_dropped_receiver() {
        let (tx, rx) = health_channel();
        assert!(tx.is_open());
        drop(rx);
        assert!(!tx.is_open());
        assert!(!tx.send(event(0, 79)));
    }

    #[test]
    fn criticality() {
        assert!(HealthEventKind::Xid { code: 79 }.is_critical());
        assert!(!HealthEventKind::Xid { code: 13 }.is_critical());
        assert!(HealthEventKind::DeviceLost.is_critical());
        assert!(!HealthEventKind::Recovered.is_critical());
        assert_eq!(HealthEventKind::Xid { code: 79 }.to_string(), "Xid 79");
    }
}
