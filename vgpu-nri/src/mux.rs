//! The NRI socket multiplexer: two ttrpc connections over one unix stream, framed as containerd/nri
//! `pkg/net/multiplex` frames them.
//!
//! A plugin dials the runtime's socket once; both sides then open the same two logical connections on
//! it without any signalling (opening is local). The plugin serves its `Plugin` service on
//! [`PLUGIN_SERVICE_CONN`] and calls the runtime's `Runtime` service on [`RUNTIME_SERVICE_CONN`]; the
//! runtime does the opposite.
//!
//! # Wire
//!
//! Every frame on the trunk:
//!
//! | bytes | field | value |
//! |---|---|---|
//! | 0..4 | connection ID | big-endian `u32`: 0 reserved, 1 plugin service, 2 runtime service |
//! | 4..8 | payload length | big-endian `u32`, at most [`MAX_PAYLOAD`] (`10 + 4 MiB`: one ttrpc header and the largest ttrpc message) |
//! | 8.. | payload | the next bytes of that connection's byte stream (ttrpc messages: 10-byte header + body) |
//!
//! A frame for a connection nobody opened is dropped (as upstream). A frame longer than [`MAX_PAYLOAD`]
//! or a trunk that ends inside a frame closes the multiplexer with an error; every logical connection
//! then reads end-of-file.
//!
//! # What we send
//!
//! Upstream's reader hands each frame to a single `Read` and fails with `ENOMEM` when the reader's buffer
//! is smaller than the frame; Go ttrpc reads through a 4096-byte `bufio.Reader`. So the frames we write
//! never span two ttrpc messages and carry at most [`WRITE_CHUNK`] (4096) bytes, and a frame is only
//! written once it is complete ([`MessageSplitter`]): that way the Go reader always has room for it
//! (its buffer is empty at each message start, and a direct read into the message buffer is never
//! larger than what is left of the message). What we read may be framed any way.

use std::collections::HashMap;

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream},
    sync::{mpsc, watch},
    task::JoinHandle,
};

/// A logical connection's ID within a multiplexed socket.
pub type ConnId = u32;

/// Connection ID 0: reserved by upstream.
pub const RESERVED_CONN: ConnId = 0;
/// The connection carrying the plugin's `Plugin` service (the runtime is the ttrpc client).
pub const PLUGIN_SERVICE_CONN: ConnId = 1;
/// The connection carrying the runtime's `Runtime` service (the plugin is the ttrpc client).
pub const RUNTIME_SERVICE_CONN: ConnId = 2;
/// Length of a frame header: connection ID and payload length.
pub const HEADER_LEN: usize = 8;
/// Length of a ttrpc message header (length `u32`, stream ID `u32`, type `u8`, flags `u8`).
pub const TTRPC_HEADER_LEN: usize = 10;
/// The largest ttrpc message body (4 MiB).
pub const TTRPC_MESSAGE_MAX: usize = 4 << 20;
/// The largest frame payload accepted (upstream's `maxPayloadSize`).
pub const MAX_PAYLOAD: usize = TTRPC_HEADER_LEN + TTRPC_MESSAGE_MAX;
/// The largest frame payload we write (see the module docs).
pub const WRITE_CHUNK: usize = 4096;
/// Buffer of each logical connection's in-process pipe: one whole ttrpc message and its header fit.
const PIPE_BUFFER: usize = MAX_PAYLOAD + HEADER_LEN;

/// The multiplexer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MuxError {
    /// Connection ID 0 was asked for.
    #[error("connection ID {RESERVED_CONN} is reserved")]
    Reserved,
    /// A connection ID was opened twice, or taken twice.
    #[error("connection ID {0} is not available (already taken, or not opened)")]
    Unavailable(ConnId),
    /// A frame announced a payload longer than [`MAX_PAYLOAD`].
    #[error("frame for connection {conn} announces {len} payload bytes, more than the {MAX_PAYLOAD} allowed")]
    Oversized {
        /// The frame's connection ID.
        conn: ConnId,
        /// The announced length.
        len: usize,
    },
    /// The trunk ended inside a frame.
    #[error("the trunk ended inside a frame ({0} bytes of it read)")]
    Truncated(usize),
    /// Reading or writing the trunk failed.
    #[error("trunk {action} failed: {message}")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The I/O error.
        message: String,
    },
}

/// One frame: a connection ID and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The logical connection.
    pub conn: ConnId,
    /// Bytes of that connection's stream.
    pub payload: Vec<u8>,
}

/// Appends `payload` to `out` as frames of `conn`, split at [`MAX_PAYLOAD`] bytes (an empty payload is
/// one empty frame, as upstream writes it).
pub fn encode_frames(conn: ConnId, payload: &[u8], out: &mut Vec<u8>) {
    let mut rest = payload;
    loop {
        let n = rest.len().min(MAX_PAYLOAD);
        out.extend_from_slice(&conn.to_be_bytes());
        // n <= MAX_PAYLOAD < u32::MAX.
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        if rest.is_empty() {
            return;
        }
    }
}

