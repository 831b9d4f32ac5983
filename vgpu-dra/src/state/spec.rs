//! Building a prepared claim's CDI spec ([`claim_spec`]): the vGPU env and mounts, the partition mounts
//! (or, with gate `NRISupport`, the NRI guard), the client-mode register UUIDs and the device nodes.

use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaim;
use vgpu_core::{abi::runtime_files, backend::VendorAdapter, model::ComputePolicy};

use super::plan::Planned;
use crate::{cdi, claims::ClaimRef, client_mode, config::DriverConfig};
use vgpu_core::cdi::{ContainerEdits, DeviceNode, Mount};
use vgpu_core::dra::DeviceType;

/// The claim's CDI spec (see [`crate::cdi`] for the edits).
pub(super) fn claim_spec(
    config: &DriverConfig,
    vendor: &dyn VendorAdapter,
    claim: &ClaimRef,
    object: &ResourceClaim,
    planned: &[Planned],
) -> vgpu_core::cdi::Spec {
    let cfg = config;
    let host = &cfg.host_manager_dir;
    let ratio = format!("{:.2}", f64::from(cfg.memory_ratio) / 100.0);
    let oversold = if cfg.memory_oversold() { "TRUE" } else { "FALSE" };
    let policy: ComputePolicy = object
        .metadata
        .annotations
        .iter()
        .flatten()
        .find(|(k, _)| k.ends_with("/vgpu-compute-policy"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_default();
    let mut common =
        ContainerEdits { device_nodes: control_nodes(config, vendor), ..ContainerEdits::default() };
    if planned.iter().any(|p| p.allocatable.kind == DeviceType::Vgpu) {
        common.env = [
            ("LD_PRELOAD", cdi::CONTROL_LIBRARY.to_owned()),
            ("MANAGER_COMPATIBILITY_MODE", cfg.compatibility_mode.to_string()),
            ("MANAGER_VISIBLE_DEVICES", String::new()),
            ("CUDA_MEM_RATIO", ratio.clone()),
            ("CUDA_CORE_LIMIT", String::new()),
            ("CUDA_CORE_SOFT_LIMIT", String::new()),
            ("CUDA_MEM_LIMIT", String::new()),
            ("CUDA_MEM_OVERSOLD", oversold.to_owned()),
            ("VMEMORY_NODE_ENABLED", "TRUE".to_owned()),
            ("CUDA_SM_SHARED_BUCKET", "TRUE".to_owned()),
            ("MANAGER_VGPU_CLAIM_UID", claim.uid.clone()),
            ("EXTERNAL_SM_WATCHER_ENABLED", if cfg.sm_watcher() { "TRUE" } else { "FALSE" }.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
        common.mounts = vec![
            Mount::bind(
                cdi::CONTROL_LIBRARY,
                &host.join(runtime_files::library_file_name(&cfg.library_version)),
                true,
            ),
            Mount::bind("/etc/ld.so.preload", &host.join(runtime_files::PRELOAD_FILE), true),
        ];
        if cfg.client_mode() {
            common.mounts.push(Mount::bind(
                client_mode::CONTAINER_REGISTRY_DIR,
                &host.join("registry"),
                true,
            ));
        } else {
            common.mounts.push(Mount::bind("/etc/vgpu-manager/.host_proc", Path::new("/proc"), true));
        }
        if cfg.sm_watcher() {
            common.mounts.push(Mount::bind(cdi::CONTAINER_WATCHER_DIR, &host.join("watcher"), true));
        }
        if cfg.nri() {
            // A container the NRI hook did not adjust (our plugin not connected to the runtime then) must
            // not run without its partition: this mount's source never exists, so the runtime refuses to
            // create it and the kubelet retries; the hook's own mount on the same path replaces it.
            common.mounts.push(crate::partition::guard_mount(&cfg.host_claim_dir(&claim.uid)));
        }
    }
    let host_claim = cfg.host_claim_dir(&claim.uid);
    let devices = planned
        .iter()
        .map(|p| {
            // A MIG or VFIO device's nodes come from its mode (the MIG caps, `/dev/vfio/<group>`).
            let nodes = match p.allocatable.kind {
                DeviceType::Gpu | DeviceType::Vgpu => vendor
                    .gpu_device_nodes(p.allocatable.gpu.index, p.allocatable.gpu.minor)
                    .iter()
                    .map(|n| DeviceNode::under(n, &cfg.host_driver_root))
                    .collect(),
                DeviceType::Mig | DeviceType::Vfio => Vec::new(),
            };
            let mut edits = ContainerEdits { device_nodes: nodes, ..ContainerEdits::default() };
            if p.allocatable.kind == DeviceType::Vgpu {
                let i = p.ordinal;
                let (hard, soft) = match p.cores {
                    Some(cores) => policy.core_limits(cores),
                    None => (String::new(), String::new()),
                };
                edits.env = vec![
                    format!("MANAGER_VISIBLE_DEVICE_{i}={}", p.device.uuid),
                    format!("CUDA_MEM_RATIO_{i}={ratio}"),
                    format!("CUDA_MEM_OVERSOLD_{i}={oversold}"),
                    format!(
                        "CUDA_MEM_LIMIT_{i}={}",
                        p.memory_mib.map(|m| format!("{m}m")).unwrap_or_default()
                    ),
                    format!("CUDA_CORE_LIMIT_{i}={hard}"),
                    format!("CUDA_CORE_SOFT_LIMIT_{i}={soft}"),
                ];
                // With NRI the hook sets the per-container partition's register UUID.
                if cfg.client_mode() && !cfg.nri() {
                    edits.env.push(format!("{}={}", client_mode::ENV, p.register_uuid));
                }
                let part = host_claim.join(&p.partition);
                // With NRI the partition mounts are per container, injected at CreateContainer.
                edits.mounts = if cfg.nri() { Vec::new() } else { crate::partition::partition_mounts(&part) };
            }
            vgpu_core::cdi::Device { name: p.cdi_name.clone(), container_edits: edits, ..Default::default() }
        })
        .collect();
    vgpu_core::cdi::Spec {
        cdi_version: vgpu_core::cdi::SPEC_VERSION.to_owned(),
        kind: cdi::KIND.to_owned(),
        devices,
        container_edits: common,
        ..Default::default()
    }
}

/// The vendor's control nodes present under the container driver root.
fn control_nodes(config: &DriverConfig, vendor: &dyn VendorAdapter) -> Vec<DeviceNode> {
    vendor
        .control_device_nodes()
        .iter()
        .filter(|n| config.container_driver_root.join(n.trim_start_matches('/')).exists())
        .map(|n| DeviceNode::under(n, &config.host_driver_root))
        .collect()
}
