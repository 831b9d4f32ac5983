//! `vgpu_serve::pprof` over real HTTP: a CPU profile of a busy thread, requested from an ephemeral loopback
//! port, decodes (gunzip, then the generated prost types) into a consistent pprof profile.
//!
//! Set `VGPU_PPROF_SAVE=/some/file` to keep the served bytes (e.g. for `go tool pprof -top /some/file`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use vgpu_serve::pprof::{MAX_SECONDS, PROFILE_PATH, PprofServer, proto};

/// The profiler is process-wide: tests that profile take turns.
static PROFILER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A pprof server on an ephemeral loopback port; stops when `stop` is cancelled.
struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start() -> Server {
    let server = PprofServer::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0);
    let stop = CancellationToken::new();
    let task = tokio::spawn(server.serve(stop.clone().cancelled_owned()));
    Server { addr, stop, task }
}

/// An HTTP/1.1 answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET path` on a fresh connection, read to its close.
async fn get(addr: SocketAddr, path: &str) -> Answer {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Answer {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
    let head = std::str::from_utf8(&raw[..split]).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Answer { status, headers, body }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap().trim(), 16).unwrap();
        raw = &raw[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// CRC-32 (IEEE), bit by bit: independent of the crate's table-driven one.
fn crc32_bitwise(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Reads a gzip member (RFC 1952) whose deflate stream is stored blocks, checking CRC-32 and ISIZE.
fn gunzip(gz: &[u8]) -> Vec<u8> {
    assert!(gz.len() >= 18, "too short for gzip: {} bytes", gz.len());
    assert_eq!(&gz[..3], &[0x1f, 0x8b, 8], "gzip magic and deflate method");
    assert_eq!(gz[3], 0, "no optional header fields");
    let mut at = 10;
    let mut out = Vec::new();
    loop {
        let head = gz[at];
        assert_eq!((head >> 1) & 3, 0, "a stored block (BTYPE 00)");
        let len = u16::from_le_bytes([gz[at + 1], gz[at + 2]]);
        let nlen = u16::from_le_bytes([gz[at + 3], gz[at + 4]]);
        assert_eq!(len, !nlen, "LEN and NLEN agree");
        at += 5;
        out.extend_from_slice(&gz[at..at + usize::from(len)]);
        at += usize::from(len);
        if head & 1 == 1 {
            break;
        }
    }
    assert_eq!(gz.len(), at + 8, "nothing after the trailer");
    assert_eq!(u32::from_le_bytes(gz[at..at + 4].try_into().unwrap()), crc32_bitwise(&out), "CRC-32");
    assert_eq!(u32::from_le_bytes(gz[at + 4..at + 8].try_into().unwrap()) as usize, out.len(), "ISIZE");
    out
}

/// Keeps a thread busy until dropped.
struct Burner {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

#[inline(never)]
fn burn_cpu(stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
    }
    x
}

impl Burner {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread =
            std::thread::Builder::new().name("burner".into()).spawn(move || burn_cpu(&flag)).unwrap();
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Checks the profile's internal consistency; returns its function names.
fn check_profile(p: &proto::Profile) -> HashSet<String> {
    let strings = &p.string_table;
    assert_eq!(strings.first().map(String::as_str), Some(""), "string_table[0] is empty");
    let s = |i: i64| -> &str {
        let i = usize::try_from(i).expect("nonnegative string index");
        strings.get(i).unwrap_or_else(|| panic!("string index {i} out of {}", strings.len()))
    };
    let types: Vec<_> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let period_type = p.period_type.expect("period_type");
    assert_eq!((s(period_type.r#type), s(period_type.unit)), ("cpu", "nanoseconds"));
    assert_eq!(p.period, 10_000_000, "100 Hz");
    let location_ids: HashSet<u64> = p.location.iter().map(|l| l.id).collect();
    let function_ids: HashSet<u64> = p.function.iter().map(|f| f.id).collect();
    assert_eq!(location_ids.len(), p.location.len(), "location ids are unique");
    assert_eq!(function_ids.len(), p.function.len(), "function ids are unique");
    assert!(!location_ids.contains(&0) && !function_ids.contains(&0), "ids are nonzero");
    for sample in &p.sample {
        assert_eq!(sample.value.len(), 2);
        assert!(sample.value[0] > 0);
        assert_eq!(sample.value[1], sample.value[0] * p.period);
        for id in &sample.location_id {
            assert!(location_ids.contains(id), "sample references missing location {id}");
        }
        for label in &sample.label {
            s(label.key);
            s(label.str);
        }
    }
    for location in &p.location {
        assert!(!location.line.is_empty());
        for line in &location.line {
            assert!(function_ids.contains(&line.function_id), "missing function {}", line.function_id);
        }
    }
    p.function
        .iter()
        .map(|f| {
            s(f.system_name);
            s(f.filename);
            s(f.name).to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_of_a_busy_thread_decodes_and_is_consistent() {
    let _turn = PROFILER.lock().await;
    let server = start().await;
    let burner = Burner::start();
    let started = Instant::now();
    let answer = get(server.addr, &format!("{PROFILE_PATH}?seconds=1")).await;
    let took = started.elapsed();
    drop(burner);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("application/octet-stream"));
    assert_eq!(answer.header("content-disposition"), Some("attachment; filename=\"profile\""));
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(10), "took {took:?}");
    if let Some(path) = std::env::var_os("VGPU_PPROF_SAVE") {
        std::fs::write(path, &answer.body).unwrap();
    }

    let profile = proto::Profile::decode(gunzip(&answer.body).as_slice()).unwrap();
    let functions = check_profile(&profile);
    assert!(!profile.sample.is_empty(), "a busy thread got sampled");
    let duration = Duration::from_nanos(profile.duration_nanos.try_into().unwrap());
    assert!(duration >= Duration::from_millis(950) && duration < Duration::from_secs(3), "{duration:?}");
    let now_nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let age = Duration::from_nanos(u64::try_from(now_nanos).unwrap() - profile.time_nanos as u64);
    assert!(age < Duration::from_secs(30), "time_nanos is the start: {age:?} ago");
    assert!(functions.iter().any(|f| f.contains("burn_cpu")), "the busy function is named: {functions:?}");
    for sample in &profile.sample {
        let leaf = profile.location.iter().find(|l| l.id == sample.location_id[0]).unwrap();
        let function = profile.function.iter().find(|f| f.id == leaf.line[0].function_id).unwrap();
        let name = &profile.string_table[function.name as usize];
        assert!(!name.contains("pprof::backtrace"), "the sampler's own frame {name} is a leaf");
    }
    let exe = &profile.mapping[0];
    assert!(exe.has_functions && !profile.string_table[exe.filename as usize].is_empty());
    let threads: HashSet<&str> =
        profile.sample.iter().map(|s| profile.string_table[s.label[0].str as usize].as_str()).collect();
    assert!(threads.contains("burner"), "samples are labelled by thread: {threads:?}");

    server.stop.cancel();
    tokio::time::timeout(Duration::from_secs(15), server.task).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_profile_while_one_runs_is_refused() {
    let _turn = PROFILER.lock().await;
    let server = start().await;
    let addr = server.addr;
    let first = tokio::spawn(async move { get(addr, &format!("{PROFILE_PATH}?seconds=2")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = get(addr, &format!("{PROFILE_PATH}?seconds=1")).await;
    assert_eq!(second.status, 409, "{}", second.text());
    assert_eq!(second.header("x-go-pprof"), Some("1"));
    assert_eq!(second.text(), "Could not enable CPU profiling: cpu profiling already in use\n");
    let first = first.await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    check_profile(&proto::Profile::decode(gunzip(&first.body).as_slice()).unwrap());
    // Once it is done, the next one runs.
    let third = get(addr, &format!("{PROFILE_PATH}?seconds=1")).await;
    assert_eq!(third.status, 200, "{}", third.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_stops_its_profile() {
    let _turn = PROFILER.lock().await;
    let server = start().await;
    let mut conn = TcpStream::connect(server.addr).await.unwrap();
    conn.write_all(format!("GET {PROFILE_PATH}?seconds=60 HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(conn);
    // The profiler is free again well before the abandoned 60 s would have ended.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = get(server.addr, &format!("{PROFILE_PATH}?seconds=1")).await;
        if answer.status == 200 {
            break;
        }
        assert_eq!(answer.status, 409, "{}", answer.text());
        assert!(Instant::now() < deadline, "the abandoned profile still runs");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_a_running_profile_early() {
    let _turn = PROFILER.lock().await;
    let server = start().await;
    let addr = server.addr;
    let started = Instant::now();
    let request = tokio::spawn(async move { get(addr, &format!("{PROFILE_PATH}?seconds=60")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.stop.cancel();
    let answer = tokio::time::timeout(Duration::from_secs(10), request).await.unwrap().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let profile = proto::Profile::decode(gunzip(&answer.body).as_slice()).unwrap();
    check_profile(&profile);
    assert!(profile.duration_nanos < 10_000_000_000, "cut short: {} ns", profile.duration_nanos);
    tokio::time::timeout(Duration::from_secs(15), server.task).await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn bad_seconds_answer_400_naming_the_parameter() {
    // Rejected before the profiler is touched: no turn needed.
    let server = start().await;
    for bad in ["0", "-5", "abc", &(MAX_SECONDS + 1).to_string(), "1.5", ""] {
        let answer = get(server.addr, &format!("{PROFILE_PATH}?seconds={bad}")).await;
        assert_eq!(answer.status, 400, "seconds={bad}: {}", answer.text());
        assert_eq!(answer.header("x-go-pprof"), Some("1"));
        let text = answer.text();
        assert!(text.contains("`seconds`") && text.contains(&format!("from 1 to {MAX_SECONDS}")), "{text}");
    }
    let answer = get(server.addr, "/debug/pprof/heap").await;
    assert_eq!(answer.status, 404);
}

#[tokio::test]
async fn binding_a_taken_port_is_a_typed_error() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap();
    let e = vgpu_serve::pprof::serve_pprof(addr, std::future::pending()).await.unwrap_err();
    assert!(matches!(e, vgpu_serve::pprof::PprofError::Bind { addr: a, .. } if a == addr), "{e}");
}
