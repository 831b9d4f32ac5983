//! NRI (Node Resource Interface) plugin runtime: the NRI protos over ttrpc on the runtime's unix socket.
//!
//! Skeleton; the plugin runtime is being built (issue #18, item 7).
//!
//! ```
//! assert_eq!(vgpu_nri::DEFAULT_SOCKET, "/var/run/nri/nri.sock");
//! ```

/// Where containerd and CRI-O listen for external NRI plugins by default.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
