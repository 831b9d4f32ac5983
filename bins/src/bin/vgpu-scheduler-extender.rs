//! `vgpu-scheduler-extender` (placeholder; filled in by a later issue).

fn main() {}
