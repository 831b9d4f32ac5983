//! GPU feature labels in the form gpu-feature-discovery (GFD) publishes them, so node-feature-discovery rules
//! and node selectors written for GFD keep working in device-plugin mode. [`gfd_labels`] is a pure function
//! of the backend's facts ([`NodeFacts`]); [`label_patch`] turns it into a node label patch that also
//! removes the GFD keys no longer produced.
//!
//! | label | value |
//! |---|---|
//! | `nvidia.com/gpu.count` | number of GPUs (`single` MIG strategy on a MIG node: number of MIG devices) |
//! | `nvidia.com/gpu.product` | product name of the first GPU, spaces → `-` (`NVIDIA-A100-SXM4-80GB`); `single` MIG: `<product>-MIG-<profile>`, or `<product>-MIG-INVALID` when the node is not uniform |
//! | `nvidia.com/gpu.memory` | memory of the first GPU, MiB (`single` MIG: of one MIG device) |
//! | `nvidia.com/gpu.family` | architecture from the compute capability: `kepler`, `maxwell`, `pascal`, `volta`, `turing`, `ampere`, `ada-lovelace`, `hopper`, `blackwell`, else `undefined` |
//! | `nvidia.com/gpu.compute.major`, `.minor` | compute capability |
//! | `nvidia.com/gpu.machine` | the machine's product name (DMI), when known, spaces → `-` |
//! | `nvidia.com/cuda.driver.major`, `.minor`, `.rev` | driver version `570.86.10` → `570`, `86`, `10` (`rev` empty-less: absent when the version has two parts) |
//! | `nvidia.com/cuda.driver-version.major`, `.minor`, `.revision`, `.full` | the same, newer GFD names |
//! | `nvidia.com/cuda.runtime.major`, `.minor` | CUDA driver API version `12.8` → `12`, `8` |
//! | `nvidia.com/cuda.runtime-version.major`, `.minor`, `.full` | the same, newer GFD names |
//! | `nvidia.com/mig.capable` | `true` when any GPU supports MIG, else `false` |
//! | `nvidia.com/mig.strategy` | `none`/`single`/`mixed`, only on MIG-capable nodes |
//! | `nvidia.com/gpu.slices.gi`, `.slices.ci` | `single` MIG: compute slices of the GPU and compute instance |
//! | `nvidia.com/mig-<profile>.count`, `.memory`, `.slices.gi`, `.slices.ci` | `mixed` MIG: per profile present (`+` → `.` in the profile) |
//!
//! Values are sanitized to label values: characters outside `[A-Za-z0-9._-]` become `_`, at most 63
//! characters, starting and ending alphanumeric. GFD's `gfd.timestamp` is not written (it would change the
//! node on every pass); `gpu.multiprocessors` and the engine counts of MIG profiles are not known to our
//! backends and are absent.

use std::collections::BTreeMap;

use crate::{
    backend::{DriverVersions, MigLayout, MigMode},
    model::{ComputeCapability, GpuDevice},
    node_config::MigStrategy,
};

/// The label prefix of every key here.
pub const PREFIX: &str = "nvidia.com/";

/// What the labels are computed from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// The GPUs, by index.
    pub devices: Vec<GpuDevice>,
    /// The MIG layout of each GPU, same order.
    pub layouts: Vec<MigLayout>,
    /// Driver and CUDA versions.
    pub driver: Option<DriverVersions>,
    /// The machine's product name (`/sys/class/dmi/id/product_name`), when known.
    pub machine: Option<String>,
}

impl NodeFacts {
    /// Reads the facts from `backend` (devices, each GPU's MIG layout, driver versions); `machine` from DMI.
    pub fn from_backend(
        backend: &dyn crate::backend::DeviceBackend,
        machine: Option<String>,
    ) -> Result<Self, crate::backend::BackendError> {
        let devices = backend.devices()?;
        let layouts = devices.iter().map(|d| backend.mig_layout(d.index)).collect::<Result<Vec<_>, _>>()?;
        let driver = backend.driver_versions()?;
        Ok(Self { devices, layouts, driver, machine })
    }
}

