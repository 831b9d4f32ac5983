//! The DeviceClasses that select this driver's devices (`deploy/dra/deviceclasses.yaml` holds the same
//! objects; a test keeps the two equal).
//!
//! | class | selects `type` | published by this driver |
//! |---|---|---|
//! | `gpu-manager` | `gpu` | with `VGPUSupport` off |
//! | `vgpu-manager` | `vgpu` | with `VGPUSupport` on (default) |
//! | `mig-manager` | `mig` | with `DynamicMIG` (MIG devices of MIG-enabled GPUs: [`crate::mig`]) |
//! | `vfio-manager` | `vfio` | with `PassthroughSupport` (`gpu-vfio-<index>`, bound to `vfio-pci` on Prepare: [`crate::vfio`]) |
//!
//! Selector (CEL): `device.driver == '<driver>' && device.attributes['<driver>'].type == '<type>'`.
//!
//! ```
//! let classes = vgpu_dra::slices::classes::device_classes("manager.nvidia.com");
//! assert_eq!(classes[1].metadata.name.as_deref(), Some("vgpu-manager"));
//! ```

use k8s_openapi::{
    api::resource::v1::{CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

/// Class names and the device `type` each selects, in manifest order.
pub const CLASSES: [(&str, &str); 4] =
    [("gpu-manager", "gpu"), ("vgpu-manager", "vgpu"), ("mig-manager", "mig"), ("vfio-manager", "vfio")];

/// The CEL selector of devices of `driver` with type `device_type`.
pub fn selector_expression(driver: &str, device_type: &str) -> String {
    format!("device.driver == '{driver}' && device.attributes['{driver}'].type == '{device_type}'")
}

/// The four DeviceClasses for `driver`.
pub fn device_classes(driver: &str) -> Vec<DeviceClass> {
    CLASSES
        .iter()
        .map(|(name, device_type)| DeviceClass {
            metadata: ObjectMeta { name: Some((*name).to_owned()), ..ObjectMeta::default() },
            spec: Some(DeviceClassSpec {
                selectors: Some(vec![DeviceSelector {
                    cel: Some(CELDeviceSelector { expression: selector_expression(driver, device_type) }),
                }]),
                ..DeviceClassSpec::default()
            }),
        })
        .collect()
}
