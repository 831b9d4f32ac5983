//! `node-device-register` JSON: decode ⇒ encode ⇒ decode gives the same inventory; stable encoding. See `vgpu_fuzz::decoders::node_device_register`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::node_device_register(data));
