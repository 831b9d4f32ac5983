//! vgpu-kube: the Kubernetes client set-up every vgpu binary shares.
