//! Property tests: every decoder of bytes from a peer, a file or the wire
//! takes arbitrary input and answers with a value or a clean error, never a
//! panic and never an allocation driven by a length it has not received.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, io};

use fenced_core::{
    Batch, Capacity, ClusterTime, Command, LeaseTable, OwnerId, ResourceName, TableSnapshot,
};
use openraft::{
    error::{InstallSnapshotError, RaftError},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
    CommittedLeaderId, EntryPayload, Membership, Vote,
};
use proptest::prelude::*;
use serde::{de::DeserializeOwned, Serialize};

use crate::{
    clock::floor::{self as time_floor, decode_slot, encode_slot, LeaderTime, TimeFloor, SLOT_LEN},
    codec,
    node::config::RunSettings,
    peer::network::{
        read_frame, read_frame_within, reply_header, split_reply, MessageTime, PeerVersion,
        REPLY_HEADER_LEN, REQUEST_HEADER_LEN,
    },
    replication::pre_vote::{PreVoteRequest, PreVoteResponse},
    state_machine::parking::Parking,
    state_machine::StateMachine,
    storage::log_store::LogStore,
    types::{Entry, LogId, Node, NodeId, TypeConfig},
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a test runtime")
}

fn log_id(term: u64, index: u64) -> LogId {
    openraft::LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn batch() -> Batch {
    Batch {
        stamp: ClusterTime::from_millis(1_234),
        commands: vec![
            Command::AcquireBounded {
                resource: ResourceName::new("billing:run").unwrap(),
                owner_id: OwnerId::random(),
                ttl_ms: 30_000,
                wait_ms: 5_000,
                capacity: Capacity {
                    max_live_leases: 10,
                    max_waiters: 10,
                },
            },
            Command::Release {
                resource: ResourceName::new("a").unwrap(),
                owner_id: OwnerId::random(),
                token: fenced_core::Token::new(3).unwrap(),
            },
        ],
    }
}

fn membership() -> Membership<NodeId, Node> {
    let nodes: BTreeMap<NodeId, Node> = (1..=3)
        .map(|id| {
            (
                id,
                Node {
                    peer_addr: format!("127.0.0.1:720{id}"),
                    client_addr: format!("127.0.0.1:710{id}"),
                },
            )
        })
        .collect();
    Membership::new(vec![nodes.keys().copied().collect()], nodes)
}

fn append_entries() -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(3, 9)),
        entries: vec![
            Entry {
                log_id: log_id(3, 10),
                payload: EntryPayload::Normal(batch()),
            },
            Entry {
                log_id: log_id(3, 11),
                payload: EntryPayload::Membership(membership()),
            },
            Entry {
                log_id: log_id(3, 12),
                payload: EntryPayload::Blank,
            },
        ],
        leader_commit: Some(log_id(3, 10)),
    }
}

fn install_snapshot() -> InstallSnapshotRequest<TypeConfig> {
    InstallSnapshotRequest {
        vote: Vote::new_committed(3, 1),
        meta: openraft::SnapshotMeta {
            last_log_id: Some(log_id(3, 10)),
            last_membership: openraft::StoredMembership::new(Some(log_id(3, 1)), membership()),
            snapshot_id: "3-10-1".into(),
        },
        offset: 0,
        data: vec![1, 2, 3, 4, 5, 6, 7, 8],
        done: true,
    }
}

fn table_snapshot() -> TableSnapshot {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let acquire = |res: &str, owner, wait_ms| Command::Acquire {
        resource: ResourceName::new(res).unwrap(),
        owner_id: owner,
        ttl_ms: 30_000,
        wait_ms,
    };
    table.apply(&Batch {
        stamp: ClusterTime::from_millis(10),
        commands: vec![
            acquire("x", a, 0),
            acquire("x", b, 9_000),
            acquire("y", b, 0),
        ],
    });
    table.snapshot()
}

/// The snapshot file's layout (state_machine/snapshots.rs), for making
/// valid ones.
#[derive(Serialize)]
struct SnapshotBodyShape {
    last_applied: Option<LogId>,
    membership: openraft::StoredMembership<NodeId, Node>,
    table: TableSnapshot,
}

