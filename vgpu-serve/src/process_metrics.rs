//! The standard Prometheus `process_*` metrics of this process (what client_golang's process collector exports
//! and the Go extender serves beside its own families), read from `/proc/self` on each scrape.
//!
//! | metric | type | source |
//! |---|---|---|
//! | `process_cpu_seconds_total` | counter | user + system time (`/proc/self/stat` utime, stime) |
//! | `process_resident_memory_bytes` | gauge | resident pages × page size (`/proc/self/stat` rss) |
//! | `process_virtual_memory_bytes` | gauge | `/proc/self/stat` vsize |
//! | `process_start_time_seconds` | gauge | boot time (`/proc/stat` btime) + `/proc/self/stat` starttime |
//! | `process_open_fds` | gauge | entries of `/proc/self/fd` |
//! | `process_max_fds` | gauge | soft `RLIMIT_NOFILE` |
//!
//! A value that cannot be read (no `/proc`, an unexpected format) is left out of the scrape rather than
//! reported as zero. Go runtime metrics (`go_*`) have no Rust counterpart and are not exported.

use std::fs;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// One reading of the process metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: Option<u64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// Soft limit of open file descriptors.
    pub max_fds: Option<u64>,
}

/// The fields of `/proc/<pid>/stat` this module uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFields {
    /// utime + stime, clock ticks.
    pub cpu_ticks: u64,
    /// starttime, clock ticks after boot.
    pub start_ticks: u64,
    /// vsize, bytes.
    pub vsize: u64,
    /// rss, pages.
    pub rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may hold spaces and `)`, so
/// fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<StatFields> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(StatFields {
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
        start_ticks: field(22)?,
        vsize: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The `btime` line of `/proc/stat`: boot time, seconds since the Unix epoch.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

impl ProcessStats {
    /// Reads this process's values (Linux `/proc`; every field is `None` elsewhere).
    pub fn read() -> Self {
        let stat = fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(parse_stat);
        let ticks = rustix::param::clock_ticks_per_second();
        let per_tick = if ticks > 0 { 1.0 / ticks as f64 } else { 0.0 };
        let boot = fs::read_to_string("/proc/stat").ok().as_deref().and_then(parse_boot_time);
        let page = rustix::param::page_size() as u64;
        let open_fds = fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64);
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        Self {
            cpu_seconds: stat.map(|s| s.cpu_ticks as f64 * per_tick),
            resident_bytes: stat.map(|s| s.rss_pages.saturating_mul(page)),
            virtual_bytes: stat.map(|s| s.vsize),
            start_time_seconds: stat.zip(boot).map(|(s, b)| b as f64 + s.start_ticks as f64 * per_tick),
            // `read_dir` itself holds one descriptor while counting.
            open_fds: open_fds.map(|n| n.saturating_sub(1)),
            max_fds,
        }
    }
}

/// A prometheus-client [`Collector`] of the `process_*` metrics; register it on a registry without a prefix.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read();
        if let Some(v) = s.cpu_seconds {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                c.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                s.start_time_seconds,
            ),
            ("process_open_fds", "Number of open file descriptors.", s.open_fds.map(|v| v as f64)),
            ("process_max_fds", "Maximum number of open file descriptors.", s.max_fds.map(|v| v as f64)),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;
    use proptest::prelude::*;

    use super::*;

    const STAT: &str = "4242 (vgpu) sched) S 1 4242 4242 0 -1 4194560 1234 0 0 0 150 50 0 0 20 0 9 0 \
                        98765 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parens() {
        let s = parse_stat(STAT).unwrap();
        assert_eq!(s, StatFields { cpu_ticks: 200, start_ticks: 98765, vsize: 123456789, rss_pages: 2048 });
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
        assert_eq!(parse_stat("no parens"), None);
        assert_eq!(parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu 1\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process_and_encodes_every_family() {
        let s = ProcessStats::read();
        assert!(s.cpu_seconds.is_some_and(|v| v >= 0.0));
        assert!(s.resident_bytes.is_some_and(|v| v > 0));
        assert!(s.open_fds.is_some_and(|v| v >= 3));
        assert!(s.max_fds.is_some_and(|v| v >= s.open_fds.unwrap_or(0)));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let start = s.start_time_seconds.unwrap();
        assert!(start > now - 86_400.0 * 365.0 && start <= now + 1.0, "{start} vs {now}");

        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for family in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(text.contains(family), "{family} missing in\n{text}");
        }
    }

    proptest! {
        /// Any text parses or is refused without panicking; a well-formed line always parses.
        #[test]
        fn stat_parser_total(text in ".{0,200}", name in "[ -~]{0,20}", nums in proptest::collection::vec(0u32..1_000_000, 30)) {
            let _ = parse_stat(&text);
            let line = format!("1 ({name}) S {}", nums.iter().map(u32::to_string).collect::<Vec<_>>().join(" "));
            let s = parse_stat(&line).unwrap();
            // Field N (1-based) is nums[N - 4]: start time is field 22, rss field 24.
            prop_assert_eq!(s.start_ticks, u64::from(nums[18]));
            prop_assert_eq!(s.rss_pages, u64::from(nums[20]));
        }
    }
}
