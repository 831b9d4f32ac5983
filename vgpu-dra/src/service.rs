//! The gRPC services on `dra.sock`: only translation between the generated types and [`DeviceState`].
//!
//! | service | method | what |
//! |---|---|---|
//! | `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` | `NodePrepareResources` | [`DeviceState::prepare`]; one map entry per claim UID (`devices`, or `error` with the claim's failure) |
//! | | `NodeUnprepareResources` | [`DeviceState::unprepare`]; one entry per claim of the request (`error` empty on success) |
//! | `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin` | the same two | the same, without `share_id` |
//! | `v1.DRAResourceHealth` | `NodeWatchResources` | every device of the pool with its status (`HEALTHY`/`UNHEALTHY` from the [`HealthFeed`], `UNKNOWN` when untracked: gate `NVMLDeviceHealthCheck` off or no health stream), last event as `message`, now and after every change, until the client leaves or the server stops |
//! | `v1alpha1.DRAResourceHealth` | `NodeWatchResources` | the same, without timeout and message |
//!
//! A request with an empty claim UID gets an entry under the empty key with an error naming the claim.

use std::{collections::HashMap, pin::Pin, sync::Arc};

use tokio::sync::{mpsc, watch};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::{checkpoint::PreparedDevice, claims::ClaimRef, health::HealthSnapshot, state::DeviceState};
use vgpu_kubelet::api::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1};

/// The devices' health ([`crate::health`]): a receiver of the [`HealthSnapshot`] the health monitor
/// publishes (of [`HealthSnapshot::unmonitored_default`] when gate `NVMLDeviceHealthCheck` is off).
pub type HealthFeed = watch::Receiver<HealthSnapshot>;

/// One device's line of a health response: name, `Some(true)` healthy / `Some(false)` unhealthy / `None`
/// unknown, message, last update (Unix seconds).
type Line<'a> = (&'a str, Option<bool>, &'a str, i64);

fn lines<'a>(devices: &'a [String], snapshot: &'a HealthSnapshot) -> Vec<Line<'a>> {
    devices
        .iter()
        .map(|name| match snapshot.get(name) {
            Some(d) => (
                name.as_str(),
                d.status.healthy(),
                d.message.as_str(),
                d.updated_ns.div_euclid(1_000_000_000),
            ),
            None => (name.as_str(), None, "", 0),
        })
        .collect()
}

/// Longest `message` the v1 health API takes.
pub const MAX_HEALTH_MESSAGE: usize = 1024;

fn claim_refs(claims: impl IntoIterator<Item = (String, String, String)>) -> Vec<ClaimRef> {
    claims.into_iter().map(|(namespace, name, uid)| ClaimRef { namespace, name, uid }).collect()
}

/// `DRAPlugin` v1 and v1beta1 over a [`DeviceState`].
#[derive(Debug, Clone)]
pub struct DraService {
    state: Arc<DeviceState>,
}

impl DraService {
    /// Serves `state`.
    pub fn new(state: Arc<DeviceState>) -> Self {
        Self { state }
    }

