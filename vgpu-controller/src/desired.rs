//! The pure step of the class reconcile: from one GPUClass, the PhysicalGPUs and the node labels, the
//! DeviceClass to apply and the status to write ([`desired_class`]). No I/O; the reconciler applies the result.
//!
//! | output | value |
//! |---|---|
//! | DeviceClass name | `<class>.<group>` ([`ControllerConfig::device_class_name`]) |
//! | DeviceClass labels | `<group>/gpuclass: <class>`, `app.kubernetes.io/managed-by: vgpu-controller` |
//! | DeviceClass ownerReferences | the GPUClass (`controller: true`, `blockOwnerDeletion: true`) when its UID is known |
//! | DeviceClass `spec.selectors` | one CEL selector ([`crate::cel::class_selector`]) |
//! | status `valid` | `true` when at least one PhysicalGPU matches; `false` otherwise, or when the vendor has no DRA driver |
//! | status `message` | `matches N PhysicalGPUs on M nodes`, or why none matches (how many GPUs each rule ruled out) |
//! | status `deviceClassName` | the DeviceClass name; absent when no DeviceClass is made (unknown vendor) |
//! | status condition `Valid` | `True`/`False`, reason `Matched`, `NoMatchingGPU` or `UnsupportedVendor` |
//!
//! A class that matches no GPU still gets its DeviceClass: its selector is right, and devices that appear
//! later make it usable without another write.
//!
//! A PhysicalGPU matches when its vendor and model (`spec.model`) are the class's, its memory and compute
//! capability (adapter status) reach the requirements (unknown counts as not reaching), and its node's labels
//! include the class's `nodeSelector`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use vgpu_api::{Condition, ConditionStatus, GPUClass, GPUClassSpec, GPUClassStatus, PhysicalGPU};

use crate::cel::{class_selector, parse_compute_capability};
use crate::config::ControllerConfig;

/// The label value `app.kubernetes.io/managed-by` of what the controller creates.
pub const MANAGED_BY: &str = "vgpu-controller";
/// The `app.kubernetes.io/managed-by` label key (value [`MANAGED_BY`] on what the controller creates).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The condition type the controller owns on GPUClasses.
pub const VALID_CONDITION: &str = "Valid";

/// Node name → labels.
pub type NodeLabels = BTreeMap<String, BTreeMap<String, String>>;

/// Why one PhysicalGPU does not match a class (the first rule it fails, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mismatch {
    /// Another vendor.
    Vendor,
    /// Another model.
    DeviceType,
    /// Memory unknown or below `minMemoryMiB`.
    Memory,
    /// Compute capability unknown or below `minComputeCapability`.
    Compute,
    /// The node's labels lack the `nodeSelector`.
    Node,
}

impl Mismatch {
    fn describe(self) -> &'static str {
        match self {
            Mismatch::Vendor => "of another vendor",
            Mismatch::DeviceType => "of another device type",
            Mismatch::Memory => "with less or unknown memory",
            Mismatch::Compute => "with a lower or unknown compute capability",
            Mismatch::Node => "on nodes outside the nodeSelector",
        }
    }
}

/// Whether `gpu` matches `spec` (`Err` names the first rule it fails).
pub fn gpu_matches(spec: &GPUClassSpec, gpu: &PhysicalGPU, nodes: &NodeLabels) -> Result<(), Mismatch> {
    if gpu.spec.vendor != spec.vendor {
        return Err(Mismatch::Vendor);
    }
    if let Some(model) = spec.device_type.as_deref().filter(|m| !m.is_empty())
        && gpu.spec.model != model
    {
        return Err(Mismatch::DeviceType);
    }
    let status = gpu.status.as_ref();
    if let Some(req) = &spec.requirements {
        if let Some(min) = req.min_memory_mib
            && status.and_then(|s| s.memory_mib).is_none_or(|m| m < min)
        {
            return Err(Mismatch::Memory);
        }
        if let Some(min) = req.min_compute_capability.as_deref() {
            let have =
                status.and_then(|s| s.compute_capability.as_deref()).and_then(parse_compute_capability);
            match (parse_compute_capability(min), have) {
                (Some(min), Some(have)) if have >= min => {}
                _ => return Err(Mismatch::Compute),
            }
        }
    }
    if let Some(selector) = &spec.node_selector
        && !selector.is_empty()
    {
        let labels = nodes.get(&gpu.spec.node_name);
        if !selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) {
            return Err(Mismatch::Node);
        }
    }
    Ok(())
}

/// What one GPUClass should produce.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredClass {
    /// The GPUClass name.
    pub class: String,
    /// The DeviceClass to apply; `None` when none can be made (unknown vendor).
    pub device_class: Option<DeviceClass>,
    /// The status to write.
    pub status: GPUClassStatus,
    /// Names of the matching PhysicalGPUs, sorted.
    pub matched: Vec<String>,
}