#[derive(Serialize)]
struct SnapshotFileShape {
    meta: openraft::SnapshotMeta<NodeId, Node>,
    body: Vec<u8>,
}

fn snapshot_body() -> Vec<u8> {
    let body = SnapshotBodyShape {
        last_applied: Some(log_id(3, 10)),
        membership: openraft::StoredMembership::new(Some(log_id(3, 1)), membership()),
        table: table_snapshot(),
    };
    codec::encode("snapshot", &body).unwrap()
}

fn snapshot_file(body: Vec<u8>) -> Vec<u8> {
    let file = SnapshotFileShape {
        meta: install_snapshot().meta,
        body,
    };
    codec::encode("snapshot file", &file).unwrap()
}

/// The inputs made of `junk` for a decoder whose valid input is `valid`:
/// the junk itself, the junk behind the right version byte, the valid
/// bytes with junk XORed in at junk-chosen places, and the valid bytes cut
/// short.
fn inputs(valid: &[u8], junk: &[u8]) -> Vec<Vec<u8>> {
    let mut versioned = vec![codec::FORMAT_VERSION];
    versioned.extend_from_slice(junk);
    let mut mutated = valid.to_vec();
    for pair in junk.chunks(2) {
        if let [at, xor] = pair {
            let i = usize::from(*at) * 31 % mutated.len();
            mutated[i] ^= xor;
        }
    }
    let cut = valid[..junk.len() % (valid.len() + 1)].to_vec();
    vec![junk.to_vec(), versioned, mutated, cut]
}

