//! A progress bar (indicatif) for `vgpuctl simulate` runs: hidden for the first second, so short runs never
//! draw one, and always hidden when stderr is not a terminal (indicatif's stderr target checks).

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Runs shorter than this draw no bar.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// A bar over `len` steps that appears once the run has lasted [`SHOW_AFTER`].
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    shown: bool,
}

impl Progress {
    /// A hidden bar of `len` steps labelled `what` (e.g. `pods`).
    pub fn new(len: u64, what: &str) -> Self {
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
        let template = format!("{{bar:40}} {{pos}}/{{len}} {what} ({{per_sec}}, eta {{eta}})");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style);
        }
        Self { bar, started: Instant::now(), shown: false }
    }

    /// One step done; shows the bar (on a terminal) once the run is older than a second.
    pub fn inc(&mut self) {
        self.bar.inc(1);
        if !self.shown && self.started.elapsed() >= SHOW_AFTER {
            self.shown = true;
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
