//! The error of a Kubernetes API call, classified by what a caller does next ([`ClusterError`]), and its
//! mapping from a [`kube::Error`] ([`cluster_error`]).
//!
//! | API answer | variant | retriable |
//! |---|---|---|
//! | 404 | [`ClusterError::NotFound`] | no |
//! | 409 | [`ClusterError::Conflict`] | yes |
//! | 408, 429, 5xx; a transport error | [`ClusterError::Unavailable`] | yes |
//! | anything else | [`ClusterError::Other`] | no |
//!
//! [`CallError`] is the unclassified form (what was attempted and the message), for callers that only report
//! or count failures and retry everything on their next pass (the node agent, the GPU module controller).

/// A failed API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The object does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// Optimistic-concurrency conflict (HTTP 409); retriable.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Timeout, throttling (429) or connection reset; retriable.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl ClusterError {
    /// Worth retrying (conflict, timeout, 429, connection reset).
    pub fn is_retriable(&self) -> bool {
        matches!(self, ClusterError::Conflict(_) | ClusterError::Unavailable(_))
    }
}

/// Maps a kube error to a [`ClusterError`] naming the operation (`patch`, `get`, …) and the object
/// (`pod ns/name`, …); see the module docs for the status mapping.
pub fn cluster_error(operation: &str, object: &str, err: &kube::Error) -> ClusterError {
    match err {
        kube::Error::Api(status) => {
            let text = format!("{operation} {object}: {} ({})", status.message, status.code);
            match status.code {
                404 => ClusterError::NotFound(format!("{object} [{operation}]")),
                409 => ClusterError::Conflict(text),
                408 | 429 | 500..=599 => ClusterError::Unavailable(text),
                _ => ClusterError::Other(text),
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            ClusterError::Unavailable(format!("{operation} {object}: {err}"))
        }
        _ => ClusterError::Other(format!("{operation} {object}: {err}")),
    }
}

/// A failed API call, unclassified: what was attempted and the client's or server's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The API server answered with an error or could not be reached.
    #[error("{operation}: {message}")]
    Api {
        /// What was attempted (`apply DeviceClass a100-shared.gpu.deckhouse.io`).
        operation: String,
        /// The client's or server's message.
        message: String,
    },
}

impl CallError {
    /// The failure of `operation` with `err`'s message.
    pub fn from_kube(operation: String, err: &kube::Error) -> Self {
        Self::Api { operation, message: err.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_error_names_the_operation() {
        let e = CallError::from_kube("get Node n1".into(), &kube::Error::LinesCodecMaxLineLengthExceeded);
        assert!(e.to_string().starts_with("get Node n1: "), "{e}");
        let status = kube::core::Status::failure("nope", "Conflict").with_code(409);
        let c = cluster_error("patch", "pod ns/p", &kube::Error::Api(Box::new(status)));
        assert!(matches!(c, ClusterError::Conflict(_)) && c.is_retriable());
    }
}
