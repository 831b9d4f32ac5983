//! `node-device-register`: the JSON array of `DeviceInfo` the device plugin writes on its Node.
//!
//! Wire form (field order as Go writes it):
//! `[{"id":0,"type":"…","uuid":"GPU-…","core":100,"memory":8192,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":6.1,"healthy":true}]`
//!
//! Decoding checks what the Go scheduler silently assumes: ids are `0..n-1` in order (they are used as slice
//! indices), numbers are non-negative, `numa` is `-1` (unknown) or a node id, `capability` is `major.minor`.
//! Unknown fields are ignored (forward compatibility); every known field is required. Go's `null` (a nil
//! slice) decodes as an empty inventory.

use std::fmt::Write as _;

use serde::Deserialize;

use super::{CodecError, NODE_DEVICE_REGISTER, gojson};
use crate::model::{ComputeCapability, DeviceHealth, GpuDevice, NodeDeviceInventory, Vendor};

const ANNOTATION: &str = NODE_DEVICE_REGISTER;

#[derive(Deserialize)]
struct WireDevice {
    id: i64,
    #[serde(rename = "type")]
    type_name: String,
    uuid: String,
    core: i64,
    memory: i64,
    number: i64,
    numa: i64,
    mig: bool,
    #[serde(rename = "busId")]
    bus_id: String,
    capability: f32,
    healthy: bool,
}

fn field_err(position: usize, field: &'static str, expected: &'static str, got: String) -> CodecError {
    CodecError::Field {
        annotation: ANNOTATION,
        location: format!("device at position {position}"),
        field,
        expected,
        got,
    }
}

/// Decodes a `node-device-register` value.
///
/// ```
/// let v = r#"[{"id":0,"type":"NVIDIA A10","uuid":"GPU-1","core":100,"memory":23028,"number":10,"numa":-1,"mig":false,"busId":"0000:17:00.0","capability":8.6,"healthy":true}]"#;
/// let inv = vgpu_core::codec::node_devices::decode(v)?;
/// assert_eq!(inv.devices[0].numa_node, None);
/// assert_eq!(vgpu_core::codec::node_devices::encode(&inv)?, v);
/// # Ok::<(), vgpu_core::codec::CodecError>(())
/// ```
pub fn decode(value: &str) -> Result<NodeDeviceInventory, CodecError> {
    let wire: Option<Vec<WireDevice>> = serde_json::from_str(value).map_err(|source| CodecError::Json {
        annotation: ANNOTATION,
        expected: "a JSON array of device objects {id,type,uuid,core,memory,number,numa,mig,busId,capability,healthy}",
        source,
    })?;
    let wire = wire.unwrap_or_default();
    let mut devices = Vec::with_capacity(wire.len());
    for (pos, w) in wire.into_iter().enumerate() {
        let index =
            u32::try_from(w.id).ok().filter(|&i| usize::try_from(i).ok() == Some(pos)).ok_or_else(|| {
                field_err(pos, "id", "the device's position (ids are 0..n-1 in order)", w.id.to_string())
            })?;
        let cores = u64::try_from(w.core)
            .map_err(|_| field_err(pos, "core", "a non-negative integer", w.core.to_string()))?;
        let memory_mib = u64::try_from(w.memory)
            .map_err(|_| field_err(pos, "memory", "a non-negative integer (MiB)", w.memory.to_string()))?;
        let split_count = u32::try_from(w.number)
            .map_err(|_| field_err(pos, "number", "a non-negative 32-bit integer", w.number.to_string()))?;
        let numa_node = match w.numa {
            -1 => None,
            n => Some(
                u32::try_from(n)
                    .map_err(|_| field_err(pos, "numa", "-1 (unknown) or a NUMA node id", n.to_string()))?,
            ),
        };
        let capability = ComputeCapability::from_f32(w.capability).ok_or_else(|| {
            field_err(
                pos,
                "capability",
                "a compute capability major.minor (one minor digit)",
                w.capability.to_string(),
            )
        })?;
        devices.push(GpuDevice {
            index,
            uuid: w.uuid,
            type_name: w.type_name,
            vendor: Vendor::Nvidia,
            memory_mib,
            cores,
            split_count,
            numa_node,
            mig_enabled: w.mig,
            bus_id: w.bus_id,
            capability,
            health: DeviceHealth::from_bool(w.healthy),
        });
    }
    Ok(NodeDeviceInventory { devices })
}

