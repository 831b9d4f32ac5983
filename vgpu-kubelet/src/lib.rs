//! vgpu-kubelet: the kubelet's gRPC APIs and the unix sockets they are spoken on, shared by the device
//! plugin (`vgpu-deviceplugin`), the DRA kubelet plugin (`vgpu-dra`), the device monitor and the tests that
//! play the kubelet. No domain logic: generated code, sockets, and one client.
//!
//! | module | what it holds |
//! |---|---|
//! | [`api`] | generated tonic/prost code: device plugin `v1beta1`, pod-resources `v1`, plugin registration, DRA `v1` / `v1beta1`, DRA resource health `v1` / `v1alpha1` |
//! | [`socket`] | [`bind_atomic`](socket::bind_atomic) (a socket published only once it accepts), [`socket_identity`](socket::socket_identity), [`connect_unix`](socket::connect_unix) (a channel to a socket path) |
//! | [`authority`] | every unix-socket gRPC server's connections: a client's invalid `:authority` (the kubelet's plugin watcher sends the socket path) rewritten to `localhost` below tonic; [`authority::call`] sends any `:authority` |
//! | [`podresources`] | the pod-resources client: [`list_pod_resources`](podresources::list_pod_resources) on [`POD_RESOURCES_SOCKET`](podresources::POD_RESOURCES_SOCKET) |
//! | [`error`] | [`SocketError`] |
//!
//! # Example
//!
//! A pod-resources server on a unix socket, bound atomically, each connection through the `:authority`
//! rewrite, and the client listing it:
//!
//! ```
//! use std::time::Duration;
//! use tonic::{Request, Response, Status};
//! use vgpu_kubelet::{
//!     api::podresources::{
//!         self as pr, pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
//!     },
//!     authority, podresources::list_pod_resources, socket::bind_atomic,
//! };
//!
//! struct OnePod;
//!
//! #[tonic::async_trait]
//! impl PodResourcesLister for OnePod {
//!     async fn list(&self, _: Request<pr::ListPodResourcesRequest>) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
//!         let pod = pr::PodResources { name: "p".into(), namespace: "ns".into(), ..Default::default() };
//!         Ok(Response::new(pr::ListPodResourcesResponse { pod_resources: vec![pod] }))
//!     }
//!     async fn get_allocatable_resources(&self, _: Request<pr::AllocatableResourcesRequest>) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
//!         Err(Status::unimplemented("not here"))
//!     }
//!     async fn get(&self, _: Request<pr::GetPodResourcesRequest>) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
//!         Err(Status::unimplemented("not here"))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let socket = dir.path().join("kubelet.sock");
//! let listener = bind_atomic(&socket, None, 0o600)?;
//! tokio::spawn(
//!     tonic::transport::Server::builder()
//!         .add_service(PodResourcesListerServer::new(OnePod))
//!         .serve_with_incoming(authority::incoming(listener)),
//! );
//! let pods = list_pod_resources(&socket, Duration::from_secs(5)).await?;
//! assert_eq!(pods[0].name, "p");
//! # Ok(())
//! # }
//! ```

pub mod api;
pub mod authority;
pub mod error;
pub mod podresources;
pub mod socket;

pub use error::SocketError;
