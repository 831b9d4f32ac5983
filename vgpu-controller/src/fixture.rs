//! Objects for tests and benches: PhysicalGPUs, GPUClasses and allocated ResourceClaims in the shapes the
//! node agent, users and the scheduler write.

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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
