//! What the services of one node share: the context, proposing a command
//! and the read index.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use fenced_core::{ClusterTime, Command, CommandOutcome, IdentityBounds, Limits};
use fenced_proto::WallTimed;
use tonic::{Response, Status};

use crate::{
    clock::{floor::LeaderTime, ClusterClock},
    counters::Counters,
    peer::network::Reachability,
    proposer::{ProposeError, Proposer},
    replication::EarlyAnswers,
    rpc::watch::Watchers,
    security::auth::Auth,
    security::tls::NodeTls,
    state_machine::parking::Parking,
    state_machine::Shared,
    storage::log_store::LogStore,
    types::{NodeId, Raft},
};

use super::forward::{not_leader, Forwarding};

/// This node's share of the cluster: its id, its Raft, the applied state,
/// the leader's write path and clock, and the log.
#[derive(Clone)]
pub struct Replica {
    pub id: NodeId,
    pub raft: Raft,
    pub shared: Arc<Shared>,
    pub proposer: Proposer,
    pub time: Arc<ClusterClock>,
    pub log: LogStore,
}

/// What a caller may ask and how long it is served: auth, the request
/// bounds and the time a call may take.
#[derive(Clone)]
pub struct CallPolicy {
    /// Who may call what; off unless the node was given auth files.
    pub auth: Arc<Auth>,
    pub limits: Limits,
    /// Per-identity limits, carried in each command an identity makes and
    /// decided by the table.
    pub identity_bounds: IdentityBounds,
    pub request_timeout: Duration,
}

/// Everything the services of one node share, in owned parts.
#[derive(Clone)]
pub struct NodeContext {
    pub replica: Replica,
    pub policy: CallPolicy,
    /// Callers waiting for a resource; the state machine wakes them.
    pub parking: Arc<Parking>,
    /// The node's counters, read by /metrics.
    pub counters: Arc<Counters>,
    /// Watch streams served by this node, and their bounds.
    pub watchers: Arc<Watchers>,
    /// Sending calls on to the leader.
    pub(super) forwarding: Arc<Forwarding>,
    /// Early copies of this node's appends and the calls their answers
    /// stood in for (counted for /metrics).
    pub early: Arc<EarlyAnswers>,
    /// Whether this node is being repaired (shown by Status).
    pub repair: Arc<crate::repair::RepairGate>,
}
impl NodeContext {
    /// Read index: leadership confirmed by a quorum, and everything
    /// committed before the call applied, within the request timeout.
    pub(crate) async fn confirm_leadership(&self, what: &str) -> Result<(), Status> {
        tokio::time::timeout(
            self.policy.request_timeout,
            self.replica.raft.ensure_linearizable(),
        )
        .await
        .map_err(|_| {
            Status::unavailable(format!(
                "{what}: no quorum confirmed leadership in time; retry"
            ))
        })?
        .map_err(|e| {
            not_leader(
                e.forward_to_leader()
                    .and_then(|f| f.leader_id.zip(f.leader_node.clone()))
                    .as_ref(),
            )
        })?;
        Ok(())
    }