fn condition(valid: bool, reason: &str, message: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: VALID_CONDITION.to_owned(),
        status: if valid { ConditionStatus::True } else { ConditionStatus::False },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_transition_time: None,
        observed_generation: generation,
    }
}

/// The DeviceClass and status of `class` given every PhysicalGPU and the node labels.
pub fn desired_class(
    config: &ControllerConfig,
    class: &GPUClass,
    gpus: &[PhysicalGPU],
    nodes: &NodeLabels,
) -> DesiredClass {
    let name = class.name_any();
    let generation = class.metadata.generation;
    let Some(driver) = config.driver(&class.spec.vendor) else {
        let known: Vec<&str> = config.drivers.keys().map(String::as_str).collect();
        let message = format!(
            "spec.vendor: Unsupported value: {:?}: no DRA driver is known for this vendor; supported values: {}",
            class.spec.vendor,
            known.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")
        );
        return DesiredClass {
            class: name,
            device_class: None,
            status: GPUClassStatus {
                valid: Some(false),
                message: Some(message.clone()),
                device_class_name: None,
                conditions: vec![condition(false, "UnsupportedVendor", &message, generation)],
            },
            matched: Vec::new(),
        };
    };
    let mut matched = Vec::new();
    let mut nodes_used = BTreeSet::new();
    let mut misses: BTreeMap<Mismatch, usize> = BTreeMap::new();
    for gpu in gpus {
        match gpu_matches(&class.spec, gpu, nodes) {
            Ok(()) => {
                matched.push(gpu.name_any());
                nodes_used.insert(gpu.spec.node_name.as_str());
            }
            Err(m) => *misses.entry(m).or_default() += 1,
        }
    }
    matched.sort();
    let device_class_name = config.device_class_name(&name);
    let (valid, reason, message) = if matched.is_empty() {
        let why: Vec<String> = misses.iter().map(|(m, n)| format!("{n} {}", m.describe())).collect();
        let detail = if why.is_empty() { "there are no PhysicalGPUs".to_owned() } else { why.join(", ") };
        (false, "NoMatchingGPU", format!("matches no PhysicalGPU of {}: {detail}", gpus.len()))
    } else {
        let n = matched.len();
        let m = nodes_used.len();
        (
            true,
            "Matched",
            format!(
                "matches {n} PhysicalGPU{} on {m} node{}",
                if n == 1 { "" } else { "s" },
                if m == 1 { "" } else { "s" }
            ),
        )
    };
    let owner = class.metadata.uid.as_ref().map(|uid| OwnerReference {
        api_version: format!("{}/{}", config.group, vgpu_api::VERSION),
        kind: "GPUClass".to_owned(),
        name: name.clone(),
        uid: uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    });
    let labels = BTreeMap::from([
        (config.class_label(), name.clone()),
        ("app.kubernetes.io/managed-by".to_owned(), MANAGED_BY.to_owned()),
    ]);
    let device_class = DeviceClass {
        metadata: ObjectMeta {
            name: Some(device_class_name.clone()),
            labels: Some(labels),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression: class_selector(driver, &class.spec) }),
            }]),
            ..DeviceClassSpec::default()
        }),
    };
    DesiredClass {
        class: name,
        device_class: Some(device_class),
        status: GPUClassStatus {
            valid: Some(valid),
            message: Some(message.clone()),
            device_class_name: Some(device_class_name),
            conditions: vec![condition(valid, reason, &message, generation)],
        },
        matched,
    }
}

/// [`desired_class`] of every class, in name order.
pub fn desired_classes(
    config: &ControllerConfig,
    classes: &[GPUClass],
    gpus: &[PhysicalGPU],
    nodes: &NodeLabels,
) -> Vec<DesiredClass> {
    let mut out: Vec<DesiredClass> = classes.iter().map(|c| desired_class(config, c, gpus, nodes)).collect();
    out.sort_by(|a, b| a.class.cmp(&b.class));
    out
}

