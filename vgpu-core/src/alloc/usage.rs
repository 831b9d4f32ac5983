//! Per-GPU usage of a node, maintained incrementally from other pods' claims.

use std::collections::BTreeMap;

use crate::model::{DeviceClaim, PodDeviceClaim};

use super::request::ContainerRole;

/// What is taken on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeviceUsage {
    /// vGPU slots taken.
    pub number: u32,
    /// Cores taken.
    pub cores: u64,
    /// Memory taken, MiB.
    pub memory_mib: u64,
}

impl DeviceUsage {
    /// The usage of one claim: one slot, its cores and memory.
    pub fn of_claim(claim: &DeviceClaim) -> Self {
        Self { number: 1, cores: claim.cores, memory_mib: claim.memory_mib }
    }

    /// Saturating sum.
    pub fn plus(self, o: Self) -> Self {
        Self {
            number: self.number.saturating_add(o.number),
            cores: self.cores.saturating_add(o.cores),
            memory_mib: self.memory_mib.saturating_add(o.memory_mib),
        }
    }

    /// Saturating difference.
    pub fn minus(self, o: Self) -> Self {
        Self {
            number: self.number.saturating_sub(o.number),
            cores: self.cores.saturating_sub(o.cores),
            memory_mib: self.memory_mib.saturating_sub(o.memory_mib),
        }
    }

    /// Per-field maximum.
    pub fn max(self, o: Self) -> Self {
        Self {
            number: self.number.max(o.number),
            cores: self.cores.max(o.cores),
            memory_mib: self.memory_mib.max(o.memory_mib),
        }
    }
}

/// What one pod takes per GPU index.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PodFootprint {
    devices: BTreeMap<u32, DeviceUsage>,
}

impl PodFootprint {
    /// Every claim of every container summed (the fast-path accounting).
    pub fn from_claim(claim: &PodDeviceClaim) -> Self {
        let mut devices = BTreeMap::<u32, DeviceUsage>::new();
        for d in claim.devices() {
            let e = devices.entry(d.index).or_default();
            *e = e.plus(DeviceUsage::of_claim(d));
        }
        Self { devices }
    }

    /// `ReducePodFootprint`: per GPU `sidecarSum + max(regularSum, initMax)`, with each container's role given
    /// by `role` (by name). Sequential init containers run before the app containers, so they do not add up.
    pub fn from_claim_with_roles(claim: &PodDeviceClaim, role: impl Fn(&str) -> ContainerRole) -> Self {
        let mut parts = BTreeMap::<u32, [DeviceUsage; 3]>::new();
        for c in &claim.containers {
            let r = role(&c.name);
            for d in &c.devices {
                let e = parts.entry(d.index).or_default();
                let u = DeviceUsage::of_claim(d);
                match r {
                    ContainerRole::Sidecar => e[0] = e[0].plus(u),
                    ContainerRole::App => e[1] = e[1].plus(u),
                    ContainerRole::SequentialInit => e[2] = e[2].max(u),
                }
            }
        }
        let devices = parts.into_iter().map(|(i, [s, r, init])| (i, s.plus(r.max(init)))).collect();
        Self { devices }
    }

    /// Usage per GPU index, ascending.
    pub fn devices(&self) -> impl Iterator<Item = (u32, DeviceUsage)> + '_ {
        self.devices.iter().map(|(i, u)| (*i, *u))
    }

    /// Usage on one GPU.
    pub fn device(&self, index: u32) -> DeviceUsage {
        self.devices.get(&index).copied().unwrap_or_default()
    }
}

/// Usage of a node's GPUs by the pods placed there, keyed by a pod key (e.g. its UID).
///
/// Adding a pod under a key that is present replaces its footprint; removing an absent key does nothing, so a
/// scheduler cache can replay informer events idempotently.
///
/// ```
/// use vgpu_core::alloc::{NodeUsage, PodFootprint};
/// use vgpu_core::codec::pod_devices;
/// let claim = pod_devices::decode_pre_allocated("main[0_GPU-a_50_4096];side[0_GPU-a_10_1024]")?;
/// let mut usage = NodeUsage::new();
/// usage.insert_pod("uid-1", PodFootprint::from_claim(&claim));
/// assert_eq!(usage.device(0).cores, 60);
/// usage.remove_pod("uid-1");
/// assert_eq!(usage.device(0).number, 0);
/// # Ok::<(), vgpu_core::codec::CodecError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeUsage {
    devices: BTreeMap<u32, DeviceUsage>,
    pods: BTreeMap<String, PodFootprint>,
}

impl NodeUsage {
    /// No pods.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a pod's footprint.
    pub fn insert_pod(&mut self, key: impl Into<String>, footprint: PodFootprint) {
        let key = key.into();
        self.remove_pod(&key);
        for (i, u) in footprint.devices() {
            let e = self.devices.entry(i).or_default();
            *e = e.plus(u);
        }
        self.pods.insert(key, footprint);
    }

    /// Removes a pod; `false` when it was not there.
    pub fn remove_pod(&mut self, key: &str) -> bool {
        let Some(old) = self.pods.remove(key) else { return false };
        for (i, u) in old.devices() {
            if let Some(e) = self.devices.get_mut(&i) {
                *e = e.minus(u);
                if *e == DeviceUsage::default() {
                    self.devices.remove(&i);
                }
            }
        }
        true
    }

    /// Whether a pod is counted.
    pub fn contains_pod(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    /// Number of pods counted.
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Usage of one GPU index (zero when unused).
    pub fn device(&self, index: u32) -> DeviceUsage {
        self.devices.get(&index).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::pod_devices::decode_pre_allocated;

    #[test]
    fn reduced_footprint() {
        let claim =
            decode_pre_allocated("init[0_G0_80_8000];side[0_G0_10_1000];app[0_G0_30_3000,1_G1_30_3000]")
                .unwrap();
        let roles = |n: &str| match n {
            "init" => ContainerRole::SequentialInit,
            "side" => ContainerRole::Sidecar,
            _ => ContainerRole::App,
        };
        let f = PodFootprint::from_claim_with_roles(&claim, roles);
        assert_eq!(f.device(0), DeviceUsage { number: 2, cores: 90, memory_mib: 9000 });
        assert_eq!(f.device(1), DeviceUsage { number: 1, cores: 30, memory_mib: 3000 });
        let all = PodFootprint::from_claim(&claim);
        assert_eq!(all.device(0), DeviceUsage { number: 3, cores: 120, memory_mib: 12000 });
    }

    #[test]
    fn insert_replace_remove() {
        let a = PodFootprint::from_claim(&decode_pre_allocated("m[0_G0_50_100]").unwrap());
        let b = PodFootprint::from_claim(&decode_pre_allocated("m[1_G1_20_100]").unwrap());
        let mut u = NodeUsage::new();
        u.insert_pod("p", a.clone());
        u.insert_pod("q", a);
        assert_eq!(u.device(0).cores, 100);
        u.insert_pod("p", b);
        assert_eq!((u.device(0).cores, u.device(1).cores), (50, 20));
        assert!(u.remove_pod("p") && !u.remove_pod("p"));
        assert!(u.remove_pod("q"));
        assert_eq!(u, NodeUsage::new());
    }
}
