//! A stand-in for the API server at the HTTP layer, shared by the kube-client tests of every crate (included
//! with `#[path]`): a `tower_test` mock pair behind a `kube::Client`, the next request as [`Seen`] (method,
//! URI with query, content type, raw and JSON body), and [`reply`] with a status and a JSON body.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use http::{Request, Response};
use kube::client::Body;
use serde_json::Value;
use tower_test::mock::{Handle, SendResponse};

/// The test's end of the mock pair.
pub type ApiHandle = Handle<Request<Body>, Response<Body>>;

/// A client whose requests arrive at the returned handle.
pub fn mock_client() -> (kube::Client, ApiHandle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), handle)
}

/// One request as the API server received it.
pub struct Seen {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// The `content-type` header.
    pub content_type: Option<String>,
    /// The body's bytes.
    pub raw: Vec<u8>,
    /// The body as JSON (`Null` when empty).
    pub body: Value,
}

/// Waits for the next request.
pub async fn next(handle: &mut ApiHandle) -> (Seen, SendResponse<Response<Body>>) {
    let (request, send) = handle.next_request().await.expect("a request");
    let method = request.method().to_string();
    let uri = request.uri().to_string();
    let content_type = request.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let raw = request.into_body().collect_bytes().await.unwrap().to_vec();
    let body = if raw.is_empty() { Value::Null } else { serde_json::from_slice(&raw).unwrap() };
    (Seen { method, uri, content_type, raw, body }, send)
}

/// Answers with `status` and `body`.
pub fn reply(send: SendResponse<Response<Body>>, status: u16, body: &Value) {
    send.send_response(
        Response::builder().status(status).body(Body::from(serde_json::to_vec(body).unwrap())).unwrap(),
    );
}
