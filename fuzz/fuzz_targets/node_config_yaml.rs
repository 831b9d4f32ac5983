//! Node config file (YAML): parse, resolve every spec; nothing panics. See `vgpu_fuzz::decoders::node_config_yaml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::node_config_yaml(data));
