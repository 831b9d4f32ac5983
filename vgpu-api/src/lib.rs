//! vgpu-api: GPU module resource types (being built, issue #20).
