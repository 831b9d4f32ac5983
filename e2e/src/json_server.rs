//! A minimal HTTP/1.1 JSON server on 127.0.0.1, for fake extenders and webhooks in tests.
//!
//! Every request body is parsed as JSON (an empty body is `null`) and handed with the request
//! path to the handler, whose `(status, json)` answer is sent back as `application/json`.

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// A running [`JsonServer`]; it stops (with its open connections) when dropped.
#[derive(Debug)]
pub struct JsonServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl JsonServer {
    /// Binds a free port on 127.0.0.1 and serves `handler(path, body)` on a tokio task.
    pub async fn start<F, Fut>(handler: F) -> Result<Self>
    where
        F: Fn(String, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = (u16, Value)> + Send + 'static,
    {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("binding the JSON server on 127.0.0.1")?;
        let addr = listener.local_addr()?;
        let handler = Arc::new(handler);
        let task = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts the connections.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let handler = Arc::clone(&handler);
                let service = service_fn(move |req: Request<Incoming>| {
                    let handler = Arc::clone(&handler);
                    async move { Ok::<_, Infallible>(answer(req, handler.as_ref()).await) }
                });
                connections.spawn(async move {
                    if let Err(e) =
                        http1::Builder::new().serve_connection(TokioIo::new(stream), service).await
                    {
                        eprintln!("vgpu-e2e json server: connection error: {e}");
                    }
                });
                // Reap finished connections so the set does not grow without bound.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self { addr, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for JsonServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer<F, Fut>(req: Request<Incoming>, handler: &F) -> Response<Full<Bytes>>
where
    F: Fn(String, Value) -> Fut,
    Fut: Future<Output = (u16, Value)>,
{
    let path = req.uri().path().to_owned();
    let (status, body) = match req.into_body().collect().await {
        Err(e) => (400, serde_json::json!({"Error": format!("reading body: {e}")})),
        Ok(collected) => {
            let bytes = collected.to_bytes();
            let parsed = if bytes.is_empty() { Ok(Value::Null) } else { serde_json::from_slice(&bytes) };
            match parsed {
                Ok(json) => handler(path, json).await,
                Err(e) => (400, serde_json::json!({"Error": format!("invalid JSON: {e}")})),
            }
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn post(addr: SocketAddr, path: &str, body: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn echoes_path_and_body() {
        let server =
            JsonServer::start(
                |path, body| async move { (200, serde_json::json!({"path": path, "got": body})) },
            )
            .await
            .unwrap();
        assert!(server.url().starts_with("http://127.0.0.1:"));
        let reply = post(server.addr(), "/scheduler/filter", r#"{"NodeNames":["a"]}"#).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.contains("application/json"), "{reply}");
        assert!(reply.ends_with(r#"{"got":{"NodeNames":["a"]},"path":"/scheduler/filter"}"#), "{reply}");
        let bad = post(server.addr(), "/x", "{nope").await;
        assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    }
}