/// Reassembles frames from trunk bytes as they arrive.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    /// Adds bytes read from the trunk.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` until one is complete.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, MuxError> {
        let Some((header, _)) = self.buf.split_first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(MuxError::Oversized { conn, len });
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(Frame { conn, payload }))
    }

    /// Bytes held that do not make a complete frame yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Cuts one connection's outgoing ttrpc byte stream into frame payloads: each at most [`WRITE_CHUNK`]
/// bytes, never spanning two ttrpc messages, and only handed out once complete.
#[derive(Debug, Default)]
pub struct MessageSplitter {
    pending: Vec<u8>,
    /// Bytes of the current message (header included) not handed out yet; 0 at a message boundary.
    left_in_message: usize,
}

impl MessageSplitter {
    /// Adds bytes the ttrpc side wrote.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next frame payload, `None` until one is complete.
    pub fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.left_in_message == 0 {
            let header = self.pending.first_chunk::<TTRPC_HEADER_LEN>()?;
            let body = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
            self.left_in_message = TTRPC_HEADER_LEN + body;
        }
        let n = self.left_in_message.min(WRITE_CHUNK);
        if self.pending.len() < n {
            return None;
        }
        self.left_in_message -= n;
        Some(self.pending.drain(..n).collect())
    }

    /// Bytes held that are not handed out yet.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// How a multiplexer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MuxEnd {
    /// The peer closed the trunk.
    Eof,
    /// The trunk failed or carried a bad frame.
    Failed(MuxError),
    /// [`Mux::close`] was called.
    Closed,
}

/// A running multiplexer over one trunk: each opened connection is an in-process byte stream
/// ([`DuplexStream`]) that ttrpc reads and writes; tasks move its bytes to and from the trunk.
#[derive(Debug)]
pub struct Mux {
    streams: HashMap<ConnId, DuplexStream>,
    end: watch::Receiver<Option<MuxEnd>>,
    end_tx: watch::Sender<Option<MuxEnd>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Mux {
    /// Starts multiplexing `trunk` with the logical connections `conns` open (each once; 0 is
    /// reserved). Must run inside a Tokio runtime.
    pub fn new<T>(trunk: T, conns: &[ConnId]) -> Result<Self, MuxError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let mut seen = Vec::new();
        for &id in conns {
            if id == RESERVED_CONN {
                return Err(MuxError::Reserved);
            }
            if seen.contains(&id) {
                return Err(MuxError::Unavailable(id));
            }
            seen.push(id);
        }
        let (mut trunk_read, mut trunk_write) = tokio::io::split(trunk);
        let (end_tx, end) = watch::channel(None);
        let (frames_tx, mut frames_rx) = mpsc::channel::<Vec<u8>>(64);
        let mut streams = HashMap::new();
        let mut inbound = HashMap::new();
        let mut tasks = Vec::new();
        for &id in conns {
            let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
            let (mut from_ttrpc, to_ttrpc) = tokio::io::split(ours);
            inbound.insert(id, to_ttrpc);
            streams.insert(id, theirs);
            let frames = frames_tx.clone();
            // Outbound: this connection's bytes → whole frames → the writer.
            tasks.push(tokio::spawn(async move {
                let mut splitter = MessageSplitter::default();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_ttrpc.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    splitter.push(&buf[..n]);
                    while let Some(chunk) = splitter.next_chunk() {
                        let mut frame = Vec::with_capacity(HEADER_LEN + chunk.len());
                        encode_frames(id, &chunk, &mut frame);
                        if frames.send(frame).await.is_err() {
                            return;
                        }
                    }
                }
            }));
        }
        drop(frames_tx);
        // The single trunk writer: frames are written whole, one at a time.
        let writer_end = end_tx.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(frame) = frames_rx.recv().await {
                if let Err(e) = trunk_write.write_all(&frame).await {
                    writer_end.send_if_modified(|end| {
                        set_end(end, MuxEnd::Failed(MuxError::Io { action: "write", message: e.to_string() }))
                    });
                    return;
                }
            }
            let _ = trunk_write.shutdown().await;
        }));
        // Inbound: trunk → frames → the connection's stream. Ends (dropping every inbound half, so ttrpc
        // reads end-of-file) when the trunk ends or fails.
        let reader_end = end_tx.clone();
        tasks.push(tokio::spawn(async move {
            let mut decoder = FrameDecoder::default();
            let mut buf = vec![0u8; 64 * 1024];
            let outcome = 'read: loop {
                let n = match trunk_read.read(&mut buf).await {
                    Ok(0) if decoder.pending() == 0 => break 'read MuxEnd::Eof,
                    Ok(0) => break 'read MuxEnd::Failed(MuxError::Truncated(decoder.pending())),
                    Ok(n) => n,
                    Err(e) => {
                        break 'read MuxEnd::Failed(MuxError::Io { action: "read", message: e.to_string() });
                    }
                };
                decoder.push(&buf[..n]);
                loop {
                    match decoder.next_frame() {
                        Ok(Some(frame)) => {
                            let gone = match inbound.get_mut(&frame.conn) {
                                Some(to_ttrpc) => to_ttrpc.write_all(&frame.payload).await.is_err(),
                                None => {
                                    tracing::debug!(
                                        conn = frame.conn,
                                        len = frame.payload.len(),
                                        "NRI mux: frame for a connection nobody opened dropped"
                                    );
                                    false
                                }
                            };
                            if gone {
                                inbound.remove(&frame.conn);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => break 'read MuxEnd::Failed(e),
                    }
                }
            };
            // Each connection reads end-of-file (the outbound task still holds the other half of its pipe).
            for (_, mut to_ttrpc) in inbound {
                let _ = to_ttrpc.shutdown().await;
            }
            reader_end.send_if_modified(|end| set_end(end, outcome));
        }));
        Ok(Self { streams, end, end_tx, tasks })
    }

    /// Takes connection `id`'s stream (once).
    pub fn take(&mut self, id: ConnId) -> Result<DuplexStream, MuxError> {
        if id == RESERVED_CONN {
            return Err(MuxError::Reserved);
        }
        self.streams.remove(&id).ok_or(MuxError::Unavailable(id))
    }

    /// A handle that resolves when the multiplexer ends.
    pub fn watcher(&self) -> MuxWatcher {
        MuxWatcher(self.end.clone())
    }

    /// How it ended, `None` while it runs.
    pub fn ended(&self) -> Option<MuxEnd> {
        self.end.borrow().clone()
    }

    /// Stops every task and drops the trunk.
    pub fn close(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.end_tx.send_if_modified(|end| set_end(end, MuxEnd::Closed));
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.shut();
    }
}

