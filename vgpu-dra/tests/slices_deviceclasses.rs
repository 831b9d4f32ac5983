//! `deploy/dra/deviceclasses.yaml` (the manifests the e2e suite applies) parsed as resource.k8s.io/v1
//! DeviceClasses: the four classes of contract §9 with their CEL selectors, equal to
//! `slices::classes::device_classes`, and each published device type selected by exactly its class.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::resource::v1::DeviceClass;
use vgpu_core::model::GpuDevice;
use vgpu_dra::{
    DRIVER_NAME,
    devices::{AllocatableDevices, DeviceConfig},
    health::HealthSnapshot,
    slices::{SliceConfig, build_slices, classes},
};

fn manifest() -> Vec<DeviceClass> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/dra/deviceclasses.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

#[test]
fn the_manifest_holds_the_four_classes() {
    let classes = manifest();
    let names: Vec<_> = classes.iter().map(|c| c.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["gpu-manager", "vgpu-manager", "mig-manager", "vfio-manager"]);
    let vgpu = &classes[1];
    let selectors = vgpu.spec.as_ref().unwrap().selectors.as_ref().unwrap();
    assert_eq!(selectors.len(), 1);
    assert_eq!(
        selectors[0].cel.as_ref().unwrap().expression,
        "device.driver == 'manager.nvidia.com' && device.attributes['manager.nvidia.com'].type == 'vgpu'"
    );
    assert_eq!(classes, classes::device_classes(DRIVER_NAME));
    // Round trip through JSON as the API server would receive it.
    let json = serde_json::to_value(&classes[0]).unwrap();
    assert_eq!(
        (json["apiVersion"].as_str(), json["kind"].as_str()),
        (Some("resource.k8s.io/v1"), Some("DeviceClass"))
    );
}

#[test]
fn each_published_type_has_its_class() {
    for vgpu_support in [true, false] {
        let gpu = GpuDevice { index: 0, uuid: "GPU-0".into(), memory_mib: 1024, ..GpuDevice::default() };
        let config = DeviceConfig { vgpu_support, ..DeviceConfig::default() };
        let devices = AllocatableDevices::new(&config, vec![(gpu, 0)], None).unwrap();
        let slices = build_slices(&SliceConfig::new("n"), &devices, &HealthSnapshot::default(), 1).unwrap();
        let device = &slices[0].spec.devices.as_ref().unwrap()[0];
        let device_type = device.attributes.as_ref().unwrap()["type"].string.clone().unwrap();
        let selecting: Vec<_> = manifest()
            .into_iter()
            .filter(|c| {
                let expression =
                    &c.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap().expression;
                *expression == classes::selector_expression(&slices[0].spec.driver, &device_type)
            })
            .map(|c| c.metadata.name.unwrap())
            .collect();
        let want = if vgpu_support { "vgpu-manager" } else { "gpu-manager" };
        assert_eq!(selecting, [want], "{device_type}");
    }
}
