//! vgpu-lease: Lease leader election and readiness shared by the vgpu control-plane binaries (being filled by issue #36).
