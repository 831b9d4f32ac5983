//! vgpu-kube: the Kubernetes client set-up every vgpu binary shares, with client-go's meaning of the flags
//! vgpu-manager's components take (`--kubeconfig`, `--master`, `--kube-api-qps`, `--kube-api-burst`).
//!
//! | module | what it holds |
//! |---|---|
//! | [`claims`] | [`claims::ClusterApi`]: what admission routes read and write (ResourceClaims, templates, DeviceClasses, pods) over a `kube::Client` ([`claims::KubeApi`]) or in memory ([`claims::MemoryApi`]) |
//! | [`client`] | [`ClientOptions`]: configuration from the flags (kubeconfig, in-cluster, `--master`) and the client behind the token bucket |
//! | [`error`] | [`error::ClusterError`]: an API call's failure classified by what the caller does next (retry or not), mapped from a [`kube::Error`] |
//! | [`rate_limit`] | [`rate_limit::TokenBucket`] (client-go's token bucket) and the `tower` layer that applies it to every request |
//!
//! This crate holds no domain logic and depends on no other vgpu crate; the binaries' flag structs (`vgpu-bins`)
//! turn into a [`ClientOptions`].
//!
//! # Example
//!
//! A client of 2 QPS and burst 3 against a local API server: the first three requests go at once, the
//! fourth waits half a second for its token.
//!
//! ```no_run
//! use vgpu_kube::ClientOptions;
//! use k8s_openapi::api::core::v1::Node;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = ClientOptions::new(2.0, 3).kubeconfig("/etc/kubernetes/admin.conf").client().await?;
//! let nodes = kube::Api::<Node>::all(client);
//! let start = std::time::Instant::now();
//! for _ in 0..4 {
//!     nodes.list(&Default::default()).await?;
//! }
//! assert!(start.elapsed() >= std::time::Duration::from_millis(500));
//! # Ok(()) }
//! ```
//!
//! The bucket on its own, runnable:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use vgpu_kube::rate_limit::TokenBucket;
//!
//! let bucket = TokenBucket::new(50.0, 2)?;
//! let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
//! let start = Instant::now();
//! rt.block_on(async {
//!     for _ in 0..4 {
//!         bucket.acquire().await;
//!     }
//! });
//! // 2 at once, then one every 20 ms: (4 − 2) / 50 s.
//! assert!(start.elapsed() >= Duration::from_millis(40));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod claims;
pub mod client;
pub mod error;
pub mod rate_limit;

pub use client::{ClientError, ClientOptions};
