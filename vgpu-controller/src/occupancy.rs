//! The pure step of the occupancy reconcile: which PhysicalGPU each allocated device of each ResourceClaim
//! is, and the `state` and `occupancy` every PhysicalGPU should show ([`desired_occupancy`]).
//!
//! A claim's `status.allocation.devices.results[]` names `(driver, pool, device)`. Our drivers publish one
//! pool per node (pool = node name) and name devices `gpu-<minor>`, `vgpu-<minor>`,
//! `gpu-<minor>-mig-…` (contract §9). The device is resolved to a PhysicalGPU on node `pool`:
//!
//! 1. by PCI address: the ResourceSlice device's `resource.kubernetes.io/pciBusID` attribute equals the
//!    PhysicalGPU's `spec.pciAddress` (domains compared as numbers: NVML writes 8 digits, sysfs 4);
//! 2. otherwise by index: the number after the device name's `gpu-`/`vgpu-` prefix equals `spec.index`.
//!
//! Results of other drivers, and devices that resolve to no PhysicalGPU, are left out. A claim that is
//! deallocated (no `status.allocation`) or deleted no longer counts, so the GPU is released on the next pass.
//!
//! | status field | value |
//! |---|---|
//! | `occupancy.claims` | the allocated claims, `namespace/name`, sorted, each once |
//! | `occupancy.usedShares` | allocation results on the GPU |
//! | `occupancy.totalShares` | the largest `sharing.shares` of the Shared classes the GPU matches, else 1; never below `usedShares` (the schema's rule) |
//! | `state` | `Unavailable` when a `DriverReady` or `HardwareHealthy` condition is `False`; else `Allocated` when `usedShares > 0`; else `Available` |

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use vgpu_api::{ConditionStatus, GPUClass, GpuState, Occupancy, PhysicalGPU, SharingMode};

use crate::config::ControllerConfig;
use crate::desired::DesiredClass;
use crate::passthrough::PassthroughPolicy;

/// The controller-owned status fields of one PhysicalGPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuStatus {
    /// `status.state`.
    pub state: GpuState,
    /// `status.occupancy`.
    pub occupancy: Occupancy,
    /// `status.classPassthrough` and condition `PassthroughPolicy` ([`crate::passthrough`]; filled by the
    /// plan, default here).
    pub passthrough: PassthroughPolicy,
}

/// A PCI address with its domain as a number (`00000000:3B:00.0` and `0000:3b:00.0` are equal).
pub fn normalize_pci(address: &str) -> Option<(u32, String)> {
    let (domain, rest) = address.split_once(':')?;
    Some((u32::from_str_radix(domain, 16).ok()?, rest.to_ascii_lowercase()))
}

/// The minor in a device name `gpu-<n>…` or `vgpu-<n>…`.
pub fn device_minor(device: &str) -> Option<u32> {
    let rest = device.strip_prefix("vgpu-").or_else(|| device.strip_prefix("gpu-"))?;
    let digits: &str = rest.split('-').next()?;
    digits.parse().ok()
}

/// `(driver, pool, device)` → PCI bus id, from the slices.
fn slice_bus_ids(slices: &[ResourceSlice]) -> HashMap<(&str, &str, &str), &str> {
    let mut out = HashMap::new();
    for slice in slices {
        for device in slice.spec.devices.iter().flatten() {
            let bus = device
                .attributes
                .as_ref()
                .and_then(|a| a.get(vgpu_core::dra::ATTRIBUTE_PCI_BUS_ID))
                .and_then(|a| a.string.as_deref());
            if let Some(bus) = bus {
                out.insert(
                    (slice.spec.driver.as_str(), slice.spec.pool.name.as_str(), device.name.as_str()),
                    bus,
                );
            }
        }
    }
    out
}

