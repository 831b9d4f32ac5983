//! `admission.k8s.io/v1` AdmissionReview in and out: decoding the body, the three answers, and the HTTP answer
//! of an admission route ([`answer`]; bodies are read under [`MAX_BODY_BYTES`]). Shared by every admission
//! server (the vGPU webhook, the GPU module controller).
//!
//! | outcome | HTTP | body |
//! |---|---|---|
//! | body is not an AdmissionReview with a `request` | 400 | the reason as text (`malformed AdmissionReview: …`) |
//! | allowed | 200 | `response{uid, allowed: true}`, plus `patch` (base64 JSON Patch) and `patchType: JSONPatch` when the object changes |
//! | denied | 200 | `response{uid, allowed: false, status{status: Failure, code: 422, reason: Invalid, message}}` |
//!
//! On the wire ([`to_wire_json`]) `patch` is a base64 string, as Go encodes the `[]byte` field of
//! `AdmissionResponse`; kube-core's type serializes it as an array of numbers, which the API server happens to
//! accept but no other AdmissionReview reader expects.
//!
//! The API server prefixes the message with `admission webhook "<name>" denied the request: ` and hands the
//! status (reason `Invalid`, code 422) to the client.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::response::StatusSummary;
use kube::core::{DynamicObject, Resource};
use serde::de::DeserializeOwned;

/// Largest accepted request body (the extender's cap, 413 above; the API server sends objects of at most ~3 MiB).
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;
/// Status reason of a denial (`metav1.StatusReasonInvalid`).
pub const DENY_REASON: &str = "Invalid";
/// Status code of a denial (422, as the API server answers `Invalid`).
pub const DENY_CODE: u16 = 422;

/// A refused object; the message names the container (or object) and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denial {
    /// The message the user sees.
    pub message: String,
}

impl Denial {
    /// A denial with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }
}

/// A body that is not an AdmissionReview request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReviewError {
    /// JSON that does not decode.
    #[error("malformed AdmissionReview: {0}")]
    Json(String),
    /// An AdmissionReview without `request`.
    #[error("malformed AdmissionReview: no request")]
    NoRequest,
}

/// Decodes an AdmissionReview request body with its object typed as `K`.
pub fn decode<K: Resource + DeserializeOwned>(body: &[u8]) -> Result<AdmissionRequest<K>, ReviewError> {
    let review: AdmissionReview<K> =
        serde_json::from_slice(body).map_err(|e| ReviewError::Json(e.to_string()))?;
    review.try_into().map_err(|_| ReviewError::NoRequest)
}

/// The answer to `req`: allowed (with `patch` when non-empty) or denied.
pub fn respond<K: Resource>(
    req: &AdmissionRequest<K>,
    outcome: Result<Option<json_patch::Patch>, Denial>,
) -> AdmissionReview<DynamicObject> {
    let base = AdmissionResponse::from(req);
    let response = match outcome {
        Ok(None) => base,
        Ok(Some(patch)) if patch.0.is_empty() => base,
        Ok(Some(patch)) => match base.clone().with_patch(patch) {
            Ok(r) => r,
            Err(e) => deny(base, &Denial::new(format!("cannot encode the patch: {e}"))),
        },
        Err(denial) => deny(base, &denial),
    };
    response.into_review()
}

/// The review as the HTTP body: JSON, with `response.patch` as base64 text (upstream's wire form of the
/// `[]byte` field) instead of the array of numbers kube-core's `Vec<u8>` serializes to.
pub fn to_wire_json(review: &AdmissionReview<DynamicObject>) -> Result<Vec<u8>, serde_json::Error> {
    use base64::Engine as _;
    let mut value = serde_json::to_value(review)?;
    if let Some(patch) = value.get_mut("response").and_then(|r| r.get_mut("patch")) {
        let bytes: Vec<u8> = serde_json::from_value(patch.take())?;
        *patch = serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    serde_json::to_vec(&value)
}

/// The HTTP answer of an admission route: the review as JSON (200), or 400 with the reason for a body that is
/// not an AdmissionReview request.
pub fn answer(result: Result<AdmissionReview<DynamicObject>, ReviewError>) -> Response {
    match result {
        Ok(review) => match to_wire_json(&review) {
            Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
            Err(e) => {
                (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the AdmissionReview: {e}\n"))
                    .into_response()
            }
        },
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

fn deny(base: AdmissionResponse, denial: &Denial) -> AdmissionResponse {
    let mut r = base.deny(&denial.message);
    r.result.status = Some(StatusSummary::Failure);
    r.result.reason = DENY_REASON.to_owned();
    r.result.code = DENY_CODE;
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    const BODY: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE","userInfo":{},"namespace":"ml","name":"web","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"main"}]}}}}"#;

    #[test]
    fn decode_and_answers() {
        let req = decode::<Pod>(BODY.as_bytes()).unwrap();
        assert_eq!(req.uid, "u-1");
        let allowed = serde_json::to_value(respond(&req, Ok(None))).unwrap();
        assert_eq!(allowed["response"]["allowed"], true);
        assert_eq!(allowed["response"]["uid"], "u-1");
        assert_eq!(allowed["apiVersion"], "admission.k8s.io/v1");
        assert!(allowed["response"].get("patch").is_none());
        let denied =
            serde_json::to_value(respond(&req, Err(Denial::new("container \"main\": bad")))).unwrap();
        assert_eq!(
            denied["response"]["status"],
            serde_json::json!({"status": "Failure", "code": 422, "reason": "Invalid", "message": "container \"main\": bad"})
        );
        assert_eq!(denied["response"]["allowed"], false);
    }

    #[test]
    fn the_wire_patch_is_base64_as_in_go() {
        use base64::Engine as _;
        let req = decode::<Pod>(BODY.as_bytes()).unwrap();
        let patch: json_patch::Patch =
            serde_json::from_str(r#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#).unwrap();
        let wire: serde_json::Value =
            serde_json::from_slice(&to_wire_json(&respond(&req, Ok(Some(patch)))).unwrap()).unwrap();
        let text = wire["response"]["patch"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&decoded).unwrap(),
            serde_json::json!([{"op":"add","path":"/metadata/labels","value":{"a":"b"}}])
        );
        assert_eq!(wire["response"]["patchType"], "JSONPatch");
        let plain: serde_json::Value =
            serde_json::from_slice(&to_wire_json(&respond(&req, Ok(None))).unwrap()).unwrap();
        assert!(plain["response"].get("patch").is_none());
    }

    #[test]
    fn malformed_bodies_name_the_problem() {
        assert!(decode::<Pod>(b"{").unwrap_err().to_string().starts_with("malformed AdmissionReview: EOF"));
        assert_eq!(
            decode::<Pod>(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).unwrap_err(),
            ReviewError::NoRequest
        );
    }
}
