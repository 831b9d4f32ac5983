//! A unix-socket gRPC call written frame by frame, so the `:authority` is whatever the caller says — the
//! socket path, as the kubelet's plugin watcher sends it. Neither tonic nor `h2`'s client can send such a
//! value (an `http::Uri` cannot hold it), so this is how tests, and anyone checking a server by hand, play
//! that client against our servers. [`exchange`] also replays a recorded client byte stream.

use std::{collections::BTreeMap, path::Path, time::Duration};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

use super::{CONTINUATION, END_HEADERS, END_STREAM, FRAME_HEADER, HEADERS, PREFACE, frame_header};

const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;

/// What went wrong with a [`call`] or [`exchange`].
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Connecting, writing or reading the socket failed.
    #[error("{action} {socket}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The socket.
        socket: String,
        /// The error.
        source: std::io::Error,
    },
    /// The server did not end every stream within the timeout.
    #[error("{socket}: no complete answer within {timeout:?}")]
    Timeout {
        /// The socket.
        socket: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// The server's bytes were not valid HTTP/2 as far as this client reads them.
    #[error("{socket}: invalid answer: {detail}")]
    Answer {
        /// The socket.
        socket: String,
        /// What was wrong.
        detail: String,
    },
}

/// The server's answer on one stream.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StreamAnswer {
    /// Every header field of every header block (response headers, then trailers), decoded.
    pub headers: Vec<(String, String)>,
    /// The DATA payloads, concatenated (for gRPC: length-prefixed messages).
    pub data: Vec<u8>,
    /// The error code of a `RST_STREAM` that ended the stream.
    pub reset: Option<u32>,
}

impl StreamAnswer {
    /// The value of the last header field named `name` (a gRPC status lives in the trailers, after the
    /// response headers).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The gRPC status code (`grpc-status`), when the stream ended with one.
    pub fn grpc_status(&self) -> Option<i32> {
        self.header("grpc-status").and_then(|s| s.parse().ok())
    }

    /// The first gRPC message of the response (after its 5-byte length prefix).
    pub fn message(&self) -> Option<&[u8]> {
        let (head, rest) = self.data.split_first_chunk::<5>()?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        rest.get(..len)
    }
}

/// The client bytes of one unary gRPC call on stream 1: the preface, an empty SETTINGS, the request headers
/// (`:authority` = `authority`, encoded with HPACK incremental indexing as grpc-go does) and `message` as
/// one length-prefixed DATA frame that ends the stream.
pub fn unary_request(authority: &str, method_path: &str, message: &[u8]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    frame_header(0, SETTINGS, 0, 0, &mut out);
    let headers: [(&[u8], &[u8]); 6] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", method_path.as_bytes()),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ];
    let block = Encoder::new().encode(headers);
    // A request's headers are far below one frame.
    frame_header(block.len(), HEADERS, END_HEADERS, 1, &mut out);
    out.extend_from_slice(&block);
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    frame_header(5 + message.len(), DATA, END_STREAM, 1, &mut out);
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Calls `method_path` (`/package.Service/Method`) on the unix socket with `authority` as the request's
/// `:authority` and `message` (an encoded protobuf) as its one message.
pub async fn call(
    socket: &Path,
    authority: &str,
    method_path: &str,
    message: &[u8],
    timeout: Duration,
) -> Result<StreamAnswer, CallError> {
    let mut answers = exchange(socket, &unary_request(authority, method_path, message), 1, timeout).await?;
    Ok(answers.remove(&1).unwrap_or_default())
}

/// Connects to `socket`, writes `client_bytes` (a client's whole stream from its preface on, e.g. a
/// recording), acknowledges the server's SETTINGS, and reads until `streams` client streams have ended
/// (END_STREAM from the server, or RST_STREAM), the server sent GOAWAY, or it closed. The answers by stream.
pub async fn exchange(
    socket: &Path,
    client_bytes: &[u8],
    streams: usize,
    timeout: Duration,
) -> Result<BTreeMap<u32, StreamAnswer>, CallError> {
    let name = socket.display().to_string();
    let io = |action: &'static str, name: &str| {
        let socket = name.to_string();
        move |source| CallError::Io { action, socket, source }
    };
    let work = async {
        let mut conn = UnixStream::connect(socket).await.map_err(io("connect to", &name))?;
        conn.write_all(client_bytes).await.map_err(io("write to", &name))?;
        let mut decoder = Decoder::new();
        let mut answers: BTreeMap<u32, StreamAnswer> = BTreeMap::new();
        let mut ended = 0;
        let mut block: Vec<u8> = Vec::new();
        let mut block_ends_stream = false;
        while ended < streams {
            let mut head = [0u8; FRAME_HEADER];
            match conn.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(io("read from", &name)(e)),
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (frame_type, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload).await.map_err(io("read from", &name))?;
            let answer = || CallError::Answer { socket: name.clone(), detail: String::new() };
            match frame_type {
                SETTINGS if flags & ACK == 0 => {
                    let mut ack = Vec::new();
                    frame_header(0, SETTINGS, ACK, 0, &mut ack);
                    conn.write_all(&ack).await.map_err(io("write to", &name))?;
                }
                GOAWAY => break,
                RST_STREAM => {
                    let code =
                        payload.first_chunk::<4>().map(|c| u32::from_be_bytes(*c)).ok_or_else(answer)?;
                    answers.entry(stream).or_default().reset = Some(code);
                    ended += 1;
                }
                DATA => {
                    answers.entry(stream).or_default().data.extend_from_slice(&payload);
                    if flags & END_STREAM != 0 {
                        ended += 1;
                    }
                }
                HEADERS | CONTINUATION => {
                    // The server's HEADERS carry neither padding nor priority.
                    if frame_type == HEADERS {
                        block_ends_stream = flags & END_STREAM != 0;
                    }
                    block.extend_from_slice(&payload);
                    if flags & END_HEADERS != 0 {
                        let fields = decoder.decode(&block).map_err(|e| CallError::Answer {
                            socket: name.clone(),
                            detail: format!("HPACK: {e:?}"),
                        })?;
                        block.clear();
                        let entry = answers.entry(stream).or_default();
                        for (n, v) in fields {
                            entry.headers.push((
                                String::from_utf8_lossy(&n).into_owned(),
                                String::from_utf8_lossy(&v).into_owned(),
                            ));
                        }
                        if block_ends_stream {
                            ended += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(answers)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| CallError::Timeout { socket: name.clone(), timeout })?
}
