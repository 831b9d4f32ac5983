//! `node-gpu-domain` JSON: round trip; stable encoding. See `vgpu_fuzz::decoders::node_gpu_domain`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::node_gpu_domain(data));
