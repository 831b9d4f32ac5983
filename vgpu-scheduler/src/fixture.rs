//! Building cluster objects the way the device plugin publishes them (tests, the simulator, benches).

use vgpu_core::alloc::{PodContainer, PodSpec};
use vgpu_core::backend::LinkMatrix;
use vgpu_core::codec::{CodecError, node_config_info, node_devices};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::{DeviceTopology, GpuLinks, P2PLinkType};

use crate::cluster::{Node, Pod};

/// The `node-device-topology` value of a backend's link matrix (unknown codes are skipped).
pub fn topology_of(matrix: &LinkMatrix) -> DeviceTopology {
    let gpus = matrix
        .rows()
        .iter()
        .enumerate()
        .map(|(i, row)| GpuLinks {
            index: i,
            links: row
                .iter()
                .enumerate()
                .filter(|(j, l)| *j != i && !l.is_empty())
                .map(|(j, l)| {
                    (j, l.iter().filter_map(|&c| P2PLinkType::from_code(i64::from(c)).ok()).collect())
                })
                .collect(),
        })
        .collect();
    DeviceTopology { gpus }
}

/// A vGPU-enabled node: allocatable `vgpu-number`, `node-device-register`, `node-config-info` and, when given,
/// `node-device-topology`.
pub fn vgpu_node(
    name: &str,
    inventory: &NodeDeviceInventory,
    config: &NodeVgpuConfig,
    topology: Option<&DeviceTopology>,
    domain: &ResourceDomain,
) -> Result<Node, CodecError> {
    let mut node = Node { name: name.to_owned(), ..Node::default() };
    let slots: u64 = inventory.schedulable().map(|d| u64::from(d.split_count)).sum();
    node.allocatable.insert(domain.vgpu_number(), slots);
    node.annotations.insert(domain.node_device_register(), node_devices::encode(inventory)?);
    node.annotations.insert(domain.node_config_info(), node_config_info::encode(config)?);
    if let Some(t) = topology {
        node.annotations.insert(domain.node_device_topology(), t.encode());
    }
    Ok(node)
}

/// A pending pod with one app container asking for `number` vGPUs with `cores` and `memory` each, plus
/// annotations.
pub fn vgpu_pod(
    uid: &str,
    number: u32,
    cores: u32,
    memory: u64,
    annotations: &[(String, String)],
    domain: &ResourceDomain,
) -> Pod {
    let mut c = PodContainer::app("main").limit(domain.vgpu_number(), number);
    if cores > 0 {
        c = c.limit(domain.vgpu_cores(), cores);
    }
    if memory > 0 {
        c = c.limit(domain.vgpu_memory(), memory);
    }
    Pod {
        uid: uid.to_owned(),
        namespace: "default".to_owned(),
        name: format!("pod-{uid}"),
        annotations: annotations.iter().cloned().collect(),
        spec: PodSpec::new().container(c),
        ..Pod::default()
    }
}
