//! The client-facing gRPC services: translate, forward to the leader when
//! this node is not it, propose, answer. No decisions are made here.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use fenced_core::{
    AcquireInSessionOutcome, AcquireOutcome, ClusterTime, Command, CommandOutcome, IdentityBounds,
    Limits, OwnerId, ResourceName,
};
use fenced_proto::{
    acquire_command, acquire_in_session_command, acquire_in_session_reply, acquire_reply,
    close_session_command, close_session_reply, describe_reply, describe_resource, history_reply,
    history_request, invalid_argument, keep_alive_command, open_session_command, release_command,
    release_reply, renew_command, renew_many_command, renew_many_reply, renew_reply, session_reply,
    v1::{
        self, cluster_client::ClusterClient, cluster_server, lock_client::LockClient, lock_server,
    },
    validate_check, validate_checks, validate_reply,
};
use openraft::{ChangeMembers, ServerState};
use tonic::{
    metadata::{Ascii, MetadataMap, MetadataValue},
    transport::Channel,
    Request, Response, Status,
};

use crate::{
    auth::{Auth, Permission, FORWARDED_IDENTITY},
    clock::{floor::LeaderTime, ClusterClock},
    counters::Counters,
    deadline::deadline_of,
    headers::{LEADER_HEADER, NODE_HEADER},
    log_store::LogStore,
    membership,
    network::Reachability,
    parking::{Parking, WaitEnd},
    peer_channel::peer_channel,
    proposer::{leader_of, ProposeError, Proposer},
    replication::EarlyAnswers,
    state_machine::{self, Shared},
    tls::NodeTls,
    types::{Node, NodeId, Raft},
    watch::Watchers,
};

