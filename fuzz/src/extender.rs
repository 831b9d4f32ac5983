//! Fuzz entries for the extender's request bodies: `ExtenderArgs` (filter, filter-dryrun, prioritize),
//! `ExtenderBindingArgs` (bind) and `ExtenderPreemptionArgs` (preempt).
//!
//! The server's body decoder is private to `vgpu_scheduler::server` (a leading-`{` check, then
//! `serde_path_to_error` over `serde_json`, a syntax error by line and column, a data error by field path),
//! so each entry drives it where it runs: the real router ([`vgpu_scheduler::server::router`]) over an
//! in-memory cluster of two vGPU nodes, called in-process (no socket), with the raw bytes as the body of a
//! `POST`. It checks, for arbitrary bytes:
//!
//! - the router never panics and never answers 5xx (a verb that panics on its blocking worker comes back as a
//!   500);
//! - the body is refused as malformed exactly when it is not a JSON object of the wire type
//!   (`serde_json::from_slice` of the same [`vgpu_scheduler::wire`] type);
//! - a refused syntax error names the line and column `serde_json` reports, a data error is not called a
//!   syntax error;
//! - a body that decodes round trips: decode ⇒ `serde_json::to_vec` ⇒ decode gives the same value, and the
//!   encoding is stable.
//!
//! Only side-effect-free routes run (filter-dryrun, prioritize, preempt; bind names no pod the cluster has,
//! so it is refused after decoding), which keeps every call independent of the ones before.
//!
//! This file is compiled both by the `vgpu-fuzz` crate (the cargo-fuzz targets) and, through `#[path]`, by
//! `vgpu-scheduler/tests/fuzz_extender.rs` on stable, so the two cannot drift. It may only use what that test
//! crate has: `vgpu_scheduler`, `vgpu_core`, `serde`, `serde_json`, `bytes`, `http`, `http_body_util`, `hyper`,
//! `hyper_util`, `tokio` and `std`.
#![allow(clippy::panic)]

use std::fmt::Debug;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::service::Service;
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use serde::de::DeserializeOwned;
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_lease::Readiness;
use vgpu_scheduler::fixture::vgpu_node;
use vgpu_scheduler::server::{AppState, router};
use vgpu_scheduler::wire::{ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs};
use vgpu_scheduler::{
    BIND_PATH, Extender, ExtenderConfig, FILTER_DRYRUN_PATH, MemoryCluster, Metrics, PREEMPT_PATH,
    PRIORITIZE_PATH,
};

/// A fuzz entry: arbitrary bytes in, a panic when a property breaks.
pub type Entry = fn(&[u8]);

/// Every entry of this module by fuzz target name (the file `fuzz/fuzz_targets/<name>.rs` and the seeds
/// folder `fuzz/seeds/<name>/`).
pub const TARGETS: &[(&str, Entry)] = &[
    ("extender_args", extender_args),
    ("extender_binding_args", extender_binding_args),
    ("extender_preemption_args", extender_preemption_args),
];

/// The names of the in-memory cluster's nodes (seeds name them).
pub const NODE_NAMES: [&str; 2] = ["n0", "n1"];

/// `ExtenderArgs`: the body of filter-dryrun (answer 200 with `Error`) and prioritize (200, or 400 with the
/// reason).
///
/// The wire type round-trips with k8s-openapi's whole `Pod`; the server decodes the pod as
/// [`ApiPod`](vgpu_scheduler::api_pod::ApiPod) (only the fields it reads), so its refusals are checked against
/// that decoding.
pub fn extender_args(data: &[u8]) {
    let _ = round_trip::<ExtenderArgs>(data);
    let typed = serde_json::from_slice::<ExtenderArgs<vgpu_scheduler::api_pod::ApiPod>>(data);
    let (status, body) = post(FILTER_DRYRUN_PATH, data);
    assert_eq!(status, StatusCode::OK, "filter-dryrun answered {status}: {body}");
    check_refusal("ExtenderArgs", data, &typed, &error_field(&body));
    let (status, body) = post(PRIORITIZE_PATH, data);
    match status {
        StatusCode::OK => check_refusal("ExtenderArgs", data, &typed, ""),
        StatusCode::BAD_REQUEST => check_refusal("ExtenderArgs", data, &typed, &body),
        _ => panic!("prioritize answered {status}: {body}"),
    }
}

/// `ExtenderBindingArgs`: the body of bind (answer 200 with `Error`).
pub fn extender_binding_args(data: &[u8]) {
    let typed = round_trip::<ExtenderBindingArgs>(data);
    let (status, body) = post(BIND_PATH, data);
    assert_eq!(status, StatusCode::OK, "bind answered {status}: {body}");
    let error = error_field(&body);
    check_refusal("ExtenderBindingArgs", data, &typed, &error);
    // No pod exists in the cluster: a bind that decodes is still refused, never bound.
    assert!(!error.is_empty(), "bind of an unknown pod succeeded: {body}");
}

