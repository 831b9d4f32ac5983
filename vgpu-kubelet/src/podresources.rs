//! The client of the kubelet's pod-resources API `v1`: which devices each container of the node holds.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    api::podresources::{
        ListPodResourcesRequest, PodResources, pod_resources_lister_client::PodResourcesListerClient,
    },
    socket::connect_unix,
};

/// The kubelet pod-resources socket.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The pod-resources API could not be reached or answered with an error.
#[derive(Debug, thiserror::Error)]
#[error("pod-resources List on {}: {message}", socket.display())]
pub struct PodResourcesError {
    /// The socket.
    pub socket: PathBuf,
    /// What went wrong.
    pub message: String,
}

/// Calls `PodResourcesLister.List` on `socket`, with `timeout` for connecting and for the call.
pub async fn list_pod_resources(
    socket: &Path,
    timeout: Duration,
) -> Result<Vec<PodResources>, PodResourcesError> {
    let err = |message: String| PodResourcesError { socket: socket.to_path_buf(), message };
    let channel = connect_unix(socket, timeout).await.map_err(|e| err(e.to_string()))?;
    let mut client = PodResourcesListerClient::new(channel);
    match tokio::time::timeout(timeout, client.list(ListPodResourcesRequest {})).await {
        Ok(Ok(resp)) => Ok(resp.into_inner().pod_resources),
        Ok(Err(status)) => Err(err(format!("{}: {}", status.code(), status.message()))),
        Err(_) => Err(err(format!("timed out after {timeout:?}"))),
    }
}
