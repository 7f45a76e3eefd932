//! fenced's changes to openraft's replication, in one place.
//!
//! openraft 0.9 replicates, elects and commits; fenced adds, around it:
//!
//! - **Early copies**: a leader's new entries go to its followers while its
//!   own fdatasync runs ([`early`]), and openraft's AppendEntries for those
//!   entries is answered from a follower's stored answer to the copy
//!   ([`transport`]).
//! - **Commit-only heartbeats** answered from a stored copy, their commit
//!   index owed to the next message ([`stream::Stream`]).
//! - **Cluster time on every message**, made durable on the followers that
//!   confirm a read ([`stream::Stream::durable_time`], [`follower`]).
//! - **A pre-vote** before any election ([`pre_vote`], [`election`]).
//! - **Heartbeats at `--heartbeat-ms`**, triggered by fenced, apart from
//!   the deadline of an AppendEntries ([`heartbeat`]).
//! - **Giving up a restored leadership** before Raft starts ([`restart`]).
//!
//! The decisions are sans-IO, pure functions and small state machines from
//! messages and state to actions, tested without a runtime: [`copies`]
//! (which appends are copied to whom; what a stored answer vouches for),
//! [`stream`] (what one of openraft's AppendEntries does on a connection;
//! what a follower does after a leader's message), [`pre_vote`]. The
//! adapters execute them: [`early`] (the links to followers), [`transport`]
//! (openraft's `RaftNetworkFactory`), [`follower`] (the peer port's Raft
//! calls), [`election`] (the pre-vote's timer and questions), [`restart`]
//! (the stored vote).
//!
//! Storage does not drive the network: the log store tells an
//! [`crate::storage::log_store::AppendSink`] of each append, and [`early::EarlyReplication`],
//! set as that sink by `node.rs`, decides and sends. The transport below
//! ([`crate::peer::network`]) knows nothing of replication.
//!
//! # Why it is safe, and what it takes from openraft
//!
//! An entry counts towards a majority only once it is durable: the leader
//! counts itself only after its own fdatasync, a follower answers (openraft's
//! AppendEntries or an early copy) only after its own, and openraft commits
//! on those answers alone; a commit-only heartbeat answered without the
//! follower moves nothing. Each behaviour of openraft this rests on is
//! checked against the real `openraft::Raft` in `openraft_contract.rs`:
//!
//! 1. a leader counts an entry and replicates it only after its own flush;
//! 2. a follower answers AppendEntries only after its own flush;
//! 3. heartbeats never move a follower's match index or the commit;
//! 4. `ensure_linearizable` returns only after the new leader's first entry
//!    applied (the leader clock starts from the time applied then);
//! 5. a restarted node restores leadership from its committed vote (what
//!    [`restart`] gives up);
//! 6. a leadership check goes out on a client of its own, never on a
//!    replication stream's (what tells [`stream::Stream`] a check apart);
//! 7. openraft's election timer stays off once disabled: elections start
//!    only from the pre-vote.

pub mod copies;
pub mod early;
pub mod election;
pub mod follower;
pub mod heartbeat;
pub mod pre_vote;
pub mod restart;
pub mod sender;
pub mod stream;
pub mod transport;

pub use early::{EarlyAnswers, EarlyReplication};
pub use election::Election;
pub use follower::RaftPeer;
pub use restart::give_up_restored_leadership;
pub use transport::Network;
