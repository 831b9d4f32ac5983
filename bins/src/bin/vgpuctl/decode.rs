//! `vgpuctl decode KIND VALUE`: decode an annotation value and print it as normalized JSON.

use std::process::ExitCode;

use serde_json::{Value, json};
use vgpu_core::{
    codec::{node_config_info, node_devices, pod_devices},
    model::{NodeDeviceInventory, NodeVgpuConfig, PodDeviceClaim},
};

use crate::input;

/// Which annotation value to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DecodeKind {
    /// `node-device-register` (node device inventory JSON).
    NodeDevices,
    /// `node-config-info` (node vGPU config JSON).
    NodeConfig,
    /// `node-device-topology` (GPU link matrix JSON).
    NodeTopology,
    /// `pre-allocated` / `real-allocated` (pod device claim text).
    PodDevices,
}

impl DecodeKind {
    /// The kind as spelled on the command line.
    fn as_str(self) -> &'static str {
        match self {
            Self::NodeDevices => "node-devices",
            Self::NodeConfig => "node-config",
            Self::NodeTopology => "node-topology",
            Self::PodDevices => "pod-devices",
        }
    }
}

/// Arguments of `vgpuctl decode`.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// Kind of value.
    #[arg(value_enum)]
    pub kind: DecodeKind,
    /// The annotation value, or `-` to read it from stdin (at most 256 KiB unless --max-bytes).
    pub value: String,
}

/// Decodes and prints; exit 0 on success, 2 (message on stderr) on any input error (unreadable, over the cap,
/// not UTF-8, malformed), 1 when stdout cannot be written.
pub fn run(args: DecodeArgs, max_bytes: Option<u64>) -> ExitCode {
    let what = format!("{} value", args.kind.as_str());
    let cap = input::cap(max_bytes, input::ANNOTATION_CAP);
    let value = if args.value == "-" {
        input::read_stdin(&what, cap)
    } else {
        input::check_argument(&what, &args.value, cap).map(|()| args.value)
    };
    let value = match value {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match normalize(args.kind, &value) {
        Ok(v) => match serde_json::to_string_pretty(&v) {
            Ok(text) => crate::output::print_line(&text, ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("error: cannot print the value: {e}");
                ExitCode::FAILURE
            }
        },
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}

fn normalize(kind: DecodeKind, value: &str) -> Result<Value, String> {
    match kind {
        DecodeKind::NodeDevices => node_devices::decode(value).map(devices_json).map_err(|e| e.to_string()),
        DecodeKind::NodeConfig => node_config_info::decode(value).map(config_json).map_err(|e| e.to_string()),
        DecodeKind::PodDevices => pod_devices::decode("pre-allocated/real-allocated", value)
            .map(|c| claim_json(&c))
            .map_err(|e| e.to_string()),
        DecodeKind::NodeTopology => topology_json(value),
    }
}

fn devices_json(inv: NodeDeviceInventory) -> Value {
    Value::Array(
        inv.devices
            .into_iter()
            .map(|d| {
                json!({
                    "id": d.index,
                    "type": d.type_name,
                    "uuid": d.uuid,
                    "core": d.cores,
                    "memory": d.memory_mib,
                    "number": d.split_count,
                    "numa": d.numa_node.map_or(-1, i64::from),
                    "mig": d.mig_enabled,
                    "busId": d.bus_id,
                    "capability": capability_json(d.capability),
                    "healthy": d.health.is_healthy(),
                })
            })
            .collect(),
    )
}

/// `major.minor` as a JSON number (`6.1`, not the f32 widening `6.099999904632568`).
fn capability_json(cap: vgpu_core::model::ComputeCapability) -> Value {
    cap.to_string()
        .parse::<serde_json::Number>()
        .map_or_else(|_| Value::String(cap.to_string()), Value::Number)
}

fn config_json(c: NodeVgpuConfig) -> Value {
    json!({
        "deviceSplit": c.device_split,
        "coresScaling": c.cores_scaling,
        "memoryFactor": c.memory_factor,
        "memoryScaling": c.memory_scaling,
    })
}

fn claim_json(c: &PodDeviceClaim) -> Value {
    Value::Array(
        c.containers
            .iter()
            .map(|ctr| {
                json!({
                    "name": ctr.name,
                    "devices": ctr.devices.iter().map(|d| json!({
                        "index": d.index,
                        "uuid": d.uuid,
                        "cores": d.cores,
                        "memoryMiB": d.memory_mib,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// The topology as decoded by the codec: per GPU its peers' link codes and their `nvidia-smi topo -m` names.
fn topology_json(value: &str) -> Result<Value, String> {
    let topo = vgpu_core::topology::DeviceTopology::decode(value).map_err(|e| e.to_string())?;
    Ok(Value::Array(
        topo.gpus
            .iter()
            .map(|g| {
                let mut links = serde_json::Map::new();
                let mut names = serde_json::Map::new();
                for (peer, l) in &g.links {
                    links.insert(peer.to_string(), l.iter().map(|t| t.code()).collect::<Vec<_>>().into());
                    names.insert(
                        peer.to_string(),
                        l.iter().map(|t| t.short_name()).collect::<Vec<_>>().into(),
                    );
                }
                json!({"index": g.index, "links": links, "linkNames": names})
            })
            .collect(),
    ))
}
