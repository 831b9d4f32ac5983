//! vgpu-kubelet: The kubelet's gRPC APIs (device plugin, pod-resources, plugin registration, DRA) and their unix sockets (being filled by issue #36).
