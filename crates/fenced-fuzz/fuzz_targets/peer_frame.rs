//! Bytes a connection sends on the peer port after its preface: frames read
//! as a Raft connection reads them, each split and decoded as the node
//! answering it would (`fenced_server::testing::fuzzing::raft_request`). The first
//! byte picks the connection's version.
#![no_main]

use std::{
    future::Future,
    io,
    pin::pin,
    task::{Context, Poll, Waker},
};

use fenced_server::{
    peer::network::{read_frame_within, PeerVersion},
    testing::fuzzing::raft_request,
};
use libfuzzer_sys::fuzz_target;

/// The frame cap for this target: small, so a length prefix over it is
/// refused as a real one over `peer_frame_max_bytes` is, within the
/// fuzzer's input sizes.
const CAP: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&version, mut stream)) = data.split_first() else {
        return;
    };
    let version = if version & 1 == 0 {
        PeerVersion::V3
    } else {
        PeerVersion::V2
    };
    loop {
        let before = stream;
        let frame = match at_once(read_frame_within(&mut stream, CAP)) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData
                    ),
                    "a frame refused as {e}"
                );
                break;
            }
        };
        // Exactly the bytes its length announced, no more read.
        assert!(frame.len() <= CAP);
        assert_eq!(before[..4], (frame.len() as u32).to_be_bytes());
        assert_eq!(before[4..4 + frame.len()], frame[..]);
        assert_eq!(stream.len(), before.len() - 4 - frame.len());
        request(version, &frame);
    }
});

/// One request frame: refused as malformed, or taken; a message taken
/// is taken again, with the same time, when it comes encoded again behind
/// that time in this build's layout (version 3).
fn request(version: PeerVersion, frame: &[u8]) {
    let (call, time, again) = match raft_request(version, frame) {
        Ok(taken) => taken,
        Err(e) => {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            return;
        }
    };
    let mut v3 = vec![call as u8];
    v3.extend_from_slice(&time.encode());
    v3.extend_from_slice(&again);
    match raft_request(PeerVersion::V3, &v3) {
        Ok(retaken) => assert_eq!(retaken, (call, time, again)),
        Err(e) => panic!("{} taken, then refused encoded again: {e}", call.name()),
    }
}

/// Runs a read from a byte slice, which never waits.
fn at_once<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a read from a byte slice waited"),
    }
}