/// Encodes an inventory exactly as Go's `json.Marshal` would. Fails when a device's index is not its position
/// or a number does not fit Go's `int64`.
pub fn encode(inventory: &NodeDeviceInventory) -> Result<String, CodecError> {
    let unencodable = |pos: usize, field: &'static str, problem: String| CodecError::Unencodable {
        annotation: ANNOTATION,
        location: format!("device at position {pos}"),
        field,
        problem,
    };
    let mut out = String::with_capacity(inventory.devices.len() * 200 + 2);
    out.push('[');
    for (pos, d) in inventory.devices.iter().enumerate() {
        if usize::try_from(d.index).ok() != Some(pos) {
            return Err(unencodable(pos, "id", format!("is {}, must equal the position", d.index)));
        }
        let core = i64::try_from(d.cores)
            .map_err(|_| unencodable(pos, "core", format!("{} overflows int64", d.cores)))?;
        let memory = i64::try_from(d.memory_mib)
            .map_err(|_| unencodable(pos, "memory", format!("{} overflows int64", d.memory_mib)))?;
        let capability = gojson::format_f32(d.capability.as_f32())
            .ok_or_else(|| unencodable(pos, "capability", "is not finite".to_owned()))?;
        if pos > 0 {
            out.push(',');
        }
        let _ = write!(out, "{{\"id\":{},\"type\":", d.index);
        gojson::write_string(&mut out, &d.type_name);
        out.push_str(",\"uuid\":");
        gojson::write_string(&mut out, &d.uuid);
        let numa = d.numa_node.map_or(-1, i64::from);
        let _ = write!(
            out,
            ",\"core\":{core},\"memory\":{memory},\"number\":{},\"numa\":{numa},\"mig\":{},\"busId\":",
            d.split_count, d.mig_enabled
        );
        gojson::write_string(&mut out, &d.bus_id);
        let _ = write!(out, ",\"capability\":{capability},\"healthy\":{}}}", d.health.is_healthy());
    }
    out.push(']');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"[{"id":0,"type":"NVIDIA GeForce GTX 1050 Ti","uuid":"GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28","core":100,"memory":8192,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":6.1,"healthy":true}]"#;

    #[test]
    fn contract_example() {
        let inv = decode(EXAMPLE).unwrap();
        assert_eq!(inv.len(), 1);
        let d = &inv.devices[0];
        assert_eq!(d.index, 0);
        assert_eq!(d.type_name, "NVIDIA GeForce GTX 1050 Ti");
        assert_eq!(d.uuid, "GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28");
        assert_eq!(d.cores, 100);
        assert_eq!(d.memory_mib, 8192);
        assert_eq!(d.split_count, 10);
        assert_eq!(d.numa_node, Some(0));
        assert!(!d.mig_enabled);
        assert_eq!(d.bus_id, "0000:01:00.0");
        assert_eq!(d.capability, ComputeCapability { major: 6, minor: 1 });
        assert_eq!(d.health, DeviceHealth::Healthy);
        assert_eq!(encode(&inv).unwrap(), EXAMPLE);
    }

    #[test]
    fn pinned_forms() {
        assert_eq!(encode(&NodeDeviceInventory::default()).unwrap(), "[]");
        assert!(decode("null").unwrap().is_empty());
        let two = r#"[{"id":0,"type":"A<&>","uuid":"u0","core":200,"memory":0,"number":0,"numa":-1,"mig":true,"busId":"","capability":8,"healthy":false},{"id":1,"type":"B","uuid":"u1","core":100,"memory":81920,"number":4,"numa":1,"mig":false,"busId":"0000:02:00.0","capability":9,"healthy":true}]"#;
        let inv = decode(two).unwrap();
        assert_eq!(inv.devices[0].type_name, "A<&>");
        assert_eq!(inv.devices[0].numa_node, None);
        assert_eq!(encode(&inv).unwrap().replace("\\u003c\\u0026\\u003e", "<&>"), two);
    }

    #[test]
    fn errors_name_annotation_and_field() {
        let bad_id = EXAMPLE.replace("\"id\":0", "\"id\":3");
        assert_eq!(
            decode(&bad_id).unwrap_err().to_string(),
            "invalid node-device-register value: device at position 0: field \"id\" is 3, expected the device's position (ids are 0..n-1 in order)"
        );
        let e = decode(&EXAMPLE.replace("\"numa\":0", "\"numa\":-2")).unwrap_err().to_string();
        assert!(e.contains("field \"numa\" is -2"), "{e}");
        let e = decode(&EXAMPLE.replace("\"core\":100", "\"core\":-1")).unwrap_err().to_string();
        assert!(e.contains("field \"core\" is -1"), "{e}");
        let e = decode(&EXAMPLE.replace("6.1", "6.15")).unwrap_err().to_string();
        assert!(e.contains("capability"), "{e}");
        let e = decode(&EXAMPLE.replace(",\"uuid\":\"GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28\"", ""))
            .unwrap_err();
        assert!(
            e.to_string().starts_with("invalid node-device-register value: expected a JSON array"),
            "{e}"
        );
        assert!(e.to_string().contains("missing field `uuid`"), "{e}");
        assert!(decode("{}").is_err());
        assert!(decode("").is_err());
    }

    pub(crate) fn arb_device() -> impl Strategy<Value = GpuDevice> {
        (
            ".{0,24}",
            ".{0,40}",
            0u64..=i64::MAX as u64,
            0u64..=i64::MAX as u64,
            any::<u32>(),
            proptest::option::of(any::<u32>()),
            any::<bool>(),
            "[0-9a-f:.]{0,16}",
            (0u32..1000, 0u32..10),
            any::<bool>(),
        )
            .prop_map(
                |(type_name, uuid, cores, memory_mib, split_count, numa_node, mig, bus_id, (ma, mi), h)| {
                    GpuDevice {
                        index: 0,
                        uuid,
                        type_name,
                        vendor: Vendor::Nvidia,
                        memory_mib,
                        cores,
                        split_count,
                        numa_node,
                        mig_enabled: mig,
                        bus_id,
                        capability: ComputeCapability { major: ma, minor: mi },
                        health: DeviceHealth::from_bool(h),
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = decode(&s);
        }

        #[test]
        fn never_panics_on_jsonish(s in r#"\[\{("[a-zA-Z]{1,10}":(-?[0-9]{1,20}(\.[0-9]{1,3})?|"[^"]{0,5}"|true|null),?){0,12}\}\]"#) {
            let _ = decode(&s);
        }

        #[test]
        fn round_trip(devs in proptest::collection::vec(arb_device(), 0..17)) {
            let devices = devs.into_iter().enumerate().map(|(i, mut d)| { d.index = i as u32; d }).collect();
            let inv = NodeDeviceInventory { devices };
            let text = encode(&inv).unwrap();
            prop_assert_eq!(decode(&text).unwrap(), inv.clone());
            // Our output is also what serde_json reads back as the same JSON.
            let reparsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            prop_assert!(reparsed.is_array());
        }
    }
}
