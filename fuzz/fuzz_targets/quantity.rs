//! Resource quantities: a parsed value agrees with its decimal form. See `vgpu_fuzz::decoders::quantity`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::quantity(data));
