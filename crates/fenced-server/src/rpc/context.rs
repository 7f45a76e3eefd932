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
    auth::Auth,
    clock::{floor::LeaderTime, ClusterClock},
    counters::Counters,
    log_store::LogStore,
    network::Reachability,
    parking::Parking,
    proposer::{ProposeError, Proposer},
    replication::EarlyAnswers,
    state_machine::Shared,
    tls::NodeTls,
    types::{NodeId, Raft},
    watch::Watchers,
};

use super::forward::{not_leader, Forwarding};

/// Everything the services of one node share.
#[derive(Clone)]
pub struct NodeContext {
    pub id: NodeId,
    pub raft: Raft,
    pub shared: Arc<Shared>,
    /// Callers waiting for a resource; the state machine wakes them.
    pub parking: Arc<Parking>,
    /// The node's counters, read by /metrics.
    pub counters: Arc<Counters>,
    pub proposer: Proposer,
    pub time: Arc<ClusterClock>,
    pub limits: Limits,
    pub log: LogStore,
    pub request_timeout: Duration,
    /// Who may call what; off unless the node was given auth files.
    pub auth: Arc<Auth>,
    /// Per-identity limits, carried in each command an identity makes and
    /// decided by the table.
    pub identity_bounds: IdentityBounds,
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
        tokio::time::timeout(self.request_timeout, self.raft.ensure_linearizable())
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

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: NodeId,
        raft: Raft,
        shared: Arc<Shared>,
        parking: Arc<Parking>,
        counters: Arc<Counters>,
        proposer: Proposer,
        time: Arc<ClusterClock>,
        limits: Limits,
        log: LogStore,
        request_timeout: Duration,
    ) -> Self {
        Self {
            id,
            raft,
            shared,
            parking,
            counters,
            proposer,
            time,
            limits,
            log,
            request_timeout,
            auth: Arc::new(Auth::disabled()),
            identity_bounds: IdentityBounds {
                max_leases_per_identity: crate::limits::DEFAULT_MAX_LEASES_PER_IDENTITY,
                max_waiters_per_identity: crate::limits::DEFAULT_MAX_WAITERS_PER_IDENTITY,
            },
            forwarding: Arc::default(),
            watchers: Arc::new(Watchers::new(
                crate::watch::DEFAULT_MAX_WATCHERS,
                crate::watch::DEFAULT_MAX_WATCHERS_PER_IDENTITY,
                crate::watch::DEFAULT_WATCH_BUFFER,
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

    /// The same context with auth and per-identity limits.
    pub fn with_auth(self, auth: Arc<Auth>, identity_bounds: IdentityBounds) -> Self {
        Self {
            auth,
            identity_bounds,
            ..self
        }
    }

    /// `command` made by the caller as authenticated here (`None` with
    /// auth off: the empty identity, without per-identity bounds): the
    /// table records the lease as that identity's and refuses any other.
    pub(crate) fn as_caller(&self, command: Command, identity: Option<&str>) -> Command {
        match identity {
            Some(id) => command.as_identity(id, self.identity_bounds),
            None => command.as_identity("", IdentityBounds::UNBOUNDED),
        }
    }

    pub(crate) fn cluster_now(&self) -> ClusterTime {
        self.read_time().0
    }

    /// Cluster time now for a read, and the leader time to make durable
    /// before the read reveals it ([`ClusterClock::for_read`]).
    pub(crate) fn read_time(&self) -> (ClusterTime, LeaderTime) {
        let term = self.raft.metrics().borrow().current_term;
        self.time.for_read(term)
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
        Response::new(reply.with_wall_time(self.shared.wall_ms_at(now).unwrap_or(0)))
    }

    /// Proposes `command` and waits for its outcome, of the command's own
    /// type `T`, at most the request timeout.
    pub(crate) async fn propose<T: CommandOutcome>(
        &self,
        command: fenced_core::Command,
        deadline: Option<Instant>,
    ) -> Result<(T, ClusterTime), ProposeError> {
        match tokio::time::timeout(
            self.request_timeout,
            self.proposer.propose(command, deadline),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(ProposeError::Unknown(format!(
                "not committed within {} ms",
                self.request_timeout.as_millis()
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
            self.request_timeout,
            crate::proposer::ensure_clock(&self.raft, &self.time),
        )
        .await
        {
            Ok(Ok(term)) => term,
            Ok(Err(ProposeError::NotLeader { leader })) => {
                return Err(self.not_leader(leader.as_ref()))
            }
            Ok(Err(_)) | Err(_) => return Err(unconfirmed()),
        };
        let Some(revealed) = self.time.stamp(term) else {
            // Leadership moved on between the two lines.
            return Err(self.not_leader(crate::proposer::leader_of(&self.raft).as_ref()));
        };
        let as_leader_time = LeaderTime::new(term, revealed);
        let (confirmed, durable) = tokio::join!(
            tokio::time::timeout(self.request_timeout, self.raft.ensure_linearizable()),
            self.time.floor().make_durable(as_leader_time),
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
        Ok(revealed.max(self.time.applied()))
    }
}
