//! `excludeDevices` / `--exclude-devices`: parse ⇒ display ⇒ parse round trip. See `vgpu_fuzz::decoders::exclude_devices`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::decoders::exclude_devices(data));
