//! Node annotations as an operator's hand edit or an older vgpu-manager writer leaves them: what Go's
//! `encoding/json` (and upstream's sort by id) accepts with an unambiguous meaning decodes through the
//! public API to what the canonical text decodes to; what Go accepts but mishandles is refused with an
//! error naming the annotation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vgpu_core::{
    alloc::{NodeLinks, ReasonCode, decode_node},
    codec::{node_config_info, node_devices, node_gpu_domain},
    topology::DeviceTopology,
};

const REGISTER: &str = r#"[{"id":0,"type":"NVIDIA A100","uuid":"GPU-a","core":100,"memory":40960,"number":10,"numa":0,"mig":false,"busId":"0000:17:00.0","capability":8,"healthy":true},{"id":1,"type":"NVIDIA A100","uuid":"GPU-b","core":100,"memory":40960,"number":10,"numa":1,"mig":false,"busId":"0000:65:00.0","capability":8,"healthy":true}]"#;
const CONFIG: &str = r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#;
const TOPOLOGY: &str = r#"[{"index":0,"links":{"1":[1,12]}},{"index":1,"links":{"0":[1,12]}}]"#;

/// The same node, written by hand: devices swapped, keys re-cased and re-ordered, a field repeated, unknown
/// fields, pretty-printed.
const REGISTER_HAND: &str = r#"
[
  { "ID": 1, "UUID": "GPU-b", "Type": "NVIDIA A100", "Core": 100, "Memory": 1, "memory": 40960,
    "Number": 10, "NUMA": 1, "Mig": false, "BusID": "0000:65:00.0", "Capability": 8.0, "Healthy": true,
    "comment": "moved to slot 2" },
  { "id": 0, "type": "NVIDIA A100", "uuid": "GPU-a", "core": 100, "memory": 40960, "number": 10,
    "numa": 0, "mig": false, "busid": "0000:17:00.0", "capability": 8, "healthy": true, "healthy": null }
]"#;
const CONFIG_HAND: &str =
    r#"{ "memoryscaling": 1.0, "DeviceSplit": 10, "coresScaling": 1, "MemoryFactor": 1 }"#;
const TOPOLOGY_HAND: &str =
    r#"[{"Links":{"+1":[1]},"INDEX":0,"links":{"01":[1,12]}},{"Index":1,"Links":{"0":[12,1]},"x":null}]"#;

#[test]
fn hand_edited_node_decodes_like_the_canonical_one() {
    assert_eq!(
        decode_node(Some(REGISTER_HAND), Some(CONFIG_HAND)),
        decode_node(Some(REGISTER), Some(CONFIG))
    );
    let (inventory, _) = decode_node(Some(REGISTER_HAND), Some(CONFIG_HAND)).unwrap();
    // Encoding the hand-edited value gives back the canonical text, byte for byte.
    assert_eq!(node_devices::encode(&inventory).unwrap(), REGISTER);
    assert_eq!(node_config_info::encode(&node_config_info::decode(CONFIG_HAND).unwrap()).unwrap(), CONFIG);
    // The topology decodes (link lists keep their order) and validates to the same pair scores.
    let hand = DeviceTopology::decode(TOPOLOGY_HAND).unwrap();
    assert_eq!(hand.gpus[0].links, DeviceTopology::decode(TOPOLOGY).unwrap().gpus[0].links);
    assert_eq!(NodeLinks::decode(TOPOLOGY_HAND).unwrap(), NodeLinks::decode(TOPOLOGY).unwrap());
}

#[test]
fn older_writer_without_some_fields_reads_as_go_zero_values() {
    // A writer that knew only id, type, uuid, core, memory and number: numa 0, not MIG, no bus id,
    // capability 0, unhealthy — what upstream's scheduler reads.
    let old = r#"[{"id":0,"type":"Tesla T4","uuid":"GPU-t","core":100,"memory":15360,"number":4}]"#;
    let inventory = node_devices::decode(old).unwrap();
    let d = &inventory.devices[0];
    assert_eq!((d.numa_node, d.mig_enabled, d.bus_id.as_str()), (Some(0), false, ""));
    assert!(!d.health.is_healthy());
    // A config missing its factor: decodes, and the node stage refuses it as upstream's filter does.
    let (_, config) = decode_node(Some(old), Some(r#"{"deviceSplit":4,"coresScaling":1}"#)).unwrap();
    assert_eq!(config.memory_factor, 0);
    assert_eq!(node_gpu_domain::decode("null").unwrap().len(), 0);
}

#[test]
fn go_accepted_defects_are_refused_with_the_annotation_named() {
    // Ids with a gap: Go's scheduler would index past its slice.
    let gap = REGISTER.replace("\"id\":1", "\"id\":2");
    let failure = decode_node(Some(&gap), Some(CONFIG)).unwrap_err();
    assert_eq!(failure.code, ReasonCode::NodeBadVgpuRegister);
    let e = node_devices::decode(&gap).unwrap_err().to_string();
    assert!(
        e.starts_with("invalid node-device-register value: device at position 1: field \"id\" is 2"),
        "{e}"
    );
    // Negative counts.
    let e = node_config_info::decode(r#"{"deviceSplit":-10}"#).unwrap_err().to_string();
    assert!(e.starts_with("invalid node-config-info value"), "{e}");
    // A negative peer and an unknown link code.
    let e = DeviceTopology::decode(r#"[{"index":0,"links":{"-1":[1]}}]"#).unwrap_err().to_string();
    assert!(e.contains("invalid node-device-topology value") && e.contains("found key \"-1\""), "{e}");
    let e = DeviceTopology::decode(r#"[{"index":0,"links":{"1":[30]}}]"#).unwrap_err().to_string();
    assert!(e.contains("expected a P2P link type code (integer 0..=24), found number 30"), "{e}");
}
