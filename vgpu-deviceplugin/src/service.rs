//! The generated tonic `DevicePlugin` trait implemented over a [`PluginHandler`]: only translation and the
//! `ListAndWatch` stream live here.

use std::{pin::Pin, sync::Arc};

use tokio::sync::{mpsc, watch};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use vgpu_core::model::GpuDevice;

use crate::plugin::PluginHandler;
use vgpu_kubelet::api::v1beta1::{
    AllocateRequest, AllocateResponse, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, device_plugin_server::DevicePlugin,
};

/// Serves one [`PluginHandler`] as a kubelet `DevicePlugin`.
pub struct DevicePluginService<H: ?Sized> {
    handler: Arc<H>,
    gpus: watch::Receiver<Vec<GpuDevice>>,
    stop: CancellationToken,
}

impl<H: PluginHandler + ?Sized> DevicePluginService<H> {
    /// `gpus` is the shared device state ([`crate::inventory::DeviceState::subscribe`]); `ListAndWatch`
    /// streams end when `stop` is cancelled, so that the server can shut down gracefully.
    pub fn new(handler: Arc<H>, gpus: watch::Receiver<Vec<GpuDevice>>, stop: CancellationToken) -> Self {
        Self { handler, gpus, stop }
    }

    /// Logs (debug) how long the handler took to answer `rpc`: the plugin's share of a pod's start-up.
    fn answered(&self, rpc: &'static str, started: std::time::Instant) {
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        tracing::debug!(plugin = self.handler.name(), rpc, elapsed_ms, "RPC answered");
    }
}

/// The `ListAndWatch` response stream.
pub type ListAndWatchStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<H: PluginHandler + ?Sized> DevicePlugin for DevicePluginService<H> {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(self.handler.options()))
    }

    type ListAndWatchStream = ListAndWatchStream;

    /// Sends the full list at once and again after every health change, until the client goes away or the
    /// plugin stops.
    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut gpus = self.gpus.clone();
        let stop = self.stop.clone();
        let handler = Arc::clone(&self.handler);
        tokio::spawn(async move {
            loop {
                let devices = handler.devices(&gpus.borrow_and_update());
                if tx.send(Ok(ListAndWatchResponse { devices })).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = gpus.changed() => if changed.is_err() { return },
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.handler.preferred_allocation(request.into_inner()).await;
        self.answered("GetPreferredAllocation", started);
        Ok(Response::new(result?))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.handler.allocate(request.into_inner()).await;
        self.answered("Allocate", started);
        if let Err(err) = &result {
            tracing::error!(plugin = self.handler.name(), %err, "Allocate failed");
        }
        Ok(Response::new(result?))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.handler.pre_start_container(request.into_inner()).await;
        self.answered("PreStartContainer", started);
        Ok(Response::new(result?))
    }
}