/// Resolves when its multiplexer ends ([`Mux::watcher`]).
#[derive(Debug, Clone)]
pub struct MuxWatcher(watch::Receiver<Option<MuxEnd>>);

impl MuxWatcher {
    /// Waits for the end; a multiplexer dropped without an end counts as [`MuxEnd::Closed`].
    pub async fn ended(&mut self) -> MuxEnd {
        match self.0.wait_for(Option::is_some).await {
            Ok(end) => end.clone().unwrap_or(MuxEnd::Closed),
            Err(_) => MuxEnd::Closed,
        }
    }
}

/// Records the first end only.
fn set_end(end: &mut Option<MuxEnd>, outcome: MuxEnd) -> bool {
    if end.is_some() {
        return false;
    }
    *end = Some(outcome);
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn message(body: usize) -> Vec<u8> {
        let mut m = u32::try_from(body).unwrap().to_be_bytes().to_vec();
        m.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
        m.extend((0..body).map(|i| (i % 251) as u8));
        m
    }

    #[test]
    fn frame_layout_is_big_endian_id_then_length() {
        let mut out = Vec::new();
        encode_frames(2, b"abc", &mut out);
        assert_eq!(out, [0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
        let mut d = FrameDecoder::default();
        d.push(&out[..5]);
        assert_eq!(d.next_frame().unwrap(), None);
        d.push(&out[5..]);
        assert_eq!(d.next_frame().unwrap(), Some(Frame { conn: 2, payload: b"abc".to_vec() }));
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut d = FrameDecoder::default();
        d.push(&[0, 0, 0, 1]);
        d.push(&u32::try_from(MAX_PAYLOAD + 1).unwrap().to_be_bytes());
        assert_eq!(d.next_frame(), Err(MuxError::Oversized { conn: 1, len: MAX_PAYLOAD + 1 }));
    }

    #[test]
    fn splitter_cuts_at_message_boundaries_and_4096() {
        let mut s = MessageSplitter::default();
        let small = message(20);
        let big = message(9000);
        s.push(&small);
        s.push(&big[..100]);
        assert_eq!(s.next_chunk().unwrap(), small, "one small message is one chunk");
        assert_eq!(s.next_chunk(), None, "an incomplete chunk waits");
        s.push(&big[100..]);
        let chunks: Vec<_> = std::iter::from_fn(|| s.next_chunk()).collect();
        assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), [4096, 4096, 818]);
        assert_eq!(chunks.concat(), big);
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn reserved_and_duplicate_ids_are_refused() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (a, _b) = tokio::io::duplex(64);
            assert_eq!(Mux::new(a, &[0]).unwrap_err(), MuxError::Reserved);
            let (a, _b) = tokio::io::duplex(64);
            assert_eq!(Mux::new(a, &[1, 1]).unwrap_err(), MuxError::Unavailable(1));
            let (a, _b) = tokio::io::duplex(64);
            let mut mux = Mux::new(a, &[1]).unwrap();
            assert!(mux.take(1).is_ok());
            assert_eq!(mux.take(1).unwrap_err(), MuxError::Unavailable(1));
            assert_eq!(mux.take(0).unwrap_err(), MuxError::Reserved);
        });
    }
}