/// `ExtenderPreemptionArgs`: the body of preempt (answer 200, or 400 with the reason).
pub fn extender_preemption_args(data: &[u8]) {
    let typed = round_trip::<ExtenderPreemptionArgs>(data);
    let (status, body) = post(PREEMPT_PATH, data);
    match status {
        StatusCode::OK => check_refusal("ExtenderPreemptionArgs", data, &typed, ""),
        StatusCode::BAD_REQUEST => check_refusal("ExtenderPreemptionArgs", data, &typed, &body),
        _ => panic!("preempt answered {status}: {body}"),
    }
}

/// Decodes `data` as the wire type; on success checks decode ⇒ encode ⇒ decode and a stable encoding.
fn round_trip<T>(data: &[u8]) -> Result<T, serde_json::Error>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let value = serde_json::from_slice::<T>(data)?;
    let encoded = match serde_json::to_vec(&value) {
        Ok(e) => e,
        Err(e) => panic!("a decoded body does not encode: {e}: {value:?}"),
    };
    let again = match serde_json::from_slice::<T>(&encoded) {
        Ok(v) => v,
        Err(e) => panic!("an encoded body does not decode: {e}: {}", String::from_utf8_lossy(&encoded)),
    };
    assert_eq!(again, value, "round trip changed the body: {}", String::from_utf8_lossy(&encoded));
    assert_eq!(serde_json::to_vec(&again).ok(), Some(encoded), "encoding is not stable");
    Ok(value)
}

/// `message` is the server's refusal (`""` when it accepted the body): it calls the body malformed exactly
/// when the body is not a JSON object that decodes as the wire type, and a syntax error by the line and column
/// `serde_json` reports.
fn check_refusal<T>(what: &str, data: &[u8], typed: &Result<T, serde_json::Error>, message: &str) {
    let malformed = message.starts_with(&format!("malformed {what} JSON"));
    let is_object = data.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let body = String::from_utf8_lossy(data);
    match typed {
        Ok(_) if is_object => assert!(!malformed, "a valid body was refused: {message}\nbody: {body}"),
        Ok(_) => {
            assert!(malformed, "a body that is not an object was not refused: {message:?}\nbody: {body}")
        }
        Err(e) => {
            assert!(
                malformed,
                "an invalid body ({e}) was not refused as malformed: {message:?}\nbody: {body}"
            );
            if !is_object {
                return;
            }
            let syntax = matches!(
                e.classify(),
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof
            );
            // By prefix: a data error may quote the body, which may say anything.
            let syntax_prefix = format!("malformed {what} JSON: syntax error at line ");
            let at = format!("{syntax_prefix}{} column {}", e.line(), e.column());
            if syntax {
                assert!(
                    message
                        .strip_prefix(&at)
                        .is_some_and(|rest| rest.starts_with(':') || rest.starts_with(" (")),
                    "{e}: the refusal does not start with {at:?}: {message}\nbody: {body}"
                );
            } else {
                assert!(
                    !message.starts_with(&syntax_prefix),
                    "{e} is not a syntax error: {message}\nbody: {body}"
                );
            }
        }
    }
}

/// The `Error` member of a JSON answer (filter, bind); a missing or non-string member is a broken answer.
fn error_field(body: &str) -> String {
    let value: serde_json::Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => panic!("the answer is not JSON: {e}: {body}"),
    };
    match value.get("Error") {
        Some(serde_json::Value::String(s)) => s.clone(),
        _ => panic!("the answer has no string Error: {body}"),
    }
}

/// The router over a two-node in-memory cluster, and the runtime that drives it; built once per process.
struct Server {
    runtime: tokio::runtime::Runtime,
    service: TowerToHyperService<axum::Router>,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => panic!("no tokio runtime: {e}"),
        };
        let d = ResourceDomain::default();
        let cluster = MemoryCluster::new();
        let inventory = NodeDeviceInventory::uniform(2, 16384, 4).with_type_name("A100");
        for name in NODE_NAMES {
            match vgpu_node(name, &inventory, &NodeVgpuConfig::default(), None, &d) {
                Ok(node) => cluster.upsert_node(node),
                Err(e) => panic!("fixture node {name}: {e}"),
            }
        }
        let metrics = Arc::new(Metrics::new());
        let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
        let extender =
            Arc::new(Extender::new(cluster, clock, ExtenderConfig::default()).with_observer(metrics.clone()));
        extender.attach();
        if let Err(e) = runtime.block_on(extender.sync()) {
            panic!("the in-memory cluster does not sync: {e}");
        }
        let state = AppState::new(extender, Readiness::ready(), metrics);
        Server { runtime, service: TowerToHyperService::new(router(state)) }
    })
}

/// `POST`s `data` to `path` through the router; the status and the answer's body (lossy UTF-8).
fn post(path: &str, data: &[u8]) -> (StatusCode, String) {
    let server = server();
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, data.len())
        .body(Full::new(Bytes::copy_from_slice(data)));
    let request = match request {
        Ok(r) => r,
        Err(e) => panic!("request for {path}: {e}"),
    };
    server.runtime.block_on(async {
        let response = match server.service.call(request).await {
            Ok(r) => r,
            Err(e) => match e {},
        };
        let status = response.status();
        let body = match response.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => panic!("reading the answer of {path}: {e}"),
        };
        (status, String::from_utf8_lossy(&body).into_owned())
    })
}
