//! ttrpc glue for the two NRI services: typed unary calls and method tables, written by hand from
//! `proto/api.proto` (the generated stubs' server half needs the `async-trait` crate, which the workspace
//! does not depend on; `tests/codegen.rs` checks every method of the proto is named here).
//!
//! | service | method | request → response | served by |
//! |---|---|---|---|
//! | `nri.pkg.api.v1alpha1.Runtime` | `"RegisterPlugin"` | `RegisterPluginRequest` → `Empty` | runtime |
//! | | `"UpdateContainers"` | `UpdateContainersRequest` → `UpdateContainersResponse` | runtime |
//! | `nri.pkg.api.v1alpha1.Plugin` | `"Configure"` | `ConfigureRequest` → `ConfigureResponse` | plugin |
//! | | `"Synchronize"` | `SynchronizeRequest` → `SynchronizeResponse` | plugin |
//! | | `"Shutdown"` | `Empty` → `Empty` | plugin |
//! | | `"CreateContainer"` | `CreateContainerRequest` → `CreateContainerResponse` | plugin |
//! | | `"UpdateContainer"` | `UpdateContainerRequest` → `UpdateContainerResponse` | plugin |
//! | | `"StopContainer"` | `StopContainerRequest` → `StopContainerResponse` | plugin |
//! | | `"RemoveContainer"` | `RemoveContainerRequest` → `RemoveContainerResponse` | plugin |
//! | | `"StateChange"` | `StateChangeEvent` → `Empty` | plugin |
//!
//! A ttrpc request names its service and method as strings; the payload is the request message in
//! protobuf encoding; the response carries a status (code and message, gRPC codes) and the payload.

use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc, time::Duration};

use protobuf::Message;
use ttrpc::r#async::{Client, MethodHandler, Service, TtrpcContext};

/// The runtime's service (the plugin calls it).
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The plugin's service (the runtime calls it).
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";

/// `Runtime.RegisterPlugin`.
pub const REGISTER_PLUGIN: &str = "RegisterPlugin";
/// `Runtime.UpdateContainers`.
pub const UPDATE_CONTAINERS: &str = "UpdateContainers";
/// `Plugin.Configure`.
pub const CONFIGURE: &str = "Configure";
/// `Plugin.Synchronize`.
pub const SYNCHRONIZE: &str = "Synchronize";
/// `Plugin.Shutdown`.
pub const SHUTDOWN: &str = "Shutdown";
/// `Plugin.CreateContainer`.
pub const CREATE_CONTAINER: &str = "CreateContainer";
/// `Plugin.UpdateContainer`.
pub const UPDATE_CONTAINER: &str = "UpdateContainer";
/// `Plugin.StopContainer`.
pub const STOP_CONTAINER: &str = "StopContainer";
/// `Plugin.RemoveContainer`.
pub const REMOVE_CONTAINER: &str = "RemoveContainer";
/// `Plugin.StateChange`.
pub const STATE_CHANGE: &str = "StateChange";

/// A boxed response future.
pub type ResponseFuture = Pin<Box<dyn Future<Output = ttrpc::Result<ttrpc::Response>> + Send>>;

/// One unary method: decodes the request, runs the handler, encodes the response or the error status.
struct Unary(Box<dyn Fn(Vec<u8>) -> ResponseFuture + Send + Sync>);

// `MethodHandler` is declared with `async_trait`; this is the signature it expands to.
impl MethodHandler for Unary {
    fn handler<'life0, 'async_trait>(
        &'life0 self,
        _ctx: TtrpcContext,
        req: ttrpc::Request,
    ) -> Pin<Box<dyn Future<Output = ttrpc::Result<ttrpc::Response>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        (self.0)(req.payload)
    }
}

/// A unary method from an async function of the decoded request; an `Err` status goes back as the
/// response status (a request that does not decode is `INVALID_ARGUMENT`).
pub fn unary<Req, Resp, F, Fut>(f: F) -> Box<dyn MethodHandler + Send + Sync>
where
    Req: Message,
    Resp: Message,
    F: Fn(Req) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, ttrpc::Status>> + Send + 'static,
{
    let f = Arc::new(f);
    Box::new(Unary(Box::new(move |payload: Vec<u8>| {
        let f = Arc::clone(&f);
        Box::pin(async move {
            let outcome = match Req::parse_from_bytes(&payload) {
                Ok(req) => f(req).await,
                Err(e) => {
                    Err(status(ttrpc::Code::INVALID_ARGUMENT, format!("cannot decode {}: {e}", Req::NAME)))
                }
            };
            let mut res = ttrpc::Response::new();
            match outcome.and_then(|resp| {
                resp.write_to_bytes()
                    .map_err(|e| status(ttrpc::Code::INTERNAL, format!("cannot encode the response: {e}")))
            }) {
                Ok(payload) => {
                    res.set_status(status(ttrpc::Code::OK, ""));
                    res.payload = payload;
                }
                Err(s) => res.set_status(s),
            }
            Ok(res)
        })
    })))
}

/// A ttrpc status.
pub fn status(code: ttrpc::Code, message: impl Into<String>) -> ttrpc::Status {
    ttrpc::get_status(code, message.into())
}

/// The service map a ttrpc server registers: `service` with `methods`.
pub fn service_map(
    service: &str,
    methods: Vec<(&str, Box<dyn MethodHandler + Send + Sync>)>,
) -> HashMap<String, Service> {
    let methods = methods.into_iter().map(|(m, h)| (m.to_owned(), h)).collect();
    HashMap::from([(service.to_owned(), Service { methods, streams: HashMap::new() })])
}

/// Calls `service`/`method` with `req`, waiting at most `timeout` (zero: no limit).
pub async fn call<Req: Message, Resp: Message>(
    client: &Client,
    service: &str,
    method: &str,
    req: &Req,
    timeout: Duration,
) -> ttrpc::Result<Resp> {
    let mut creq = ttrpc::Request::new();
    creq.set_service(service.to_owned());
    creq.set_method(method.to_owned());
    creq.set_timeout_nano(i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX));
    creq.payload = req
        .write_to_bytes()
        .map_err(|e| ttrpc::Error::Others(format!("cannot encode {service}/{method}: {e}")))?;
    let res = client.request(creq).await?;
    Resp::parse_from_bytes(&res.payload)
        .map_err(|e| ttrpc::Error::Others(format!("cannot decode the {service}/{method} response: {e}")))
}
