//! Objects for tests and benches: PhysicalGPUs, GPUClasses and allocated ResourceClaims in the shapes the
//! node agent, users and the scheduler write; claims as the pod mutation creates them and their pods.

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use vgpu_api::{
    GPUClass, GPUClassSpec, PhysicalGPU, PhysicalGPUSpec, PhysicalGPUStatus, SharingMode, SharingPolicy,
};

/// PhysicalGPU `<node>-<index>-<vendor>` at PCI address `0000:<index+1 in hex>:00.0` with `memoryMiB`.
pub fn gpu(node: &str, index: u32, vendor: &str, model: &str, memory_mib: Option<u64>) -> PhysicalGPU {
    let mut gpu = PhysicalGPU::new(
        &format!("{node}-{index}-{vendor}"),
        PhysicalGPUSpec {
            node_name: node.to_owned(),
            index,
            pci_address: pci_address(index),
            vendor: vendor.to_owned(),
            vendor_id: if vendor == "nvidia" { "10de".into() } else { "9999".into() },
            vendor_name: vendor.to_owned(),
            device_id: "20b0".into(),
            device_name: model.to_owned(),
            model: model.to_owned(),
            subsystem: None,
            class_code: "030200".into(),
            numa_node: None,
            iommu_group: None,
            passthrough: None,
        },
    );
    gpu.status =
        Some(PhysicalGPUStatus { memory_mib, driver: Some(vendor.to_owned()), ..Default::default() });
    gpu
}

/// The PCI address the fixture gives the GPU of `index`.
pub fn pci_address(index: u32) -> String {
    format!("0000:{:02x}:00.0", (index + 1) % 256)
}

/// GPUClass `name` (UID `uid-<name>`), shared with `shares` or exclusive when `None`.
pub fn class(name: &str, vendor: &str, device_type: Option<&str>, shares: Option<u32>) -> GPUClass {
    let mut class = GPUClass::new(
        name,
        GPUClassSpec {
            vendor: vendor.to_owned(),
            device_type: device_type.map(str::to_owned),
            requirements: None,
            sharing: match shares {
                Some(n) => SharingPolicy { mode: SharingMode::Shared, shares: Some(n) },
                None => SharingPolicy { mode: SharingMode::Exclusive, shares: None },
            },
            node_selector: None,
            passthrough: None,
        },
    );
    class.metadata.uid = Some(format!("uid-{name}"));
    class.metadata.generation = Some(1);
    class
}

/// ResourceClaim `<namespace>/<name>` allocated the devices `(driver, pool, device)`.
pub fn allocated_claim(namespace: &str, name: &str, devices: &[(&str, &str, &str)]) -> ResourceClaim {
    let results = devices
        .iter()
        .map(|(driver, pool, device)| DeviceRequestAllocationResult {
            driver: (*driver).to_owned(),
            pool: (*pool).to_owned(),
            device: (*device).to_owned(),
            request: "gpu".to_owned(),
            ..DeviceRequestAllocationResult::default()
        })
        .collect();
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Default::default(),
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult { results: Some(results), config: None }),
                ..AllocationResult::default()
            }),
            ..ResourceClaimStatus::default()
        }),
    }
}

/// `1_700_000_000 + seconds` seconds after the epoch (a fixed instant for claim ages).
pub fn time(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// ResourceClaim `<namespace>/<name>` as the pod mutation creates it (default group): labels
/// `app.kubernetes.io/managed-by: vgpu-controller` and `gpu.deckhouse.io/admission-id: <id>`, UID
/// `uid-<name>`, resourceVersion `1`, created at `created`, no owner.
pub fn generated_claim(namespace: &str, name: &str, id: &str, created: Timestamp) -> ResourceClaim {
    let labels = BTreeMap::from([
        (crate::desired::MANAGED_BY_LABEL.to_owned(), crate::desired::MANAGED_BY.to_owned()),
        (format!("{}/admission-id", vgpu_api::DEFAULT_GROUP), id.to_owned()),
    ]);
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".to_owned()),
            labels: Some(labels),
            creation_timestamp: Some(Time(created)),
            ..ObjectMeta::default()
        },
        spec: Default::default(),
        status: None,
    }
}

/// Pod `<namespace>/<name>` with UID `uid` (none when empty), label `gpu.deckhouse.io/admission-id: <id>`,
/// one container, and a pod claim naming each of `claims`.
pub fn pod(namespace: &str, name: &str, uid: &str, id: &str, claims: &[&str]) -> Pod {
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: (!uid.is_empty()).then(|| uid.to_owned()),
            labels: Some(BTreeMap::from([(
                format!("{}/admission-id", vgpu_api::DEFAULT_GROUP),
                id.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    };
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.containers
        .push(k8s_openapi::api::core::v1::Container { name: "main".to_owned(), ..Default::default() });
    spec.resource_claims = Some(
        claims
            .iter()
            .enumerate()
            .map(|(i, c)| k8s_openapi::api::core::v1::PodResourceClaim {
                name: format!("claim-{i}"),
                resource_claim_name: Some((*c).to_owned()),
                resource_claim_template_name: None,
            })
            .collect(),
    );
    pod
}
