//! `node-device-topology`: decode; on success, encode, decode again and require the same topology and a
//! stable text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_core::topology::DeviceTopology;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(topology) = DeviceTopology::decode(text) else { return };
    let canonical = topology.encode();
    let again = DeviceTopology::decode(&canonical).expect("an encoded topology decodes");
    assert_eq!(again, topology, "round trip changed the topology: {canonical}");
    assert_eq!(again.encode(), canonical, "encoding is not stable");
});
