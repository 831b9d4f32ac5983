//! JSON round trip of every spec and status (serde layer, proptest): any value serializes to JSON that
//! deserializes to the same value, the wire names are camelCase, and unset optionals are left out.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use proptest::{option, prelude::*};
use vgpu_api::{
    Condition, ConditionStatus, GPUClassSpec, GPUClassStatus, GpuState, Occupancy, PciSubsystem,
    PhysicalGPUSpec, PhysicalGPUStatus, Requirements, SharingMode, SharingPolicy,
};

fn hex4() -> impl Strategy<Value = String> {
    "[0-9a-f]{4}"
}

fn condition() -> impl Strategy<Value = Condition> {
    (
        "[A-Z][a-zA-Z]{0,12}",
        prop_oneof![
            Just(ConditionStatus::True),
            Just(ConditionStatus::False),
            Just(ConditionStatus::Unknown)
        ],
        option::of("[A-Za-z]{0,10}"),
        option::of(".{0,20}"),
        option::of("2026-0[1-9]-1[0-9]T00:00:00Z"),
        option::of(any::<i64>()),
    )
        .prop_map(|(type_, status, reason, message, last_transition_time, observed_generation)| {
            Condition { type_, status, reason, message, last_transition_time, observed_generation }
        })
}

fn gpu_spec() -> impl Strategy<Value = PhysicalGPUSpec> {
    (
        ("[a-z0-9-]{1,20}", any::<u32>(), "[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7]", "[a-z]{1,8}"),
        (hex4(), ".{0,20}", hex4(), ".{0,30}", "[a-z0-9-]{0,10}"),
        option::of((hex4(), hex4(), option::of(".{0,10}"))),
        ("[0-9a-f]{6}", option::of(any::<u32>()), option::of(any::<u32>()), option::of(any::<bool>())),
    )
        .prop_map(
            |(
                (node_name, index, pci_address, vendor),
                (vendor_id, vendor_name, device_id, device_name, model),
                subsystem,
                (class_code, numa_node, iommu_group, passthrough),
            )| PhysicalGPUSpec {
                node_name,
                index,
                pci_address,
                vendor,
                vendor_id,
                vendor_name,
                device_id,
                device_name,
                model,
                subsystem: subsystem.map(|(vendor_id, device_id, name)| PciSubsystem {
                    vendor_id,
                    device_id,
                    name,
                }),
                class_code,
                numa_node,
                iommu_group,
                passthrough,
            },
        )
}

fn gpu_status() -> impl Strategy<Value = PhysicalGPUStatus> {
    (
        (
            option::of("[a-z-]{1,8}"),
            option::of("[0-9.]{1,8}"),
            option::of(any::<u64>()),
            option::of("[0-9.]{1,4}"),
        ),
        option::of(prop_oneof![
            Just(GpuState::Available),
            Just(GpuState::Allocated),
            Just(GpuState::Unavailable)
        ]),
        option::of((any::<u32>(), any::<u32>(), prop::collection::vec("[a-z]{1,5}/[a-z]{1,5}", 0..3))),
        prop::collection::vec(condition(), 0..4),
        option::of(any::<bool>()),
    )
        .prop_map(
            |(
                (driver, driver_version, memory_mib, compute_capability),
                state,
                occupancy,
                conditions,
                class_passthrough,
            )| {
                PhysicalGPUStatus {
                    driver,
                    driver_version,
                    memory_mib,
                    compute_capability,
                    state,
                    occupancy: occupancy.map(|(total_shares, used_shares, claims)| Occupancy {
                        total_shares,
                        used_shares,
                        claims,
                    }),
                    class_passthrough,
                    conditions,
                }
            },
        )
}

fn class_spec() -> impl Strategy<Value = GPUClassSpec> {
    (
        "[a-z]{1,8}",
        option::of("[a-z0-9-]{1,12}"),
        option::of((
            option::of(1..u64::MAX),
            option::of("[0-9]\\.[0-9]"),
            prop::collection::vec("[a-z]{1,6}", 0..3),
        )),
        prop_oneof![Just(SharingMode::Exclusive), Just(SharingMode::Shared)],
        option::of(any::<u32>()),
        option::of(prop::collection::btree_map("[a-z./]{1,10}", "[a-z]{0,5}", 0..3)),
        option::of(any::<bool>()),
    )
        .prop_map(|(vendor, device_type, requirements, mode, shares, node_selector, passthrough)| {
            GPUClassSpec {
                vendor,
                device_type,
                requirements: requirements.map(|(min_memory_mib, min_compute_capability, capabilities)| {
                    Requirements { min_memory_mib, min_compute_capability, capabilities }
                }),
                sharing: SharingPolicy { mode, shares },
                node_selector: node_selector.map(|m: BTreeMap<String, String>| m),
                passthrough,
            }
        })
}

fn class_status() -> impl Strategy<Value = GPUClassStatus> {
    (
        option::of(any::<bool>()),
        option::of(".{0,20}"),
        option::of("[a-z-]{1,20}"),
        prop::collection::vec(condition(), 0..3),
    )
        .prop_map(|(valid, message, device_class_name, conditions)| GPUClassStatus {
            valid,
            message,
            device_class_name,
            conditions,
        })
}

fn round_trip<T>(value: &T) -> serde_json::Value
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_value(value).unwrap();
    let back: T = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(&back, value);
    json
}

proptest! {
    #[test]
    fn physical_gpu_spec_round_trips(spec in gpu_spec()) {
        let json = round_trip(&spec);
        prop_assert!(json.get("pciAddress").is_some() && json.get("pci_address").is_none());
        prop_assert_eq!(json.get("numaNode").is_some(), spec.numa_node.is_some());
    }

    #[test]
    fn physical_gpu_status_round_trips(status in gpu_status()) {
        let json = round_trip(&status);
        prop_assert_eq!(json.get("memoryMiB").is_some(), status.memory_mib.is_some());
        prop_assert_eq!(json.get("conditions").is_some(), !status.conditions.is_empty());
    }

    #[test]
    fn gpu_class_spec_round_trips(spec in class_spec()) {
        let json = round_trip(&spec);
        prop_assert_eq!(json["sharing"].get("shares").is_some(), spec.sharing.shares.is_some());
    }

    #[test]
    fn gpu_class_status_round_trips(status in class_status()) {
        let json = round_trip(&status);
        prop_assert_eq!(json.get("deviceClassName").is_some(), status.device_class_name.is_some());
    }
}

#[test]
fn documented_example_parses() {
    let gpu: vgpu_api::PhysicalGPU = serde_json::from_value(serde_json::json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
        "metadata": { "name": "w1-nvidia-20b0-0000-3b-00-0" },
        "spec": {
            "nodeName": "w1", "index": 0, "pciAddress": "0000:3b:00.0", "vendor": "nvidia",
            "vendorId": "10de", "vendorName": "NVIDIA Corporation", "deviceId": "20b0",
            "deviceName": "GA100 [A100 SXM4 40GB]", "model": "a100-sxm4-40gb", "classCode": "030200"
        },
        "status": {
            "driver": "nvidia", "memoryMiB": 40960, "state": "Available",
            "occupancy": { "totalShares": 4, "usedShares": 1, "claims": ["ns/c"] },
            "conditions": [{ "type": "DriverBound", "status": "True", "reason": "Bound" }]
        }
    }))
    .unwrap();
    let status = gpu.status.unwrap();
    assert_eq!(status.memory_mib, Some(40960));
    assert_eq!(status.conditions[0].status, ConditionStatus::True);
    assert_eq!(gpu.spec.model, "a100-sxm4-40gb");
}
