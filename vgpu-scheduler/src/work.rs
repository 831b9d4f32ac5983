//! Bounded verb work: the CPU-heavy part of filter, filter-dryrun, prioritize and preempt runs on blocking
//! threads when its request body is large, so the async workers that answer `/healthz`, `/readyz`, `/metrics`
//! and `/version` are never busy with it for long, and on the calling task when the body is small
//! ([`INLINE_BODY_BYTES`]: no hand-off to another thread and back); only a bounded number of verb calls are
//! in the server at once.
//!
//! Two limits ([`WorkLimits`]):
//!
//! - **Admission** ([`WorkLimits::max_admitted`]): verb calls inside the server at once, from before their body
//!   is read until their answer is built: reading, queued or running. A call beyond it is refused at once,
//!   before a byte of its body is read ([`Busy::Full`]). This bounds the request bodies held in memory to
//!   `max_admitted × max_body_bytes`.
//! - **Workers** ([`WorkLimits::max_running`]): heavy calls running at once, each on a tokio blocking thread
//!   (decoding the body, the verb, encoding the answer). An admitted call waits for a worker up to
//!   [`WorkLimits::queue_timeout`], then is refused ([`Busy::QueueTimeout`]).
//! - **Binds** ([`WorkLimits::max_admitted_binds`]): bind calls take no worker (their work is two API calls)
//!   and have an admission of their own, with a small body limit ([`BIND_BODY_BYTES`]). kube-scheduler binds
//!   asynchronously while its next filters run, and binds to one node wait for each other (gate
//!   `SerializedNodeBind`): counted with the filters, a burst of them would fill the admission and get the
//!   filters refused as busy (each refusal sends a pod to kube-scheduler's backoff queue).
//!
//! A verb's async parts (the bind's patch and binding, events, the PodDisruptionBudget list) run inside the
//! blocking thread through [`tokio::runtime::Handle::block_on`]; their I/O is still driven by the runtime.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default [`WorkLimits::queue_timeout`].
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper end of the default [`WorkLimits::max_running`].
pub const MAX_DEFAULT_WORKERS: usize = 16;
/// Lower end of the default [`WorkLimits::max_admitted`].
pub const MIN_DEFAULT_ADMITTED: usize = 16;
/// Default [`WorkLimits::max_admitted_binds`].
pub const DEFAULT_ADMITTED_BINDS: usize = 1024;
/// Largest bind request body (`ExtenderBindingArgs` is four short strings): admitted binds hold at most
/// `max_admitted_binds ×` this (64 MiB by default).
pub const BIND_BODY_BYTES: usize = 64 * 1024;
/// `Retry-After` (seconds) sent with a refused call.
pub const RETRY_AFTER_SECS: u64 = 1;
/// Verb bodies up to this size run on the async runtime's own thread ([`WorkPool::run_small`],
/// [`WorkPool::run_small_async`]): a filter
/// over some hundreds of candidates takes tens of microseconds, less than handing it to a blocking thread and
/// back (two cross-thread wake-ups). 32 KiB holds a pod and about 2,000 node names.
pub const INLINE_BODY_BYTES: usize = 32 * 1024;

/// How much verb work the server takes at once (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkLimits {
    /// Heavy verb calls running at once, each on a blocking thread (at least 1).
    pub max_running: usize,
    /// Verb calls in the server at once (reading their body, queued for a worker, or running); more are refused
    /// before their body is read. At least [`max_running`](Self::max_running).
    pub max_admitted: usize,
    /// Longest wait of an admitted heavy call for a worker.
    pub queue_timeout: Duration,
    /// Bind calls in the server at once (their own admission; see the module docs).
    pub max_admitted_binds: usize,
}

impl Default for WorkLimits {
    /// Workers: the CPUs this process may use (`std::thread::available_parallelism`, which reads cgroup CPU
    /// quotas), 1 to [`MAX_DEFAULT_WORKERS`]; admitted: 4 × workers, at least [`MIN_DEFAULT_ADMITTED`];
    /// queue timeout: [`DEFAULT_QUEUE_TIMEOUT`].
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self::with_workers(cpus.clamp(1, MAX_DEFAULT_WORKERS))
    }
}

impl WorkLimits {
    /// `workers` running at once (at least 1), 4 × `workers` admitted (at least [`MIN_DEFAULT_ADMITTED`]), the
    /// default queue timeout.
    pub fn with_workers(workers: usize) -> Self {
        let workers = workers.max(1);
        Self {
            max_running: workers,
            max_admitted: workers.saturating_mul(4).max(MIN_DEFAULT_ADMITTED),
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            max_admitted_binds: DEFAULT_ADMITTED_BINDS,
        }
    }
}