/// The most PhysicalGPUs matching `class` that sit on one node; `None` while no GPU matches (the class's
/// status says why, and counts cannot be compared with anything yet).
pub fn most_on_one_node(class: &GPUClass, gpus: &[PhysicalGPU]) -> Option<u64> {
    let mut per_node: BTreeMap<&str, u64> = BTreeMap::new();
    for g in gpus.iter().filter(|g| gpu_matches(&class.spec, g, &NodeLabels::new()).is_ok()) {
        *per_node.entry(g.spec.node_name.as_str()).or_default() += 1;
    }
    per_node.values().copied().max()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixture;

    #[test]
    fn a100_shared_makes_its_device_class() {
        let config = ControllerConfig::default();
        let gpus = vec![
            fixture::gpu("w1", 0, "nvidia", "a100-sxm4-40gb", Some(40960)),
            fixture::gpu("w1", 1, "nvidia", "a100-sxm4-40gb", Some(40960)),
            fixture::gpu("w2", 0, "nvidia", "t4", Some(15360)),
            fixture::gpu("w3", 0, "metax", "c500", Some(65536)),
        ];
        let class = fixture::class("a100-shared", "nvidia", Some("a100-sxm4-40gb"), Some(4));
        let d = desired_class(&config, &class, &gpus, &NodeLabels::new());
        assert_eq!(d.matched, ["w1-0-nvidia", "w1-1-nvidia"]);
        assert_eq!(d.status.valid, Some(true));
        assert_eq!(d.status.message.as_deref(), Some("matches 2 PhysicalGPUs on 1 node"));
        assert_eq!(d.status.device_class_name.as_deref(), Some("a100-shared.gpu.deckhouse.io"));
        let dc = serde_json::to_value(d.device_class.unwrap()).unwrap();
        assert_eq!(dc["metadata"]["name"], "a100-shared.gpu.deckhouse.io");
        assert_eq!(dc["metadata"]["labels"]["gpu.deckhouse.io/gpuclass"], "a100-shared");
        assert_eq!(
            dc["metadata"]["ownerReferences"][0],
            serde_json::json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "name": "a100-shared", "uid": "uid-a100-shared", "controller": true, "blockOwnerDeletion": true})
        );
        assert!(
            dc["spec"]["selectors"][0]["cel"]["expression"]
                .as_str()
                .unwrap()
                .starts_with("device.driver == \"manager.nvidia.com\"")
        );
    }

    #[test]
    fn no_match_names_the_rules() {
        let config = ControllerConfig::default();
        let gpus = vec![
            fixture::gpu("w1", 0, "nvidia", "a100-sxm4-40gb", Some(40960)),
            fixture::gpu("w2", 0, "nvidia", "t4", None),
            fixture::gpu("w3", 0, "metax", "c500", Some(65536)),
        ];
        let mut class = fixture::class("big", "nvidia", None, None);
        class.spec.requirements =
            Some(vgpu_api::Requirements { min_memory_mib: Some(81920), ..Default::default() });
        let d = desired_class(&config, &class, &gpus, &NodeLabels::new());
        assert_eq!(d.status.valid, Some(false));
        assert_eq!(
            d.status.message.as_deref(),
            Some("matches no PhysicalGPU of 3: 1 of another vendor, 2 with less or unknown memory")
        );
        assert_eq!(d.status.conditions[0].reason.as_deref(), Some("NoMatchingGPU"));
        assert!(d.device_class.is_some());

        let empty = desired_class(&config, &class, &[], &NodeLabels::new());
        assert_eq!(
            empty.status.message.as_deref(),
            Some("matches no PhysicalGPU of 0: there are no PhysicalGPUs")
        );

        let amd = fixture::class("amd", "amd", None, None);
        let d = desired_class(&config, &amd, &gpus, &NodeLabels::new());
        assert_eq!(
            (d.status.valid, d.device_class.is_none(), d.status.device_class_name),
            (Some(false), true, None)
        );
        assert_eq!(
            d.status.message.as_deref(),
            Some(
                "spec.vendor: Unsupported value: \"amd\": no DRA driver is known for this vendor; supported values: \"metax\", \"nvidia\""
            )
        );
    }

    #[test]
    fn compute_and_node_selector() {
        let mut a = fixture::gpu("w1", 0, "nvidia", "a100", Some(40960));
        a.status.as_mut().unwrap().compute_capability = Some("8.0".into());
        let mut b = fixture::gpu("w2", 0, "nvidia", "a100", Some(40960));
        b.status.as_mut().unwrap().compute_capability = Some("7.5".into());
        let mut class = fixture::class("c", "nvidia", None, None);
        class.spec.requirements =
            Some(vgpu_api::Requirements { min_compute_capability: Some("8.0".into()), ..Default::default() });
        let nodes = NodeLabels::new();
        assert_eq!(gpu_matches(&class.spec, &a, &nodes), Ok(()));
        assert_eq!(gpu_matches(&class.spec, &b, &nodes), Err(Mismatch::Compute));
        class.spec.node_selector = Some(BTreeMap::from([("pool".to_owned(), "ml".to_owned())]));
        assert_eq!(gpu_matches(&class.spec, &a, &nodes), Err(Mismatch::Node));
        let nodes =
            NodeLabels::from([("w1".to_owned(), BTreeMap::from([("pool".to_owned(), "ml".to_owned())]))]);
        assert_eq!(gpu_matches(&class.spec, &a, &nodes), Ok(()));
    }
}