/// Marks a request a follower forwarded, so it is never forwarded twice: a
/// node that is not the leader refuses such a call instead.
pub const FORWARDED: &str = "x-fenced-forwarded";
/// Extra time a parked acquire waits past its `wait_ms` for the answer.
pub(crate) const WAIT_GRACE: Duration = Duration::from_secs(5);

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
    forward: Arc<Mutex<HashMap<(NodeId, String), Channel>>>,
    /// Calls this node sent on to the leader.
    pub(crate) forwarded: Arc<AtomicU64>,
    /// Forwarded calls go over mutual TLS when set.
    forward_tls: Option<Arc<NodeTls>>,
    /// Which peers this node's Raft calls and pre-votes could not reach:
    /// told to a client that finds no leader here.
    reachability: Arc<Reachability>,
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
            forward: Arc::default(),
            forwarded: Arc::default(),
            forward_tls: None,
            watchers: Arc::new(Watchers::new(
                crate::watch::DEFAULT_MAX_WATCHERS,
                crate::watch::DEFAULT_MAX_WATCHERS_PER_IDENTITY,
                crate::watch::DEFAULT_WATCH_BUFFER,
            )),
            reachability: Arc::default(),
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

    /// Reports peers' reachability from `reachability` in refusals.
    pub fn with_reachability(self, reachability: Arc<Reachability>) -> Self {
        Self {
            reachability,
            ..self
        }
    }

    /// UNAVAILABLE naming the leader (with its client address in
    /// [`LEADER_HEADER`]), or, when there is none, this node and how many
    /// members it reaches, so that a client can say why.
    fn not_leader(&self, leader: Option<&(NodeId, Node)>) -> Status {
        if leader.is_some() {
            return not_leader(leader);
        }
        let voters: Vec<NodeId> = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config.membership().voter_ids().collect()
        };
        let reachable = voters
            .iter()
            .filter(|id| **id == self.id || self.reachability.is_reachable(**id))
            .count();
        Status::unavailable(no_leader_message(self.id, reachable, voters.len()))
    }

    pub(crate) fn propose_status(&self, e: ProposeError) -> Status {
        match e {
            ProposeError::NotLeader { leader } => self.not_leader(leader.as_ref()),
            e => propose_status(e),
        }
    }

    /// Forwards to the leader over mutual TLS.
    pub fn with_forward_tls(self, tls: Option<Arc<NodeTls>>) -> Self {
        Self {
            forward_tls: tls,
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

    /// The leader, when it is known and is not this node.
    pub(crate) fn other_leader(&self) -> Option<(NodeId, Node)> {
        // Read in place: cloning the metrics (membership included) on every
        // request costs more than the check.
        if self.raft.metrics().borrow().state == ServerState::Leader {
            return None;
        }
        leader_of(&self.raft)
    }

    pub(crate) fn channel_to(&self, leader: &(NodeId, Node)) -> Result<Channel, Status> {
        let mut map = self.forward.lock().unwrap_or_else(PoisonError::into_inner);
        // By id and address: the answer must come from that node's
        // certificate, and an id may move to another address.
        let key = (leader.0, leader.1.peer_addr.clone());
        if let Some(ch) = map.get(&key) {
            return Ok(ch.clone());
        }
        let addr = &key.1;
        let ch = peer_channel(addr, self.forward_tls.as_ref(), Some(leader.0))
            .map_err(|e| Status::unavailable(format!("leader address {addr}: {e}")))?;
        map.insert(key, ch.clone());
        Ok(ch)
    }

    /// Calls this node has forwarded to the leader since it started.
    pub fn forwarded_calls(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }

    /// The leader hint, `<id>,<client address>`, as this node knows it now.
    fn leader_hint(&self) -> Option<MetadataValue<Ascii>> {
        // Read in place, like `other_leader`: this runs on every answer.
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let id = m.current_leader?;
        let node = m.membership_config.membership().get_node(&id)?;
        leader_hint_value(id, &node.client_addr)
    }

    /// Puts this node's id and its leader hint on an answer. A hint already
    /// there came from the leader itself (a forwarded call) and stays.
    pub(crate) fn hinted<T>(
        &self,
        answer: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        let node = MetadataValue::from(self.id);
        match answer {
            Ok(mut resp) => {
                self.add_hint(resp.metadata_mut(), node);
                Ok(resp)
            }
            Err(mut status) => {
                self.add_hint(status.metadata_mut(), node);
                Err(status)
            }
        }
    }

    fn add_hint(&self, md: &mut MetadataMap, node: MetadataValue<Ascii>) {
        md.insert(NODE_HEADER, node);
        if !md.contains_key(LEADER_HEADER) {
            if let Some(hint) = self.leader_hint() {
                md.insert(LEADER_HEADER, hint);
            }
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

/// `<id>,<client address>`; `None` when the address is unknown or cannot
/// travel in metadata.
fn leader_hint_value(id: NodeId, client_addr: &str) -> Option<MetadataValue<Ascii>> {
    if client_addr.is_empty() {
        return None;
    }
    MetadataValue::try_from(format!("{id},{client_addr}")).ok()
}

pub(crate) fn is_forwarded<T>(req: &Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED)
}

/// The call to send the leader: it carries the identity this node
/// authenticated, which the leader trusts on its peer port only.
/// The forwarded request carries the caller's own bearer token when it had
/// one, so the leader authenticates it itself; a certificate identity goes
/// by name, believed only over the peer port's mutual TLS.
pub(crate) fn forwarded<T>(
    msg: T,
    timeout: Duration,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    identity: Option<&str>,
) -> Result<Request<T>, Status> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert(FORWARDED, MetadataValue::from_static("1"));
    if let Some(token) = authorization {
        req.metadata_mut().insert("authorization", token);
    } else if let Some(identity) = identity {
        let value = MetadataValue::try_from(identity)
            .map_err(|_| Status::internal("the identity's name cannot be forwarded"))?;
        req.metadata_mut().insert(FORWARDED_IDENTITY, value);
    }
    req.set_timeout(timeout);
    Ok(req)
}

/// What a node without a leader tells a client.
fn no_leader_message(me: NodeId, reachable: usize, members: usize) -> String {
    format!(
        "node {me} has no leader: {reachable} of {members} members reachable; \
         a majority ({}) must run and reach each other; retry with backoff",
        members / 2 + 1
    )
}

pub(crate) fn not_leader(leader: Option<&(NodeId, Node)>) -> Status {
    match leader {
        None => Status::unavailable("no leader is elected right now; retry with backoff"),
        Some((id, node)) => {
            let mut status = Status::unavailable(format!(
                "this node is not the leader; the leader is node {id} (client address {})",
                if node.client_addr.is_empty() {
                    "unknown"
                } else {
                    &node.client_addr
                }
            ));
            if let Some(v) = leader_hint_value(*id, &node.client_addr) {
                status.metadata_mut().insert(LEADER_HEADER, v);
            }
            status
        }
    }
}

pub(crate) fn propose_status(e: ProposeError) -> Status {
    match e {
        ProposeError::NotLeader { leader } => not_leader(leader.as_ref()),
        ProposeError::QueueFull(_) => Status::resource_exhausted(e.to_string()),
        ProposeError::Unknown(_) | ProposeError::Unavailable(_) => {
            Status::unavailable(e.to_string())
        }
        ProposeError::DeadlineExceeded => Status::deadline_exceeded(e.to_string()),
        ProposeError::Internal(_) => Status::internal(e.to_string()),
    }
}

/// The timeout of a forwarded call: what is left of the caller's deadline
/// (so the leader drops the command once the caller gave up), at most
/// `budget`. `None` when the deadline has already passed.
pub(crate) fn forward_timeout(deadline: Option<Instant>, budget: Duration) -> Option<Duration> {
    match deadline {
        None => Some(budget),
        Some(d) => {
            let left = d.checked_duration_since(Instant::now())?;
            (!left.is_zero()).then(|| left.min(budget))
        }
    }
}

/// Runs `call` against the leader when this node is not it, with what is
/// left of the caller's `deadline`; a call whose deadline passed before it
/// could be forwarded (this node was paused, say) is answered
/// DEADLINE_EXCEEDED unforwarded. It goes as `identity` (already authorized
/// here; the leader checks it again). `extra` is added to the forwarded call's
/// timeout budget (a blocking acquire's wait).
#[macro_export]
#[doc(hidden)]
macro_rules! forward_or {
    ($ctx:expr, $req:expr, $deadline:expr, $identity:expr, $client:ident, $method:ident) => {
        $crate::forward_or!(
            $ctx,
            $req,
            $deadline,
            $identity,
            $client,
            $method,
            std::time::Duration::ZERO
        )
    };
    ($ctx:expr, $req:expr, $deadline:expr, $identity:expr, $client:ident, $method:ident, $extra:expr) => {
        if let Some(leader) = $ctx.other_leader() {
            if $crate::services::is_forwarded(&$req) {
                return Err($crate::services::not_leader(Some(&leader)));
            }
            let Some(timeout) = $crate::services::forward_timeout(
                $deadline,
                $ctx.request_timeout + $crate::services::WAIT_GRACE + $extra,
            ) else {
                $ctx.proposer.note_deadline_drop();
                tracing::info!(
                    rpc = stringify!($method),
                    leader = leader.0,
                    "request not forwarded: its caller's deadline passed"
                );
                return Err(tonic::Status::deadline_exceeded(
                    "the caller's deadline passed before the request reached the leader; \
                     nothing was written",
                ));
            };
            let ch = $ctx.channel_to(&leader)?;
            $ctx.forwarded
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let authorization = $req.metadata().get("authorization").cloned();
            return $client::new(ch)
                .$method($crate::services::forwarded(
                    $req.into_inner(),
                    timeout,
                    authorization,
                    $identity.as_deref(),
                )?)
                .await;
        }
    };
}

pub struct LockService {
    ctx: NodeContext,
    /// Served on the peer port, where forwarded identities are trusted.
    peer: bool,
}

impl LockService {
    pub fn new(ctx: NodeContext, peer: bool) -> Self {
        Self { ctx, peer }
    }

    /// The resource and owner id of an acquire.
    fn acquire_parts(command: &Command) -> Result<(ResourceName, OwnerId), Status> {
        command
            .resource()
            .cloned()
            .zip(command.owner_id())
            .ok_or_else(|| Status::internal("an acquire without a resource"))
    }

    /// A session's open, keep-alive or close, for the caller: its identity
    /// (none without auth; the command records it as empty), which needs
    /// `lock` on some prefix, and the command `build` makes for it.
    fn session_command<T>(
        &self,
        req: &Request<T>,
        operation: &str,
        build: fn(&T, &str, &Limits) -> Result<Command, fenced_core::InvalidArgument>,
    ) -> Result<(Option<String>, Command), Status> {
        let identity =
            self.ctx
                .auth
                .authorize(req, self.peer, Permission::Lock, operation, None)?;
        let who = identity.as_deref().unwrap_or("");
        let command =
            build(req.get_ref(), who, &self.ctx.limits).map_err(|e| invalid_argument(&e))?;
        Ok((identity, command))
    }

    fn authorize<T>(
        &self,
        req: &Request<T>,
        permission: Permission,
        operation: &str,
        resource: &fenced_core::ResourceName,
    ) -> Result<Option<String>, Status> {
        self.ctx.auth.authorize(
            req,
            self.peer,
            permission,
            operation,
            Some(resource.as_str()),
        )
    }

    async fn propose<T: CommandOutcome>(
        &self,
        command: fenced_core::Command,
        deadline: Option<Instant>,
    ) -> Result<(T, ClusterTime), ProposeError> {
        self.ctx.propose(command, deadline).await
    }

    /// Proposes `command` and answers with `reply` of its outcome.
    async fn decide<T: CommandOutcome, R>(
        &self,
        command: Command,
        deadline: Option<Instant>,
        reply: fn(&T, ClusterTime) -> Result<R, Status>,
    ) -> Result<Response<R>, Status> {
        let (outcome, now) = self
            .propose(command, deadline)
            .await
            .map_err(|e| self.ctx.propose_status(e))?;
        reply(&outcome, now).map(Response::new)
    }

    async fn answer_acquire(
        &self,
        req: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let deadline = deadline_of(&req);
        let command =
            acquire_command(req.get_ref(), &self.ctx.limits).map_err(|e| invalid_argument(&e))?;
        let (resource, owner) = Self::acquire_parts(&command)?;
        let identity = self.authorize(&req, Permission::Lock, "acquire", &resource)?;
        let wait_ms = req.get_ref().wait_ms;
        forward_or!(
            self.ctx,
            req,
            deadline,
            identity,
            LockClient,
            acquire,
            Duration::from_millis(wait_ms)
        );
        let command = self.ctx.as_caller(command, identity.as_deref());
        let parked = if wait_ms > 0 {
            Some(
                self.ctx
                    .parking
                    .park(resource.clone(), owner)
                    .map_err(|e| Status::resource_exhausted(e.to_string()))?,
            )
        } else {
            None
        };
        let (outcome, now) = self
            .propose::<AcquireOutcome>(command, deadline)
            .await
            .map_err(|e| self.ctx.propose_status(e))?;
        let (AcquireOutcome::Waiting { .. }, Some(mut parked)) = (&outcome, parked) else {
            return acquire_reply(&outcome, resource.as_str(), now).map(Response::new);
        };
        let wait = Duration::from_millis(wait_ms) + WAIT_GRACE;
        let end = match tokio::time::timeout(wait, &mut parked.rx).await {
            Ok(Ok(end)) => end,
            Ok(Err(_)) => {
                return Err(Status::aborted(
                    "a retry with the same owner_id took over this wait; use the retry's answer",
                ))
            }
            Err(_) => return Err(Status::deadline_exceeded(
                "no answer within wait_ms; the outcome is unknown: retry with the same owner_id",
            )),
        };
        let now = self.ctx.cluster_now();
        let outcome = match end {
            WaitEnd::Granted(grant) => AcquireOutcome::Granted(grant),
            WaitEnd::Elapsed {
                current_token,
                remaining_ms,
            } => AcquireOutcome::Held {
                current_token,
                remaining_ms,
            },
            WaitEnd::TokensExhausted { limit } => AcquireOutcome::TokensExhausted { limit },
        };
        acquire_reply(&outcome, resource.as_str(), now).map(Response::new)
    }

    async fn answer_renew(
        &self,
        req: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        let deadline = deadline_of(&req);
        let command =
            renew_command(req.get_ref(), &self.ctx.limits).map_err(|e| invalid_argument(&e))?;
        let (resource, _) = Self::acquire_parts(&command)?;
        let identity = self.authorize(&req, Permission::Lock, "renew", &resource)?;
        forward_or!(self.ctx, req, deadline, identity, LockClient, renew);
        let command = self.ctx.as_caller(command, identity.as_deref());
        self.decide(command, deadline, renew_reply).await
    }

    /// Every lease of the call in one command, hence one log entry at one
    /// cluster time. The caller must hold `lock` on every resource: a call
    /// naming one it may not renew is refused whole, before anything is
    /// proposed (docs/DECISIONS.md, "Batch renewal").
    async fn answer_renew_many(
        &self,
        req: Request<v1::RenewManyRequest>,
    ) -> Result<Response<v1::RenewManyResponse>, Status> {
        let deadline = deadline_of(&req);
        let command = renew_many_command(req.get_ref(), &self.ctx.limits)
            .map_err(|e| invalid_argument(&e))?;
        let mut identity = None;
        for resource in command.resources() {
            identity = self.authorize(&req, Permission::Lock, "renew", resource)?;
        }
        forward_or!(self.ctx, req, deadline, identity, LockClient, renew_many);
        let command = self.ctx.as_caller(command, identity.as_deref());
        let (outcomes, now) = self
            .propose::<Vec<_>>(command, deadline)
            .await
            .map_err(|e| self.ctx.propose_status(e))?;
        renew_many_reply(&outcomes, now).map(Response::new)
    }

    async fn answer_release(
        &self,
        req: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let deadline = deadline_of(&req);
        let command = release_command(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let (resource, _) = Self::acquire_parts(&command)?;
        let identity = self.authorize(&req, Permission::Lock, "release", &resource)?;
        forward_or!(self.ctx, req, deadline, identity, LockClient, release);
        let command = self.ctx.as_caller(command, identity.as_deref());
        let (outcome, now) = self
            .propose(command, deadline)
            .await
            .map_err(|e| self.ctx.propose_status(e))?;
        Ok(Response::new(release_reply(&outcome, now)))
    }

    /// A lease that lives with the caller's session; never waits.
    async fn answer_acquire_in_session(
        &self,
        req: Request<v1::AcquireInSessionRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let deadline = deadline_of(&req);
        let resource =
            ResourceName::from_bytes(&req.get_ref().resource).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize(&req, Permission::Lock, "acquire_in_session", &resource)?;
        let command = acquire_in_session_command(
            req.get_ref(),
            identity.as_deref().unwrap_or(""),
            &self.ctx.limits,
        )
        .map_err(|e| invalid_argument(&e))?;
        forward_or!(
            self.ctx,
            req,
            deadline,
            identity,
            LockClient,
            acquire_in_session
        );
        let command = self.ctx.as_caller(command, identity.as_deref());
        let (outcome, now) = self
            .propose::<AcquireInSessionOutcome>(command, deadline)
            .await
            .map_err(|e| self.ctx.propose_status(e))?;
        acquire_in_session_reply(&outcome, resource.as_str(), now).map(Response::new)
    }

    async fn answer_open_session(
        &self,
        req: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        let deadline = deadline_of(&req);
        let (identity, command) =
            self.session_command(&req, "open_session", open_session_command)?;
        forward_or!(self.ctx, req, deadline, identity, LockClient, open_session);
        self.decide(command, deadline, session_reply).await
    }

    async fn answer_keep_alive(
        &self,
        req: Request<v1::KeepAliveRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        let deadline = deadline_of(&req);
        let (identity, command) = self.session_command(&req, "keep_alive", keep_alive_command)?;
        forward_or!(self.ctx, req, deadline, identity, LockClient, keep_alive);
        self.decide(command, deadline, session_reply).await
    }

    async fn answer_close_session(
        &self,
        req: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        let deadline = deadline_of(&req);
        let (identity, command) =
            self.session_command(&req, "close_session", close_session_command)?;
        forward_or!(self.ctx, req, deadline, identity, LockClient, close_session);
        self.decide(command, deadline, close_session_reply).await
    }

    async fn answer_describe(
        &self,
        req: Request<v1::DescribeRequest>,
    ) -> Result<Response<v1::DescribeResponse>, Status> {
        let resource = describe_resource(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize(&req, Permission::Read, "describe", &resource)?;
        // CANARY (deliberately broken build for fenced-jepsen): every read
        // is served from this node's local state.
        if req.get_ref().allow_stale
            || fenced_core::canary::on(fenced_core::canary::Canary::LocalDescribe)
        {
            let now = self.ctx.time.applied();
            return Ok(Response::new(describe_reply(
                &self.ctx.shared.describe(resource.as_str(), now),
                now,
            )));
        }
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            LockClient,
            describe
        );
        let now = self.ctx.linearizable_read("describe").await?;
        Ok(Response::new(describe_reply(
            &self.ctx.shared.describe(resource.as_str(), now),
            now,
        )))
    }

    async fn answer_validate_token(
        &self,
        req: Request<v1::ValidateTokenRequest>,
    ) -> Result<Response<v1::ValidateTokenResponse>, Status> {
        let check = validate_check(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize(&req, Permission::Read, "validate_token", &check.0)?;
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            LockClient,
            validate_token
        );
        let now = self.ctx.linearizable_read("validate_token").await?;
        let answers = self
            .ctx
            .shared
            .validate_all(std::slice::from_ref(&check), now);
        let (v, owner) = answers
            .first()
            .ok_or_else(|| Status::internal("validate_token: no answer for the check"))?;
        Ok(Response::new(validate_reply(v, *owner, now)))
    }

    async fn answer_validate_tokens(
        &self,
        req: Request<v1::ValidateTokensRequest>,
    ) -> Result<Response<v1::ValidateTokensResponse>, Status> {
        let checks = validate_checks(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        // Every resource of the batch must be readable by the caller.
        let mut identity = None;
        for (resource, _, _) in &checks {
            identity = self.authorize(&req, Permission::Read, "validate_tokens", resource)?;
        }
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            LockClient,
            validate_tokens
        );
        let now = self.ctx.linearizable_read("validate_tokens").await?;
        let results = self
            .ctx
            .shared
            .validate_all(&checks, now)
            .iter()
            .map(|(v, owner)| validate_reply(v, *owner, now))
            .collect();
        Ok(Response::new(v1::ValidateTokensResponse {
            results,
            cluster_time_ms: now.as_millis(),
        }))
    }

    async fn answer_watch(
        &self,
        req: Request<v1::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let prefix =
            fenced_core::watch_prefix(&req.get_ref().prefix).map_err(|e| invalid_argument(&e))?;
        // The permission covers the prefix: every resource under it.
        let identity = self.ctx.auth.authorize(
            &req,
            self.peer,
            Permission::Read,
            "watch",
            Some(prefix.as_str()),
        )?;
        // Served from this node's applied state: revisions are the same on
        // every node, so the stream may move between nodes.
        let slot = self
            .ctx
            .watchers
            .admit(identity.as_deref())?
            .showing_owners(self.ctx.auth.shows_owner_ids(identity.as_deref()));
        tracing::debug!(
            prefix,
            from_revision = req.get_ref().from_revision,
            identity = identity.as_deref().unwrap_or(""),
            "watch started"
        );
        // The stream outlives this check: its caller is authorized again
        // while it is open, from the same credentials.
        let credentials = Request::from_parts(req.metadata().clone(), req.extensions().clone(), ());
        let (auth, peer, watched) = (Arc::clone(&self.ctx.auth), self.peer, prefix.clone());
        let recheck: crate::watch::Recheck = Box::new(move || {
            auth.authorize(
                &credentials,
                peer,
                Permission::Read,
                "watch",
                Some(&watched),
            )
            .map(|_| ())
        });
        let rx = crate::watch::start(
            Arc::clone(&self.ctx.shared),
            slot,
            prefix,
            req.get_ref().from_revision,
            recheck,
        );
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn answer_history(
        &self,
        req: Request<v1::HistoryRequest>,
    ) -> Result<Response<v1::HistoryResponse>, Status> {
        let (resource, limit) = history_request(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize(&req, Permission::Read, "history", &resource)?;
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            LockClient,
            history
        );
        let now = self.ctx.linearizable_read("history").await?;
        let entries = self.ctx.shared.history(resource.as_str(), limit);
        let mut reply = history_reply(&entries, now);
        // Owner ids only to an admin (docs/DECISIONS.md, "Owner ids are
        // shown to admins only").
        if !self.ctx.auth.shows_owner_ids(identity.as_deref()) {
            for e in &mut reply.entries {
                e.owner_id.clear();
            }
        }
        Ok(Response::new(reply))
    }
}

#[tonic::async_trait]
impl lock_server::Lock for LockService {
    async fn acquire(
        &self,
        req: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.ctx.hinted(self.answer_acquire(req).await)
    }

    async fn renew(
        &self,
        req: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        self.ctx.hinted(self.answer_renew(req).await)
    }

    async fn renew_many(
        &self,
        req: Request<v1::RenewManyRequest>,
    ) -> Result<Response<v1::RenewManyResponse>, Status> {
        self.ctx.hinted(self.answer_renew_many(req).await)
    }

    async fn release(
        &self,
        req: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        self.ctx.hinted(self.answer_release(req).await)
    }

    async fn open_session(
        &self,
        req: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        self.ctx.hinted(self.answer_open_session(req).await)
    }

    async fn acquire_in_session(
        &self,
        req: Request<v1::AcquireInSessionRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.ctx.hinted(self.answer_acquire_in_session(req).await)
    }

    async fn keep_alive(
        &self,
        req: Request<v1::KeepAliveRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        self.ctx.hinted(self.answer_keep_alive(req).await)
    }

    async fn close_session(
        &self,
        req: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        self.ctx.hinted(self.answer_close_session(req).await)
    }

    async fn describe(
        &self,
        req: Request<v1::DescribeRequest>,
    ) -> Result<Response<v1::DescribeResponse>, Status> {
        self.ctx.hinted(self.answer_describe(req).await)
    }

    async fn validate_token(
        &self,
        req: Request<v1::ValidateTokenRequest>,
    ) -> Result<Response<v1::ValidateTokenResponse>, Status> {
        self.ctx.hinted(self.answer_validate_token(req).await)
    }

    async fn validate_tokens(
        &self,
        req: Request<v1::ValidateTokensRequest>,
    ) -> Result<Response<v1::ValidateTokensResponse>, Status> {
        self.ctx.hinted(self.answer_validate_tokens(req).await)
    }

    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<v1::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        self.ctx.hinted(self.answer_watch(req).await)
    }

    async fn history(
        &self,
        req: Request<v1::HistoryRequest>,
    ) -> Result<Response<v1::HistoryResponse>, Status> {
        self.ctx.hinted(self.answer_history(req).await)
    }
}

/// The body of a Watch answer.
pub type WatchStream = tokio_stream::wrappers::ReceiverStream<Result<v1::WatchResponse, Status>>;

/// How Status and the status page name a node's Raft state.
pub fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// A membership change refused by openraft. Leadership lost before the
/// change was committed here is UNAVAILABLE with the new leader, as for a
/// node that is not the leader: the caller retries there.
fn write_status(
    e: openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, Node>>,
) -> Status {
    use openraft::error::{ClientWriteError, RaftError};
    if let RaftError::APIError(ClientWriteError::ForwardToLeader(f)) = &e {
        let leader = f.leader_id.zip(f.leader_node.clone());
        return not_leader(leader.as_ref());
    }
    Status::failed_precondition(e.to_string())
}

pub struct ClusterService {
    ctx: NodeContext,
    /// Served on the peer port, where forwarded identities are trusted.
    peer: bool,
}

impl ClusterService {
    pub fn new(ctx: NodeContext, peer: bool) -> Self {
        Self { ctx, peer }
    }

    /// Membership changes and the state digest are for admins only.
    fn admin<T>(&self, req: &Request<T>, operation: &str) -> Result<Option<String>, Status> {
        self.ctx
            .auth
            .authorize(req, self.peer, Permission::Admin, operation, None)
    }

    fn members(&self) -> Vec<v1::Member> {
        let m = self.ctx.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| v1::Member {
                id: *id,
                peer_addr: node.peer_addr.clone(),
                client_addr: node.client_addr.clone(),
                voter: voters.contains(id),
            })
            .collect()
    }

    fn membership_response(&self, log_index: u64) -> v1::MembershipResponse {
        v1::MembershipResponse {
            members: self.members(),
            log_index,
        }
    }

    async fn answer_status(
        &self,
        req: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        // Only on request: hashing the whole table would stall this node's
        // runtime thread for tens of milliseconds with 100,000 leases. The
        // applied index is the one of the table digested, so replicas that
        // report the same index can be compared even while entries apply.
        // Without the digest, Status is open like the health service
        // (docs/DECISIONS.md, "Status without the digest needs no grant").
        if req.get_ref().with_digest {
            self.admin(&req, "Status with digest")?;
        }
        let (last_applied, state_digest) = if req.get_ref().with_digest {
            let (applied, snapshot) = self.ctx.shared.table_snapshot();
            let digest = tokio::task::spawn_blocking(move || state_machine::digest(&snapshot))
                .await
                .map_err(|e| Status::internal(format!("state digest: {e}")))?;
            (applied, digest)
        } else {
            (self.ctx.shared.last_applied(), 0)
        };
        let m = self.ctx.raft.metrics().borrow().clone();
        let leader = leader_of(&self.ctx.raft);
        let role = role_name(m.state);
        let c = &self.ctx.counters;
        use std::sync::atomic::Ordering::Relaxed;
        Ok(Response::new(v1::StatusResponse {
            node_id: self.ctx.id,
            leader_id: leader.as_ref().map_or(0, |l| l.0),
            leader_addr: leader.map(|l| l.1.client_addr).unwrap_or_default(),
            term: m.current_term,
            members: self.members(),
            last_applied: last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            role: role.to_string(),
            live_leases: self.ctx.shared.live_leases() as u64,
            last_token: self
                .ctx
                .shared
                .last_token()
                .map_or(0, fenced_core::Token::get),
            log_syncs: self.ctx.log.sync_count(),
            applied_entries: c.entries.load(Relaxed),
            applied_commands: c.commands.load(Relaxed),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            state_digest,
            membership_index: m.membership_config.log_id().map_or(0, |l| l.index),
            last_applied_term: last_applied.map_or(0, |l| l.leader_id.term),
            repairing: self.ctx.repair.repairing(),
        }))
    }

    /// Membership calls are checked against the leader's membership only.
    /// A node that knows no leader (just restarted, or cut off) may hold an
    /// old one: its "not a member" or "already a learner" would be false,
    /// and a caller that retries a removal reads "not a member" as done.
    /// This node leads, confirmed by a quorum, and has applied everything
    /// committed before the call: a membership decision then reads the
    /// cluster's membership, not the stale view of a leader that was cut
    /// off and has not noticed yet.
    async fn confirmed_leader(&self) -> Result<(), Status> {
        if self.ctx.raft.metrics().borrow().state != ServerState::Leader {
            return Err(not_leader(leader_of(&self.ctx.raft).as_ref()));
        }
        self.ctx.confirm_leadership("membership change").await
    }

    async fn answer_add_learner(
        &self,
        req: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let node_id = req.get_ref().node_id;
        // Only an admin adds a node, a joining node's own certificate
        // included (docs/DECISIONS.md, "Only an admin adds a node").
        let identity = self.admin(&req, "AddLearner").inspect_err(|_| {
            if let Some(named) = req
                .peer_certs()
                .and_then(|certs| certs.first().and_then(|c| crate::tls::node_id_of(c)))
            {
                tracing::info!(
                    certificate_node = named,
                    node = node_id,
                    "join refused: a node certificate does not add nodes; an admin must"
                );
            }
        })?;
        let node = Node {
            peer_addr: req.get_ref().peer_addr.clone(),
            client_addr: req.get_ref().client_addr.clone(),
        };
        // The addresses are checked here too, so bad input is refused
        // before anything is forwarded.
        membership::check_add(&BTreeMap::new(), node_id, &node)?;
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            ClusterClient,
            add_learner
        );
        self.confirmed_leader().await?;
        // Against everything committed before the call, applied here (see
        // confirmed_leader); the window left is in docs/DECISIONS.md.
        membership::check_not_retired(&self.ctx.shared.retired_ids(), node_id)?;
        let members = membership::members_of(&self.ctx.raft);
        if membership::check_add(&members, node_id, &node)? == membership::AddPlan::AlreadyLearner {
            // A joining node stops asking at this answer: it must mean a
            // committed addition, not one only in this leader's log.
            if !membership::is_member(&self.ctx.raft, node_id) {
                return Err(Status::unavailable(format!(
                    "node_id: the addition of learner {node_id} is not committed yet; retry"
                )));
            }
            return Ok(Response::new(
                self.membership_response(self.membership_index()),
            ));
        }
        tracing::info!(
            node = node_id,
            peer = %node.peer_addr,
            client = %node.client_addr,
            by = identity.as_deref().unwrap_or("anyone (auth off)"),
            "adding a learner"
        );
        // Not blocking: the node may not run yet (an operator adds it before
        // starting it), and it catches up on its own once it does.
        let resp = self
            .ctx
            .raft
            .add_learner(node_id, node, false)
            .await
            .map_err(write_status)?;
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_change_membership(
        &self,
        req: Request<v1::ChangeMembershipRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let identity = self.admin(&req, "ChangeMembership")?;
        if req.get_ref().voter_ids.is_empty() {
            return Err(Status::invalid_argument(
                "voter_ids: must name at least one node",
            ));
        }
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            ClusterClient,
            change_membership
        );
        let voters: BTreeSet<NodeId> = req.into_inner().voter_ids.into_iter().collect();
        self.confirmed_leader().await?;
        let retired = self.ctx.shared.retired_ids();
        for id in &voters {
            membership::check_not_retired(&retired, *id)?;
        }
        let leaving = membership::members_of(&self.ctx.raft)
            .into_iter()
            .filter(|(id, m)| m.voter && !voters.contains(id) && !retired.contains(*id))
            .count();
        membership::check_retire_room(&retired, leaving)?;
        let resp = self
            .ctx
            .raft
            .change_membership(voters, false)
            .await
            .map_err(write_status)?;
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_remove_node(
        &self,
        req: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let identity = self.admin(&req, "RemoveNode")?;
        let id = req.get_ref().node_id;
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            ClusterClient,
            remove_node
        );
        self.confirmed_leader().await?;
        let members = membership::members_of(&self.ctx.raft);
        let voter = members.get(&id).is_some_and(|m| m.voter);
        let in_contact = if voter {
            self.voters_in_contact().await
        } else {
            BTreeSet::new()
        };
        membership::check_remove(&members, id, &in_contact)?;
        let retired = self.ctx.shared.retired_ids();
        membership::check_retire_room(&retired, usize::from(!retired.contains(id)))?;
        tracing::info!(
            node = id,
            voter,
            by = identity.as_deref().unwrap_or("anyone (auth off)"),
            "removing a member"
        );
        // A voter leaves the voters and the membership in one change (joint
        // consensus, then the new set). A leader that removes itself keeps
        // leading until the change commits, then steps down, and the voters
        // left elect one of themselves.
        let change = if voter {
            ChangeMembers::RemoveVoters([id].into())
        } else {
            ChangeMembers::RemoveNodes([id].into())
        };
        let mut resp = self
            .ctx
            .raft
            .change_membership(change, false)
            .await
            .map_err(write_status)?;
        if voter && membership::members_of(&self.ctx.raft).contains_key(&id) {
            // openraft keeps a removed voter as a learner: take it out.
            resp = self
                .ctx
                .raft
                .change_membership(ChangeMembers::RemoveNodes([id].into()), false)
                .await
                .map_err(write_status)?;
        }
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_promote_learner(
        &self,
        req: Request<v1::PromoteLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let identity = self.admin(&req, "PromoteLearner")?;
        let id = req.get_ref().node_id;
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            ClusterClient,
            promote_learner
        );
        self.confirmed_leader().await?;
        membership::check_not_retired(&self.ctx.shared.retired_ids(), id)?;
        let members = membership::members_of(&self.ctx.raft);
        let (matched, last) = self.progress_of(id);
        if membership::check_promote(&members, id, matched, last)?
            == membership::PromotePlan::AlreadyVoter
        {
            return Ok(Response::new(
                self.membership_response(self.membership_index()),
            ));
        }
        tracing::info!(
            node = id,
            matched,
            last_log_index = last,
            by = identity.as_deref().unwrap_or("anyone (auth off)"),
            "promoting a learner to voter"
        );
        let resp = self
            .ctx
            .raft
            .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
            .await
            .map_err(write_status)?;
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_list_members(
        &self,
        req: Request<v1::ListMembersRequest>,
    ) -> Result<Response<v1::ListMembersResponse>, Status> {
        let identity = self.admin(&req, "ListMembers")?;
        forward_or!(
            self.ctx,
            req,
            deadline_of(&req),
            identity,
            ClusterClient,
            list_members
        );
        let m = self.ctx.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(not_leader(leader_of(&self.ctx.raft).as_ref()));
        }
        let last = m.last_log_index.unwrap_or(0);
        let members = self
            .members()
            .into_iter()
            .map(|member| {
                let (matched, _) = self.progress_of(member.id);
                v1::MemberProgress {
                    leader: member.id == self.ctx.id,
                    matched: matched.is_some(),
                    match_index: matched.unwrap_or(0),
                    lag: last.saturating_sub(matched.unwrap_or(0)),
                    member: Some(member),
                }
            })
            .collect();
        Ok(Response::new(v1::ListMembersResponse {
            leader_id: self.ctx.id,
            term: m.current_term,
            last_log_index: last,
            members,
            promote_max_lag: membership::PROMOTE_MAX_LAG,
            retired_ids: self
                .ctx
                .shared
                .retired_ids()
                .ids()
                .iter()
                .copied()
                .collect(),
        }))
    }
}

impl ClusterService {
    /// The index of the membership in force.
    fn membership_index(&self) -> u64 {
        self.ctx
            .raft
            .metrics()
            .borrow()
            .membership_config
            .log_id()
            .map_or(0, |l| l.index)
    }

    /// The last index the leader knows matches on node `id` (its own last
    /// index for itself), and the leader's last log index.
    fn progress_of(&self, id: NodeId) -> (Option<u64>, u64) {
        let m = self.ctx.raft.metrics();
        let m = m.borrow();
        let last = m.last_log_index.unwrap_or(0);
        if id == self.ctx.id {
            return (Some(last), last);
        }
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).copied().flatten())
            .map(|l| l.index);
        (matched, last)
    }

    /// The voters that answered the leader just now: a fresh entry (a tick)
    /// is appended and each voter that has it within a second counts, the
    /// leader always.
    async fn voters_in_contact(&self) -> BTreeSet<NodeId> {
        let before = self.ctx.raft.metrics().borrow().last_log_index.unwrap_or(0);
        self.ctx.proposer.tick();
        let target = self
            .ctx
            .raft
            .wait(Some(Duration::from_millis(500)))
            .metrics(
                |m| m.last_log_index.unwrap_or(0) > before,
                "a fresh entry to probe the voters",
            )
            .await
            .map_or(before, |m| m.last_log_index.unwrap_or(before));
        let voters: BTreeSet<NodeId> = membership::members_of(&self.ctx.raft)
            .into_iter()
            .filter(|(_, m)| m.voter)
            .map(|(id, _)| id)
            .collect();
        let reached = |m: &openraft::RaftMetrics<NodeId, Node>| -> BTreeSet<NodeId> {
            let r = m.replication.clone().unwrap_or_default();
            voters
                .iter()
                .copied()
                .filter(|v| {
                    *v == self.ctx.id
                        || r.get(v)
                            .copied()
                            .flatten()
                            .is_some_and(|l| l.index >= target)
                })
                .collect()
        };
        let _ = self
            .ctx
            .raft
            .wait(Some(Duration::from_secs(1)))
            .metrics(
                |m| reached(m).len() == voters.len(),
                "every voter has the probe",
            )
            .await;
        reached(&self.ctx.raft.metrics().borrow())
    }
}

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
    async fn status(
        &self,
        req: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        self.ctx.hinted(self.answer_status(req).await)
    }

    async fn add_learner(
        &self,
        req: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_add_learner(req).await)
    }

    async fn change_membership(
        &self,
        req: Request<v1::ChangeMembershipRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_change_membership(req).await)
    }

    async fn remove_node(
        &self,
        req: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_remove_node(req).await)
    }

    async fn promote_learner(
        &self,
        req: Request<v1::PromoteLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_promote_learner(req).await)
    }

    async fn list_members(
        &self,
        req: Request<v1::ListMembersRequest>,
    ) -> Result<Response<v1::ListMembersResponse>, Status> {
        self.ctx.hinted(self.answer_list_members(req).await)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn a_node_without_a_leader_names_itself_and_the_majority_it_needs() {
        assert_eq!(
            no_leader_message(2, 1, 3),
            "node 2 has no leader: 1 of 3 members reachable; a majority (2) must run and \
             reach each other; retry with backoff"
        );
        assert!(no_leader_message(1, 2, 5).contains("2 of 5 members reachable; a majority (3)"));
    }

    #[test]
    fn a_forward_gets_only_what_is_left_of_the_deadline() {
        let budget = Duration::from_secs(15);
        assert_eq!(forward_timeout(None, budget), Some(budget));
        let left = forward_timeout(Some(Instant::now() + Duration::from_secs(2)), budget)
            .expect("time left");
        assert!(left <= Duration::from_secs(2) && left > Duration::from_secs(1));
        assert_eq!(
            forward_timeout(Some(Instant::now() + Duration::from_secs(60)), budget),
            Some(budget)
        );
        assert_eq!(forward_timeout(Some(Instant::now()), budget), None);
        let past = Instant::now()
            .checked_sub(Duration::from_millis(5))
            .expect("a monotonic clock well past its start");
        assert_eq!(forward_timeout(Some(past), budget), None);
    }

    #[test]
    fn a_change_refused_for_lost_leadership_is_unavailable_and_names_the_leader() {
        use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
        let lost = |leader_id, leader_node| {
            write_status(RaftError::APIError(ClientWriteError::ForwardToLeader(
                ForwardToLeader {
                    leader_id,
                    leader_node,
                },
            )))
        };
        let node = Node {
            peer_addr: "10.0.0.3:7201".into(),
            client_addr: "10.0.0.3:7101".into(),
        };
        let s = lost(Some(3), Some(node));
        assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
        assert!(s.message().contains("the leader is node 3"), "{s:?}");
        let s = lost(None, None);
        assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
        assert!(s.message().contains("no leader"), "{s:?}");
    }

    #[test]
    fn the_leader_hint_is_id_comma_address_or_nothing() {
        let hint = leader_hint_value(2, "10.0.0.2:7101").expect("a hint");
        assert_eq!(hint.to_str().ok(), Some("2,10.0.0.2:7101"));
        assert!(leader_hint_value(2, "").is_none(), "no address, no hint");
        assert!(
            leader_hint_value(2, "bad\naddress").is_none(),
            "an address that cannot travel in metadata is left out"
        );
    }
}
