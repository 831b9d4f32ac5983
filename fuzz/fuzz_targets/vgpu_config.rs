//! `vgpu.config` file image (raw bytes): round trip; stable encoding. See `vgpu_fuzz::decoders::vgpu_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::vgpu_config(data));
