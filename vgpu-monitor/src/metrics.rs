//! The exposition: every family of contract §8, encoded from a [`Snapshot`] at scrape time by the
//! [`Collector`] impl of [`NodeCollector`] (no long-lived gauges: a container that is gone has no series
//! on the next scrape). Register it with [`register`] on a registry that carries `service="vGPU"` (see
//! [`new_registry`]), so every series has that label. All families are gauges.
//!
//! | family | labels | value |
//! |---|---|---|
//! | `exporter_build_info` | `node,version,branch,commit,platform,date` | 1 |
//! | `physical_gpu_device_total_memory_in_bytes` | `node,device_idx,device_uuid,device_type,pci_bus_id,minor_num,mig_enabled,capability,numa_node` | device memory |
//! | `physical_gpu_device_memory_usage_in_bytes` | same | used memory |
//! | `physical_gpu_device_memory_utilization_percent` | same | used / total × 100 |
//! | `physical_gpu_device_core_utilization_percent` | same | Σ processes' `sm + 0.85 × (enc + dec)`, capped at 100 |
//! | `physical_gpu_device_health_status` | same | 1 healthy, 0 not |
//! | `node_gpu_device_configuration_info` | `node,device_split,cores_scaling,memory_scaling,memory_factor` (`%.2f`) | 1 |
//! | `node_gpu_device_driver_version_info` | `node,driver_version,cuda_version,nvml_version` | 1 (only when the backend reports a driver) |
//! | `node_vgpu_device_total_memory_in_bytes` | `node` | Σ vGPU memory (physical × memory scaling) |
//! | `node_vgpu_device_total_physical_memory_in_bytes` | `node` | Σ physical memory |
//! | `node_vgpu_device_assigned_memory_in_bytes` | `node` | Σ claimed memory |
//! | `node_vgpu_device_assigned_physical_memory_in_bytes` | `node` | Σ claimed / scaling when scaling > 1 |
//! | `vgpu_device_total_cores_number` | `node,device_idx,device_uuid,device_type` | cores scaling × 100 |
//! | `vgpu_device_assigned_cores_number` | same | Σ claimed cores (`ReducePodFootprint`) |
//! | `vgpu_device_peak_shared_containers_number` | same | split count |
//! | `vgpu_device_current_shared_containers_number` | same | claims on the GPU |
//! | `vgpu_device_total_memory_in_bytes` | same | physical × memory scaling |
//! | `vgpu_device_total_physical_memory_in_bytes` | same | physical memory |
//! | `vgpu_device_assigned_memory_in_bytes` | same | Σ claimed memory |
//! | `vgpu_device_assigned_physical_memory_in_bytes` | same | claimed / scaling when scaling > 1 |
//! | `container_vgpu_device_memory_limit_in_bytes` | `pod_namespace,pod_name,container_name,vdevice_idx,device_uuid,node` | `total_memory` of the slot |
//! | `container_vgpu_device_physical_memory_limit_in_bytes` | same | `real_memory` of the slot |
//! | `container_vgpu_device_memory_usage_in_bytes` | same | physical + virtual (ledger, with `VirtualMemoryTracking`) |
//! | `container_vgpu_device_physical_memory_usage_in_bytes` | same | Σ memory of the container's processes |
//! | `container_vgpu_device_memory_utilization_percent` | same | usage / limit × 100, capped at 100 |
//! | `container_vgpu_device_core_utilization_percent` | same | Σ `sm + 0.85 × (enc + dec)` (terms ≤ 100), capped at 100 |
//! | `mig_device_total_memory_in_bytes` | `node,device_idx,device_uuid,parent_uuid,ci_id,gi_id,profile` | MIG instance memory |
//! | `mig_device_memory_usage_in_bytes` | same | memory used inside the instance (only instances whose backend reports it) |
//! | `mig_device_memory_utilization_percent` | same | used / total × 100, capped at 100 (same instances) |
//! | `container_mig_device_allocation_info` | `node,device_idx,device_uuid,parent_uuid,pod_namespace,pod_name,container_name` | 1 per container holding the MIG device (kubelet pod-resources; no series without a source) |
//! | `sm_watcher_file_present` | `node` | with `SharedSMUtilizationWatcher` only: 1 when `watcher/sm_util.config` was read, 0 when the monitor fell back to the backend |
//!
//! Families without series (no GPUs, no containers) still get their `# HELP`/`# TYPE` lines, so a
//! dashboard sees the family exists.

