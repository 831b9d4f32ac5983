//! `vgpu-device-monitor` (placeholder).
fn main() {}
