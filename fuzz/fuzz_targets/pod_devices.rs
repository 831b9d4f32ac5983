//! `pre-allocated` / `real-allocated` text: both names decode alike; round trip; stable encoding. See `vgpu_fuzz::decoders::pod_devices`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::pod_devices(data));
