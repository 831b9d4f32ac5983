//! Planning a Prepare, with no side effect: the claim's allocation results resolved to this node's devices
//! and their limits ([`plan`]), the overlap check against the checkpoint ([`check_overlap`]), the vGPU
//! partitions from the consumer pods ([`assign_partitions`]) and, in client mode, their register UUIDs
//! ([`mint_register_uuids`]).

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::error::ClaimFailure;
use crate::{
    cdi,
    checkpoint::{Checkpoint, PreparedDevice},
    claims::{ClaimRef, ClaimSource},
    client_mode,
    config::DriverConfig,
    devices::{AllocatableDevice, AllocatableDevices, DeviceError},
    modes::ClaimDevice,
};
use vgpu_core::dra::DeviceType;

/// One allocation result resolved to a GPU, before any side effect.
#[derive(Debug)]
pub(super) struct Planned {
    pub(super) device: PreparedDevice,
    pub(super) partition: String,
    pub(super) register_uuid: String,
    pub(super) ordinal: usize,
    pub(super) cores: Option<u64>,
    pub(super) memory_mib: Option<u64>,
    pub(super) cdi_name: String,
    /// The device the result names (its kind and GPU: index, minor).
    pub(super) allocatable: AllocatableDevice,
}

/// Resolves this driver's allocation results (pure: no side effect).
pub(super) fn plan(
    config: &DriverConfig,
    devices: &AllocatableDevices,
    claim: &ClaimRef,
    object: &ResourceClaim,
) -> Result<Vec<Planned>, ClaimFailure> {
    let name = format!("{}/{}", claim.namespace, claim.name);
    let status = object.status.as_ref();
    let results = status
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| ClaimFailure::NotAllocated(name.clone()))?
        .devices
        .as_ref()
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    let mut planned = Vec::new();
    let mut ordinals: BTreeMap<&str, usize> = BTreeMap::new();
    for (position, result) in results.iter().enumerate() {
        if result.driver != config.driver_name {
            continue;
        }
        if result.pool != config.node_name {
            return Err(ClaimFailure::Pool {
                claim: name,
                device: result.device.clone(),
                pool: result.pool.clone(),
                node: config.node_name.clone(),
            });
        }
        let device = devices.get(&result.device).ok_or_else(|| ClaimFailure::Device {
            claim: name.clone(),
            source: DeviceError::UnknownDevice(result.device.clone()),
        })?;
        let consumed = result.consumed_capacity.iter().flatten().map(|(k, v)| (k.as_str(), v.0.as_str()));
        let limits = devices
            .limits(&result.device, consumed)
            .map_err(|source| ClaimFailure::Device { claim: name.clone(), source })?;
        let ordinal = ordinals.entry(result.request.as_str()).or_insert(0);
        let id = cdi::device_id(&result.request, &result.device, result.share_id.as_deref(), position);
        let cdi_name = cdi::device_name(&claim.uid, &id);
        planned.push(Planned {
            device: PreparedDevice {
                request_names: vec![result.request.clone()],
                pool_name: result.pool.clone(),
                device_name: result.device.clone(),
                share_id: result.share_id.clone(),
                cdi_device_ids: vec![cdi::qualified(&cdi_name)],
                uuid: device.gpu.uuid.clone(),
            },
            partition: crate::partition::fallback_key(crate::partition::main_request(&result.request)),
            register_uuid: String::new(),
            ordinal: *ordinal,
            cores: limits.cores,
            memory_mib: limits.memory_mib,
            cdi_name,
            allocatable: device.clone(),
        });
        *ordinal += 1;
    }
    let consumers = status.and_then(|s| s.reserved_for.as_ref()).map_or(0, Vec::len);
    // With NRI the partitions are per container (made at CreateContainer), so several pods may share.
    if consumers > 1 && !config.nri() && planned.iter().any(|p| p.allocatable.kind == DeviceType::Vgpu) {
        return Err(ClaimFailure::Shared { claim: name, consumers });
    }
    Ok(planned)
}

