//! Per-container vGPU requests (from `resources.limits`).

/// Most vGPUs one container may request (`vgpu.MaxDeviceCount`).
pub const MAX_VGPU_NUMBER: u32 = 16;

/// A container request the scheduler refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `vgpu-number` above [`MAX_VGPU_NUMBER`].
    #[error("container {container} requests vGPU number exceeding limit ({number} > {MAX_VGPU_NUMBER})")]
    NumberExceedsLimit {
        /// Container name.
        container: String,
        /// Requested number.
        number: u32,
    },
    /// `vgpu-cores` above 100.
    #[error("container {container} requests vGPU core exceeding limit ({cores} > 100)")]
    CoresExceedLimit {
        /// Container name.
        container: String,
        /// Requested cores.
        cores: u32,
    },
}

/// The three vGPU quantities of one container, as written by the user (raw, not yet resolved per node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VgpuRequest {
    /// `vgpu-number`: vGPUs, each on a distinct physical GPU.
    pub number: u32,
    /// `vgpu-cores`: percent of one GPU per vGPU, 0..=100.
    pub cores: u32,
    /// `vgpu-memory`: per vGPU, in units of the node memory factor; 0 = whole card.
    pub memory: u64,
}

impl VgpuRequest {
    /// The request asks for at least one vGPU.
    pub fn is_vgpu(&self) -> bool {
        self.number > 0
    }

    /// Applies the admission defaults: cores or memory without a number → 1 vGPU; a number with neither
    /// cores nor memory → whole card (cores 100).
    pub fn with_defaults(mut self) -> Self {
        if self.number == 0 && (self.cores > 0 || self.memory > 0) {
            self.number = 1;
        }
        if self.number > 0 && self.cores == 0 && self.memory == 0 {
            self.cores = 100;
        }
        self
    }

    /// Memory in MiB on a node with this memory factor (saturating).
    pub fn memory_mib(&self, memory_factor: u32) -> u64 {
        self.memory.saturating_mul(u64::from(memory_factor))
    }
}

/// Whether a container is an init container or an app container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ContainerKind {
    /// `spec.initContainers` (a restartable one is a sidecar).
    Init,
    /// `spec.containers`.
    #[default]
    App,
}

/// One container's vGPU request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ContainerVgpuRequest {
    /// Container name.
    pub name: String,
    /// Init or app container.
    pub kind: ContainerKind,
    /// Init container with `restartPolicy: Always` (sidecar).
    pub restartable: bool,
    /// The quantities.
    pub request: VgpuRequest,
}

impl ContainerVgpuRequest {
    /// Checks the scheduler's hard limits (number ≤ 16, cores ≤ 100).
    pub fn validate(&self) -> Result<(), RequestError> {
        if self.request.number > MAX_VGPU_NUMBER {
            return Err(RequestError::NumberExceedsLimit {
                container: self.name.clone(),
                number: self.request.number,
            });
        }
        if self.request.cores > 100 {
            return Err(RequestError::CoresExceedLimit {
                container: self.name.clone(),
                cores: self.request.cores,
            });
        }
        Ok(())
    }

    /// A non-restartable init container (runs to completion before the app containers).
    pub fn is_sequential_init(&self) -> bool {
        self.kind == ContainerKind::Init && !self.restartable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_limits() {
        let r = VgpuRequest { number: 0, cores: 0, memory: 1024 }.with_defaults();
        assert_eq!(r, VgpuRequest { number: 1, cores: 0, memory: 1024 });
        let r = VgpuRequest { number: 2, cores: 0, memory: 0 }.with_defaults();
        assert_eq!(r.cores, 100);
        assert_eq!(VgpuRequest::default().with_defaults(), VgpuRequest::default());
        let c = ContainerVgpuRequest {
            name: "main".into(),
            request: VgpuRequest { number: 17, ..Default::default() },
            ..Default::default()
        };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "container main requests vGPU number exceeding limit (17 > 16)"
        );
        let c = ContainerVgpuRequest {
            name: "main".into(),
            request: VgpuRequest { number: 1, cores: 101, memory: 0 },
            ..Default::default()
        };
        assert!(matches!(c.validate(), Err(RequestError::CoresExceedLimit { cores: 101, .. })));
    }
}
