//! Per-stage latency histograms of `vgpuctl simulate` (hdrhistogram, nanoseconds, 3 significant digits).
//!
//! | key | what is timed |
//! |---|---|
//! | `filter` | the whole live filter call, as the server would run it (request to answer) |
//! | `lock_wait` | waiting for the `SerializedNodeFilter` lock |
//! | `rank` | expiry sweep, node gates and ranking of the candidates |
//! | `allocation` | allocation on the ranked nodes until one fits, with its reservation |
//! | `patch` | the pre-allocation patch (in-memory cluster: apply + watch fan-out into the cache) |
//! | `cache_update` | recording the reservation for expiry and the patched pod in the cache |
//! | `bind` | the bind verb |
//! | `filter_on_cpu` | CPU time the thread ran during the filter call (`/proc/thread-self/schedstat`, Linux) |
//! | `filter_runqueue_wait` | time the thread waited for a CPU during the filter call (other processes) |
//!
//! On a shared machine the wall-clock tail is mostly preemption: `filter_runqueue_wait` says how much of a
//! slow call was the machine's, `filter_on_cpu` how much was ours (both at the kernel's accounting
//! granularity, a scheduler tick: meaningful in the tail, 0 for most short calls).
//!
//! Counts (`counts` in the JSON): `nodes_tried`, the candidates a filter judged (every one rejected with a
//! reason of its own — from its rank-table row or by an allocation attempt — plus the chosen one; the ones
//! left untried once a node fits are not counted).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use vgpu_scheduler::{ExtenderObserver, FilterStage};

/// Highest latency recorded without saturating: 60 s.
const MAX_NS: u64 = 60_000_000_000;

/// One histogram per stage name.
#[derive(Debug, Default)]
pub struct StageHistograms {
    by_stage: Mutex<BTreeMap<&'static str, Histogram<u64>>>,
    counts: Mutex<BTreeMap<&'static str, Histogram<u64>>>,
}

impl StageHistograms {
    /// Records `elapsed` under `stage` (saturating at 60 s).
    pub fn record(&self, stage: &'static str, elapsed: Duration) {
        self.record_value(stage, u64::try_from(elapsed.as_nanos()).unwrap_or(MAX_NS));
    }

    /// Records a count under `name` (reported by [`counts_json`](Self::counts_json), not as a stage).
    pub fn record_count(&self, name: &'static str, count: usize) {
        Self::record_in(&self.counts, name, u64::try_from(count).unwrap_or(MAX_NS));
    }

    fn record_value(&self, stage: &'static str, value: u64) {
        Self::record_in(&self.by_stage, stage, value);
    }

    fn record_in(map: &Mutex<BTreeMap<&'static str, Histogram<u64>>>, stage: &'static str, value: u64) {
        let ns = value.clamp(1, MAX_NS);
        let mut map = map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let h = match map.entry(stage) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => match Histogram::new_with_bounds(1, MAX_NS, 3) {
                Ok(h) => e.insert(h),
                Err(_) => return,
            },
        };
        h.saturating_record(ns);
    }

    /// A stage's quantile in microseconds (0 when it never ran).
    #[cfg(test)]
    pub fn quantile_us(&self, stage: &str, q: f64) -> f64 {
        let map = self.by_stage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(stage).map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1000.0)
    }

    /// `{stage: {count, p50_us, p90_us, p99_us, p999_us, max_us, mean_us}}` in stage-name order.
    pub fn to_json(&self) -> Value {
        let map = self.by_stage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let us = |v: u64| v as f64 / 1000.0;
        map.iter()
            .map(|(k, h)| {
                let v = json!({
                    "count": h.len(),
                    "p50_us": us(h.value_at_quantile(0.5)),
                    "p90_us": us(h.value_at_quantile(0.9)),
                    "p99_us": us(h.value_at_quantile(0.99)),
                    "p999_us": us(h.value_at_quantile(0.999)),
                    "max_us": us(h.max()),
                    "mean_us": h.mean() / 1000.0,
                });
                ((*k).to_owned(), v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// `{name: {p50, p90, p99, max, mean}}` of the recorded counts (e.g. `nodes_tried`).
    pub fn counts_json(&self) -> Value {
        let map = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.iter()
            .map(|(k, h)| {
                let v = json!({
                    "p50": h.value_at_quantile(0.5),
                    "p90": h.value_at_quantile(0.9),
                    "p99": h.value_at_quantile(0.99),
                    "max": h.max(),
                    "mean": h.mean(),
                });
                ((*k).to_owned(), v)
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// One line per stage: `name  count  p50  p99  max` (µs).
    pub fn to_text(&self) -> String {
        let map = self.by_stage.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut s = String::new();
        for (k, h) in map.iter() {
            s.push_str(&format!(
                "    {k:<13} n={:<7} p50 {:>9.1} us  p99 {:>9.1} us  max {:>9.1} us\n",
                h.len(),
                h.value_at_quantile(0.5) as f64 / 1000.0,
                h.value_at_quantile(0.99) as f64 / 1000.0,
                h.max() as f64 / 1000.0
            ));
        }
        s
    }
}

/// This thread's (time on CPU, time waiting on a run queue), ns, from `/proc/thread-self/schedstat`
/// (`None` where it cannot be read).
pub fn thread_schedstat() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut it = text.split_ascii_whitespace().map(str::parse::<u64>);
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

impl StageHistograms {
    /// Records the on-CPU and run-queue parts of a call that started at `before` ([`thread_schedstat`]).
    pub fn record_sched(&self, before: Option<(u64, u64)>) {
        if let (Some((run0, wait0)), Some((run1, wait1))) = (before, thread_schedstat()) {
            self.record("filter_on_cpu", Duration::from_nanos(run1.saturating_sub(run0)));
            self.record("filter_runqueue_wait", Duration::from_nanos(wait1.saturating_sub(wait0)));
        }
    }
}

impl ExtenderObserver for StageHistograms {
    fn filter_stage(&self, stage: FilterStage, elapsed: Duration) {
        self.record(stage.as_str(), elapsed);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn records_per_stage_and_reports_quantiles() {
        let h = StageHistograms::default();
        for i in 1..=100u64 {
            h.record("rank", Duration::from_micros(i));
        }
        h.filter_stage(FilterStage::Patch, Duration::from_micros(7));
        let j = h.to_json();
        assert_eq!(j["rank"]["count"], 100);
        let p50 = j["rank"]["p50_us"].as_f64().unwrap();
        assert!((49.9..=50.1).contains(&p50), "{p50}");
        let p99 = h.quantile_us("rank", 0.99);
        assert!((98.9..=99.1).contains(&p99), "{p99}");
        assert_eq!(j["patch"]["count"], 1);
        assert_eq!(h.quantile_us("absent", 0.5), 0.0);
        assert!(h.to_text().contains("patch"));
        h.record_count("nodes_tried", 1);
        h.record_count("nodes_tried", 5000);
        let c = h.counts_json();
        assert_eq!(c["nodes_tried"]["p50"], 1);
        assert!((4995..=5005).contains(&c["nodes_tried"]["max"].as_u64().unwrap()), "{c}");
        assert!(h.to_json().get("nodes_tried").is_none());
    }
}