/// Refuses a device (share) planned twice in the claim or already prepared for another claim.
pub(super) fn check_overlap(
    claim: &ClaimRef,
    planned: &[Planned],
    cp: &Checkpoint,
) -> Result<(), ClaimFailure> {
    let name = format!("{}/{}", claim.namespace, claim.name);
    let clash = |a: &PreparedDevice, b: &PreparedDevice| {
        a.device_name == b.device_name
            && (a.share_id.is_none() || b.share_id.is_none() || a.share_id == b.share_id)
    };
    let overlap = |device: &PreparedDevice, other: String| ClaimFailure::Overlap {
        claim: name.clone(),
        device: device.device_name.clone(),
        share: device.share_id.as_ref().map(|s| format!(" (share {s})")).unwrap_or_default(),
        other,
    };
    for (i, p) in planned.iter().enumerate() {
        if planned[..i].iter().any(|q| clash(&p.device, &q.device)) {
            return Err(overlap(&p.device, format!("{name} ({}) itself", claim.uid)));
        }
        for (uid, other) in cp.claims() {
            if uid != &claim.uid && other.prepared_devices.iter().any(|d| clash(&p.device, d)) {
                return Err(overlap(&p.device, format!("{}/{} ({uid})", other.namespace, other.name)));
            }
        }
    }
    Ok(())
}

/// The modes' view of the planned devices.
pub(super) fn claim_devices(planned: &[Planned]) -> Vec<ClaimDevice> {
    planned
        .iter()
        .map(|p| ClaimDevice {
            request: p.device.request_names.first().cloned().unwrap_or_default(),
            device: p.allocatable.clone(),
            share_id: p.device.share_id.clone(),
            cdi_name: p.cdi_name.clone(),
        })
        .collect()
}

/// Sets each vGPU device's partition from the claim's consumer pods ([`crate::partition`]); a consumer
/// that cannot be read is left out (its requests get their fallback partition).
pub(super) async fn assign_partitions(
    claims: &dyn ClaimSource,
    claim: &ClaimRef,
    object: &ResourceClaim,
    planned: &mut [Planned],
) {
    let requests: std::collections::BTreeSet<String> = planned
        .iter()
        .filter(|p| p.allocatable.kind == DeviceType::Vgpu)
        .filter_map(|p| p.device.request_names.first())
        .map(|r| crate::partition::main_request(r).to_owned())
        .collect();
    let consumers = object.status.as_ref().and_then(|s| s.reserved_for.as_ref());
    let mut pods = Vec::new();
    for consumer in consumers.into_iter().flatten().filter(|c| c.resource == "pods") {
        match claims.pod(&claim.namespace, &consumer.name).await {
            Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(consumer.uid.as_str()) => pods.push(pod),
            Ok(_) => {
                tracing::warn!(claim = %claim.uid, pod = %consumer.name, "consumer pod not found (or re-created): its containers get per-request partitions")
            }
            Err(e) => {
                tracing::warn!(claim = %claim.uid, pod = %consumer.name, error = %e, "cannot read the consumer pod: its containers get per-request partitions")
            }
        }
    }
    let partitions = crate::partition::resolve(object, &requests, &pods);
    for p in planned.iter_mut().filter(|p| p.allocatable.kind == DeviceType::Vgpu) {
        let main =
            p.device.request_names.first().map(|r| crate::partition::main_request(r)).unwrap_or_default();
        if let Some(key) = partitions.by_request.get(main) {
            p.partition.clone_from(key);
        }
    }
}

/// Client mode: one fresh register UUID per vGPU partition, set on its devices; returns UUID → key.
pub(super) fn mint_register_uuids(planned: &mut [Planned]) -> Result<BTreeMap<String, String>, ClaimFailure> {
    let mut by_key: BTreeMap<String, String> = BTreeMap::new();
    for p in planned.iter_mut().filter(|p| p.allocatable.kind == DeviceType::Vgpu) {
        if !by_key.contains_key(&p.partition) {
            let source = Path::new(client_mode::KERNEL_UUID);
            let uuid = client_mode::mint_uuid(source).map_err(|source_err| ClaimFailure::Io {
                path: source.to_path_buf(),
                action: "mint a register UUID",
                source: source_err,
            })?;
            by_key.insert(p.partition.clone(), uuid);
        }
        p.register_uuid.clone_from(&by_key[&p.partition]);
    }
    Ok(by_key.into_iter().map(|(key, uuid)| (uuid, key)).collect())
}
