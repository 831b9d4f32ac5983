//! One async lock per pod UID, held by a live filter from its pre-allocation check to its reservation (and by
//! a bind from reading the pod to its binding), so that concurrent filters of the same pod run one after the
//! other (and the later ones find the reservation of the first) while filters of different pods never wait
//! on each other. Entries exist only while a verb holds or waits for them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

type Entry = Arc<tokio::sync::Mutex<()>>;

/// The per-pod locks.
#[derive(Debug, Default)]
pub(crate) struct PodLocks {
    map: Mutex<HashMap<String, Entry>>,
}

/// A held pod lock; dropping it frees the pod's entry when nobody else holds or waits for it.
#[derive(Debug)]
pub(crate) struct PodGuard<'a> {
    locks: &'a PodLocks,
    uid: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl PodLocks {
    /// Waits for the lock of `uid`.
    pub(crate) async fn lock(&self, uid: &str) -> PodGuard<'_> {
        let entry = {
            let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            map.entry(uid.to_owned()).or_default().clone()
        };
        let guard = entry.lock_owned().await;
        PodGuard { locks: self, uid: uid.to_owned(), guard: Some(guard) }
    }

    /// Pods with a lock entry now (held or waited for).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for PodGuard<'_> {
    fn drop(&mut self) {
        // The guard holds a reference to the entry: release it first, then the map's is the last one unless
        // another filter holds a clone (waiting for or holding the lock). Clones are only taken under the map
        // lock, so the count cannot grow while it is checked.
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.get(&self.uid).is_some_and(|e| Arc::strong_count(e) == 1) {
            map.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn same_pod_serializes_other_pods_do_not_and_entries_go_away() {
        let locks = Arc::new(PodLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (locks, inside, most) = (locks.clone(), inside.clone(), most.clone());
                tokio::spawn(async move {
                    let _g = locks.lock("a").await;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "one filter of pod a at a time");
        assert_eq!(locks.len(), 0);
        let a = locks.lock("a").await;
        let b = tokio::time::timeout(std::time::Duration::from_secs(5), locks.lock("b")).await;
        assert!(b.is_ok(), "another pod does not wait");
        assert_eq!(locks.len(), 2);
        drop((a, b));
        assert_eq!(locks.len(), 0);
    }
}