/// Why a verb call was refused without being served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    /// Every admission slot is taken.
    #[error("extender busy: {admitted} verb calls already in progress; retry later")]
    Full {
        /// [`WorkLimits::max_admitted`].
        admitted: usize,
    },
    /// No worker became free in time.
    #[error("extender busy: no worker free within {waited:?} ({running} calls running); retry later")]
    QueueTimeout {
        /// [`WorkLimits::queue_timeout`].
        waited: Duration,
        /// [`WorkLimits::max_running`].
        running: usize,
    },
    /// Every bind admission slot is taken.
    #[error("extender busy: {admitted} bind calls already in progress; retry later")]
    BindsFull {
        /// [`WorkLimits::max_admitted_binds`].
        admitted: usize,
    },
    /// The blocking task ended without an answer (it panicked or the runtime is shutting down).
    #[error("extender internal error: the verb's worker stopped: {0}")]
    Stopped(String),
}

/// An admitted verb call (its slot is freed when this is dropped).
#[derive(Debug)]
pub struct Admission {
    _slot: OwnedSemaphorePermit,
}

/// The admission gate and the worker slots of one server.
#[derive(Debug)]
pub struct WorkPool {
    limits: WorkLimits,
    admitted: Arc<Semaphore>,
    running: Arc<Semaphore>,
    binds: Arc<Semaphore>,
}

