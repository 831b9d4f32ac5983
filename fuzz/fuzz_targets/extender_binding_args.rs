//! `ExtenderBindingArgs` body through the router (bind): no panic, no 5xx, refusal iff invalid. See `vgpu_fuzz::extender::extender_binding_args`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::extender::extender_binding_args(data));