    async fn prepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<Vec<PreparedDevice>, String>> {
        let (valid, invalid): (Vec<_>, Vec<_>) = claims.into_iter().partition(|c| !c.uid.is_empty());
        let mut out: HashMap<_, _> = self
            .state
            .prepare(&valid)
            .await
            .into_iter()
            .map(|(uid, r)| (uid, r.map_err(|e| e.to_string())))
            .collect();
        for c in invalid {
            out.insert(String::new(), Err(format!("claim {}/{}: empty UID", c.namespace, c.name)));
        }
        for c in &valid {
            out.entry(c.uid.clone()).or_insert_with(|| {
                Err("not prepared: an earlier claim of the same call stopped the plugin".to_owned())
            });
        }
        out
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, String> {
        let mut out: HashMap<_, _> = self
            .state
            .unprepare(&claims)
            .await
            .into_iter()
            .map(|(uid, r)| (uid, r.err().map(|e| e.to_string()).unwrap_or_default()))
            .collect();
        for c in &claims {
            out.entry(c.uid.clone()).or_default();
        }
        out
    }
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        let claims =
            claim_refs(request.into_inner().claims.into_iter().map(|c| (c.namespace, c.name, c.uid)));
        let claims = self
            .prepare(claims)
            .await
            .into_iter()
            .map(|(uid, result)| {
                let response = match result {
                    Ok(devices) => dra_v1::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| dra_v1::Device {
                                request_names: d.request_names,
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(error) => dra_v1::NodePrepareResourceResponse { devices: Vec::new(), error },
                };
                (uid, response)
            })
            .collect();
        Ok(Response::new(dra_v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        let claims =
            claim_refs(request.into_inner().claims.into_iter().map(|c| (c.namespace, c.name, c.uid)));
        let claims = self
            .unprepare(claims)
            .await
            .into_iter()
            .map(|(uid, error)| (uid, dra_v1::NodeUnprepareResourceResponse { error }))
            .collect();
        Ok(Response::new(dra_v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims =
            claim_refs(request.into_inner().claims.into_iter().map(|c| (c.namespace, c.name, c.uid)));
        let claims = self
            .prepare(claims)
            .await
            .into_iter()
            .map(|(uid, result)| {
                let response = match result {
                    Ok(devices) => dra_v1beta1::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| dra_v1beta1::Device {
                                request_names: d.request_names,
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(error) => dra_v1beta1::NodePrepareResourceResponse { devices: Vec::new(), error },
                };
                (uid, response)
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims =
            claim_refs(request.into_inner().claims.into_iter().map(|c| (c.namespace, c.name, c.uid)));
        let claims = self
            .unprepare(claims)
            .await
            .into_iter()
            .map(|(uid, error)| (uid, dra_v1beta1::NodeUnprepareResourceResponse { error }))
            .collect();
        Ok(Response::new(dra_v1beta1::NodeUnprepareResourcesResponse { claims }))
    }
}

// === impl HealthService ===

/// `DRAResourceHealth` v1 and v1alpha1 over a [`HealthFeed`]: every device of the pool, `UNKNOWN` when the
/// snapshot does not track it.
#[derive(Debug, Clone)]
pub struct HealthService {
    pool: String,
    devices: Arc<[String]>,
    feed: HealthFeed,
    stop: CancellationToken,
}

/// The stream type of both health services.
pub type HealthStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl HealthService {
    /// Reports `feed` for `devices` of `pool` (the node name); streams end when `stop` is cancelled.
    pub fn new(
        pool: impl Into<String>,
        devices: impl IntoIterator<Item = String>,
        feed: HealthFeed,
        stop: CancellationToken,
    ) -> Self {
        Self { pool: pool.into(), devices: devices.into_iter().collect(), feed, stop }
    }

    fn watch<T: Send + 'static>(
        &self,
        convert: impl Fn(&str, Vec<Line<'_>>) -> T + Send + 'static,
    ) -> HealthStream<T> {
        let (tx, rx) = mpsc::channel(4);
        let mut feed = self.feed.clone();
        let stop = self.stop.clone();
        let pool = self.pool.clone();
        let devices = Arc::clone(&self.devices);
        tokio::spawn(async move {
            loop {
                let message = {
                    let snapshot = feed.borrow_and_update();
                    convert(&pool, lines(&devices, &snapshot))
                };
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = feed.changed() => if changed.is_err() { return },
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

fn truncate(message: &str) -> String {
    let mut end = message.len().min(MAX_HEALTH_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_owned()
}

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream<health_v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.watch(|pool, lines| {
            health_v1::NodeWatchResourcesResponse {
                devices: lines
                    .into_iter()
                    .map(|(device, healthy, message, updated)| health_v1::DeviceHealth {
                        device: Some(health_v1::DeviceIdentifier {
                            pool_name: pool.to_owned(),
                            device_name: device.to_owned(),
                        }),
                        health: match healthy {
                            Some(true) => health_v1::HealthStatus::Healthy,
                            Some(false) => health_v1::HealthStatus::Unhealthy,
                            None => health_v1::HealthStatus::Unknown,
                        }
                        .into(),
                        last_updated_time: updated,
                        health_check_timeout_seconds: 0,
                        message: truncate(message),
                    })
                    .collect(),
            }
        })))
    }
}

#[tonic::async_trait]
impl health_v1alpha1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream<health_v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.watch(|pool, lines| {
            health_v1alpha1::NodeWatchResourcesResponse {
                devices: lines
                    .into_iter()
                    .map(|(device, healthy, _, updated)| health_v1alpha1::DeviceHealth {
                        device: Some(health_v1alpha1::DeviceIdentifier {
                            pool_name: pool.to_owned(),
                            device_name: device.to_owned(),
                        }),
                        health: match healthy {
                            Some(true) => health_v1alpha1::HealthStatus::Healthy,
                            Some(false) => health_v1alpha1::HealthStatus::Unhealthy,
                            None => health_v1alpha1::HealthStatus::Unknown,
                        }
                        .into(),
                        last_updated_time: updated,
                    })
                    .collect(),
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_at_a_char_boundary() {
        let long = "é".repeat(600);
        let cut = truncate(&long);
        assert!(cut.len() <= MAX_HEALTH_MESSAGE && cut.chars().all(|c| c == 'é'));
        assert_eq!(truncate("Xid 79"), "Xid 79");
    }
}
