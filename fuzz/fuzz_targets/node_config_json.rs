//! Node config file (JSON with comments): parse, resolve every spec; nothing panics. See `vgpu_fuzz::decoders::node_config_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::node_config_json(data));
