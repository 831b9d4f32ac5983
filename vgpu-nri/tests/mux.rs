//! The multiplexer's framing, property-tested: frames decode whatever way the trunk bytes are split;
//! what we write is cut at ttrpc message boundaries and 4096 bytes; a running `Mux` delivers each
//! connection's bytes intact whatever framing the peer uses (empty frames, frames for connections nobody
//! opened, any chunk sizes).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vgpu_nri::mux::{
    Frame, FrameDecoder, HEADER_LEN, MessageSplitter, Mux, MuxEnd, TTRPC_HEADER_LEN, WRITE_CHUNK,
    encode_frames,
};

fn ttrpc_message(body: &[u8], stream: u32) -> Vec<u8> {
    let mut m = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    m.extend_from_slice(&stream.to_be_bytes());
    m.extend_from_slice(&[1, 0]);
    m.extend_from_slice(body);
    m
}

/// Splits `bytes` at the given cut points (taken modulo the length).
fn pieces(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
}

proptest! {
    #[test]
    fn frames_survive_any_split(
        frames in prop::collection::vec((1u32..5, prop::collection::vec(any::<u8>(), 0..300)), 1..12),
        cuts in prop::collection::vec(any::<usize>(), 0..20),
    ) {
        let mut wire = Vec::new();
        for (conn, payload) in &frames {
            encode_frames(*conn, payload, &mut wire);
        }
        prop_assert_eq!(wire.len(), frames.iter().map(|(_, p)| HEADER_LEN + p.len()).sum::<usize>());
        let mut decoder = FrameDecoder::default();
        let mut got = Vec::new();
        for piece in pieces(&wire, &cuts) {
            decoder.push(&piece);
            while let Some(frame) = decoder.next_frame().unwrap() {
                got.push(frame);
            }
        }
        let want: Vec<Frame> = frames.into_iter().map(|(conn, payload)| Frame { conn, payload }).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(decoder.pending(), 0);
    }

    #[test]
    fn outgoing_chunks_never_span_messages_or_exceed_4096(
        bodies in prop::collection::vec(0usize..10_000, 1..6),
        cuts in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let messages: Vec<Vec<u8>> = bodies
            .iter()
            .enumerate()
            .map(|(i, &n)| ttrpc_message(&vec![u8::try_from(i).unwrap(); n], u32::try_from(2 * i + 1).unwrap()))
            .collect();
        let stream = messages.concat();
        let mut splitter = MessageSplitter::default();
        let mut chunks = Vec::new();
        for piece in pieces(&stream, &cuts) {
            splitter.push(&piece);
            while let Some(chunk) = splitter.next_chunk() {
                chunks.push(chunk);
            }
        }
        prop_assert_eq!(chunks.concat(), stream);
        prop_assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= WRITE_CHUNK));
        // Every message boundary is a chunk boundary.
        let mut boundaries = std::collections::BTreeSet::new();
        let mut at = 0;
        for c in &chunks {
            at += c.len();
            boundaries.insert(at);
        }
        let mut end = 0;
        for m in &messages {
            end += m.len();
            prop_assert!(boundaries.contains(&end), "message ending at {} is split across a frame", end);
            prop_assert!(m.len() >= TTRPC_HEADER_LEN);
        }
    }

    #[test]
    fn a_running_mux_delivers_bytes_whatever_the_peer_framing(
        to_one in prop::collection::vec(any::<u8>(), 0..20_000),
        to_two in prop::collection::vec(any::<u8>(), 0..5_000),
        sizes in prop::collection::vec(0usize..5000, 1..10),
        reply_body in 0usize..12_000,
    ) {
        mux_round_trip(&to_one, &to_two, &sizes, reply_body);
    }
}

/// Runs a `Mux` over an in-memory trunk: the peer sends `to_one` and `to_two` framed in `sizes`, we answer
/// one ttrpc message of `reply_body` bytes on connection 2, then the peer hangs up.
fn mux_round_trip(to_one: &[u8], to_two: &[u8], sizes: &[usize], reply_body: usize) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (ours, mut peer) = tokio::io::duplex(1 << 16);
        let mut mux = Mux::new(ours, &[1, 2]).unwrap();
        let mut one = mux.take(1).unwrap();
        let mut two = mux.take(2).unwrap();
        // The peer frames each connection's bytes in its own sizes, with empty frames and frames for
        // connection 7 (nobody opened it) in between.
        let mut wire = Vec::new();
        for (conn, data) in [(1u32, to_one), (2, to_two)] {
            let mut rest = data;
            let mut i = 0;
            while !rest.is_empty() {
                // A size of 0 is an empty frame; the next frame still carries at least one byte, so
                // the loop ends even when every size is 0.
                let size = sizes[i % sizes.len()];
                if size == 0 {
                    encode_frames(conn, &[], &mut wire);
                }
                let n = size.max(1).min(rest.len());
                encode_frames(conn, &rest[..n], &mut wire);
                encode_frames(7, b"ignored", &mut wire);
                rest = &rest[n..];
                i += 1;
            }
        }
        let writer = tokio::spawn(async move {
            peer.write_all(&wire).await.unwrap();
            peer
        });
        let mut got_one = vec![0u8; to_one.len()];
        one.read_exact(&mut got_one).await.unwrap();
        let mut got_two = vec![0u8; to_two.len()];
        two.read_exact(&mut got_two).await.unwrap();
        assert_eq!(got_one, to_one);
        assert_eq!(got_two, to_two);
        let mut peer = writer.await.unwrap();

        // What we write back: one ttrpc message on connection 2, framed at most 4096 bytes per frame.
        let reply = ttrpc_message(&vec![9u8; reply_body], 1);
        two.write_all(&reply).await.unwrap();
        let mut decoder = FrameDecoder::default();
        let mut back = Vec::new();
        let mut buf = vec![0u8; 8192];
        while back.len() < reply.len() {
            let n = peer.read(&mut buf).await.unwrap();
            assert!(n > 0);
            decoder.push(&buf[..n]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                assert_eq!(frame.conn, 2);
                assert!(frame.payload.len() <= 4096 && !frame.payload.is_empty());
                back.extend(frame.payload);
            }
        }
        assert_eq!(back, reply);

        // The peer hangs up: the mux ends, each connection reads end-of-file.
        drop(peer);
        assert_eq!(mux.watcher().ended().await, MuxEnd::Eof);
        assert_eq!(one.read(&mut buf).await.unwrap(), 0);
    });
}

#[test]
fn peer_framing_with_only_empty_sizes_still_ends() {
    // Once a case with every size 0 made the test loop forever while framing the peer's bytes.
    mux_round_trip(&[1, 2, 3], &[4], &[0], 10);
}

#[tokio::test]
async fn a_trunk_that_ends_inside_a_frame_is_an_error() {
    let (ours, mut peer) = tokio::io::duplex(1024);
    let mux = Mux::new(ours, &[1]).unwrap();
    peer.write_all(&[0, 0, 0, 1, 0, 0, 0, 9, 1, 2]).await.unwrap();
    drop(peer);
    let end = mux.watcher().ended().await;
    assert!(
        matches!(end, MuxEnd::Failed(ref e) if e.to_string().contains("ended inside a frame")),
        "{end:?}"
    );
}

#[tokio::test]
async fn an_oversized_frame_closes_the_mux() {
    let (ours, mut peer) = tokio::io::duplex(1024);
    let mux = Mux::new(ours, &[1]).unwrap();
    peer.write_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
    let end = mux.watcher().ended().await;
    assert!(matches!(end, MuxEnd::Failed(ref e) if e.to_string().contains("more than the")), "{end:?}");
}