/// Decodes every input made of `junk`; a value that decodes encodes again.
fn decodes_cleanly<T: Serialize + DeserializeOwned>(what: &'static str, valid: &T, junk: &[u8]) {
    let bytes = codec::encode(what, valid).expect("the valid value encodes");
    codec::decode::<T>(what, &bytes).expect("the valid value decodes");
    for input in inputs(&bytes, junk) {
        match codec::decode::<T>(what, &input) {
            Ok(value) => {
                codec::encode(what, &value).expect("a decoded value encodes again");
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

type AppendReply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
type VoteReply = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
type SnapshotReply =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_peer_frame_of_any_bytes_is_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let rt = runtime();
        match rt.block_on(read_frame(&mut &bytes[..])) {
            Ok(None) => prop_assert!(bytes.len() < 4 || bytes.is_empty()),
            Ok(Some(frame)) => {
                let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
                prop_assert_eq!(frame.len(), len);
                prop_assert_eq!(&frame[..], &bytes[4..4 + len]);
            }
            Err(e) => prop_assert!(matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData
            )),
        }
        // Under a small cap, whatever the prefix says.
        if let Ok(Some(frame)) = rt.block_on(read_frame_within(&mut &bytes[..], 64)) {
            prop_assert!(frame.len() <= 64);
        }
    }

    #[test]
    fn a_request_or_reply_header_of_any_bytes_splits_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
        match MessageTime::split(PeerVersion::V3, &bytes) {
            Some((time, rest)) => {
                prop_assert!(bytes.len() >= REQUEST_HEADER_LEN);
                prop_assert_eq!(rest.len(), bytes.len() - REQUEST_HEADER_LEN);
                let again = time.encode();
                prop_assert_eq!(MessageTime::split(PeerVersion::V3, &again).map(|(t, _)| t), Some(time));
            }
            None => prop_assert!(bytes.len() < REQUEST_HEADER_LEN),
        }
        let v2 = PeerVersion::V2.request_header_len();
        match MessageTime::split(PeerVersion::V2, &bytes) {
            Some((time, rest)) => {
                prop_assert_eq!(rest.len(), bytes.len() - v2);
                prop_assert_eq!(time.at.term, 0);
            }
            None => prop_assert!(bytes.len() < v2),
        }
        match split_reply(&bytes) {
            Ok((floor, rest)) => {
                prop_assert_eq!(rest.len(), bytes.len() - REPLY_HEADER_LEN);
                prop_assert_eq!(reply_header(PeerVersion::V3, floor), bytes[..REPLY_HEADER_LEN].to_vec());
            }
            Err(e) => {
                prop_assert!(bytes.len() < REPLY_HEADER_LEN);
                prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            }
        }
    }

    #[test]
    fn every_raft_call_body_decodes_or_is_refused(junk in proptest::collection::vec(any::<u8>(), 0..256)) {
        decodes_cleanly("append_entries", &append_entries(), &junk);
        decodes_cleanly("vote", &VoteRequest::new(Vote::new(4, 2), Some(log_id(3, 12))), &junk);
        decodes_cleanly("install_snapshot", &install_snapshot(), &junk);
        decodes_cleanly("pre_vote", &PreVoteRequest { candidate: 2, last_log_id: Some(log_id(3, 12)) }, &junk);
        decodes_cleanly::<AppendReply>("append_entries", &Ok(AppendEntriesResponse::Success), &junk);
        decodes_cleanly::<VoteReply>(
            "vote",
            &Ok(VoteResponse { vote: Vote::new(4, 2), vote_granted: true, last_log_id: Some(log_id(3, 12)) }),
            &junk,
        );
        decodes_cleanly::<SnapshotReply>("install_snapshot", &Ok(InstallSnapshotResponse { vote: Vote::new_committed(3, 1) }), &junk);
        decodes_cleanly("pre_vote", &PreVoteResponse { granted: true }, &junk);
    }

    #[test]
    fn the_storage_codec_decodes_any_bytes_or_refuses_them(junk in proptest::collection::vec(any::<u8>(), 0..256)) {
        decodes_cleanly("batch", &batch(), &junk);
        decodes_cleanly::<EntryPayload<TypeConfig>>("log entry", &EntryPayload::Normal(batch()), &junk);
        decodes_cleanly::<EntryPayload<TypeConfig>>("log entry", &EntryPayload::Membership(membership()), &junk);
        decodes_cleanly("vote", &Vote::<NodeId>::new_committed(3, 1), &junk);
        decodes_cleanly("log id", &Some(log_id(3, 10)), &junk);
    }

    #[test]
    fn a_table_snapshot_of_any_bytes_loads_or_is_refused(junk in proptest::collection::vec(any::<u8>(), 0..256)) {
        let valid = table_snapshot();
        let bytes = codec::encode("table", &valid).unwrap();
        for input in inputs(&bytes, &junk) {
            if let Ok(snapshot) = codec::decode::<TableSnapshot>("table", &input) {
                // Loaded only when every invariant holds.
                if let Ok(table) = LeaseTable::from_snapshot(snapshot) {
                    prop_assert!(table.check_invariants().is_ok());
                }
            }
            // Built as it is decoded, as a node loads its snapshot: the
            // same verdict, and the same table when loaded.
            let seed = fenced_core::TableSeed { history_len: fenced_core::DEFAULT_HISTORY_PER_RESOURCE };
            let streamed = codec::decode_seed("table", &input, seed);
            let whole = codec::decode::<TableSnapshot>("table", &input)
                .ok()
                .and_then(|s| LeaseTable::from_snapshot(s).ok());
            prop_assert_eq!(streamed.is_ok(), whole.is_some());
            if let (Ok(streamed), Some(whole)) = (streamed, whole) {
                prop_assert!(streamed.check_invariants().is_ok());
                prop_assert_eq!(streamed.snapshot(), whole.snapshot());
            }
        }
    }

    #[test]
    fn a_cluster_time_slot_of_any_bytes_decodes_only_when_whole(slot in any::<[u8; SLOT_LEN]>(), t in any::<u64>()) {
        if let Some(v) = decode_slot(&slot) {
            // A slot of format 1 decodes too, and is written back as 2.
            if slot[3] == 2 {
                prop_assert_eq!(encode_slot(v), slot);
            }
        }
        let lt = LeaderTime::new(t / 3, ClusterTime::from_millis(t));
        prop_assert_eq!(decode_slot(&encode_slot(lt)), Some(lt));
    }

    #[test]
    fn a_config_file_of_any_text_parses_or_names_its_problem(text in "[a-z_ =\"0-9.\\n\\[\\]:/,-]{0,200}") {
        if let Ok(settings) = toml::from_str::<RunSettings>(&text) {
            // Whatever parsed is checked like flags: a value or an error.
            let _ = settings.into_node_config();
        }
    }

    #[test]
    fn a_config_file_with_any_numbers_is_bounded_by_name(
        key in prop::sample::select(vec![
            "max_connections", "max_concurrent_streams", "http2_keepalive_interval_ms",
            "http2_keepalive_timeout_ms", "idle_timeout_ms", "max_live_leases", "max_waiters",
            "max_snapshot_bytes", "max_batch", "max_pending", "max_parked", "heartbeat_ms",
            "election_timeout_ms", "snapshot_logs", "request_timeout_ms", "ttl_min_ms",
            "max_pending_handshakes", "max_pending_handshakes_per_source",
        ]),
        value in any::<i64>(),
    ) {
        let text = format!(
            "id = 1\ndata_dir = \"/tmp/x\"\nlisten = \"127.0.0.1:1\"\npeer_listen = \"127.0.0.1:2\"\n\
             initial_cluster = \"1=127.0.0.1:2\"\n{key} = {value}"
        );
        match toml::from_str::<RunSettings>(&text) {
            Ok(settings) => {
                if let Err(e) = settings.into_node_config() {
                    prop_assert!(e.starts_with(key), "{e}");
                }
            }
            // Negative or too large for the field: the parser names it.
            Err(e) => prop_assert!(e.to_string().contains(key), "{e}"),
        }
    }
}