impl WorkPool {
    /// A pool with these limits (zero counts are taken as 1; `max_admitted` as at least `max_running`).
    pub fn new(limits: WorkLimits) -> Self {
        let running = limits.max_running.clamp(1, Semaphore::MAX_PERMITS);
        let admitted = limits.max_admitted.clamp(running, Semaphore::MAX_PERMITS);
        let binds = limits.max_admitted_binds.clamp(1, Semaphore::MAX_PERMITS);
        let limits =
            WorkLimits { max_running: running, max_admitted: admitted, max_admitted_binds: binds, ..limits };
        Self {
            limits,
            admitted: Arc::new(Semaphore::new(admitted)),
            running: Arc::new(Semaphore::new(running)),
            binds: Arc::new(Semaphore::new(binds)),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> WorkLimits {
        self.limits
    }

    /// Verb calls in the server now (admitted and not finished).
    pub fn in_flight(&self) -> usize {
        self.limits.max_admitted.saturating_sub(self.admitted.available_permits())
    }

    /// Admits a verb call, or refuses it at once when every slot is taken.
    pub fn admit(&self) -> Result<Admission, Busy> {
        self.admitted
            .clone()
            .try_acquire_owned()
            .map(|slot| Admission { _slot: slot })
            .map_err(|_| Busy::Full { admitted: self.limits.max_admitted })
    }

    /// Admits a bind call (its own slots), or refuses it at once when every bind slot is taken.
    pub fn admit_bind(&self) -> Result<Admission, Busy> {
        self.binds
            .clone()
            .try_acquire_owned()
            .map(|slot| Admission { _slot: slot })
            .map_err(|_| Busy::BindsFull { admitted: self.limits.max_admitted_binds })
    }

    /// Runs `work` on a blocking thread once a worker is free (waiting up to the queue timeout), keeping the
    /// admission until it is done. Call from within a tokio runtime.
    pub async fn run<R, W>(&self, admission: Admission, work: W) -> Result<R, Busy>
    where
        R: Send + 'static,
        W: FnOnce() -> R + Send + 'static,
    {
        let worker = self.worker().await?;
        let done = tokio::task::spawn_blocking(move || {
            let out = work();
            drop(worker);
            drop(admission);
            out
        });
        done.await.map_err(|e| Busy::Stopped(e.to_string()))
    }

    /// Runs `work` once a worker is free, like [`run`](Self::run), but on the calling task when the request
    /// body is small (`body_len` ≤ [`INLINE_BODY_BYTES`]): the same limits without the hand-off to a blocking
    /// thread and back (prioritize).
    pub async fn run_small<R, W>(&self, admission: Admission, body_len: usize, work: W) -> Result<R, Busy>
    where
        R: Send + 'static,
        W: FnOnce() -> R + Send + 'static,
    {
        if body_len > INLINE_BODY_BYTES {
            return self.run(admission, work).await;
        }
        let worker = self.worker().await?;
        let out = work();
        drop(worker);
        drop(admission);
        Ok(out)
    }

    /// Runs async `work` once a worker is free, like [`run_async`](Self::run_async), but on the calling task
    /// when the request body is small (`body_len` ≤ [`INLINE_BODY_BYTES`]): the same limits (a worker
    /// permit, the queue timeout, the admission held until done) without the hand-off to a blocking thread.
    pub async fn run_small_async<R, F>(
        &self,
        admission: Admission,
        body_len: usize,
        work: F,
    ) -> Result<R, Busy>
    where
        R: Send + 'static,
        F: Future<Output = R> + Send + 'static,
    {
        if body_len > INLINE_BODY_BYTES {
            return self.run_async(admission, work).await;
        }
        let worker = self.worker().await?;
        let out = work.await;
        drop(worker);
        drop(admission);
        Ok(out)
    }

    /// A worker permit, waiting up to the queue timeout.
    async fn worker(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Busy> {
        match tokio::time::timeout(self.limits.queue_timeout, self.running.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) | Err(_) => Err(Busy::QueueTimeout {
                waited: self.limits.queue_timeout,
                running: self.limits.max_running,
            }),
        }
    }

    /// [`run`](Self::run) for async work: `work` is driven to completion on the blocking thread with
    /// [`Handle::block_on`](tokio::runtime::Handle::block_on) of the current runtime.
    pub async fn run_async<R, F>(&self, admission: Admission, work: F) -> Result<R, Busy>
    where
        R: Send + 'static,
        F: Future<Output = R> + Send + 'static,
    {
        let handle = tokio::runtime::Handle::current();
        self.run(admission, move || handle.block_on(work)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_cpus() {
        let l = WorkLimits::with_workers(2);
        assert_eq!((l.max_running, l.max_admitted), (2, 16));
        let l = WorkLimits::with_workers(8);
        assert_eq!((l.max_running, l.max_admitted), (8, 32));
        assert_eq!(WorkLimits::with_workers(0).max_running, 1);
        let d = WorkLimits::default();
        assert!((1..=MAX_DEFAULT_WORKERS).contains(&d.max_running));
        assert_eq!(d.queue_timeout, DEFAULT_QUEUE_TIMEOUT);
        let p = WorkPool::new(WorkLimits {
            max_running: 0,
            max_admitted: 0,
            queue_timeout: Duration::ZERO,
            max_admitted_binds: 0,
        });
        assert_eq!(
            (p.limits().max_running, p.limits().max_admitted, p.limits().max_admitted_binds),
            (1, 1, 1)
        );
        assert_eq!(d.max_admitted_binds, DEFAULT_ADMITTED_BINDS);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admission_is_refused_when_full_and_freed_after_the_work() {
        let pool = Arc::new(WorkPool::new(WorkLimits {
            max_running: 1,
            max_admitted: 2,
            queue_timeout: Duration::from_millis(50),
            max_admitted_binds: 1,
        }));
        let a = pool.admit().unwrap();
        let b = pool.admit().unwrap();
        assert_eq!(pool.admit().unwrap_err(), Busy::Full { admitted: 2 });
        // Binds have slots of their own: a full verb admission does not refuse them, nor they the verbs.
        let bind = pool.admit_bind().unwrap();
        assert_eq!(pool.admit_bind().unwrap_err(), Busy::BindsFull { admitted: 1 });
        drop(bind);
        assert!(pool.admit_bind().is_ok());
        assert_eq!(pool.in_flight(), 2);
        // One runs (holding the worker until told), the other times out in the queue.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let p = pool.clone();
        let first = tokio::spawn(async move { p.run(a, move || rx.recv().is_ok()).await });
        while pool.running.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let queued = pool.run(b, || true).await;
        assert!(matches!(queued, Err(Busy::QueueTimeout { running: 1, .. })), "{queued:?}");
        tx.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Ok(true));
        assert_eq!(pool.in_flight(), 0);
        let c = pool.admit().unwrap();
        assert_eq!(pool.run_async(c, async { 7 }).await, Ok(7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_work_runs_on_the_calling_task_under_the_same_limits() {
        let pool = Arc::new(WorkPool::new(WorkLimits {
            max_running: 1,
            max_admitted: 3,
            queue_timeout: Duration::from_millis(50),
            max_admitted_binds: 1,
        }));
        let caller = std::thread::current().id();
        let a = pool.admit().unwrap();
        let on = pool.run_small_async(a, 10, async { std::thread::current().id() }).await.unwrap();
        assert_eq!(on, caller, "a small body runs inline");
        let a = pool.admit().unwrap();
        let on = pool.run_small_async(a, INLINE_BODY_BYTES + 1, async { std::thread::current().id() }).await;
        assert_ne!(on.unwrap(), caller, "a large body runs on a blocking thread");
        let a = pool.admit().unwrap();
        let on = pool.run_small(a, 10, || std::thread::current().id()).await.unwrap();
        assert_eq!(on, caller, "small sync work (prioritize) runs inline too");
        let a = pool.admit().unwrap();
        let on = pool.run_small(a, INLINE_BODY_BYTES + 1, || std::thread::current().id()).await;
        assert_ne!(on.unwrap(), caller, "large sync work runs on a blocking thread");
        // The worker permit is held while inline work runs: a second call queues and times out.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (p, a) = (pool.clone(), pool.admit().unwrap());
        let first =
            tokio::spawn(async move { p.run_small_async(a, 10, async move { rx.await.is_ok() }).await });
        while pool.running.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let b = pool.admit().unwrap();
        let queued = pool.run_small_async(b, 10, async { true }).await;
        assert!(matches!(queued, Err(Busy::QueueTimeout { running: 1, .. })), "{queued:?}");
        tx.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Ok(true));
        assert_eq!(pool.in_flight(), 0);
    }
}
