//! The stable runner of the fuzz entries: proptest over the checked-in seeds, mutated, and over arbitrary
//! bytes, for a bounded number of cases. Not part of the `vgpu-fuzz` crate (it needs proptest): included
//! through `#[path]` by `vgpu-core/tests/fuzz_entries.rs` and `vgpu-scheduler/tests/fuzz_extender.rs`, next to
//! `fuzz/src/corpus.rs` (as `corpus`).
//!
//! Knobs (environment): `VGPU_FUZZ_CASES` (cases per target, default per test file), `VGPU_FUZZ_SECONDS`
//! (wall-clock budget per target, default 4; cases past it pass without running, so a slow machine cuts the
//! run short instead of timing out), `PROPTEST_RNG_SEED` (a fixed seed; random by default, so successive CI
//! runs cover different inputs and a failure prints its minimal input).

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::sync::Once;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use super::corpus;

thread_local! {
    /// Set while this thread runs generated cases: their panics are expected (proptest shrinks them), so the
    /// panic hook only records where they happened instead of printing each one.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
                LAST_PANIC.with(|p| *p.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

/// Cases per target: `VGPU_FUZZ_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("VGPU_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn budget() -> Duration {
    let secs = std::env::var("VGPU_FUZZ_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4.0_f64);
    Duration::from_secs_f64(secs.max(0.0))
}

/// Runs `entry` on every seed of `target` as it is, then on `cases` generated inputs (three in four a seed
/// with up to eight [`corpus::mutate`] edits, one in four arbitrary bytes). A panic in the entry fails the
/// test with the minimal input proptest shrank it to.
pub fn run(seeds_root: &Path, target: &str, entry: fn(&[u8]), cases: u32) {
    let seeds = corpus::seeds(seeds_root, target);
    assert!(!seeds.is_empty(), "fuzz/seeds/{target}/ has no seeds");
    for seed in &seeds {
        entry(seed);
    }
    let mutated = (
        prop::sample::select(seeds.clone()),
        prop::sample::select(seeds),
        vec((any::<u8>(), any::<u32>(), any::<u32>()), 1..8),
    )
        .prop_map(|(seed, donor, edits)| corpus::mutate(&seed, &donor, &edits));
    let strategy = prop_oneof![3 => mutated, 1 => vec(any::<u8>(), 0..512)];
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config);
    install_quiet_hook();
    QUIET.with(|q| q.set(true));
    let (start, budget) = (Instant::now(), budget());
    let ran = std::cell::Cell::new(0_u32);
    let result = runner.run(&strategy, |input| {
        if start.elapsed() > budget {
            return Ok(());
        }
        ran.set(ran.get() + 1);
        match std::panic::catch_unwind(|| entry(&input)) {
            Ok(()) => Ok(()),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                let at = LAST_PANIC.with(|p| p.borrow().clone());
                Err(TestCaseError::fail(format!("{why} (at {at})")))
            }
        }
    });
    QUIET.with(|q| q.set(false));
    match result {
        Ok(()) => eprintln!("{target}: {} cases in {:.1?}", ran.get(), start.elapsed()),
        Err(TestError::Fail(why, input)) => panic!(
            "fuzz target {target} failed: {why}\nminimal input ({} bytes): {:?}\nsave it under fuzz/seeds/{target}/ \
             and fix the decoder",
            input.len(),
            String::from_utf8_lossy(&input),
        ),
        Err(e) => panic!("fuzz target {target}: {e}"),
    }
}
