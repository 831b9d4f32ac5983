//! `node-device-topology` JSON: round trip; stable encoding. See `vgpu_fuzz::decoders::node_device_topology`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::node_device_topology(data));
