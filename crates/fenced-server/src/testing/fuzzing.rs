//! The decoders of bytes a peer or a disk hands a node, as the node runs
//! them, callable without a node: the entry points of the fuzz targets
//! (`crates/fenced-fuzz`). Not an API; nothing else calls these.

use std::io;

use fenced_core::LeaseTable;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

use crate::{
    peer::handoff::TimeoutNow,
    peer::network::{
        check_snapshot_chunk, decode_call, encode_call, split_request, MessageTime, PeerVersion,
        RaftCall,
    },
    replication::pre_vote::PreVoteRequest,
    security::limits::ServerLimits,
    types::{NodeId, SnapshotMeta, TypeConfig},
};

/// A Raft request frame (after its length) decoded as
/// [`crate::node::peer_listener`] splits it and
/// [`crate::replication::follower::RaftPeer::answer`] decodes and checks
/// it before answering: its call, its time (of the message's term where
/// the answer takes it so) and its message encoded again. An error is the
/// refusal that closes the connection.
pub fn raft_request(
    version: PeerVersion,
    frame: &[u8],
) -> io::Result<(RaftCall, MessageTime, Vec<u8>)> {
    let (call, time, body) = split_request(version, frame)?;
    let (time, again) = match call {
        RaftCall::AppendEntries => {
            let req: AppendEntriesRequest<TypeConfig> = decode_call(call, body)?;
            let time = time.of_term(version, req.vote.leader_id().get_term())?;
            (time, encode_call(call, &req)?)
        }
        RaftCall::Vote => {
            let req: VoteRequest<NodeId> = decode_call(call, body)?;
            (time, encode_call(call, &req)?)
        }
        RaftCall::InstallSnapshot => {
            let req: InstallSnapshotRequest<TypeConfig> = decode_call(call, body)?;
            check_snapshot_chunk(&req, ServerLimits::default().max_snapshot_bytes)?;
            let time = time.of_term(version, req.vote.leader_id().get_term())?;
            (time, encode_call(call, &req)?)
        }
        RaftCall::PreVote => {
            let req: PreVoteRequest = decode_call(call, body)?;
            (time, encode_call(call, &req)?)
        }
        RaftCall::TimeoutNow => {
            let req: TimeoutNow = decode_call(call, body)?;
            (time, encode_call(call, &req)?)
        }
    };
    Ok((call, time, again))
}

/// A snapshot file's meta and table, decoded as a node loads its snapshot
/// at open, remembering `history_len` grants per resource.
pub fn snapshot_file(
    bytes: &[u8],
    history_len: usize,
) -> Result<(SnapshotMeta, LeaseTable), String> {
    crate::state_machine::file_table(bytes, history_len)
}

/// The seed corpus of the fuzz targets (`crates/fenced-fuzz/seeds`): one
/// valid input of each kind, so the fuzzers start past the formats' outer
/// layers. This test checks that every committed seed is still taken;
/// `FENCED_WRITE_FUZZ_SEEDS=1` writes them again after a format change.
#[cfg(test)]
mod seeds {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::{Path, PathBuf};

    use fenced_core::{Batch, ClusterTime, Limits, DEFAULT_HISTORY_PER_RESOURCE};
    use fenced_proto::v1;
    use openraft::{CommittedLeaderId, EntryPayload, Vote};
    use prost::Message;

    use super::*;
    use crate::{
        peer::network::request_frame,
        state_machine::{inspect_export, testing::file_holding},
        types::{Entry, LogId},
    };

