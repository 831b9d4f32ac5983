//! `--pprof-bind-port`: CPU profiles over HTTP in pprof's format, as Go's `net/http/pprof` serves them.
//!
//! `GET /debug/pprof/profile?seconds=S` ([`PROFILE_PATH`]) samples the whole process for `S` seconds
//! ([`DEFAULT_SECONDS`] when absent, at most [`MAX_SECONDS`]) at [`SAMPLE_FREQUENCY`] Hz and answers a
//! gzip-compressed `perftools.profiles.Profile` (the protobuf `go tool pprof` reads:
//! `go tool pprof http://127.0.0.1:N/debug/pprof/profile?seconds=10`). The binaries serve it on
//! `127.0.0.1:N` only ([`listen_addr`]) when `--pprof-bind-port N` is nonzero.
//!
//! | piece | what it does |
//! |---|---|
//! | [`listen_addr`] | the flag's port to the loopback address to serve on; `None` for `0` (off) |
//! | [`serve_pprof`] | binds and serves until shutdown ([`PprofServer::bind`] + [`PprofServer::serve`]) |
//! | [`PprofServer`] | a bound listener: [`PprofServer::local_addr`] tells the port (tests bind port 0) |
//! | [`profile_from_report`] | a sampled [`::pprof::Report`] to a [`proto::Profile`] |
//! | [`encode_gzip`] | a [`proto::Profile`] to the served bytes |
//! | [`proto`] | the `perftools.profiles` messages, generated from `proto/perftools/profiles/profile.proto` |
//!
//! # The profile
//!
//! As Go's CPU profile: `sample_type` is `[samples/count, cpu/nanoseconds]`, `period_type` `cpu/nanoseconds`,
//! `period` one sampling interval (10 ms at 100 Hz); each sample is one distinct stack (per thread, labelled
//! `thread`) with location ids leaf first and values `[count, count × period]`. One [`proto::Function`] per
//! distinct symbol (name, mangled name, file) and one [`proto::Location`] per distinct (function, line) (an
//! inlined call is a location of its own), all in one [`proto::Mapping`], the executable, marked symbolized:
//! symbols are resolved in-process, so `go tool pprof` has nothing to look up. The sampler's own frames (the
//! unwinder its signal handler runs) are left out of the stacks.
//!
//! Unwinding runs in the `SIGPROF` handler: in an optimized build a busy thread gets ~100% of its ticks; in an
//! unoptimized (debug) build unwinding is slow enough that about half the ticks are lost.
//!
//! The body is gzip as Go's is, but with *stored* (uncompressed) deflate blocks: no deflate encoder is a
//! dependency here, every gzip reader (`go tool pprof` included) reads stored blocks, and a profile is small.
//!
//! # Differences from Go's handler
//!
//! - A `seconds` that is not a whole number in `1..=`[`MAX_SECONDS`] answers 400 naming the parameter (Go
//!   silently falls back to 30 s). An absent `seconds` means [`DEFAULT_SECONDS`], as in Go.
//! - A second profile while one runs answers **409 Conflict** with Go's text "Could not enable CPU profiling:
//!   cpu profiling already in use" (Go answers 500 with the same text). The profiler is process-wide, so this
//!   holds across every [`PprofServer`] of the process. Errors carry Go's `X-Go-Pprof: 1` header and a
//!   `text/plain` body, so `go tool pprof` prints the message.
//! - Only the CPU profile is served; other `/debug/pprof/*` paths answer 404.
//! - A profile in progress when the server shuts down ends early and answers what it sampled so far; one
//!   whose client disconnects stops at once (as Go's, which watches the request context).
//!
//! # Example
//!
//! A report with one stack sampled three times, as the profiler builds it, to the profile `go tool pprof`
//! reads:
//!
//! ```
//! use std::collections::HashMap;
//! use std::time::{Duration, SystemTime};
//! use prost::Message as _;
//! use vgpu_serve::pprof::{profile_from_report, proto};
//!
//! let symbol = |name: &str| ::pprof::Symbol {
//!     name: Some(name.as_bytes().to_vec()),
//!     addr: None,
//!     lineno: Some(7),
//!     filename: Some("src/main.rs".into()),
//! };
//! let stack = ::pprof::Frames {
//!     frames: vec![vec![symbol("leaf")], vec![symbol("main")]], // leaf first
//!     thread_name: "worker".into(),
//!     thread_id: 1,
//!     sample_timestamp: SystemTime::now(),
//! };
//! let mut report = ::pprof::Report { data: HashMap::from([(stack, 3)]), timing: Default::default() };
//! report.timing.frequency = 100;
//! report.timing.duration = Duration::from_secs(1);
//!
//! let bytes = profile_from_report(&report).encode_to_vec();
//! let profile = proto::Profile::decode(bytes.as_slice())?;
//! let s = |i: i64| profile.string_table[i as usize].as_str();
//! assert_eq!(s(0), "");
//! let types: Vec<_> = profile.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
//! assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
//! assert_eq!(profile.period, 10_000_000); // 10 ms at 100 Hz
//! assert_eq!(profile.duration_nanos, 1_000_000_000);
//! let sample = &profile.sample[0];
//! assert_eq!(sample.value, [3, 30_000_000]);
//! let names: Vec<_> = sample
//!     .location_id
//!     .iter()
//!     .map(|id| {
//!         let location = profile.location.iter().find(|l| l.id == *id).unwrap();
//!         let function = profile.function.iter().find(|f| f.id == location.line[0].function_id).unwrap();
//!         s(function.name)
//!     })
//!     .collect();
//! assert_eq!(names, ["leaf", "main"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderValue, StatusCode, Uri, header};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::http::{HttpTimeouts, serve};