/// A label value as GFD writes it: spaces → `-`, other characters outside `[A-Za-z0-9._-]` → `_`, at most
/// 63 characters, alphanumeric at both ends.
pub fn sanitize(value: &str) -> String {
    let mapped: String = value
        .trim()
        .chars()
        .map(|c| match c {
            ' ' => '-',
            c if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') => c,
            _ => '_',
        })
        .take(63)
        .collect();
    mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// The architecture family of a compute capability, GFD's names.
pub fn family(capability: ComputeCapability) -> &'static str {
    match (capability.major, capability.minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, m) if m < 5 => "volta",
        (7, _) => "turing",
        (8, m) if m < 9 => "ampere",
        (8, _) => "ada-lovelace",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        _ => "undefined",
    }
}

/// Whether a key is one [`gfd_labels`] may write (used to remove stale ones). The MIG manager's own
/// `nvidia.com/mig.config*` keys and the GPU operator's `gpu.deploy.*`/`gpu.present` are not.
pub fn is_gfd_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix(PREFIX) else {
        return false;
    };
    rest.starts_with("cuda.")
        || rest.starts_with("mig-")
        || matches!(rest, "mig.capable" | "mig.strategy")
        || (rest.starts_with("gpu.")
            && !rest.starts_with("gpu.deploy.")
            && !matches!(rest, "gpu.present" | "gpu.replicas" | "gpu.sharing-strategy"))
}

/// The GFD label set of a node.
pub fn gfd_labels(facts: &NodeFacts, strategy: MigStrategy) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut put = |key: &str, value: String| {
        labels.insert(format!("{PREFIX}{key}"), value);
    };
    let capable = facts.layouts.iter().any(|l| l.mode != MigMode::NotSupported);
    put("mig.capable", capable.to_string());
    if let Some(machine) = facts.machine.as_deref().map(sanitize).filter(|m| !m.is_empty()) {
        put("gpu.machine", machine);
    }
    if let Some(driver) = &facts.driver {
        let parts: Vec<&str> = driver.driver_version.trim().split('.').collect();
        if let [major, minor, rest @ ..] = parts.as_slice() {
            put("cuda.driver.major", sanitize(major));
            put("cuda.driver.minor", sanitize(minor));
            put("cuda.driver-version.major", sanitize(major));
            put("cuda.driver-version.minor", sanitize(minor));
            if let Some(rev) = rest.first() {
                put("cuda.driver.rev", sanitize(rev));
                put("cuda.driver-version.revision", sanitize(rev));
            }
            put("cuda.driver-version.full", sanitize(&driver.driver_version));
        }
        if let Some((major, minor)) = driver.cuda_version {
            put("cuda.runtime.major", major.to_string());
            put("cuda.runtime.minor", minor.to_string());
            put("cuda.runtime-version.major", major.to_string());
            put("cuda.runtime-version.minor", minor.to_string());
            put("cuda.runtime-version.full", format!("{major}.{minor}"));
        }
    }
    let Some(first) = facts.devices.first() else {
        return labels;
    };
    let product = sanitize(&first.type_name);
    put("gpu.family", family(first.capability).to_owned());
    put("gpu.compute.major", first.capability.major.to_string());
    put("gpu.compute.minor", first.capability.minor.to_string());
    if capable {
        put("mig.strategy", strategy_name(strategy).to_owned());
    }
    let mig_instances =
        facts.layouts.iter().filter(|l| l.mode == MigMode::Enabled).flat_map(|l| &l.instances);
    match strategy {
        MigStrategy::Single if facts.layouts.iter().any(|l| l.mode == MigMode::Enabled) => {
            let all_enabled = facts.layouts.len() == facts.devices.len()
                && facts.layouts.iter().all(|l| l.mode == MigMode::Enabled && !l.instances.is_empty());
            let instances: Vec<_> = mig_instances.collect();
            let uniform = instances.windows(2).all(|w| w[0].profile == w[1].profile);
            match instances.first() {
                Some(one) if all_enabled && uniform => {
                    put("gpu.count", instances.len().to_string());
                    put("gpu.product", sanitize(&format!("{product}-MIG-{}", one.profile)));
                    put("gpu.memory", one.memory_mib.to_string());
                    put("gpu.slices.gi", one.profile.compute_slices.to_string());
                    put("gpu.slices.ci", one.profile.compute_slices.to_string());
                }
                _ => {
                    put("gpu.count", "0".to_owned());
                    put("gpu.product", sanitize(&format!("{product}-MIG-INVALID")));
                    put("gpu.memory", "0".to_owned());
                }
            }
        }
        _ => {
            put("gpu.count", facts.devices.len().to_string());
            put("gpu.product", product);
            put("gpu.memory", first.memory_mib.to_string());
            if strategy == MigStrategy::Mixed {
                let mut per_profile: BTreeMap<String, (u32, u64, u32)> = BTreeMap::new();
                for instance in mig_instances {
                    let name = instance.profile.to_string().replace('+', ".");
                    let entry = per_profile.entry(name).or_insert((
                        0,
                        instance.memory_mib,
                        instance.profile.compute_slices,
                    ));
                    entry.0 += 1;
                }
                for (name, (count, memory, slices)) in per_profile {
                    put(&format!("mig-{name}.count"), count.to_string());
                    put(&format!("mig-{name}.memory"), memory.to_string());
                    put(&format!("mig-{name}.slices.gi"), slices.to_string());
                    put(&format!("mig-{name}.slices.ci"), slices.to_string());
                }
            }
        }
    }
    labels
}

