//! `vgpu-scheduler-extender` (placeholder).
fn main() {}