/// The `perftools.profiles` messages (pprof's `profile.proto`), generated by prost from
/// `proto/perftools/profiles/profile.proto` into `src/gen/` (the workspace's `tests/codegen.rs` keeps them current).
pub mod proto {
    include!("gen/perftools.profiles.rs");
}

/// The CPU profile route.
pub const PROFILE_PATH: &str = "/debug/pprof/profile";
/// Profile length when the request names no `seconds` (Go's).
pub const DEFAULT_SECONDS: u64 = 30;
/// The longest profile a request may ask for, seconds.
pub const MAX_SECONDS: u64 = 300;
/// Samples per second (Go's CPU profiler rate).
pub const SAMPLE_FREQUENCY: i32 = 100;
/// Shared objects (name substrings) in which an interrupted thread is not sampled: unwinding from inside them
/// from a signal handler is not safe. Such ticks are dropped, not attributed elsewhere.
pub const BLOCKLIST: &[&str] = &["libc", "libgcc", "pthread", "vdso"];

const NANOS_PER_SECOND: i64 = 1_000_000_000;
/// Go's text when a profile is already running.
const BUSY_TEXT: &str = "cpu profiling already in use";
/// How much of a rejected `seconds` value an error message repeats.
const MAX_ECHOED_VALUE: usize = 64;

/// Why a profile could not be served, or the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PprofError {
    /// The listening socket could not be bound.
    #[error("binding the pprof listener on {addr} failed: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The `seconds` query parameter is not a whole number in `1..=MAX_SECONDS`: answer 400.
    #[error(
        "invalid query parameter `seconds`: {value:?}; expected a whole number of seconds from 1 to {MAX_SECONDS}"
    )]
    BadSeconds {
        /// The value given (at most 64 characters of it).
        value: String,
    },
    /// Another profile is running in this process: answer 409.
    #[error("Could not enable CPU profiling: {BUSY_TEXT}")]
    Busy,
    /// The profiler could not be started: answer 500.
    #[error("Could not enable CPU profiling: {0}")]
    Start(String),
    /// The sampled stacks could not be collected: answer 500.
    #[error("Could not collect the CPU profile: {0}")]
    Report(String),
}

