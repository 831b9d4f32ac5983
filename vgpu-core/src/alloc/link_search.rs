//! Which subset searches link placement ran: opt-in, per thread, for metrics
//! (`vgpu_scheduler_link_search_total{algo}` and `..._candidates{algo}`).
//!
//! Link placement fills the policy run that overflows the need with the members of best link quality: an
//! exhaustive search over the run's subsets when there are at most [`MAX_COMBINATIONS`](super::MAX_COMBINATIONS)
//! of them, a greedy one above. [`record_link_searches`] runs a closure and returns the searches made inside it
//! on this thread; outside it nothing is recorded and the cost is one thread-local check per search.
//!
//! ```
//! use vgpu_core::alloc::{LinkSearchAlgo, record_link_searches};
//!
//! let (value, searches) = record_link_searches(|| 42);
//! assert_eq!(value, 42);
//! assert!(searches.is_empty());
//! assert_eq!(LinkSearchAlgo::Greedy.as_str(), "greedy");
//! ```

use std::cell::RefCell;

/// How a subset search ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkSearchAlgo {
    /// Every subset of the run was scored.
    Exhaustive,
    /// Members were added one at a time by best gain (too many subsets to score).
    Greedy,
}

impl LinkSearchAlgo {
    /// Every algorithm, in label order.
    pub const ALL: [LinkSearchAlgo; 2] = [LinkSearchAlgo::Exhaustive, LinkSearchAlgo::Greedy];

    /// The metric label: `exhaustive` or `greedy`.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkSearchAlgo::Exhaustive => "exhaustive",
            LinkSearchAlgo::Greedy => "greedy",
        }
    }
}

/// One subset search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSearch {
    /// How it ran.
    pub algo: LinkSearchAlgo,
    /// GPUs it chose among (the overflowing run).
    pub candidates: usize,
}

thread_local! {
    static RECORDER: RefCell<Option<Vec<LinkSearch>>> = const { RefCell::new(None) };
}

/// Runs `f` and returns its value with the link subset searches it made on this thread, in order. Nested
/// calls each get their own searches; the outer call does not see the inner call's.
pub fn record_link_searches<T>(f: impl FnOnce() -> T) -> (T, Vec<LinkSearch>) {
    let outer = RECORDER.with(|r| r.replace(Some(Vec::new())));
    let value = f();
    let searches = RECORDER.with(|r| r.replace(outer)).unwrap_or_default();
    (value, searches)
}

/// Records a search when a recorder is active on this thread.
pub(crate) fn note(search: LinkSearch) {
    RECORDER.with(|r| {
        if let Some(v) = r.borrow_mut().as_mut() {
            v.push(search);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searches_are_recorded_only_inside_and_per_call() {
        let s = |n| LinkSearch { algo: LinkSearchAlgo::Exhaustive, candidates: n };
        note(s(1));
        let (((), inner), outer) = record_link_searches(|| {
            note(s(2));
            let inner = record_link_searches(|| note(s(3)));
            note(s(4));
            inner
        });
        assert_eq!(inner, vec![s(3)]);
        assert_eq!(outer, vec![s(2), s(4)]);
        assert!(record_link_searches(|| ()).1.is_empty(), "nothing left over");
    }
}
