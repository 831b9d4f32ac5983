//! The HTTP/2 `:authority` of requests on our unix sockets.
//!
//! The kubelet's plugin watcher dials a plugin's registration socket with the socket's path as the gRPC
//! target (`k8s.io/kubernetes` `pkg/kubelet/pluginmanager/operationexecutor`), so grpc-go sends that path,
//! e.g. `/var/lib/kubelet/plugins_registry/manager.nvidia.com-reg.sock`, as the request's `:authority`.
//! Go's gRPC servers ignore it; the `h2` crate under tonic parses it as a URI authority, finds a `/`, and
//! resets the stream with `PROTOCOL_ERROR`, so the kubelet never learns the plugin exists
//! (`RegisterPlugin error -- failed to get plugin info using RPC GetInfo`). Other clients on unix sockets
//! do the same (Python's gRPC, older kubelets on the device-plugin and CSI sockets).
//!
//! An authority means nothing on a unix socket. [`AuthorityRewrite`] wraps an accepted connection and
//! rewrites the client's header blocks on the way in: every request's `:authority` that is not a valid URI
//! authority becomes `localhost` (the value the kubelet sends on its other sockets); everything else
//! passes unchanged. It works at the frame level, below tonic, so every unix-socket gRPC server of ours
//! takes it the same way ([`incoming`]: the device-plugin servers, the client-mode registry, the DRA kubelet
//! plugin's two sockets).
//!
//! What it does to the client → server byte stream:
//!
//! | bytes | handling |
//! |---|---|
//! | the 24-byte connection preface | passed through; anything else there (not HTTP/2) makes the wrapper pass every byte through untouched |
//! | `HEADERS` + `CONTINUATION` frames | one header block collected (padding removed, priority kept), HPACK-decoded with the client's dynamic table, `:authority` fixed, re-encoded as literals without indexing (so the server's table stays empty and nothing depends on it) and written as `HEADERS` (+ `CONTINUATION` past 16,384 bytes, the size every peer accepts) |
//! | every other frame (`DATA`, `SETTINGS`, `PING`, `WINDOW_UPDATE`, ...) | streamed through as it arrives, never buffered whole |
//!
//! A header block that cannot be decoded, is larger than [`MAX_HEADER_BLOCK`], or a `CONTINUATION` that
//! does not follow its `HEADERS` ends the connection with an `InvalidData` read error, as the server
//! would end it with a connection error. The server → client direction is not touched.
//!
//! [`call`] is the other side: a gRPC call over a unix socket with any `:authority`, written frame by frame
//! (neither tonic nor `h2`'s client can send a path there), for tests and for checking a server by hand.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

pub mod call;

use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt as _, wrappers::UnixListenerStream};
use tonic::transport::server::Connected;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame header length.
const FRAME_HEADER: usize = 9;
/// Frame types.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// Frame flags.
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload every HTTP/2 peer accepts (`SETTINGS_MAX_FRAME_SIZE`'s initial value).
const MAX_FRAME: usize = 16_384;
/// The largest dynamic table a client's size update may ask for. A server advertising no
/// `SETTINGS_HEADER_TABLE_SIZE` (tonic's) allows 4,096 bytes; the margin covers servers that advertise more.
const MAX_TABLE_SIZE: usize = 65_536;
/// The largest header block (all of its frames) taken from a client.
pub const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// The authority written instead of an invalid one.
pub const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// The accepted connections of `listener`, each wrapped in [`AuthorityRewrite`]: the incoming stream for
/// tonic's `serve_with_incoming*`.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<AuthorityRewrite<UnixStream>>> {
    UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityRewrite::new))
}

/// A server-side connection whose client header blocks reach the server with a valid `:authority`
/// (module docs). Writes pass through untouched; [`Connected`] answers what the inner stream answers.
#[derive(Debug)]
pub struct AuthorityRewrite<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to the reader, from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    /// A read error found while rewriting, reported once `out` is drained.
    failed: Option<io::Error>,
}