/// The status every PhysicalGPU should have (keyed by PhysicalGPU name; every GPU appears).
pub fn desired_occupancy(
    config: &ControllerConfig,
    gpus: &[PhysicalGPU],
    classes: &[GPUClass],
    desired: &[DesiredClass],
    claims: &[ResourceClaim],
    slices: &[ResourceSlice],
) -> BTreeMap<String, GpuStatus> {
    let mut by_pci: HashMap<(&str, (u32, String)), usize> = HashMap::new();
    let mut by_index: HashMap<(&str, &str, u32), usize> = HashMap::new();
    for (i, gpu) in gpus.iter().enumerate() {
        if let Some(pci) = normalize_pci(&gpu.spec.pci_address) {
            by_pci.insert((gpu.spec.node_name.as_str(), pci), i);
        }
        by_index.insert((gpu.spec.node_name.as_str(), gpu.spec.vendor.as_str(), gpu.spec.index), i);
    }
    let bus_ids = slice_bus_ids(slices);
    let mut used = vec![0u32; gpus.len()];
    let mut holders: Vec<BTreeSet<String>> = vec![BTreeSet::new(); gpus.len()];
    for claim in claims {
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        let key = format!("{}/{}", claim.namespace().unwrap_or_default(), claim.name_any());
        for r in results.into_iter().flatten() {
            let Some(vendor) = config.vendor_of_driver(&r.driver) else { continue };
            let via_pci = bus_ids
                .get(&(r.driver.as_str(), r.pool.as_str(), r.device.as_str()))
                .and_then(|bus| normalize_pci(bus))
                .and_then(|pci| by_pci.get(&(r.pool.as_str(), pci)).copied());
            let gpu = via_pci.or_else(|| {
                device_minor(&r.device).and_then(|m| by_index.get(&(r.pool.as_str(), vendor, m)).copied())
            });
            if let Some(i) = gpu {
                used[i] += 1;
                holders[i].insert(key.clone());
            }
        }
    }
    // Largest share count of the Shared classes each GPU matches.
    let mut shares_of: HashMap<&str, u32> = HashMap::new();
    for class in classes.iter().filter(|c| c.spec.sharing.mode == SharingMode::Shared) {
        let n = class.spec.sharing.shares.unwrap_or(1);
        let name = class.name_any();
        for d in desired.iter().filter(|d| d.class == name) {
            for gpu in &d.matched {
                let e = shares_of.entry(gpu.as_str()).or_insert(1);
                *e = (*e).max(n);
            }
        }
    }
    gpus.iter()
        .enumerate()
        .map(|(i, gpu)| {
            let name = gpu.name_any();
            let total = shares_of.get(name.as_str()).copied().unwrap_or(1).max(used[i]);
            let unhealthy = gpu.status.iter().flat_map(|s| &s.conditions).any(|c| {
                (c.type_ == "DriverReady" || c.type_ == "HardwareHealthy")
                    && c.status == ConditionStatus::False
            });
            let state = if unhealthy {
                GpuState::Unavailable
            } else if used[i] > 0 {
                GpuState::Allocated
            } else {
                GpuState::Available
            };
            let occupancy = Occupancy {
                total_shares: total,
                used_shares: used[i],
                claims: std::mem::take(&mut holders[i]).into_iter().collect(),
            };
            (name, GpuStatus { state, occupancy, passthrough: PassthroughPolicy::default() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourcePool, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::desired::{NodeLabels, desired_classes};
    use crate::fixture;

    fn slice(node: &str, devices: &[(&str, &str)]) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta { name: Some(format!("{node}-slice")), ..ObjectMeta::default() },
            spec: ResourceSliceSpec {
                driver: "manager.nvidia.com".into(),
                pool: ResourcePool { name: node.into(), generation: 1, resource_slice_count: 1 },
                node_name: Some(node.into()),
                devices: Some(
                    devices
                        .iter()
                        .map(|(name, bus)| Device {
                            name: (*name).into(),
                            attributes: Some(BTreeMap::from([(
                                vgpu_core::dra::ATTRIBUTE_PCI_BUS_ID.to_owned(),
                                DeviceAttribute { string: Some((*bus).into()), ..Default::default() },
                            )])),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        }
    }

    #[test]
    fn claims_resolve_by_pci_then_index() {
        let config = ControllerConfig::default();
        let gpus = vec![
            fixture::gpu("w1", 0, "nvidia", "a100", Some(40960)),
            fixture::gpu("w1", 1, "nvidia", "a100", Some(40960)),
            fixture::gpu("w2", 0, "nvidia", "a100", Some(40960)),
        ];
        let classes = vec![fixture::class("shared", "nvidia", None, Some(4))];
        let desired = desired_classes(&config, &classes, &gpus, &NodeLabels::new());
        // vgpu-7 on w1 is the device at the bus id of index 1 (NVML's 8-digit domain, upper case).
        let slices = vec![slice("w1", &[("vgpu-7", "00000000:02:00.0")])];
        let claims = vec![
            fixture::allocated_claim("ml", "a", &[("manager.nvidia.com", "w1", "vgpu-7")]),
            fixture::allocated_claim("ml", "b", &[("manager.nvidia.com", "w1", "vgpu-7")]),
            fixture::allocated_claim("ml", "c", &[("manager.nvidia.com", "w2", "gpu-0")]),
            fixture::allocated_claim("ml", "other", &[("other.example.com", "w2", "gpu-0")]),
            fixture::allocated_claim("ml", "lost", &[("manager.nvidia.com", "w9", "gpu-0")]),
        ];
        let out = desired_occupancy(&config, &gpus, &classes, &desired, &claims, &slices);
        assert_eq!(out["w1-0-nvidia"].state, GpuState::Available);
        assert_eq!(
            out["w1-0-nvidia"].occupancy,
            Occupancy { total_shares: 4, used_shares: 0, claims: vec![] }
        );
        assert_eq!(out["w1-1-nvidia"].state, GpuState::Allocated);
        assert_eq!(
            out["w1-1-nvidia"].occupancy,
            Occupancy { total_shares: 4, used_shares: 2, claims: vec!["ml/a".into(), "ml/b".into()] }
        );
        assert_eq!(out["w2-0-nvidia"].occupancy.claims, ["ml/c"]);

        // Released: the claims are gone.
        let out = desired_occupancy(&config, &gpus, &classes, &desired, &[], &slices);
        assert_eq!(out["w1-1-nvidia"].state, GpuState::Available);
        assert_eq!(out["w1-1-nvidia"].occupancy.used_shares, 0);
    }

    #[test]
    fn exclusive_and_unhealthy() {
        let config = ControllerConfig::default();
        let mut gpu = fixture::gpu("w1", 0, "nvidia", "a100", Some(40960));
        gpu.status.as_mut().unwrap().conditions.push(vgpu_api::Condition {
            type_: "HardwareHealthy".into(),
            status: ConditionStatus::False,
            reason: None,
            message: None,
            last_transition_time: None,
            observed_generation: None,
        });
        let gpus = vec![gpu];
        let claims = vec![
            fixture::allocated_claim("ml", "a", &[("manager.nvidia.com", "w1", "gpu-0")]),
            fixture::allocated_claim("ml", "b", &[("manager.nvidia.com", "w1", "gpu-0")]),
        ];
        let out = desired_occupancy(&config, &gpus, &[], &[], &claims, &[]);
        assert_eq!(out["w1-0-nvidia"].state, GpuState::Unavailable);
        // Two claims on an exclusive GPU: total follows used, so the schema rule holds.
        assert_eq!(out["w1-0-nvidia"].occupancy.total_shares, 2);
    }

    proptest::proptest! {
        /// Whatever the claims, classes and devices: every GPU appears once, `usedShares <= totalShares` (the
        /// schema's rule, so the status write cannot be refused), `usedShares` counts exactly the results that
        /// resolve to the GPU, and the claim list is sorted without duplicates.
        #[test]
        fn occupancy_invariants(
            gpus_per_node in proptest::collection::vec(0u32..4, 1..4),
            shares in proptest::option::of(2u32..8),
            results in proptest::collection::vec((0usize..5, 0u32..6, proptest::bool::ANY, 0usize..4), 0..24),
        ) {
            let config = ControllerConfig::default();
            let mut gpus = Vec::new();
            for (n, count) in gpus_per_node.iter().enumerate() {
                for i in 0..*count {
                    gpus.push(fixture::gpu(&format!("w{n}"), i, "nvidia", "a100", Some(40960)));
                }
            }
            let classes = vec![fixture::class("c", "nvidia", Some("a100"), shares)];
            let desired = desired_classes(&config, &classes, &gpus, &NodeLabels::new());
            let claims: Vec<ResourceClaim> = results
                .iter()
                .map(|(node, minor, ours, claim)| {
                    let driver = if *ours { "manager.nvidia.com" } else { "other.example.com" };
                    fixture::allocated_claim("ml", &format!("c{claim}"), &[(driver, &format!("w{node}"), &format!("vgpu-{minor}"))])
                })
                .collect();
            let out = desired_occupancy(&config, &gpus, &classes, &desired, &claims, &[]);
            proptest::prop_assert_eq!(out.len(), gpus.len());
            for gpu in &gpus {
                let s = &out[&gpu.name_any()];
                proptest::prop_assert!(s.occupancy.used_shares <= s.occupancy.total_shares);
                let expected = results
                    .iter()
                    .filter(|(node, minor, ours, _)| *ours && format!("w{node}") == gpu.spec.node_name && *minor == gpu.spec.index)
                    .count();
                proptest::prop_assert_eq!(s.occupancy.used_shares as usize, expected);
                let mut sorted = s.occupancy.claims.clone();
                sorted.sort();
                sorted.dedup();
                proptest::prop_assert_eq!(&sorted, &s.occupancy.claims);
                proptest::prop_assert_eq!(s.state == GpuState::Allocated, expected > 0);
            }
        }
    }

    #[test]
    fn names_and_addresses() {
        assert_eq!(device_minor("gpu-3"), Some(3));
        assert_eq!(device_minor("vgpu-12"), Some(12));
        assert_eq!(device_minor("gpu-1-mig-9-0-1"), Some(1));
        assert_eq!(device_minor("gpu-vfio-0"), None);
        assert_eq!(device_minor("mx-0"), None);
        assert_eq!(normalize_pci("00000000:3B:00.0"), normalize_pci("0000:3b:00.0"));
        assert_eq!(normalize_pci("zz"), None);
    }
}
