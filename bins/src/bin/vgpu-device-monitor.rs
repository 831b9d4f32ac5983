//! `vgpu-device-monitor` (placeholder; filled in by a later issue).

fn main() {}
