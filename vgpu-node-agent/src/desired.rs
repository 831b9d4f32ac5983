//! The pure step: what the cluster should hold for one scan. [`gpu_object`] turns a discovered GPU into its
//! PhysicalGPU, [`gpu_name`] names it, [`node_labels`] computes the node's vendor labels.
//!
//! | what | value | example |
//! |---|---|---|
//! | PhysicalGPU name | `<node>-<vendor>-<device id>-<pci address, `:` and `.` as `-`>` | `w1-nvidia-20b0-0000-3b-00-0` |
//! | PhysicalGPU labels | `<domain>/vendor=<vendor>`, `<domain>/node=<node>` | `gpu.deckhouse.io/vendor=nvidia` |
//! | node label | `<domain>/vendor=<vendor with most GPUs>` (ties: the smaller vendor key) | `gpu.deckhouse.io/vendor=nvidia` |
//! | node labels | `<domain>/vendor.<vendor>=true` for every vendor present | `gpu.deckhouse.io/vendor.metax=true` |
//!
//! The name holds the PCI address rather than the index: the index is the position in PCI order, so removing
//! one GPU would rename every GPU after it (delete and re-create); the address is stable while the card stays
//! in its slot. The index is kept in `spec.index`.
//!
//! A node with GPUs of two vendors gets one `<domain>/vendor` value (a label has one value) and one
//! `<domain>/vendor.<key>` label per vendor, so an adapter DaemonSet can select either way.

use std::collections::BTreeMap;

use vgpu_api::{Condition, ConditionStatus, PciSubsystem, PhysicalGPUSpec, PhysicalGPUStatus};
use vgpu_core::discovery::DiscoveredGpu;

use crate::cluster::GpuObject;

/// The condition type the agent owns: whether a kernel driver is bound.
pub const CONDITION_DRIVER_BOUND: &str = "DriverBound";

/// The longest object name the API server takes (a DNS subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// The PhysicalGPU name of a GPU on `node`; `None` when it would be longer than [`MAX_NAME_LEN`].
///
/// ```
/// # use vgpu_core::discovery::{DiscoveredGpu, PciAddress, VendorTable};
/// # let gpu = DiscoveredGpu {
/// #     index: 0, address: "0000:3b:00.0".parse().unwrap(), vendor: VendorTable::builtin().get(0x10de).unwrap().clone(),
/// #     vendor_id: 0x10de, vendor_name: "NVIDIA".into(), device_id: 0x20b0, device_name: "GA100".into(),
/// #     subsystem: None, class_code: 0x030200, class_name: "3D".into(), numa_node: None, driver: None,
/// #     iommu_group: None, sysfs_path: "/sys/bus/pci/devices/0000:3b:00.0".into(),
/// # };
/// assert_eq!(vgpu_node_agent::desired::gpu_name("w1", &gpu).as_deref(), Some("w1-nvidia-20b0-0000-3b-00-0"));
/// ```
pub fn gpu_name(node: &str, gpu: &DiscoveredGpu) -> Option<String> {
    let address = gpu.address.to_string().replace([':', '.'], "-");
    let name = format!("{node}-{}-{:04x}-{address}", gpu.vendor.key, gpu.device_id);
    (name.len() <= MAX_NAME_LEN).then_some(name)
}

/// The PhysicalGPU of a discovered GPU; `None` when its name would be too long (see [`gpu_name`]).
pub fn gpu_object(node: &str, domain: &str, gpu: &DiscoveredGpu) -> Option<GpuObject> {
    let name = gpu_name(node, gpu)?;
    let labels = BTreeMap::from([
        (format!("{domain}/vendor"), gpu.vendor.key.clone()),
        (format!("{domain}/node"), node.to_owned()),
    ]);
    let spec = PhysicalGPUSpec {
        node_name: node.to_owned(),
        index: u32::try_from(gpu.index).unwrap_or(u32::MAX),
        pci_address: gpu.address.to_string(),
        vendor: gpu.vendor.key.clone(),
        vendor_id: format!("{:04x}", gpu.vendor_id),
        vendor_name: gpu.vendor_name.clone(),
        device_id: format!("{:04x}", gpu.device_id),
        device_name: gpu.device_name.clone(),
        model: gpu.model_slug(),
        subsystem: gpu.subsystem.as_ref().map(|s| PciSubsystem {
            vendor_id: format!("{:04x}", s.vendor_id),
            device_id: format!("{:04x}", s.device_id),
            name: s.name.clone(),
        }),
        class_code: format!("{:06x}", gpu.class_code),
        numa_node: gpu.numa_node,
        iommu_group: gpu.iommu_group,
        passthrough: None,
    };
    let condition = match &gpu.driver {
        Some(driver) => Condition {
            type_: CONDITION_DRIVER_BOUND.into(),
            status: ConditionStatus::True,
            reason: Some("Bound".into()),
            message: Some(format!("kernel driver {driver} is bound")),
            last_transition_time: None,
            observed_generation: None,
        },
        None => Condition {
            type_: CONDITION_DRIVER_BOUND.into(),
            status: ConditionStatus::False,
            reason: Some("Unbound".into()),
            message: Some("no kernel driver is bound to the device".into()),
            last_transition_time: None,
            observed_generation: None,
        },
    };
    let status =
        PhysicalGPUStatus { driver: gpu.driver.clone(), conditions: vec![condition], ..Default::default() };
    Some(GpuObject { name, labels, spec, status })
}

