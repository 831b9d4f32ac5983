//! `include-gpu-type` and friends: list round trip; matching never panics. See `vgpu_fuzz::decoders::device_filter`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::device_filter(data));
