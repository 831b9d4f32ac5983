//! `ExtenderArgs` body through the router (filter-dryrun, prioritize): no panic, no 5xx, refusal iff invalid. See `vgpu_fuzz::extender::extender_args`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz::extender::extender_args(data));
