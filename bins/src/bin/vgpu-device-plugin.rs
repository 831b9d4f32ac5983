//! `vgpu-device-plugin` (placeholder).
fn main() {}
