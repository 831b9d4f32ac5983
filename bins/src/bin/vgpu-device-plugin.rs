//! `vgpu-device-plugin` (placeholder; filled in by a later issue).

fn main() {}