    fn dir(target: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fenced-fuzz/seeds/{target}"))
    }

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(3, 1), index)
    }

    /// A table with a lease, a waiter, a session's lease and a fenced key.
    fn table() -> LeaseTable {
        let limits = Limits::default();
        let owner = |b: u8| vec![b; 16];
        let acquire = |res: &[u8], o: u8, wait_ms| v1::AcquireRequest {
            label: String::new(),
            resource: res.to_vec(),
            owner_id: owner(o),
            ttl_ms: 30_000,
            wait_ms,
        };
        let commands = vec![
            fenced_proto::acquire_command(&acquire(b"billing:run", 1, 0), &limits).unwrap(),
            fenced_proto::acquire_command(&acquire(b"billing:run", 2, 9_000), &limits).unwrap(),
            fenced_proto::open_session_command(
                &v1::OpenSessionRequest {
                    session_id: owner(3),
                    ttl_ms: 20_000,
                },
                "tenant-a",
                &limits,
            )
            .unwrap(),
            fenced_proto::acquire_in_session_command(
                &v1::AcquireInSessionRequest {
                    label: String::new(),
                    resource: b"report:7".to_vec(),
                    owner_id: owner(4),
                    session_id: owner(3),
                },
                "tenant-a",
                &limits,
            )
            .unwrap(),
            fenced_proto::kv_put_command(
                &v1::KvPutRequest {
                    key: b"billing/state".to_vec(),
                    value: b"done".to_vec(),
                    resource: b"billing:run".to_vec(),
                    owner_id: owner(1),
                    token: 1,
                },
                &limits,
            )
            .unwrap(),
        ];
        let mut table = LeaseTable::new();
        table.apply(&Batch {
            stamp: ClusterTime::from_millis(10),
            commands,
        });
        table
    }

    /// Named inputs of one target.
    type Inputs = Vec<(&'static str, Vec<u8>)>;

    fn peer_frames() -> Inputs {
        let time = MessageTime {
            at: crate::clock::floor::LeaderTime::new(3, ClusterTime::from_millis(10)),
            durable: true,
        };
        let batch = Batch {
            stamp: ClusterTime::from_millis(10),
            commands: vec![fenced_proto::release_command(&v1::ReleaseRequest {
                resource: b"billing:run".to_vec(),
                owner_id: vec![1; 16],
                token: 1,
            })
            .unwrap()],
        };
        let append = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(9)),
            entries: vec![Entry {
                log_id: log_id(10),
                payload: EntryPayload::Normal(batch),
            }],
            leader_commit: Some(log_id(9)),
        };
        let (_, body) = file_holding(&table(), log_id(10));
        let (meta, _) = crate::state_machine::testing::snapshot_at(log_id(10));
        let install = InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            meta,
            offset: 0,
            data: body,
            done: true,
        };
        let vote = VoteRequest::<NodeId>::new(Vote::new(4, 2), Some(log_id(10)));
        let pre_vote = PreVoteRequest {
            candidate: 2,
            last_log_id: Some(log_id(10)),
        };
        let timeout_now = TimeoutNow { leader: 1, term: 3 };
        // A connection's version byte (0: this build's), then one frame.
        let framed = |frame: io::Result<Vec<u8>>| [vec![0], frame.unwrap()].concat();
        vec![
            (
                "append_entries",
                framed(request_frame(RaftCall::AppendEntries, time, &append)),
            ),
            (
                "install_snapshot",
                framed(request_frame(RaftCall::InstallSnapshot, time, &install)),
            ),
            ("vote", framed(request_frame(RaftCall::Vote, time, &vote))),
            (
                "pre_vote",
                framed(request_frame(RaftCall::PreVote, time, &pre_vote)),
            ),
            (
                "timeout_now",
                framed(request_frame(RaftCall::TimeoutNow, time, &timeout_now)),
            ),
        ]
    }

    /// Each target's seeds, by file name.
    fn seeds() -> Vec<(&'static str, Inputs)> {
        let table = table();
        let (file, body) = file_holding(&table, log_id(10));
        let grpc = |which: u8, message: Vec<u8>| [vec![which], message].concat();
        vec![
            ("peer_frame", peer_frames()),
            (
                "table_snapshot",
                vec![(
                    "table",
                    crate::codec::encode("table", &table.snapshot()).unwrap(),
                )],
            ),
            (
                "snapshot_file",
                vec![
                    ("file", [vec![0], file].concat()),
                    ("export", [vec![1], body].concat()),
                ],
            ),
            (
                "grpc_request",
                vec![
                    (
                        "acquire",
                        grpc(
                            0,
                            v1::AcquireRequest {
                                label: String::new(),
                                resource: b"billing:run".to_vec(),
                                owner_id: vec![7; 16],
                                ttl_ms: 30_000,
                                wait_ms: 5_000,
                            }
                            .encode_to_vec(),
                        ),
                    ),
                    (
                        "renew_many",
                        grpc(
                            2,
                            v1::RenewManyRequest {
                                leases: vec![v1::RenewRequest {
                                    resource: b"billing:run".to_vec(),
                                    owner_id: vec![7; 16],
                                    token: 3,
                                    ttl_ms: 30_000,
                                }],
                            }
                            .encode_to_vec(),
                        ),
                    ),
                    (
                        "kv_put",
                        grpc(
                            13,
                            v1::KvPutRequest {
                                key: b"billing/state".to_vec(),
                                value: b"done".to_vec(),
                                resource: b"billing:run".to_vec(),
                                owner_id: vec![7; 16],
                                token: 3,
                            }
                            .encode_to_vec(),
                        ),
                    ),
                ],
            ),
        ]
    }

    /// Whether the input a seed holds is taken by the decoder its target
    /// fuzzes.
    fn taken(target: &str, input: &[u8]) -> bool {
        let (&first, rest) = input.split_first().unwrap();
        match target {
            "peer_frame" => raft_request(PeerVersion::V3, &rest[4..]).is_ok(),
            "table_snapshot" => crate::codec::decode_seed(
                "table",
                input,
                fenced_core::TableSeed {
                    history_len: DEFAULT_HISTORY_PER_RESOURCE,
                },
            )
            .is_ok(),
            "snapshot_file" if first == 0 => {
                snapshot_file(rest, DEFAULT_HISTORY_PER_RESOURCE).is_ok()
            }
            "snapshot_file" => inspect_export(rest).is_ok(),
            _ => match first {
                0 => v1::AcquireRequest::decode(rest).is_ok(),
                2 => v1::RenewManyRequest::decode(rest).is_ok(),
                _ => v1::KvPutRequest::decode(rest).is_ok(),
            },
        }
    }

    #[test]
    fn the_fuzz_seeds_are_inputs_the_decoders_take() {
        let write = std::env::var_os("FENCED_WRITE_FUZZ_SEEDS").is_some();
        for (target, inputs) in seeds() {
            for (name, input) in inputs {
                assert!(taken(target, &input), "{target}/{name} as built is refused");
                let path = dir(target).join(name);
                if write {
                    std::fs::create_dir_all(dir(target)).unwrap();
                    std::fs::write(&path, &input).unwrap();
                }
                let committed = std::fs::read(&path).unwrap_or_else(|e| {
                    panic!(
                        "{}: {e} (FENCED_WRITE_FUZZ_SEEDS=1 writes it)",
                        path.display()
                    )
                });
                assert!(
                    taken(target, &committed),
                    "{} is refused: FENCED_WRITE_FUZZ_SEEDS=1 writes it again",
                    path.display()
                );
            }
        }
    }
}