    pub fn new(
        replica: Replica,
        policy: CallPolicy,
        parking: Arc<Parking>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            replica,
            policy,
            parking,
            counters,
            forwarding: Arc::default(),
            watchers: Arc::new(Watchers::new(
                crate::rpc::watch::DEFAULT_MAX_WATCHERS,
                crate::rpc::watch::DEFAULT_MAX_WATCHERS_PER_IDENTITY,
                crate::rpc::watch::DEFAULT_WATCH_BUFFER,
            )),
            early: Arc::default(),
            repair: Arc::default(),
        }
    }

    /// Counts early copies in `early` (see [`crate::replication::early`]).
    pub fn with_early_answers(self, early: Arc<EarlyAnswers>) -> Self {
        Self { early, ..self }
    }

    /// The same context serving Watch under these bounds.
    pub fn with_watchers(self, watchers: Watchers) -> Self {
        Self {
            watchers: Arc::new(watchers),
            ..self
        }
    }

    /// Reports the repair's progress from `repair`.
    pub fn with_repair(self, repair: Arc<crate::repair::RepairGate>) -> Self {
        Self { repair, ..self }
    }

    /// Forwards to the leader over mutual TLS when `tls` is set, and
    /// reports peers' reachability from `reachability` in refusals.
    pub fn with_forwarding(
        self,
        tls: Option<Arc<NodeTls>>,
        reachability: Arc<Reachability>,
    ) -> Self {
        Self {
            forwarding: Arc::new(Forwarding::new(tls, reachability)),
            ..self
        }
    }

    /// `command` made by the caller as authenticated here (`None` with
    /// auth off: the empty identity, without per-identity bounds): the
    /// table records the lease as that identity's and refuses any other. A
    /// session command already names its identity and goes as it is.
    pub(crate) fn as_caller(&self, command: Command, identity: Option<&str>) -> Command {
        if command.carries_identity() {
            return command;
        }
        match identity {
            Some(id) => command.as_identity(id, self.policy.identity_bounds),
            None => command.as_identity("", IdentityBounds::UNBOUNDED),
        }
    }

    pub(crate) fn cluster_now(&self) -> ClusterTime {
        self.read_time().0
    }

    /// Cluster time now for a read, and the leader time to make durable
    /// before the read reveals it ([`ClusterClock::for_read`]).
    pub(crate) fn read_time(&self) -> (ClusterTime, LeaderTime) {
        let term = self.replica.raft.metrics().borrow().current_term;
        self.replica.time.for_read(term)
    }

    /// Proposes `command` as [`Self::propose`] does, a refusal turned into
    /// the status the caller is told (one naming the leader when this
    /// node is not it).
    pub(crate) async fn propose_or_refuse<T: CommandOutcome>(
        &self,
        command: Command,
        deadline: Option<Instant>,
    ) -> Result<(T, ClusterTime), Status> {
        self.propose(command, deadline)
            .await
            .map_err(|e| self.propose_status(e))
    }

    /// Proposes `command` and answers with `reply` of its outcome: how
    /// every write call ends.
    pub(crate) async fn decide<T: CommandOutcome, R>(
        &self,
        command: Command,
        deadline: Option<Instant>,
        reply: impl FnOnce(&T, ClusterTime) -> Result<R, Status>,
    ) -> Result<Response<R>, Status>
    where
        R: WallTimed,
    {
        let (outcome, now) = self.propose_or_refuse(command, deadline).await?;
        reply(&outcome, now).map(|r| self.dated(r, now))
    }

    /// A reply that carries cluster time `now`, with the leader's wall clock
    /// then for the people who read it (0 before the cluster's first
    /// anchor).
    pub(crate) fn dated<R: WallTimed>(&self, reply: R, now: ClusterTime) -> Response<R> {
        Response::new(reply.with_wall_time(self.replica.shared.wall_ms_at(now).unwrap_or(0)))
    }

    /// Proposes `command` and waits for its outcome, of the command's own
    /// type `T`, at most the request timeout.
    pub(crate) async fn propose<T: CommandOutcome>(
        &self,
        command: fenced_core::Command,
        deadline: Option<Instant>,
    ) -> Result<(T, ClusterTime), ProposeError> {
        match tokio::time::timeout(
            self.policy.request_timeout,
            self.replica.proposer.propose(command, deadline),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(ProposeError::Unknown(format!(
                "not committed within {} ms",
                self.policy.request_timeout.as_millis()
            ))),
        }
    }

    /// Makes this leader's state safe to read linearizably (`rpc` names
    /// the call in errors) and returns the cluster time the read answers at.
    ///
    /// The time this read reveals is taken BEFORE leadership is confirmed:
    /// the confirming heartbeats carry it (or later) to a quorum, which
    /// makes it durable before answering, and this node makes it durable
    /// too. Any later leader starts its clock at or above it, also after a
    /// restart of the whole cluster.
    ///
    /// A new leader's clock may still be starting: the read waits for it
    /// (the read index that starts it) and reveals the clock of the term it
    /// confirms, or is refused. Never the last applied time or the floor:
    /// both lie behind that clock (which counts from the moment the node
    /// became leader), and a lease read at them would show more time left
    /// than it has.
    pub(crate) async fn linearizable_read(&self, rpc: &str) -> Result<ClusterTime, Status> {
        let unconfirmed = || {
            Status::unavailable(format!(
                "{rpc}: no quorum confirmed leadership in time; retry"
            ))
        };
        let term = match tokio::time::timeout(
            self.policy.request_timeout,
            crate::proposer::ensure_clock(&self.replica.raft, &self.replica.time),
        )
        .await
        {
            Ok(Ok(term)) => term,
            Ok(Err(ProposeError::NotLeader { leader })) => {
                return Err(self.not_leader(leader.as_ref()))
            }
            Ok(Err(_)) | Err(_) => return Err(unconfirmed()),
        };
        let Some(revealed) = self.replica.time.stamp(term) else {
            // Leadership moved on between the two lines.
            return Err(self.not_leader(crate::proposer::leader_of(&self.replica.raft).as_ref()));
        };
        let as_leader_time = LeaderTime::new(term, revealed);
        let (confirmed, durable) = tokio::join!(
            tokio::time::timeout(
                self.policy.request_timeout,
                self.replica.raft.ensure_linearizable()
            ),
            self.replica.time.floor().make_durable(as_leader_time),
        );
        durable.map_err(|e| {
            tracing::error!(error = %e, "cannot make the cluster time durable");
            Status::unavailable(format!("{rpc}: cannot store the cluster time: {e}"))
        })?;
        // Read index: confirm leadership with a quorum and wait until the
        // state machine has applied everything committed before the read.
        confirmed.map_err(|_| unconfirmed())?.map_err(|e| {
            self.not_leader(
                e.forward_to_leader()
                    .and_then(|f| f.leader_id.zip(f.leader_node.clone()))
                    .as_ref(),
            )
        })?;
        // Entries applied since carry later stamps, durable in the log.
        Ok(revealed.max(self.replica.time.applied()))
    }
}
