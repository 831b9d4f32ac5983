//! The kubelet plugin's Prometheus metrics (contract §1.5): [`DriverMetrics`], served on `--metrics-path` by
//! [`crate::endpoint`] (with `/healthz` and `/readyz`) as OpenMetrics 1.0 text ([`CONTENT_TYPE`]), followed by
//! the `process_*` families ([`vgpu_serve::process_metrics`]).
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `vgpu_kubelet_plugin_prepared_claims` | gauge | | claims prepared on this node (completed checkpoint entries), after each Prepare/Unprepare |
//! | `vgpu_kubelet_plugin_claim_operations_total` | counter | `operation` = `prepare`\|`unprepare`, `result` = `success`\|`failure` | claims handled, one per claim of a request |
//! | `vgpu_kubelet_plugin_request_duration_seconds` | histogram | `operation` | time of one NodePrepareResources/NodeUnprepareResources call (lock wait included) |
//!
//! | `vgpu_kubelet_plugin_resource_slice_pool_generation` | gauge | | the pool generation the API holds from this plugin (0 before the first successful round) |
//! | `vgpu_kubelet_plugin_resource_slice_publish_rounds_total` | counter | | publishing rounds finished, successful or not |
//! | `vgpu_kubelet_plugin_resource_slice_publish_failing` | gauge | | 1 while the last publishing round failed |
//!
//! | `vgpu_kubelet_plugin_device_health` | gauge | `device`, `uuid`, `status` = `Healthy`\|`Unhealthy`\|`Unknown` | 1 for the device's current status, 0 for the other two (a state set: three series per allocatable device) |
//! | `vgpu_kubelet_plugin_device_health_monitored` | gauge | | 1 while a health stream feeds the statuses (gate `NVMLDeviceHealthCheck` on and the backend's stream alive), else 0 |
//!
//! Every `operation`/`result` series exists from the start (zero), so rates work before the first claim.
//! The `resource_slice_*` ones are read at scrape time from the slice publisher's progress channel
//! ([`crate::slices::publisher::SlicePublisher::status`], given by [`DriverMetrics::set_publisher`]) and are
//! absent until it is given. The `device_health*` ones are read at scrape time from the health snapshot
//! ([`crate::health::HealthSnapshot`], given by [`DriverMetrics::set_health`]) and are absent until it is
//! given; a snapshot that tracks no devices (gate off) has `device_health_monitored 0` and no
//! `device_health` series. The label set is bounded: `device` and `uuid` come from this node's allocatable
//! devices, `status` from three values.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::Registry,
};
use tokio::sync::watch;

use crate::{
    devices::AllocatableDevices,
    health::{HealthSnapshot, HealthStatus},
    slices::publisher::PublisherStatus,
};

/// Content type of the metrics page.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Metric name prefix.
pub const PREFIX: &str = "vgpu_kubelet_plugin";
/// Request-duration histogram buckets (seconds): 1 ms … ~16 s.
pub const DURATION_BUCKETS: [f64; 15] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384,
];

/// Which kubelet call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// NodePrepareResources.
    Prepare,
    /// NodeUnprepareResources.
    Unprepare,
}

