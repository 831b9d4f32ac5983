//! `vgpu-kubelet-plugin` (placeholder).
fn main() {}