fn strategy_name(strategy: MigStrategy) -> &'static str {
    match strategy {
        MigStrategy::None => "none",
        MigStrategy::Single => "single",
        MigStrategy::Mixed => "mixed",
    }
}

/// The label changes that make `current` carry exactly `wanted` among the GFD keys: changed or new keys set,
/// GFD keys not in `wanted` removed (`None`), other keys untouched.
pub fn label_patch(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> BTreeMap<String, Option<String>> {
    let mut patch: BTreeMap<String, Option<String>> = wanted
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    for key in current.keys().filter(|k| is_gfd_key(k) && !wanted.contains_key(*k)) {
        patch.insert(key.clone(), None);
    }
    patch
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use crate::backend::{DeviceBackend, mock::MockBackend};

    use super::*;

    fn facts(yaml: &str) -> NodeFacts {
        let backend = MockBackend::from_yaml_str(yaml).unwrap();
        let devices = backend.devices().unwrap();
        let layouts = devices.iter().map(|d| backend.mig_layout(d.index).unwrap()).collect();
        NodeFacts {
            devices,
            layouts,
            driver: backend.driver_versions().unwrap(),
            machine: Some("DGX A100 (920-23687)".to_owned()),
        }
    }

    const A100: &str = "\
driver: { version: 570.86.10, cudaVersion: '12.8' }
gpus:
  - { uuid: GPU-0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', mig: { mode: Enabled, instances: [
      { uuid: MIG-a, profile: 3g.40gb, gpuInstanceId: 1, placementStart: 0, placementSize: 4, memoryMiB: 40320 },
      { uuid: MIG-b, profile: 1g.10gb, gpuInstanceId: 2, placementStart: 4, placementSize: 1, memoryMiB: 9856 },
      { uuid: MIG-c, profile: 1g.10gb+me, gpuInstanceId: 3, placementStart: 5, placementSize: 1, memoryMiB: 9856 } ] } }
  - { uuid: GPU-1, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', mig: { mode: Disabled } }
";

    const H100: &str = "\
driver: { version: '550.54', cudaVersion: '12.4' }
gpus:
  - { uuid: GPU-0, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, computeCapability: '9.0', mig: { mode: Enabled, instances: [
      { uuid: MIG-a, profile: 1g.10gb, gpuInstanceId: 1, placementStart: 0, placementSize: 1, memoryMiB: 9856 },
      { uuid: MIG-b, profile: 1g.10gb, gpuInstanceId: 2, placementStart: 1, placementSize: 1, memoryMiB: 9856 } ] } }
";

    fn table(labels: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
        labels.iter().map(|(k, v)| (k.strip_prefix(PREFIX).unwrap(), v.as_str())).collect()
    }

    #[test]
    fn a100_node_mixed() {
        let labels = gfd_labels(&facts(A100), MigStrategy::Mixed);
        assert_eq!(
            table(&labels),
            vec![
                ("cuda.driver-version.full", "570.86.10"),
                ("cuda.driver-version.major", "570"),
                ("cuda.driver-version.minor", "86"),
                ("cuda.driver-version.revision", "10"),
                ("cuda.driver.major", "570"),
                ("cuda.driver.minor", "86"),
                ("cuda.driver.rev", "10"),
                ("cuda.runtime-version.full", "12.8"),
                ("cuda.runtime-version.major", "12"),
                ("cuda.runtime-version.minor", "8"),
                ("cuda.runtime.major", "12"),
                ("cuda.runtime.minor", "8"),
                ("gpu.compute.major", "8"),
                ("gpu.compute.minor", "0"),
                ("gpu.count", "2"),
                ("gpu.family", "ampere"),
                ("gpu.machine", "DGX-A100-_920-23687"),
                ("gpu.memory", "81920"),
                ("gpu.product", "NVIDIA-A100-SXM4-80GB"),
                ("mig-1g.10gb.count", "1"),
                ("mig-1g.10gb.me.count", "1"),
                ("mig-1g.10gb.me.memory", "9856"),
                ("mig-1g.10gb.me.slices.ci", "1"),
                ("mig-1g.10gb.me.slices.gi", "1"),
                ("mig-1g.10gb.memory", "9856"),
                ("mig-1g.10gb.slices.ci", "1"),
                ("mig-1g.10gb.slices.gi", "1"),
                ("mig-3g.40gb.count", "1"),
                ("mig-3g.40gb.memory", "40320"),
                ("mig-3g.40gb.slices.ci", "3"),
                ("mig-3g.40gb.slices.gi", "3"),
                ("mig.capable", "true"),
                ("mig.strategy", "mixed"),
            ]
        );
        // single on a non-uniform node: GFD's INVALID product.
        let single = gfd_labels(&facts(A100), MigStrategy::Single);
        assert_eq!(single["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB-MIG-INVALID");
        assert_eq!(single["nvidia.com/gpu.count"], "0");
    }

    #[test]
    fn h100_node_single_and_none() {
        let single = gfd_labels(&facts(H100), MigStrategy::Single);
        let want = [
            ("cuda.driver.major", "550"),
            ("cuda.driver.minor", "54"),
            ("gpu.count", "2"),
            ("gpu.family", "hopper"),
            ("gpu.memory", "9856"),
            ("gpu.product", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
            ("gpu.slices.gi", "1"),
            ("mig.capable", "true"),
            ("mig.strategy", "single"),
        ];
        for (k, v) in want {
            assert_eq!(single.get(&format!("{PREFIX}{k}")).map(String::as_str), Some(v), "{k}");
        }
        assert!(!single.contains_key("nvidia.com/cuda.driver.rev"), "a two-part driver version has no rev");
        let none = gfd_labels(&facts(H100), MigStrategy::None);
        assert_eq!(none["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
        assert_eq!(none["nvidia.com/gpu.count"], "1");
        assert_eq!(none["nvidia.com/mig.strategy"], "none");
        assert!(!none.keys().any(|k| k.starts_with("nvidia.com/mig-")));
        let t4 =
            facts("gpus:\n  - { uuid: a, name: Tesla T4, memoryMiB: 15360, computeCapability: '7.5' }\n");
        let labels = gfd_labels(&t4, MigStrategy::Mixed);
        assert_eq!(labels["nvidia.com/mig.capable"], "false");
        assert_eq!(labels["nvidia.com/gpu.family"], "turing");
        assert!(!labels.contains_key("nvidia.com/mig.strategy"));
    }

    #[test]
    fn patch_removes_stale_gfd_keys_only() {
        let current: BTreeMap<String, String> = [
            ("nvidia.com/mig-1g.10gb.count", "7"),
            ("nvidia.com/gpu.count", "1"),
            ("nvidia.com/mig.config", "all-1g.10gb"),
            ("nvidia.com/mig.config.state", "success"),
            ("nvidia.com/gpu.deploy.driver", "true"),
            ("kubernetes.io/hostname", "n"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let wanted: BTreeMap<String, String> = [
            ("nvidia.com/gpu.count".to_owned(), "1".to_owned()),
            ("nvidia.com/gpu.memory".to_owned(), "9".to_owned()),
        ]
        .into_iter()
        .collect();
        let patch = label_patch(&current, &wanted);
        assert_eq!(
            patch.into_iter().collect::<Vec<_>>(),
            vec![
                ("nvidia.com/gpu.memory".to_owned(), Some("9".to_owned())),
                ("nvidia.com/mig-1g.10gb.count".to_owned(), None),
            ]
        );
    }

    proptest::proptest! {
        #[test]
        fn sanitized_values_are_label_values(text in proptest::prelude::any::<String>()) {
            let value = sanitize(&text);
            proptest::prop_assert!(value.len() <= 63);
            proptest::prop_assert!(value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
            if let (Some(first), Some(last)) = (value.chars().next(), value.chars().last()) {
                proptest::prop_assert!(first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric());
            }
        }
    }
}