use std::borrow::Cow;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::gauge::ConstGauge,
    registry::Registry,
};

use crate::collect::{NodeCollector, Snapshot, percent};

/// The constant label on every series.
pub const SERVICE_LABEL: (&str, &str) = ("service", "vGPU");

/// A registry whose every series carries `service="vGPU"`.
pub fn new_registry() -> Registry {
    Registry::with_labels([(Cow::Borrowed(SERVICE_LABEL.0), Cow::Borrowed(SERVICE_LABEL.1))].into_iter())
}

/// Registers `collector` (shared) on `registry`.
pub fn register(registry: &mut Registry, collector: std::sync::Arc<NodeCollector>) {
    registry.register_collector(Box::new(collector));
}

type Labels = Vec<(&'static str, String)>;
/// A family of one row kind: name, help, value of a row.
type Spec<T> = (&'static str, &'static str, fn(&T) -> f64);

fn family<'r>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (&'r Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric =
        encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Gauge)?;
    for (labels, value) in rows {
        let g = ConstGauge::new(value);
        g.encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

fn s<T: ToString>(v: T) -> String {
    v.to_string()
}

impl Snapshot {
    /// Encodes every family.
    pub fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let node = || ("node", self.node.clone());
        let b = &self.build;
        family(
            &mut e,
            "exporter_build_info",
            "A metric with a constant '1' value labeled by version, branch, commit, platform and build date.",
            [(
                &vec![
                    node(),
                    ("version", b.version.clone()),
                    ("branch", b.branch.clone()),
                    ("commit", b.commit.clone()),
                    ("platform", b.platform.clone()),
                    ("date", b.date.clone()),
                ],
                1.0,
            )],
        )?;
        let phys_labels = |p: &crate::collect::PhysicalGpu| -> Labels {
            let d = &p.device;
            vec![
                node(),
                ("device_idx", s(d.index)),
                ("device_uuid", d.uuid.clone()),
                ("device_type", d.type_name.clone()),
                ("pci_bus_id", d.bus_id.clone()),
                ("minor_num", s(p.minor)),
                ("mig_enabled", s(d.mig_enabled)),
                ("capability", s(d.capability)),
                ("numa_node", d.numa_node.map_or_else(|| "-1".to_owned(), s)),
            ]
        };
        let physical: [Spec<crate::collect::PhysicalGpu>; 5] = [
            (
                "physical_gpu_device_total_memory_in_bytes",
                "Total memory of the physical GPU in bytes.",
                |p| p.total_bytes as f64,
            ),
            ("physical_gpu_device_memory_usage_in_bytes", "Used memory of the physical GPU in bytes.", |p| {
                p.used_bytes as f64
            }),
            (
                "physical_gpu_device_memory_utilization_percent",
                "Memory utilization of the physical GPU (0-100).",
                |p| {
                    if p.total_bytes == 0 {
                        0.0
                    } else {
                        (p.used_bytes as f64 * 100.0 / p.total_bytes as f64).min(100.0)
                    }
                },
            ),
            (
                "physical_gpu_device_core_utilization_percent",
                "Core utilization of the physical GPU (0-100): sum over processes of sm + 0.85*(enc+dec).",
                |p| p.core_percent,
            ),
            (
                "physical_gpu_device_health_status",
                "Health of the physical GPU (1 healthy, 0 unhealthy).",
                |p| {
                    if p.device.health.is_healthy() { 1.0 } else { 0.0 }
                },
            ),
        ];
        let rows: Vec<Labels> = self.physical.iter().map(phys_labels).collect();
        for (name, help, value) in physical {
            family(&mut e, name, help, rows.iter().zip(&self.physical).map(|(l, p)| (l, value(p))))?;
        }
        family(
            &mut e,
            "node_gpu_device_configuration_info",
            "Device configuration of the node: split count, cores scaling, memory scaling and memory factor.",
            [(
                &vec![
                    node(),
                    ("device_split", s(self.split_count)),
                    ("cores_scaling", format!("{:.2}", self.cores_scaling)),
                    ("memory_scaling", format!("{:.2}", self.memory_scaling)),
                    ("memory_factor", s(self.memory_factor)),
                ],
                1.0,
            )],
        )?;
        let driver_rows: Vec<Labels> = self
            .driver
            .iter()
            .map(|d| {
                let cuda = d.cuda_version.map_or_else(String::new, |(a, b)| format!("{a}.{b}"));
                vec![
                    node(),
                    ("driver_version", d.driver_version.clone()),
                    ("cuda_version", cuda),
                    ("nvml_version", String::new()),
                ]
            })
            .collect();
        family(
            &mut e,
            "node_gpu_device_driver_version_info",
            "Driver versions of the node's GPUs.",
            driver_rows.iter().map(|l| (l, 1.0)),
        )?;
        let sum = |f: fn(&crate::collect::VgpuDevice) -> u64| {
            self.vgpu.iter().map(f).fold(0u64, u64::saturating_add) as f64
        };
        for (name, help, v) in [
            (
                "node_vgpu_device_total_memory_in_bytes",
                "Total vGPU memory of the node in bytes.",
                sum(|d| d.total_memory),
            ),
            (
                "node_vgpu_device_total_physical_memory_in_bytes",
                "Total physical memory of the node's vGPU devices in bytes.",
                sum(|d| d.total_physical_memory),
            ),
            (
                "node_vgpu_device_assigned_memory_in_bytes",
                "vGPU memory assigned on the node in bytes.",
                sum(|d| d.assigned_memory),
            ),
            (
                "node_vgpu_device_assigned_physical_memory_in_bytes",
                "Physical memory behind the vGPU memory assigned on the node in bytes.",
                sum(|d| d.assigned_physical_memory),
            ),
        ] {
            family(&mut e, name, help, [(&vec![node()], v)])?;
        }
        let vgpu_labels = |d: &crate::collect::VgpuDevice| -> Labels {
            vec![
                node(),
                ("device_idx", s(d.index)),
                ("device_uuid", d.uuid.clone()),
                ("device_type", d.type_name.clone()),
            ]
        };
        let vgpu: [Spec<crate::collect::VgpuDevice>; 8] = [
            ("vgpu_device_total_cores_number", "Total cores of the vGPU device.", |d| d.total_cores),
            ("vgpu_device_assigned_cores_number", "Cores assigned on the vGPU device.", |d| {
                d.assigned_cores as f64
            }),
            (
                "vgpu_device_peak_shared_containers_number",
                "Most containers that can share the vGPU device (split count).",
                |d| f64::from(d.peak_shared),
            ),
            (
                "vgpu_device_current_shared_containers_number",
                "Containers currently sharing the vGPU device.",
                |d| f64::from(d.current_shared),
            ),
            ("vgpu_device_total_memory_in_bytes", "Total memory of the vGPU device in bytes.", |d| {
                d.total_memory as f64
            }),
            (
                "vgpu_device_total_physical_memory_in_bytes",
                "Physical memory of the vGPU device in bytes.",
                |d| d.total_physical_memory as f64,
            ),
            ("vgpu_device_assigned_memory_in_bytes", "Memory assigned on the vGPU device in bytes.", |d| {
                d.assigned_memory as f64
            }),
            (
                "vgpu_device_assigned_physical_memory_in_bytes",
                "Physical memory behind the memory assigned on the vGPU device in bytes.",
                |d| d.assigned_physical_memory as f64,
            ),
        ];
        let rows: Vec<Labels> = self.vgpu.iter().map(vgpu_labels).collect();
        for (name, help, value) in vgpu {
            family(&mut e, name, help, rows.iter().zip(&self.vgpu).map(|(l, d)| (l, value(d))))?;
        }
        let ctr_labels = |c: &crate::collect::ContainerDevice| -> Labels {
            vec![
                ("pod_namespace", c.pod_namespace.clone()),
                ("pod_name", c.pod_name.clone()),
                ("container_name", c.container_name.clone()),
                ("vdevice_idx", s(c.vdevice_idx)),
                ("device_uuid", c.device_uuid.clone()),
                node(),
            ]
        };
        let ctr: [Spec<crate::collect::ContainerDevice>; 6] = [
            (
                "container_vgpu_device_memory_limit_in_bytes",
                "Memory limit of the container on the vGPU device in bytes.",
                |c| c.memory_limit as f64,
            ),
            (
                "container_vgpu_device_physical_memory_limit_in_bytes",
                "Physical memory limit of the container on the vGPU device in bytes.",
                |c| c.physical_memory_limit as f64,
            ),
            (
                "container_vgpu_device_memory_usage_in_bytes",
                "Memory used by the container on the vGPU device in bytes (physical plus virtual).",
                |c| c.memory_usage as f64,
            ),
            (
                "container_vgpu_device_physical_memory_usage_in_bytes",
                "Physical memory used by the container on the vGPU device in bytes.",
                |c| c.physical_memory_usage as f64,
            ),
            (
                "container_vgpu_device_memory_utilization_percent",
                "Memory utilization of the container on the vGPU device (0-100).",
                |c| c.memory_percent,
            ),
            (
                "container_vgpu_device_core_utilization_percent",
                "Core utilization of the container on the vGPU device (0-100).",
                |c| c.core_percent,
            ),
        ];
        let rows: Vec<Labels> = self.containers.iter().map(ctr_labels).collect();
        for (name, help, value) in ctr {
            family(&mut e, name, help, rows.iter().zip(&self.containers).map(|(l, c)| (l, value(c))))?;
        }
        let mig_rows: Vec<Labels> = self
            .mig
            .iter()
            .map(|m| {
                vec![
                    node(),
                    ("device_idx", s(m.device_idx)),
                    ("device_uuid", m.uuid.clone()),
                    ("parent_uuid", m.parent_uuid.clone()),
                    ("ci_id", s(m.ci_id)),
                    ("gi_id", s(m.gi_id)),
                    ("profile", m.profile.clone()),
                ]
            })
            .collect();
        family(
            &mut e,
            "mig_device_total_memory_in_bytes",
            "Total memory of the MIG device in bytes.",
            mig_rows.iter().zip(&self.mig).map(|(l, m)| (l, m.total_memory as f64)),
        )?;
        let mig_used = || mig_rows.iter().zip(&self.mig).filter_map(|(l, m)| Some((l, m, m.used_memory?)));
        family(
            &mut e,
            "mig_device_memory_usage_in_bytes",
            "Memory usage of the MIG device in bytes.",
            mig_used().map(|(l, _, used)| (l, used as f64)),
        )?;
        family(
            &mut e,
            "mig_device_memory_utilization_percent",
            "Memory utilization of the MIG device (0-100).",
            mig_used().map(|(l, m, used)| (l, percent(used, m.total_memory))),
        )?;
        let alloc_rows: Vec<Labels> = self
            .mig_allocations
            .iter()
            .map(|a| {
                vec![
                    node(),
                    ("device_idx", s(a.device_idx)),
                    ("device_uuid", a.device_uuid.clone()),
                    ("parent_uuid", a.parent_uuid.clone()),
                    ("pod_namespace", a.pod_namespace.clone()),
                    ("pod_name", a.pod_name.clone()),
                    ("container_name", a.container_name.clone()),
                ]
            })
            .collect();
        family(
            &mut e,
            "container_mig_device_allocation_info",
            "MIG device allocated to the container (1).",
            alloc_rows.iter().map(|l| (l, 1.0)),
        )?;
        if let Some(present) = self.sm_watcher_file_present {
            family(
                &mut e,
                "sm_watcher_file_present",
                "1 when the shared SM watcher file was read, 0 when the monitor sampled the backend instead.",
                [(&vec![node()], if present { 1.0 } else { 0.0 })],
            )?;
        }
        Ok(())
    }
}

impl Collector for NodeCollector {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.gather().encode(encoder)
    }
}