impl Operation {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prepare => "prepare",
            Self::Unprepare => "unprepare",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpResult {
    operation: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    operation: &'static str,
}

/// The driver's metric families (cheap to share: every family is reference-counted).
#[derive(Debug)]
pub struct DriverMetrics {
    registry: Registry,
    process: Registry,
    prepared_claims: Gauge,
    operations: Family<OpResult, Counter>,
    duration: Family<OpLabel, Histogram, fn() -> Histogram>,
    publisher: Arc<std::sync::OnceLock<watch::Receiver<PublisherStatus>>>,
    health: Arc<std::sync::OnceLock<HealthSource>>,
}

/// The health snapshot and the UUID of each device name (the `uuid` label).
#[derive(Debug)]
struct HealthSource {
    snapshot: watch::Receiver<HealthSnapshot>,
    uuids: std::collections::BTreeMap<String, String>,
}

/// The `device_health*` families, read from the health snapshot once it is set.
#[derive(Debug)]
struct HealthCollector(Arc<std::sync::OnceLock<HealthSource>>);

const STATUSES: [HealthStatus; 3] = [HealthStatus::Healthy, HealthStatus::Unhealthy, HealthStatus::Unknown];

impl Collector for HealthCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(source) = self.0.get() else { return Ok(()) };
        let snapshot = source.snapshot.borrow().clone();
        let monitored = ConstGauge::new(i64::from(snapshot.is_monitored()));
        monitored.encode(encoder.encode_descriptor(
            "vgpu_kubelet_plugin_device_health_monitored",
            "1 while a health stream feeds the device statuses, else 0",
            None,
            monitored.metric_type(),
        )?)?;
        let mut family = encoder.encode_descriptor(
            "vgpu_kubelet_plugin_device_health",
            "1 for the device's current health status (Healthy, Unhealthy, Unknown), 0 for the others",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (device, state) in snapshot.iter() {
            let uuid = source.uuids.get(device).map_or("", String::as_str);
            for status in STATUSES {
                let labels = [("device", device), ("uuid", uuid), ("status", status.as_str())];
                let g = ConstGauge::new(i64::from(state.status == status));
                g.encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The `resource_slice_*` families, read from the publisher's progress channel once it is set.
#[derive(Debug)]
struct PublisherCollector(Arc<std::sync::OnceLock<watch::Receiver<PublisherStatus>>>);

impl Collector for PublisherCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(status) = self.0.get() else { return Ok(()) };
        let status = status.borrow().clone();
        let rounds = ConstCounter::new(status.rounds);
        rounds.encode(encoder.encode_descriptor(
            "vgpu_kubelet_plugin_resource_slice_publish_rounds",
            "ResourceSlice publishing rounds finished, successful or not",
            None,
            rounds.metric_type(),
        )?)?;
        let gauges = [
            (
                "vgpu_kubelet_plugin_resource_slice_pool_generation",
                "Pool generation of this node's ResourceSlices in the API (0 before the first success)",
                status.generation,
            ),
            (
                "vgpu_kubelet_plugin_resource_slice_publish_failing",
                "1 while the last ResourceSlice publishing round failed",
                i64::from(status.last_error.is_some()),
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

fn histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

impl Default for DriverMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl DriverMetrics {
    /// Every family registered, every `operation`/`result` series at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let prepared_claims = Gauge::default();
        let operations = Family::<OpResult, Counter>::default();
        let duration: Family<OpLabel, Histogram, fn() -> Histogram> = Family::new_with_constructor(histogram);
        registry.register("prepared_claims", "Claims prepared on this node", prepared_claims.clone());
        registry.register(
            "claim_operations",
            "Claims handled by Prepare and Unprepare, by result",
            operations.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Duration of one NodePrepareResources or NodeUnprepareResources call",
            duration.clone(),
        );
        for operation in [Operation::Prepare, Operation::Unprepare].map(Operation::as_str) {
            for result in ["success", "failure"] {
                let _ = operations.get_or_create(&OpResult { operation, result });
            }
            let _ = duration.get_or_create(&OpLabel { operation });
        }
        let publisher = Arc::new(std::sync::OnceLock::new());
        let mut process = Registry::default();
        let health = Arc::new(std::sync::OnceLock::new());
        process.register_collector(Box::new(PublisherCollector(Arc::clone(&publisher))));
        process.register_collector(Box::new(HealthCollector(Arc::clone(&health))));
        process.register_collector(Box::new(vgpu_serve::process_metrics::ProcessCollector));
        Self { registry, process, prepared_claims, operations, duration, publisher, health }
    }

    /// Reads the `device_health*` families from `snapshot` from now on, with the `uuid` label of each
    /// device name taken from `devices` (the first call wins).
    pub fn set_health(&self, snapshot: watch::Receiver<HealthSnapshot>, devices: &AllocatableDevices) {
        let uuids = devices.iter().map(|d| (d.name.clone(), d.gpu.uuid.clone())).collect();
        let _ = self.health.set(HealthSource { snapshot, uuids });
    }

    /// Reads the `resource_slice_*` families from `status` from now on (the first call wins).
    pub fn set_publisher(&self, status: watch::Receiver<PublisherStatus>) {
        let _ = self.publisher.set(status);
    }

    /// One request: `successes` and `failures` claims, taking `elapsed`.
    pub fn request(&self, operation: Operation, successes: usize, failures: usize, elapsed: Duration) {
        let op = operation.as_str();
        for (result, n) in [("success", successes), ("failure", failures)] {
            if n > 0 {
                self.operations.get_or_create(&OpResult { operation: op, result }).inc_by(n as u64);
            }
        }
        self.duration.get_or_create(&OpLabel { operation: op }).observe(elapsed.as_secs_f64());
    }

    /// Sets the number of prepared claims.
    pub fn set_prepared_claims(&self, n: usize) {
        self.prepared_claims.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text: the driver's families, the `resource_slice_*` ones, then the `process_*` ones.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        text::encode_registry(&mut out, &self.registry)?;
        text::encode_registry(&mut out, &self.process)?;
        text::encode_eof(&mut out)?;
        Ok(out)
    }
}

/// Times one request for [`DriverMetrics::request`].
#[derive(Debug)]
pub struct Timer(Instant);

impl Timer {
    /// Starts now.
    pub fn start() -> Self {
        Self(Instant::now())
    }

    /// Time since start.
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn families_start_at_zero_and_count() {
        let m = DriverMetrics::new();
        let text = m.encode().unwrap();
        assert!(
            text.contains(
                "vgpu_kubelet_plugin_claim_operations_total{operation=\"unprepare\",result=\"failure\"} 0"
            ),
            "{text}"
        );
        m.request(Operation::Prepare, 2, 1, Duration::from_millis(3));
        m.set_prepared_claims(2);
        let text = m.encode().unwrap();
        assert!(
            text.contains("claim_operations_total{operation=\"prepare\",result=\"success\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("claim_operations_total{operation=\"prepare\",result=\"failure\"} 1"),
            "{text}"
        );
        assert!(text.contains("vgpu_kubelet_plugin_prepared_claims 2"), "{text}");
        assert!(text.contains("request_duration_seconds_count{operation=\"prepare\"} 1"), "{text}");
        assert!(
            text.contains("request_duration_seconds_bucket{le=\"0.004\",operation=\"prepare\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        assert!(!text.contains("resource_slice"), "absent until the publisher is set");
    }

    #[test]
    fn publisher_progress_is_read_at_scrape_time() {
        let m = DriverMetrics::new();
        let (tx, rx) = watch::channel(PublisherStatus::default());
        m.set_publisher(rx);
        let text = m.encode().unwrap();
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_publish_rounds_total 0\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_pool_generation 0\n"), "{text}");
        tx.send_replace(PublisherStatus {
            rounds: 3,
            generation: 2,
            last_error: Some("list: refused".into()),
        });
        let text = m.encode().unwrap();
        assert!(
            text.contains("# TYPE vgpu_kubelet_plugin_resource_slice_publish_rounds counter\n"),
            "{text}"
        );
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_publish_rounds_total 3\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_pool_generation 2\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_resource_slice_publish_failing 1\n"), "{text}");
    }

    #[test]
    fn device_health_is_a_bounded_state_set_read_at_scrape_time() {
        use vgpu_core::backend::{HealthEvent, HealthEventKind, mock::MockBackend};

        use crate::{
            devices::DeviceConfig,
            health::{HealthConfig, HealthMonitor},
        };
        let backend = MockBackend::from_yaml_str(
            "gpus:\n  - { uuid: GPU-A, name: A30, memoryMiB: 1024 }\n  - { uuid: GPU-B, name: A30, memoryMiB: 1024 }\n",
        )
        .unwrap();
        let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
        let m = DriverMetrics::new();
        assert!(!m.encode().unwrap().contains("device_health"), "absent until the snapshot is set");

        // Gate off: the unmonitored default has no devices.
        let off = DriverMetrics::new();
        let (_tx, rx) = watch::channel(HealthSnapshot::unmonitored_default());
        off.set_health(rx, &devices);
        let text = off.encode().unwrap();
        assert!(text.contains("vgpu_kubelet_plugin_device_health_monitored 0\n"), "{text}");
        assert!(!text.contains("vgpu_kubelet_plugin_device_health{"), "{text}");

        let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
        m.set_health(monitor.subscribe(), &devices);
        let text = m.encode().unwrap();
        assert!(text.contains("# TYPE vgpu_kubelet_plugin_device_health gauge\n"), "{text}");
        assert!(text.contains("vgpu_kubelet_plugin_device_health_monitored 1\n"), "{text}");
        let series = text.lines().filter(|l| l.starts_with("vgpu_kubelet_plugin_device_health{")).count();
        assert_eq!(series, devices.len() * 3, "three statuses per device: {text}");
        let first = devices.iter().next().unwrap();
        let line = |status: &str| {
            format!(
                "vgpu_kubelet_plugin_device_health{{device=\"{}\",uuid=\"{}\",status=\"{status}\"}}",
                first.name, first.gpu.uuid
            )
        };
        assert!(text.contains(&format!("{} 1\n", line("Healthy"))), "{text}");
        assert!(text.contains(&format!("{} 0\n", line("Unhealthy"))), "{text}");
        let xid = HealthEvent {
            index: first.gpu.index,
            uuid: first.gpu.uuid.clone(),
            kind: HealthEventKind::Xid { code: 79 },
            message: String::new(),
        };
        assert!(monitor.apply(&xid));
        let text = m.encode().unwrap();
        assert!(text.contains(&format!("{} 1\n", line("Unhealthy"))), "{text}");
        assert!(text.contains(&format!("{} 0\n", line("Healthy"))), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("vgpu_kubelet_plugin_device_health{")).count(),
            devices.len() * 3,
            "no new series on a change"
        );
    }
}