impl<S> AuthorityRewrite<S> {
    /// Wraps a freshly accepted connection (nothing read from it yet).
    pub fn new(inner: S) -> Self {
        Self { inner, rewriter: Rewriter::new(), out: Vec::new(), out_pos: 0, failed: None }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Connected> Connected for AuthorityRewrite<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRewrite<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(err) = this.failed.take() {
                return Poll::Ready(Err(err));
            }
            if this.rewriter.is_passthrough() {
                // Not HTTP/2, or nothing to rewrite: read straight into the caller's buffer.
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) => {
                    let filled = read.filled();
                    if filled.is_empty() {
                        return Poll::Ready(Ok(())); // EOF
                    }
                    if let Err(err) = this.rewriter.feed(filled, &mut this.out) {
                        this.failed = Some(io::Error::new(io::ErrorKind::InvalidData, err));
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRewrite<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Why a client's byte stream could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// HPACK decoding failed (a compression error in HTTP/2 terms).
    #[error("HTTP/2 header block of stream {stream}: HPACK decoding failed: {detail}")]
    Hpack {
        /// The stream the block belongs to.
        stream: u32,
        /// The decoder's error.
        detail: String,
    },
    /// A header block larger than [`MAX_HEADER_BLOCK`].
    #[error("HTTP/2 header block of stream {stream} exceeds {MAX_HEADER_BLOCK} bytes")]
    TooLarge {
        /// The stream the block belongs to.
        stream: u32,
    },
    /// A frame other than the `CONTINUATION` of the open header block, or a `CONTINUATION` without one.
    #[error("HTTP/2 frame of type {frame_type:#x} on stream {stream} where {expected}")]
    Sequence {
        /// The frame's type.
        frame_type: u8,
        /// The frame's stream.
        stream: u32,
        /// What had to come instead.
        expected: &'static str,
    },
    /// A padded or prioritised `HEADERS` frame too short for its own fields.
    #[error("HTTP/2 HEADERS frame of stream {stream}: padding or priority longer than the payload")]
    Padding {
        /// The frame's stream.
        stream: u32,
    },
}

/// Where the rewriter is in the client's byte stream.
#[derive(Debug)]
enum State {
    /// Matching the connection preface; `usize` bytes matched so far.
    Preface(usize),
    /// Collecting a frame header.
    Head { bytes: [u8; FRAME_HEADER], have: usize },
    /// Streaming the payload of a frame that is passed through.
    Forward(usize),
    /// Collecting the payload of a `HEADERS`/`CONTINUATION` frame.
    Block { frame_type: u8, flags: u8, stream: u32, len: usize },
    /// Passing everything through (the stream did not open with the HTTP/2 preface).
    Passthrough,
}

/// A header block being assembled from `HEADERS` and `CONTINUATION` frames.
#[derive(Debug)]
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client → server rewrite, fed with whatever the socket gave (any split) and appending what the
/// server should read. Kept apart from the I/O so tests drive it with arbitrary chunkings.
pub struct Rewriter {
    state: State,
    decoder: Decoder<'static>,
    /// The payload of the frame in [`State::Block`] so far.
    payload: Vec<u8>,
    open: Option<OpenBlock>,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("state", &self.state)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A rewriter at the start of a connection.
    pub fn new() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
        Self { state: State::Preface(0), decoder, payload: Vec::new(), open: None }
    }

    /// Whether every further byte passes through unchanged.
    pub fn is_passthrough(&self) -> bool {
        matches!(self.state, State::Passthrough)
    }

    /// Takes the next `input` bytes of the client's stream and appends what the server is to read to `out`.
    /// After an error the connection must be closed: the rewriter's state is undefined.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        while !input.is_empty() {
            match &mut self.state {
                State::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Preface(matched) => {
                    let want = &PREFACE[*matched..];
                    let n = want.len().min(input.len());
                    if input[..n] != want[..n] {
                        // The bytes matched so far are already out.
                        self.state = State::Passthrough;
                        continue;
                    }
                    out.extend_from_slice(&input[..n]);
                    *matched += n;
                    input = &input[n..];
                    if *matched == PREFACE.len() {
                        self.state = State::Head { bytes: [0; FRAME_HEADER], have: 0 };
                    }
                }
                State::Head { bytes, have } => {
                    let n = (FRAME_HEADER - *have).min(input.len());
                    bytes[*have..*have + n].copy_from_slice(&input[..n]);
                    *have += n;
                    input = &input[n..];
                    if *have == FRAME_HEADER {
                        let head = *bytes;
                        self.start_frame(head, out)?;
                    }
                }
                State::Forward(remaining) => {
                    let n = (*remaining).min(input.len());
                    out.extend_from_slice(&input[..n]);
                    *remaining -= n;
                    input = &input[n..];
                    if *remaining == 0 {
                        self.state = State::Head { bytes: [0; FRAME_HEADER], have: 0 };
                    }
                }
                State::Block { frame_type, flags, stream, len } => {
                    let (frame_type, flags, stream, len) = (*frame_type, *flags, *stream, *len);
                    let n = (len - self.payload.len()).min(input.len());
                    self.payload.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if self.payload.len() == len {
                        let payload = std::mem::take(&mut self.payload);
                        self.state = State::Head { bytes: [0; FRAME_HEADER], have: 0 };
                        self.block_frame(frame_type, flags, stream, &payload, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A complete frame header: decide whether the payload is collected or forwarded.
    fn start_frame(&mut self, head: [u8; FRAME_HEADER], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (frame_type, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if let Some(open) = &self.open
            && (frame_type != CONTINUATION || stream != open.stream)
        {
            return Err(RewriteError::Sequence {
                frame_type,
                stream,
                expected: "a CONTINUATION of the open header block",
            });
        }
        match frame_type {
            HEADERS | CONTINUATION => {
                let held = self.open.as_ref().map_or(0, |o| o.fragment.len());
                if held + len > MAX_HEADER_BLOCK + 256 {
                    return Err(RewriteError::TooLarge { stream });
                }
                self.payload.clear();
                self.payload.reserve(len);
                self.state = State::Block { frame_type, flags, stream, len };
                if len == 0 {
                    self.state = State::Head { bytes: [0; FRAME_HEADER], have: 0 };
                    self.block_frame(frame_type, flags, stream, &[], out)?;
                }
            }
            _ => {
                out.extend_from_slice(&head);
                self.state = if len == 0 {
                    State::Head { bytes: [0; FRAME_HEADER], have: 0 }
                } else {
                    State::Forward(len)
                };
            }
        }
        Ok(())
    }

    /// The whole payload of a `HEADERS` or `CONTINUATION` frame.
    fn block_frame(
        &mut self,
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        if frame_type == HEADERS {
            let mut fragment = payload;
            let mut pad = 0;
            if flags & PADDED != 0 {
                let (&len, rest) = fragment.split_first().ok_or(RewriteError::Padding { stream })?;
                pad = usize::from(len);
                fragment = rest;
            }
            let mut priority = None;
            if flags & PRIORITY != 0 {
                let (fields, rest) =
                    fragment.split_first_chunk::<5>().ok_or(RewriteError::Padding { stream })?;
                priority = Some(*fields);
                fragment = rest;
            }
            let fragment =
                fragment.get(..fragment.len().checked_sub(pad).ok_or(RewriteError::Padding { stream })?);
            let fragment = fragment.ok_or(RewriteError::Padding { stream })?;
            self.open = Some(OpenBlock {
                stream,
                end_stream: flags & END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
            });
        } else {
            let open = self.open.as_mut().ok_or(RewriteError::Sequence {
                frame_type,
                stream,
                expected: "a HEADERS frame before it",
            })?;
            open.fragment.extend_from_slice(payload);
        }
        if self.open.as_ref().is_some_and(|o| o.fragment.len() > MAX_HEADER_BLOCK) {
            return Err(RewriteError::TooLarge { stream });
        }
        if flags & END_HEADERS != 0
            && let Some(open) = self.open.take()
        {
            self.finish_block(open, out)?;
        }
        Ok(())
    }

    /// Decodes a complete block, fixes its `:authority`, and writes it as new frames.
    fn finish_block(&mut self, open: OpenBlock, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut block = Vec::with_capacity(open.fragment.len() + 64);
        let mut too_large = false;
        self.decoder
            .decode_with_cb(&open.fragment, |name, value| {
                let value: &[u8] = if name.as_ref() == b":authority" && !valid_authority(&value) {
                    LOCAL_AUTHORITY
                } else {
                    &value
                };
                encode_literal(&name, value, &mut block);
                too_large |= block.len() > 2 * MAX_HEADER_BLOCK;
            })
            .map_err(|e| RewriteError::Hpack { stream: open.stream, detail: format!("{e:?}") })?;
        if too_large {
            return Err(RewriteError::TooLarge { stream: open.stream });
        }
        write_block(open.stream, open.end_stream, open.priority, &block, out);
        Ok(())
    }
}

/// Whether `h2` takes `value` as a request's `:authority` (the same parse it applies).
pub fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// An HPACK integer with an `prefix`-bit prefix whose other bits are `first` (RFC 7541 §5.1).
fn encode_int(mut value: usize, prefix: u8, first: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// "Literal Header Field without Indexing — New Name" with plain (not Huffman-coded) strings
/// (RFC 7541 §6.2.2): decodable by any decoder, whatever its dynamic table holds.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_int(name.len(), 7, 0, out);
    out.extend_from_slice(name);
    encode_int(value.len(), 7, 0, out);
    out.extend_from_slice(value);
}

/// Writes `block` as a `HEADERS` frame, then `CONTINUATION` frames past [`MAX_FRAME`] bytes.
fn write_block(stream: u32, end_stream: bool, priority: Option<[u8; 5]>, block: &[u8], out: &mut Vec<u8>) {
    let first_room = MAX_FRAME - priority.map_or(0, |p| p.len());
    let (first, mut rest) = block.split_at(block.len().min(first_room));
    let mut flags = if end_stream { END_STREAM } else { 0 };
    if priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let len = first.len() + priority.map_or(0, |p| p.len());
    frame_header(len, HEADERS, flags, stream, out);
    if let Some(p) = priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (part, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        frame_header(part.len(), CONTINUATION, if tail.is_empty() { END_HEADERS } else { 0 }, stream, out);
        out.extend_from_slice(part);
        rest = tail;
    }
}

fn frame_header(len: usize, frame_type: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    let len = len as u32; // at most MAX_FRAME
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use loona_hpack::Encoder;
    use proptest::prelude::*;

    /// Header fields in order.
    type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

    /// Splits `bytes` into frames of the client stream: (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut frames = Vec::new();
        while bytes.len() >= FRAME_HEADER {
            let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            frames.push((bytes[3], bytes[4], stream, bytes[FRAME_HEADER..FRAME_HEADER + len].to_vec()));
            bytes = &bytes[FRAME_HEADER + len..];
        }
        assert!(bytes.is_empty(), "trailing partial frame");
        frames
    }

    /// The header lists of `out` (after the preface), decoded with one decoder as the server would.
    fn header_lists(out: &[u8]) -> Vec<(u32, u8, HeaderList)> {
        let mut decoder = Decoder::new();
        let mut lists = Vec::new();
        let mut block = Vec::new();
        let mut head = None;
        for (ty, flags, stream, payload) in frames(&out[PREFACE.len()..]) {
            match ty {
                HEADERS => {
                    let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                    assert_eq!(flags & PADDED, 0);
                    block = payload[skip..].to_vec();
                    head = Some((stream, flags));
                }
                CONTINUATION => block.extend_from_slice(&payload),
                _ => continue,
            }
            if flags & END_HEADERS != 0 {
                let (stream, flags) = head.take().unwrap();
                lists.push((stream, flags, decoder.decode(&block).unwrap()));
            }
        }
        lists
    }

    fn request(authority: &[u8], extra: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut headers = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/pluginregistration.Registration/GetInfo".to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
        ];
        for i in 0..extra {
            headers.push((format!("x-extra-{i}").into_bytes(), vec![b'v'; 100]));
        }
        headers
    }

    /// A client stream: preface, SETTINGS, one HEADERS block per request (split into CONTINUATIONs of
    /// `split` bytes, padded when `pad`), a DATA frame after each.
    fn client_stream(requests: &[Vec<(Vec<u8>, Vec<u8>)>], split: usize, pad: u8) -> Vec<u8> {
        let mut encoder = Encoder::new();
        let mut out = PREFACE.to_vec();
        frame_header(0, 0x4, 0, 0, &mut out);
        for (i, headers) in requests.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            let block = encoder.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
            let mut chunks = block.chunks(split.max(1));
            let first = chunks.next().unwrap_or(&[]);
            let last = block.len() <= split.max(1);
            let flags = if last { END_HEADERS } else { 0 } | if pad > 0 { PADDED } else { 0 };
            let len = first.len() + if pad > 0 { 1 + usize::from(pad) } else { 0 };
            frame_header(len, HEADERS, flags, stream, &mut out);
            if pad > 0 {
                out.push(pad);
            }
            out.extend_from_slice(first);
            out.extend(std::iter::repeat_n(0, usize::from(pad)));
            let rest: Vec<&[u8]> = chunks.collect();
            for (j, part) in rest.iter().enumerate() {
                frame_header(
                    part.len(),
                    CONTINUATION,
                    if j + 1 == rest.len() { END_HEADERS } else { 0 },
                    stream,
                    &mut out,
                );
                out.extend_from_slice(part);
            }
            frame_header(5, 0x0, END_STREAM, stream, &mut out);
            out.extend_from_slice(&[0, 0, 0, 0, 0]);
        }
        out
    }

    fn rewrite(input: &[u8], chunk: usize) -> Result<Vec<u8>, RewriteError> {
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for part in input.chunks(chunk.max(1)) {
            rewriter.feed(part, &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn a_socket_path_becomes_localhost_and_a_valid_authority_stays() {
        let path = b"/var/lib/kubelet/plugins_registry/manager.nvidia.com-reg.sock";
        // Two requests with the path: the second refers to the client's dynamic table entry.
        let input =
            client_stream(&[request(path, 0), request(path, 0), request(b"localhost:1234", 0)], 1000, 0);
        let out = rewrite(&input, 7).unwrap();
        let lists = header_lists(&out);
        let authorities: Vec<_> = lists
            .iter()
            .map(|(_, _, h)| h.iter().find(|(n, _)| n == b":authority").unwrap().1.clone())
            .collect();
        assert_eq!(authorities, [b"localhost".to_vec(), b"localhost".to_vec(), b"localhost:1234".to_vec()]);
        // DATA and SETTINGS frames are unchanged.
        let data: Vec<_> = frames(&out[PREFACE.len()..]).into_iter().filter(|f| f.0 == 0).collect();
        assert_eq!(data.len(), 3);
    }

    #[test]
    fn a_non_http2_stream_passes_through() {
        let input = b"GET / HTTP/1.1\r\nHost: /a/b\r\n\r\n";
        assert_eq!(rewrite(input, 3).unwrap(), input);
        // A stream that starts like the preface and then differs.
        let input = b"PRI * HTTP/1.1\r\n";
        assert_eq!(rewrite(input, 1).unwrap(), input);
    }

    #[test]
    fn a_continuation_on_another_stream_is_refused() {
        let mut input = PREFACE.to_vec();
        frame_header(1, HEADERS, 0, 1, &mut input);
        input.push(0x82);
        frame_header(1, CONTINUATION, END_HEADERS, 3, &mut input);
        input.push(0x84);
        assert!(matches!(rewrite(&input, 100), Err(RewriteError::Sequence { stream: 3, .. })));
        let mut input = PREFACE.to_vec();
        frame_header(1, CONTINUATION, END_HEADERS, 1, &mut input);
        input.push(0x84);
        assert!(matches!(rewrite(&input, 100), Err(RewriteError::Sequence { .. })));
    }

    #[test]
    fn bad_hpack_padding_and_size_are_errors() {
        let mut input = PREFACE.to_vec();
        frame_header(1, HEADERS, END_HEADERS, 1, &mut input);
        input.push(0xff); // indexed field, index past every table
        assert!(matches!(rewrite(&input, 100), Err(RewriteError::Hpack { stream: 1, .. })));
        let mut input = PREFACE.to_vec();
        frame_header(2, HEADERS, END_HEADERS | PADDED, 1, &mut input);
        input.extend_from_slice(&[5, 0x82]);
        assert!(matches!(rewrite(&input, 100), Err(RewriteError::Padding { stream: 1 })));
        let mut input = PREFACE.to_vec();
        frame_header(MAX_HEADER_BLOCK + 1000, HEADERS, END_HEADERS, 1, &mut input);
        assert!(matches!(rewrite(&input, 100), Err(RewriteError::TooLarge { stream: 1 })));
    }

    #[test]
    fn a_large_block_is_split_into_continuations() {
        let input = client_stream(&[request(b"/a/b.sock", 300)], 4000, 3);
        let out = rewrite(&input, 4096).unwrap();
        let types: Vec<u8> = frames(&out[PREFACE.len()..]).iter().map(|f| f.0).collect();
        assert!(types.contains(&CONTINUATION), "{types:?}");
        let lists = header_lists(&out);
        assert_eq!(lists.len(), 1);
        assert_eq!(lists[0].2.len(), 305);
        assert!(lists[0].2.contains(&(b":authority".to_vec(), b"localhost".to_vec())));
    }

    fn header() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        (
            proptest::string::string_regex("[a-z][a-z0-9-]{0,20}").unwrap(),
            proptest::collection::vec(any::<u8>(), 0..200),
        )
            .prop_map(|(n, v)| (n.into_bytes(), v))
    }

    proptest! {
        /// Whatever the chunking, frame split, padding and header lists: the server reads the same header
        /// lists in the same order with only invalid authorities replaced, and the other frames unchanged.
        #[test]
        fn rewriting_keeps_every_header_but_a_bad_authority(
            requests in proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..80), proptest::collection::vec(header(), 0..12)),
                1..6,
            ),
            split in 1usize..300,
            chunk in 1usize..500,
            pad in 0u8..4,
        ) {
            let requests: Vec<Vec<(Vec<u8>, Vec<u8>)>> = requests
                .into_iter()
                .map(|(authority, extra)| {
                    let mut headers = request(&authority, 0);
                    headers.extend(extra);
                    headers
                })
                .collect();
            let input = client_stream(&requests, split, pad);
            let out = rewrite(&input, chunk).unwrap();
            let lists = header_lists(&out);
            prop_assert_eq!(lists.len(), requests.len());
            for (i, ((stream, _, got), sent)) in lists.iter().zip(&requests).enumerate() {
                prop_assert_eq!(*stream, 1 + 2 * i as u32);
                let want: Vec<(Vec<u8>, Vec<u8>)> = sent
                    .iter()
                    .map(|(n, v)| {
                        if n == b":authority" && !valid_authority(v) { (n.clone(), LOCAL_AUTHORITY.to_vec()) } else { (n.clone(), v.clone()) }
                    })
                    .collect();
                prop_assert_eq!(got, &want);
            }
            let data_in: Vec<_> = frames(&input[PREFACE.len()..]).into_iter().filter(|f| f.0 != HEADERS && f.0 != CONTINUATION).collect();
            let data_out: Vec<_> = frames(&out[PREFACE.len()..]).into_iter().filter(|f| f.0 != HEADERS && f.0 != CONTINUATION).collect();
            prop_assert_eq!(data_in, data_out);
        }

        /// Arbitrary bytes after the preface never panic the rewriter.
        #[test]
        fn arbitrary_input_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2000), chunk in 1usize..64) {
            let mut input = PREFACE.to_vec();
            input.extend(bytes);
            let _ = rewrite(&input, chunk);
        }
    }
}
