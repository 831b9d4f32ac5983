//! `devices.json` (raw bytes): round trip; stable encoding. See `vgpu_fuzz::decoders::devices_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::devices_json(data));
