//! vgpu-node: Node runtime shared by the device plugin and the DRA driver: client-mode registry, SM utilization watcher (being filled by issue #36).