impl PprofError {
    /// The HTTP status that answers this error.
    pub fn status(&self) -> StatusCode {
        match self {
            PprofError::BadSeconds { .. } => StatusCode::BAD_REQUEST,
            PprofError::Busy => StatusCode::CONFLICT,
            PprofError::Bind { .. } | PprofError::Start(_) | PprofError::Report(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

impl IntoResponse for PprofError {
    /// Go's `serveError`: the status, `X-Go-Pprof: 1`, and the message as `text/plain`.
    fn into_response(self) -> Response {
        let headers = [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8")),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::HeaderName::from_static("x-go-pprof"), HeaderValue::from_static("1")),
        ];
        (self.status(), headers, format!("{self}\n")).into_response()
    }
}

/// Where `--pprof-bind-port port` serves: `127.0.0.1:port`, or `None` when `port` is 0 (profiling off, the
/// flag's default).
pub fn listen_addr(port: u16) -> Option<SocketAddr> {
    (port != 0).then_some(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// Binds `addr` and serves CPU profiles on it until `shutdown` completes (see [`PprofServer::serve`]).
/// Fails only when the address cannot be bound.
pub async fn serve_pprof<F>(addr: SocketAddr, shutdown: F) -> Result<(), PprofError>
where
    F: Future<Output = ()> + Send,
{
    PprofServer::bind(addr).await?.serve(shutdown).await;
    Ok(())
}

/// A bound pprof listener, not yet serving.
#[derive(Debug)]
pub struct PprofServer {
    listener: TcpListener,
    local_addr: SocketAddr,
}

impl PprofServer {
    /// Binds `addr` (port 0: an ephemeral port, see [`PprofServer::local_addr`]).
    pub async fn bind(addr: SocketAddr) -> Result<Self, PprofError> {
        let bind_error = |source| PprofError::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        Ok(Self { listener, local_addr })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves [`PROFILE_PATH`] with [`crate::http::serve`] (HTTP/1.1, no TLS, the default timeouts) until
    /// `shutdown` completes. A profile still running then ends early and is answered with what was sampled.
    pub async fn serve<F>(self, shutdown: F)
    where
        F: Future<Output = ()> + Send,
    {
        let stop = CancellationToken::new();
        let app = Router::new()
            .route(PROFILE_PATH, get(profile_handler))
            .with_state(Arc::new(Shared { stop: stop.clone() }));
        // Cancelled when `shutdown` completes, and when the server's future is dropped before that.
        let cancel_on_exit = stop.drop_guard();
        let shutdown = async move {
            shutdown.await;
            drop(cancel_on_exit);
        };
        tracing::info!(addr = %self.local_addr, path = PROFILE_PATH, "serving CPU profiles");
        serve(self.listener, app, None, &HttpTimeouts::default(), shutdown).await;
    }
}

/// What the handler shares with the server.
#[derive(Debug)]
struct Shared {
    /// Cancelled when the server shuts down.
    stop: CancellationToken,
}

async fn profile_handler(State(shared): State<Arc<Shared>>, uri: Uri) -> Response {
    match profile(&shared, uri.query()).await {
        Ok(body) => {
            let headers = [
                (header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream")),
                (header::CONTENT_DISPOSITION, HeaderValue::from_static("attachment; filename=\"profile\"")),
                (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            ];
            (headers, body).into_response()
        }
        Err(e) => {
            tracing::debug!(error = %e, "CPU profile not served");
            e.into_response()
        }
    }
}

/// Samples for the requested time and returns the gzip-compressed profile. Dropping the future (the client
/// went away) stops the profiler.
async fn profile(shared: &Shared, query: Option<&str>) -> Result<Vec<u8>, PprofError> {
    let seconds = parse_seconds(query)?;
    let slot = ProfilingSlot::acquire().ok_or(PprofError::Busy)?;
    // Starting resolves the blocklist's shared objects and warms the unwinder: blocking work.
    let session = tokio::task::spawn_blocking(move || Session::start(slot))
        .await
        .map_err(|e| PprofError::Start(e.to_string()))??;
    tracing::debug!(seconds, "CPU profile started");
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        () = shared.stop.cancelled() => tracing::debug!("CPU profile cut short by shutdown"),
    }
    // Symbolizing the stacks is blocking work too.
    tokio::task::spawn_blocking(move || session.finish())
        .await
        .map_err(|e| PprofError::Report(e.to_string()))?
}

/// The `seconds` query parameter (its first occurrence): [`DEFAULT_SECONDS`] when absent.
fn parse_seconds(query: Option<&str>) -> Result<u64, PprofError> {
    let value = query
        .unwrap_or_default()
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find_map(|(key, value)| (key == "seconds").then_some(value));
    let Some(value) = value else { return Ok(DEFAULT_SECONDS) };
    match value.parse::<u64>() {
        Ok(seconds) if (1..=MAX_SECONDS).contains(&seconds) => Ok(seconds),
        _ => Err(PprofError::BadSeconds { value: value.chars().take(MAX_ECHOED_VALUE).collect() }),
    }
}

// === impl ProfilingSlot ===

/// Whether a profile is running in this process (the profiler is process-wide).
static PROFILING: AtomicBool = AtomicBool::new(false);

/// The right to run the process's one profile; released when dropped.
#[derive(Debug)]
struct ProfilingSlot(());

impl ProfilingSlot {
    fn acquire() -> Option<Self> {
        PROFILING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then_some(Self(()))
    }
}

impl Drop for ProfilingSlot {
    fn drop(&mut self) {
        PROFILING.store(false, Ordering::Release);
    }
}

// === impl Session ===

/// A running profiler; dropping it stops sampling and frees the slot.
struct Session {
    // Field order is drop order: stop the profiler, then free the slot.
    guard: ::pprof::ProfilerGuard<'static>,
    _slot: ProfilingSlot,
}

impl Session {
    fn start(slot: ProfilingSlot) -> Result<Self, PprofError> {
        let guard = ::pprof::ProfilerGuardBuilder::default()
            .frequency(SAMPLE_FREQUENCY)
            .blocklist(BLOCKLIST)
            .build()
            .map_err(|e| match e {
                // Someone in the process drives the profiler without our slot.
                ::pprof::Error::Running => PprofError::Busy,
                e => PprofError::Start(e.to_string()),
            })?;
        Ok(Self { guard, _slot: slot })
    }

    /// Stops sampling and encodes what was sampled.
    fn finish(self) -> Result<Vec<u8>, PprofError> {
        let report = self.guard.report().build().map_err(|e| PprofError::Report(e.to_string()))?;
        drop(self);
        let profile = profile_from_report(&report);
        tracing::debug!(
            samples = profile.sample.len(),
            functions = profile.function.len(),
            "CPU profile collected"
        );
        Ok(encode_gzip(&profile))
    }
}

// === profile_from_report ===

/// Builds the [`proto::Profile`] of a sampled report (see the module docs for its shape). Stacks with a
/// nonpositive count are left out.
pub fn profile_from_report(report: &::pprof::Report) -> proto::Profile {
    let period = NANOS_PER_SECOND / i64::from(report.timing.frequency.max(1));
    let mut b = ProfileBuilder::default();
    b.string(""); // entry 0 must be ""
    let cpu_nanos = proto::ValueType { r#type: b.string("cpu"), unit: b.string("nanoseconds") };
    let samples_count = proto::ValueType { r#type: b.string("samples"), unit: b.string("count") };
    let thread_key = b.string("thread");
    let mut samples = Vec::with_capacity(report.data.len());
    for (frames, &count) in &report.data {
        let Ok(count) = i64::try_from(count) else { continue };
        if count <= 0 {
            continue;
        }
        let location_id =
            sampled_frames(&frames.frames).iter().flatten().map(|symbol| b.location(symbol)).collect();
        let label = vec![proto::Label {
            key: thread_key,
            str: b.string(&frames.thread_name_or_id()),
            ..Default::default()
        }];
        samples.push(proto::Sample { location_id, value: vec![count, count.saturating_mul(period)], label });
    }
    // The one mapping: the executable, already symbolized (so `go tool pprof` looks for no binary).
    let exe = std::env::current_exe().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let mapping = proto::Mapping {
        id: MAPPING_ID,
        filename: b.string(&exe),
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: true,
        ..Default::default()
    };
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    proto::Profile {
        sample_type: vec![samples_count, cpu_nanos],
        sample: samples,
        mapping: vec![mapping],
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
        time_nanos: report.timing.start_time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, nanos),
        duration_nanos: nanos(report.timing.duration),
        period_type: Some(cpu_nanos),
        period,
        ..Default::default()
    }
}

/// The id of the profile's one [`proto::Mapping`] (the executable).
const MAPPING_ID: u64 = 1;
/// How deep in a stack the sampler's own frames may reach.
const MAX_SAMPLER_FRAMES: usize = 8;

/// `frames` (leaf first) without the sampler's own frames on top: the signal handler and the trampoline are
/// already gone, but the unwinder it calls (`backtrace::…`, then pprof's `Trace::trace`) may remain where it
/// was not inlined into the handler (debug builds). They end at pprof's `<… as pprof::backtrace::Trace>::trace`.
fn sampled_frames(frames: &[Vec<::pprof::Symbol>]) -> &[Vec<::pprof::Symbol>] {
    let is_sampler_entry = |frame: &Vec<::pprof::Symbol>| {
        frame.iter().any(|symbol| {
            let name = symbol.name();
            name.starts_with("<pprof::backtrace::") && name.ends_with(" as pprof::backtrace::Trace>::trace")
        })
    };
    match frames.iter().take(MAX_SAMPLER_FRAMES).position(is_sampler_entry) {
        Some(entry) => &frames[entry + 1..],
        None => frames,
    }
}

/// The deduplicated tables of a profile under construction.
#[derive(Default)]
struct ProfileBuilder {
    strings: Vec<String>,
    string_index: HashMap<String, i64>,
    functions: Vec<proto::Function>,
    /// (name, system name, file) → function id.
    function_ids: HashMap<(i64, i64, i64), u64>,
    locations: Vec<proto::Location>,
    /// (function id, line) → location id.
    location_ids: HashMap<(u64, i64), u64>,
}

impl ProfileBuilder {
    /// The string table index of `s`, added if new.
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_index.get(s) {
            return i;
        }
        let i = i64::try_from(self.strings.len()).unwrap_or(i64::MAX);
        self.strings.push(s.to_owned());
        self.string_index.insert(s.to_owned(), i);
        i
    }

    /// The location id of `symbol`, added (with its function) if new.
    fn location(&mut self, symbol: &::pprof::Symbol) -> u64 {
        let name = self.string(&symbol.name());
        let system_name = self.string(&symbol.sys_name());
        let filename = match &symbol.filename {
            Some(path) => self.string(&path.to_string_lossy()),
            None => 0,
        };
        let next_function_id = self.functions.len() as u64 + 1;
        let function_id = *self.function_ids.entry((name, system_name, filename)).or_insert(next_function_id);
        if function_id == next_function_id {
            self.functions.push(proto::Function {
                id: function_id,
                name,
                system_name,
                filename,
                ..Default::default()
            });
        }
        let line = i64::from(symbol.lineno.unwrap_or(0));
        let next_location_id = self.locations.len() as u64 + 1;
        let location_id = *self.location_ids.entry((function_id, line)).or_insert(next_location_id);
        if location_id == next_location_id {
            self.locations.push(proto::Location {
                id: location_id,
                mapping_id: MAPPING_ID,
                line: vec![proto::Line { function_id, line, ..Default::default() }],
                ..Default::default()
            });
        }
        location_id
    }
}

// === gzip ===

/// The bytes served for `profile`: its protobuf encoding in a gzip container of stored deflate blocks.
pub fn encode_gzip(profile: &proto::Profile) -> Vec<u8> {
    gzip_stored(&profile.encode_to_vec())
}

/// The most one stored deflate block holds.
const MAX_STORED_BLOCK: usize = 0xFFFF;

/// `data` as a gzip member (RFC 1952) whose deflate stream (RFC 1951) is stored blocks only.
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let blocks = data.len().div_ceil(MAX_STORED_BLOCK).max(1);
    let mut out = Vec::with_capacity(10 + data.len() + 5 * blocks + 8);
    // ID1 ID2, CM = deflate, FLG = none, MTIME = 0, XFL = 0, OS = unknown (as Go writes it).
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    let mut chunks = data.chunks(MAX_STORED_BLOCK).peekable();
    if chunks.peek().is_none() {
        // An empty stream is one empty final block.
        out.extend_from_slice(&[1, 0x00, 0x00, 0xff, 0xff]);
    }
    while let Some(chunk) = chunks.next() {
        // BFINAL in bit 0, BTYPE = 00 (stored); the block's length fields start at the next byte.
        out.push(u8::from(chunks.peek().is_none()));
        let len = u16::try_from(chunk.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    // ISIZE: the input length modulo 2^32.
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// The CRC-32 lookup table (IEEE 802.3, reflected polynomial `0xEDB88320`).
const CRC32_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut c = n as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        table[n] = c;
        n += 1;
    }
    table
};

/// The CRC-32 gzip carries (the zlib/PNG/Ethernet one).
fn crc32(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |c, &b| CRC32_TABLE[usize::from((c as u8) ^ b)] ^ (c >> 8))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Reads a gzip member of stored blocks back (the test's own reader of the format).
    fn gunzip_stored(gz: &[u8]) -> Vec<u8> {
        assert_eq!(&gz[..4], &[0x1f, 0x8b, 8, 0], "header");
        let mut at = 10;
        let mut out = Vec::new();
        loop {
            let head = gz[at];
            assert_eq!(head >> 1, 0, "stored block");
            let len = u16::from_le_bytes([gz[at + 1], gz[at + 2]]);
            let nlen = u16::from_le_bytes([gz[at + 3], gz[at + 4]]);
            assert_eq!(len, !nlen);
            at += 5;
            out.extend_from_slice(&gz[at..at + usize::from(len)]);
            at += usize::from(len);
            if head & 1 == 1 {
                break;
            }
        }
        let crc = u32::from_le_bytes(gz[at..at + 4].try_into().unwrap());
        let size = u32::from_le_bytes(gz[at + 4..at + 8].try_into().unwrap());
        assert_eq!(gz.len(), at + 8, "trailing bytes");
        assert_eq!(crc, crc32(&out));
        assert_eq!(size as usize, out.len());
        out
    }

    #[test]
    fn crc32_matches_the_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"The quick brown fox jumps over the lazy dog"), 0x414F_A339);
    }

    #[test]
    fn gzip_stored_round_trips_across_block_boundaries() {
        for len in
            [0, 1, MAX_STORED_BLOCK - 1, MAX_STORED_BLOCK, MAX_STORED_BLOCK + 1, 3 * MAX_STORED_BLOCK + 7]
        {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let gz = gzip_stored(&data);
            assert_eq!(gunzip_stored(&gz), data, "len {len}");
            assert_eq!(gz.len(), 18 + len + 5 * len.div_ceil(MAX_STORED_BLOCK).max(1), "len {len}");
        }
    }

    #[test]
    fn encode_gzip_decodes_back_to_the_profile() {
        let profile = proto::Profile {
            string_table: vec![String::new(), "x".repeat(100_000)],
            period: 10,
            ..Default::default()
        };
        let decoded = proto::Profile::decode(gunzip_stored(&encode_gzip(&profile)).as_slice()).unwrap();
        assert_eq!(decoded, profile);
    }

    #[test]
    fn seconds_default_bounds_and_errors() {
        assert_eq!(parse_seconds(None).unwrap(), DEFAULT_SECONDS);
        assert_eq!(parse_seconds(Some("debug=1")).unwrap(), DEFAULT_SECONDS);
        assert_eq!(parse_seconds(Some("seconds=5")).unwrap(), 5);
        assert_eq!(parse_seconds(Some("x=1&seconds=300&seconds=9")).unwrap(), 300);
        for bad in
            ["seconds=0", "seconds=301", "seconds=-1", "seconds=abc", "seconds=", "seconds", "seconds=1.5"]
        {
            let e = parse_seconds(Some(bad)).unwrap_err();
            assert!(matches!(e, PprofError::BadSeconds { .. }), "{bad}");
            assert_eq!(e.status(), StatusCode::BAD_REQUEST);
            assert!(e.to_string().contains("`seconds`"), "{e}");
        }
        let long = format!("seconds={}", "9".repeat(500));
        let PprofError::BadSeconds { value } = parse_seconds(Some(&long)).unwrap_err() else { panic!() };
        assert_eq!(value.len(), MAX_ECHOED_VALUE);
    }

    #[test]
    fn listen_addr_is_loopback_and_zero_is_off() {
        assert_eq!(listen_addr(0), None);
        assert_eq!(listen_addr(6060), Some("127.0.0.1:6060".parse().unwrap()));
    }

    #[test]
    fn profile_tables_are_deduplicated() {
        let symbol = |name: &str, line| ::pprof::Symbol {
            name: Some(name.as_bytes().to_vec()),
            addr: None,
            lineno: Some(line),
            filename: None,
        };
        let stack = |frames: Vec<::pprof::Symbol>, thread_id| ::pprof::Frames {
            frames: frames.into_iter().map(|s| vec![s]).collect(),
            thread_name: String::new(),
            thread_id,
            sample_timestamp: SystemTime::now(),
        };
        let mut report = ::pprof::Report {
            data: HashMap::from([
                (stack(vec![symbol("a", 1), symbol("main", 9)], 1), 2),
                (stack(vec![symbol("a", 2), symbol("main", 9)], 2), 5),
                (stack(vec![symbol("idle", 1)], 3), 0),
            ]),
            timing: Default::default(),
        };
        report.timing.frequency = 50;
        let p = profile_from_report(&report);
        assert_eq!(p.sample.len(), 2, "the zero-count stack is left out");
        assert_eq!(p.function.len(), 2, "a, main");
        assert_eq!(p.location.len(), 3, "a:1, a:2, main:9");
        assert_eq!(p.period, 20_000_000);
        let mut strings = p.string_table.clone();
        strings.sort();
        strings.dedup();
        assert_eq!(strings.len(), p.string_table.len(), "no duplicate strings");
        for s in &p.sample {
            assert_eq!(s.value[1], s.value[0] * p.period);
            assert_eq!(p.string_table[s.label[0].key as usize], "thread");
        }
    }

    #[test]
    fn the_samplers_own_frames_are_dropped() {
        let frame = |name: &str| {
            vec![::pprof::Symbol {
                name: Some(name.as_bytes().to_vec()),
                addr: None,
                lineno: None,
                filename: None,
            }]
        };
        let sampled = vec![
            frame("backtrace::backtrace::trace_unsynchronized"),
            frame("<pprof::backtrace::backtrace_rs::Trace as pprof::backtrace::Trace>::trace"),
            frame("leaf"),
            frame("main"),
        ];
        assert_eq!(sampled_frames(&sampled), &sampled[2..]);
        assert_eq!(sampled_frames(&sampled[2..]), &sampled[2..], "nothing to drop");
        // Only the sampler's: an application's own `backtrace` frames stay.
        let own = vec![frame("backtrace::backtrace::trace_unsynchronized"), frame("main")];
        assert_eq!(sampled_frames(&own), &own[..]);
    }

    #[test]
    fn errors_answer_like_go() {
        let r = PprofError::Busy.into_response();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()["x-go-pprof"], "1");
        assert!(r.headers()[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/plain"));
        assert_eq!(
            PprofError::Busy.to_string(),
            "Could not enable CPU profiling: cpu profiling already in use"
        );
    }
}
