//! vgpu-lease: leader election on a `coordination.k8s.io/v1` Lease and the readiness it feeds, shared by the
//! control-plane binaries (the scheduler extender and the GPU module controller).
//!
//! A replica's [`Readiness`] holds two facts: whether its caches are synced ([`Readiness::set_synced`], set by
//! the component) and its leader role ([`Readiness::set_role`], set by [`leader::run`]). `/readyz` answers
//! [`Readiness::is_ready`], so with election on only the leader is ready.
//!
//! # Module map
//!
//! | module | what it holds |
//! |---|---|
//! | [`leader`] | [`LeaderConfig`], [`LeaderMode`], [`leader::run`]: Lease election (`--leader-elect`) or following another elector's Lease (`--watch-lease`), the role in [`Readiness`] and the pod's role label; [`leader::MemoryLeases`] for tests |
//! | [`readiness`] | [`Readiness`] and [`Role`]: caches synced + leader role, watched by whoever reports readiness |
//!
//! # Example
//!
//! A follower is not ready; it becomes ready once it leads and its caches are synced.
//!
//! ```
//! use vgpu_lease::leader::{LeaderConfig, LeaderMode};
//! use vgpu_lease::{Readiness, Role};
//!
//! let config = LeaderConfig::new(LeaderMode::from_flags(true, false)?, "kube-system", "vgpu-scheduler");
//! config.validate()?;
//! let readiness = Readiness::new(config.initial_role());
//! assert_eq!(readiness.role(), Role::Follower);
//! readiness.set_synced(true);
//! assert!(!readiness.is_ready(), "a follower is not ready");
//! readiness.set_role(Role::Leader);
//! assert!(readiness.is_ready());
//! // In a binary: tokio::spawn(vgpu_lease::leader::run(client, config, readiness.clone(), shutdown));
//! # Ok::<(), vgpu_lease::leader::LeaderConfigError>(())
//! ```

pub mod leader;
pub mod readiness;

pub use leader::{LeaderConfig, LeaderConfigError, LeaderMode, LeaseTimings};
pub use readiness::{Readiness, Role};
