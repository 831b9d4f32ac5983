//! `node-config-info` JSON: round trip (floats bit for bit); stable encoding. See `vgpu_fuzz::decoders::node_config_info`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::node_config_info(data));