/// The node labels for the GPUs found (empty when there are none). See the module docs.
pub fn node_labels<'a>(
    domain: &str,
    gpus: impl IntoIterator<Item = &'a DiscoveredGpu>,
) -> BTreeMap<String, String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for gpu in gpus {
        *counts.entry(gpu.vendor.key.as_str()).or_default() += 1;
    }
    let mut labels = BTreeMap::new();
    // The most GPUs wins; among equals the first key in order (max_by_key keeps the last maximum, so reverse).
    if let Some((primary, _)) = counts.iter().rev().max_by_key(|(_, count)| **count) {
        labels.insert(format!("{domain}/vendor"), (*primary).to_owned());
    }
    for key in counts.keys() {
        labels.insert(format!("{domain}/vendor.{key}"), "true".to_owned());
    }
    labels
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use vgpu_core::discovery::VendorTable;

    use super::*;

    fn gpu(index: usize, vendor: u16, device: u16, address: &str, driver: Option<&str>) -> DiscoveredGpu {
        DiscoveredGpu {
            index,
            address: address.parse().unwrap(),
            vendor: VendorTable::builtin().get(vendor).unwrap().clone(),
            vendor_id: vendor,
            vendor_name: "V".into(),
            device_id: device,
            device_name: "GA100 [A100 SXM4 40GB]".into(),
            subsystem: None,
            class_code: 0x030200,
            class_name: "3D controller".into(),
            numa_node: Some(1),
            driver: driver.map(str::to_owned),
            iommu_group: None,
            sysfs_path: "/sys".into(),
        }
    }

    #[test]
    fn object_fields() {
        let obj =
            gpu_object("w1", "gpu.deckhouse.io", &gpu(2, 0x10de, 0x20b0, "0000:3b:00.0", Some("nvidia")))
                .unwrap();
        assert_eq!(obj.name, "w1-nvidia-20b0-0000-3b-00-0");
        assert_eq!(obj.labels["gpu.deckhouse.io/vendor"], "nvidia");
        assert_eq!(obj.labels["gpu.deckhouse.io/node"], "w1");
        assert_eq!(obj.spec.index, 2);
        assert_eq!(obj.spec.vendor_id, "10de");
        assert_eq!(obj.spec.class_code, "030200");
        assert_eq!(obj.spec.model, "a100-sxm4-40gb");
        assert_eq!(obj.status.driver.as_deref(), Some("nvidia"));
        assert_eq!(obj.status.conditions[0].status, ConditionStatus::True);
        let unbound = gpu_object("w1", "d.io", &gpu(0, 0x9999, 0x4001, "0000:5e:00.0", None)).unwrap();
        assert_eq!(unbound.status.conditions[0].status, ConditionStatus::False);
        assert_eq!(unbound.status.driver, None);
    }

    #[test]
    fn too_long_names_are_refused() {
        let g = gpu(0, 0x10de, 0x20b0, "0000:3b:00.0", None);
        assert!(gpu_name(&"n".repeat(MAX_NAME_LEN - 25), &g).is_some());
        assert!(gpu_name(&"n".repeat(MAX_NAME_LEN - 24), &g).is_none());
    }

    #[test]
    fn labels_pick_the_majority_vendor() {
        let a = gpu(0, 0x10de, 1, "0000:01:00.0", None);
        let b = gpu(1, 0x10de, 1, "0000:02:00.0", None);
        let m = gpu(2, 0x9999, 1, "0000:03:00.0", None);
        let labels = node_labels("d.io", [&a, &b, &m]);
        assert_eq!(
            labels,
            BTreeMap::from([
                ("d.io/vendor".to_owned(), "nvidia".to_owned()),
                ("d.io/vendor.metax".to_owned(), "true".to_owned()),
                ("d.io/vendor.nvidia".to_owned(), "true".to_owned()),
            ])
        );
        assert_eq!(node_labels("d.io", [&a, &m])["d.io/vendor"], "metax", "ties go to the first key");
        assert!(node_labels("d.io", []).is_empty());
    }
}