proptest! {
    // Each case opens files: fewer of them.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_snapshot_file_of_any_bytes_is_loaded_or_refused_at_open(junk in proptest::collection::vec(any::<u8>(), 0..256)) {
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(&dir.path().join("raft-log")).unwrap();
        let body = snapshot_body();
        let file = snapshot_file(body.clone());
        let open = |i: usize, bytes: &[u8]| {
            let state = dir.path().join(format!("state-{i}"));
            std::fs::create_dir_all(&state).unwrap();
            std::fs::write(state.join("snapshot.bin"), bytes).unwrap();
            StateMachine::open(
                &state,
                Parking::new(4),
                log.purge_horizon(),
                fenced_core::DEFAULT_HISTORY_PER_RESOURCE,
            )
        };
        // The valid file loads: the mutations below start from a real one.
        let sm = open(0, &file).expect("the valid snapshot file loads");
        prop_assert_eq!(sm.shared().live_leases(), 2);
        // The whole file mutated, and a valid file around a mutated body.
        let mut cases = inputs(&file, &junk);
        cases.extend(inputs(&body, &junk).into_iter().map(snapshot_file));
        for (i, input) in cases.iter().enumerate() {
            // A value or a storage error; a panic fails the test.
            let _ = open(i + 1, input);
        }
    }

    #[test]
    fn a_cluster_time_file_of_any_bytes_opens_at_a_whole_slot_or_zero(junk in proptest::collection::vec(any::<u8>(), 0..8192), t in any::<u64>(), at in 0usize..8192) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(time_floor::FILE_NAME);
        std::fs::write(&path, &junk).unwrap();
        let floor = TimeFloor::open(dir.path()).unwrap();
        // Whatever it read came from a slot that passed its check.
        let got = floor.leader_time();
        let from_a_slot = (0..junk.len()).any(|i| {
            decode_slot(&junk[i..(i + SLOT_LEN).min(junk.len())]) == Some(got)
        });
        prop_assert!(got == LeaderTime::ZERO || from_a_slot, "{:?} read from no whole slot", got);
        // A whole slot written anywhere never makes open fail.
        let mut bytes = junk.clone();
        let slot = encode_slot(LeaderTime::new(t / 2, ClusterTime::from_millis(t)));
        let at = at.min(bytes.len());
        bytes.splice(at..at, slot);
        std::fs::write(&path, &bytes).unwrap();
        prop_assert!(TimeFloor::open(dir.path()).is_ok());
    }
}
