//! One fenced node: storage, Raft, the proposer and the gRPC listeners,
//! started together and stopped together. Beside it, what starts nodes:
//! their settings (`config`), `fenced dev` and the peer port's listener.
//!
//! Architecture invariant: the top of the crate; nothing imports it but
//! its own children and the binary.

pub mod config;
pub mod dev;
pub mod peer_listener;
pub mod within;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use fenced_core::Limits;
use fenced_proto::v1::{
    cluster_server::ClusterServer, kv_server::KvServer, lock_server::LockServer,
    maintenance_server::MaintenanceServer,
};
use openraft::{error::Fatal, AnyError, SnapshotPolicy, StorageError, StorageIOError};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

use crate::{
    clock::{floor::TimeFloor, AppliedTime, ClusterClock},
    counters::Counters,
    observe::health,
    observe::metrics,
    peer::membership::{self, Join, JoinRefused},
    peer::network::Wire,
    proposer::{run_leader_watch, run_ticker, Proposer, ProposerConfig},
    replication::{self, EarlyAnswers, EarlyReplication, Election, Network, RaftPeer},
    rpc::maintenance::MaintenanceService,
    rpc::watch::Watchers,
    rpc::{
        CallPolicy, ClusterService, KvService, LockService, NodeContext, Replica,
        KV_MESSAGE_MAX_BYTES,
    },
    security::auth::{self, Auth, AuthConfig},
    security::limits::{ConnectionLimit, Port, ServerLimits},
    security::revocation::Revocations,
    security::tls::{self, Members, TlsSettings},
    state_machine::parking::Parking,
    state_machine::StateMachine,
    storage::data_format::{LOG_DIR, STATE_DIR},
    storage::log_store::LogStore,
    storage::log_store::SimFsync,
    types::{Node, NodeId, Raft},
};

/// The largest client request accepted, in bytes (names are at most 200).
const CLIENT_MESSAGE_MAX_BYTES: usize = 64 * 1024;

/// The largest Lock request accepted: a full RenewMany (each lease encodes
/// in at most its weight plus 14 bytes; docs/DECISIONS.md, "Batch renewal").
const LOCK_MESSAGE_MAX_BYTES: usize =
    fenced_core::MAX_RENEW_BATCH_BYTES + 16 * fenced_core::MAX_RENEW_BATCH;

/// Everything a node needs to start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: NodeId,
    pub data_dir: PathBuf,
    /// Client listener.
    pub listen: SocketAddr,
    /// Peer (Raft) listener.
    pub peer_listen: SocketAddr,
    /// The cluster's first membership, identical on every node.
    pub initial_cluster: BTreeMap<NodeId, Node>,
    /// Join a running cluster as a learner instead (`--join`); ignored
    /// when the data dir holds this node's state.
    pub join: Option<Join>,
    pub limits: Limits,
    pub election_timeout_ms: u64,
    /// How often a follower checks whether to stand once its leader lease
    /// ran out; `None`: every tenth to fifth of the election timeout.
    pub election_check_ms: Option<u64>,
    pub heartbeat_ms: u64,
    /// Build a snapshot (and purge the log behind it) every this many entries.
    pub snapshot_logs: u64,
    /// Build one as well every this many bytes of log appended, however
    /// few entries they are.
    pub snapshot_log_bytes: u64,
    pub proposer: ProposerConfig,
    pub max_parked: usize,
    pub request_timeout: Duration,
    /// Where `/metrics` is served over HTTP; `None` serves no metrics.
    pub metrics_listen: Option<SocketAddr>,
    /// The tokens and policy files; auth is off when neither is set.
    pub auth: AuthConfig,
    pub max_leases_per_identity: u64,
    pub max_waiters_per_identity: u64,
    /// Grants remembered per resource (History); the same on every node.
    pub history_per_resource: usize,
    /// Watch streams on this node, in total and per identity.
    pub max_watchers: usize,
    pub max_watchers_per_identity: usize,
    /// Messages one Watch stream may have waiting for its client.
    pub watch_buffer: usize,
    /// Connections, streams, keep-alive, idle timeout, snapshot size.
    pub server_limits: ServerLimits,
    /// TLS on both ports (mutual between nodes); `None`: plaintext.
    pub tls: Option<TlsSettings>,
    /// Serve `/metrics` over HTTPS with the same certificate (needs `tls`).
    pub metrics_tls: bool,
}

impl NodeConfig {
    /// A node with default tuning.
    pub fn new(
        id: NodeId,
        data_dir: PathBuf,
        listen: SocketAddr,
        peer_listen: SocketAddr,
        initial_cluster: BTreeMap<NodeId, Node>,
    ) -> Self {
        Self {
            id,
            data_dir,
            listen,
            peer_listen,
            initial_cluster,
            join: None,
            limits: Limits::default(),
            // docs/decisions/replication.md, "The election timeout is
            // 200 ms": grants again within half a second of losing the
            // leader, and a leader stalled 300 ms is not replaced.
            election_timeout_ms: 200,
            election_check_ms: None,
            heartbeat_ms: 50,
            snapshot_logs: 10_000,
            snapshot_log_bytes: 16 << 20,
            proposer: ProposerConfig {
                max_pending: 65_536,
                max_batch: fenced_core::MAX_BATCH_COMMANDS,
                // openraft 0.9 syncs the leader's log inside its core task:
                // a second entry in flight only holds up the first one's
                // commit (DECISIONS.md, "Batching").
                max_in_flight: 1,
                clock_skew_ppm: 0,
                wall: crate::proposer::WallSource::System,
            },
            max_parked: 100_000,
            request_timeout: Duration::from_secs(10),
            metrics_listen: None,
            auth: AuthConfig::default(),
            max_leases_per_identity: crate::security::limits::DEFAULT_MAX_LEASES_PER_IDENTITY,
            max_waiters_per_identity: crate::security::limits::DEFAULT_MAX_WAITERS_PER_IDENTITY,
            history_per_resource: fenced_core::DEFAULT_HISTORY_PER_RESOURCE,
            max_watchers: crate::rpc::watch::DEFAULT_MAX_WATCHERS,
            max_watchers_per_identity: crate::rpc::watch::DEFAULT_MAX_WATCHERS_PER_IDENTITY,
            watch_buffer: crate::rpc::watch::DEFAULT_WATCH_BUFFER,
            server_limits: ServerLimits::default(),
            tls: None,
            metrics_tls: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    Config(String),
    #[error("data dir {dir}: {source}")]
    Storage {
        dir: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("raft: {0}")]
    Raft(String),
}

/// A started node.
pub struct RunningNode {
    pub ctx: NodeContext,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// The peer port's TLS, for the handover's call.
    peer_tls: Option<Arc<tls::NodeTls>>,
    /// How long a stopping leader tries to hand over.
    handover_within: Duration,
    /// Resolves when the cluster refused this node's join for good.
    join_refused: Option<tokio::sync::oneshot::Receiver<String>>,
}

/// A node's listening sockets, bound before it starts (and outside any
/// runtime, so that a node may start in a runtime of its own). `fenced dev`
/// binds every node's before starting any, so that no node's first messages
/// find a peer port that is not listening yet (a connection to a bound port
/// waits in its backlog until the node accepts).
pub struct Listeners {
    client: std::net::TcpListener,
    peer: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
}

impl Listeners {
    /// Binds the client, peer and (if set) metrics addresses of `cfg`.
    pub fn bind(cfg: &NodeConfig) -> Result<Self, NodeError> {
        let bind =
            |addr: SocketAddr| listen(addr).map_err(|source| NodeError::Listen { addr, source });
        Ok(Self {
            client: bind(cfg.listen)?,
            peer: bind(cfg.peer_listen)?,
            metrics: cfg.metrics_listen.map(bind).transpose()?,
        })
    }
}

/// A non-blocking listening socket on `addr`, as tokio's `TcpListener::bind`
/// makes it (SO_REUSEADDR, a backlog of 1024: a burst of connections waits
/// rather than being reset), but without a runtime.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Registers a bound listener with the current runtime.
fn tokio_listener(l: std::net::TcpListener) -> Result<TcpListener, NodeError> {
    let addr = l
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    TcpListener::from_std(l).map_err(|source| NodeError::Listen { addr, source })
}

/// What the deterministic simulation (crate `fenced-sim`) puts in place of
/// the network, the disk's timing and the random spread of elections.
#[derive(Clone)]
pub struct Simulated {
    pub wire: Arc<dyn Wire>,
    pub fsync: SimFsync,
    /// How a node being repaired asks the members for their status.
    pub status: Arc<dyn crate::repair::run::AskStatus>,
    pub seed: u64,
}

/// A node's working parts without its listeners: storage, Raft, the
/// cluster clock, the proposer, the election, the context the services run
/// on and the answerer of peers' Raft calls. The real node serves them on
/// its ports; the simulation calls them directly.
pub struct NodeCore {
    pub ctx: NodeContext,
    /// Answers the peers' Raft calls.
    pub peer: RaftPeer,
    pub auth: Arc<Auth>,
    pub tls: Option<Arc<tls::NodeTls>>,
    pub members: Members,
    /// The join to run, unless the data dir holds this node's state.
    pub join: Option<Join>,
    /// Ends the election loop (and whatever the caller adds).
    pub stop: CancellationToken,
    /// The leader watch, the ticker, the election loop and the snapshot-by-bytes
    /// watch, in that order.
    pub tasks: Vec<JoinHandle<()>>,
}

impl NodeCore {
    /// Opens storage, writes the initial membership on a pristine data
    /// dir, starts Raft, the proposer and the election; `sim` replaces the
    /// network and the disk's timing (the simulation), `None` for a real
    /// node.
    pub async fn open(cfg: &NodeConfig, sim: Option<Simulated>) -> Result<Self, NodeError> {
        crate::observe::metrics::process_start_unix_seconds();
        cfg.limits
            .validate()
            .map_err(|e| NodeError::Config(e.to_string()))?;
        if !cfg.initial_cluster.is_empty() && !cfg.initial_cluster.contains_key(&cfg.id) {
            return Err(NodeError::Config(format!(
                "initial_cluster: does not name this node's id {}",
                cfg.id
            )));
        }
        // The membership view: which node certificates the peer port admits,
        // which may send Raft calls and forward a caller's identity.
        let members = Members::default();
        let revocations = Arc::new(
            Revocations::load(cfg.tls.as_ref().and_then(|t| t.deny.as_deref()))
                .map_err(NodeError::Config)?,
        );
        members.set_revocations(Arc::clone(&revocations));
        let auth = Arc::new(
            Auth::load(cfg.auth.clone())
                .map_err(NodeError::Config)?
                .with_forwarders(members.clone())
                .with_revocations(revocations),
        );
        let storage = |source: Box<dyn std::error::Error + Send + Sync>| NodeError::Storage {
            dir: cfg.data_dir.clone(),
            source,
        };
        private_dirs(&cfg.data_dir).map_err(|e| storage(Box::new(e)))?;
        // A layout this build does not know is refused before it is read.
        let layout =
            crate::storage::data_format::check(&cfg.data_dir).map_err(|e| storage(Box::new(e)))?;
        let log_dir = cfg.data_dir.join(LOG_DIR);
        let log = match &sim {
            Some(sim) => LogStore::open_simulated(&log_dir, Arc::clone(&sim.fsync)),
            None => LogStore::open(&log_dir),
        }
        .map_err(|e| {
            storage(Box::new(crate::storage::log_store::unreadable_log(
                &log_dir, e,
            )))
        })?;
        match replication::give_up_restored_leadership(&log, cfg.id).await {
            Ok(Some(term)) => tracing::info!(
                term,
                "led before the restart: standing for election in a new term"
            ),
            Ok(None) => {}
            Err(e) => return Err(storage(Box::new(e))),
        }
        // A data directory marked by `fenced repair` (crate::repair).
        let repair =
            crate::repair::marker::read(&cfg.data_dir).map_err(|e| storage(Box::new(e)))?;
        if let Some(marked) = repair.filter(|m| m.node != cfg.id) {
            return Err(NodeError::Config(
                crate::repair::run::RepairError::OtherNode {
                    marked: marked.node,
                    me: cfg.id,
                }
                .to_string(),
            ));
        }
        // Owned here: the state machine wakes the callers the services park.
        let parking = Parking::new(cfg.max_parked);
        // Owned here: the parts that count hold it, /metrics reads it.
        let counters = Arc::new(Counters::default());
        let sm = StateMachine::open_counted(
            &cfg.data_dir.join(STATE_DIR),
            Arc::clone(&parking),
            log.purge_horizon(),
            cfg.history_per_resource,
            Arc::clone(&counters),
        )
        .map_err(|e| storage(e.to_string().into()))?;
        let shared = sm.shared();
        let floor = Arc::new(TimeFloor::open(&cfg.data_dir).map_err(|e| storage(Box::new(e)))?);
        // Written once every file of an older layout was read (and the
        // snapshot rewritten in its checksum frame): a crash before this
        // leaves the older layout, read again at the next start.
        if layout.is_none_or(|v| v < crate::storage::data_format::VERSION) {
            crate::storage::data_format::write(&cfg.data_dir).map_err(|e| storage(Box::new(e)))?;
        }
        let time = Arc::new(ClusterClock::new(
            cfg.proposer.clock_skew_ppm,
            Arc::clone(&floor),
            Arc::clone(&shared) as Arc<dyn AppliedTime>,
        ));

        let raft_config = openraft::Config {
            cluster_name: "fenced".into(),
            // The deadline of an AppendEntries; heartbeats are fenced's
            // (crate::replication::heartbeat).
            heartbeat_interval: crate::replication::heartbeat::append_deadline_ms(
                cfg.heartbeat_ms,
                cfg.election_timeout_ms,
            ),
            election_timeout_min: cfg.election_timeout_ms,
            election_timeout_max: cfg.election_timeout_ms * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_logs),
            // Entries kept behind a snapshot let a follower that lags a little
            // catch up from the log instead of a whole snapshot.
            max_in_snapshot_log_to_keep: (cfg.snapshot_logs / 2).min(1_000),
            purge_batch_size: (cfg.snapshot_logs / 4).clamp(1, 256),
            ..Default::default()
        }
        .validate()
        .map_err(|e| NodeError::Config(e.to_string()))?;
        let tls = match &cfg.tls {
            Some(s) => Some(Arc::new(
                tls::load(s, members.clone()).map_err(NodeError::Config)?,
            )),
            None => None,
        };
        let early_answers = Arc::new(EarlyAnswers::default());
        let wire = sim.as_ref().map(|s| Arc::clone(&s.wire));
        let network = Network::new(Arc::clone(&early_answers), Arc::clone(&time))
            .with_tls(tls.clone())
            .with_wire(wire.clone());
        let mut repair_step = repair.map(|m| m.step);
        let directory = repair_directory(cfg);
        let peers: Arc<dyn crate::repair::run::AskStatus> = match &sim {
            Some(sim) => Arc::clone(&sim.status),
            None => Arc::new(crate::repair::run::GrpcStatus(tls.clone())),
        };
        if repair_step.is_none()
            && log.is_pristine()
            // A state machine without a log is a restored or recovered
            // node's: not one to fold into a running cluster.
            && shared.last_applied().is_none()
            && !cfg.initial_cluster.is_empty()
            && crate::repair::run::cluster_formed(cfg.id, &directory, &peers).await
        {
            tracing::warn!(
                node = cfg.id,
                "this node's Raft log is empty but its cluster has formed: its data was lost \
                 (or it starts after the others formed the cluster); repairing from the peers \
                 (docs/OPERATIONS.md, \"A damaged node\")"
            );
            crate::repair::marker::write(
                &cfg.data_dir,
                &crate::repair::marker::Marker {
                    node: cfg.id,
                    step: crate::repair::marker::Step::Fence,
                },
            )
            .map_err(|e| storage(Box::new(e)))?;
            repair_step = Some(crate::repair::marker::Step::Fence);
        }
        if repair_step == Some(crate::repair::marker::Step::Fence) {
            tracing::info!(
                node = cfg.id,
                "repair: asking the other voters for their terms before taking part"
            );
            let fence = crate::repair::run::store_fence(
                cfg.id,
                &cfg.data_dir,
                &log,
                directory.clone(),
                &peers,
                &members,
            )
            .await
            .map_err(|e| NodeError::Config(e.to_string()))?;
            repair_step = Some(crate::repair::marker::Step::CatchUp { term: fence.term });
        }
        let repair_gate = Arc::new(crate::repair::RepairGate::new(repair_step));
        // On a pristine data dir: the first membership, written before Raft
        // starts so that it starts as a follower of a formed cluster and
        // stands only after a pre-vote (LogStore::seed_membership says why
        // not openraft's `initialize`).
        if !cfg.initial_cluster.is_empty()
            && log
                .seed_membership(&cfg.initial_cluster)
                .await
                .map_err(|e| storage(Box::new(e)))?
        {
            tracing::info!(
                members = cfg.initial_cluster.len(),
                "initial membership written"
            );
        }
        let reachability = network.reachability();
        let raft = Raft::new(cfg.id, Arc::new(raft_config), network, log.clone(), sm)
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        // A leader's appends go to its followers before its own fdatasync
        // ends (crate::replication::early).
        log.on_append(Arc::new(
            EarlyReplication::new(cfg.id, raft.metrics(), Arc::clone(&early_answers))
                .with_tls(tls.clone())
                .with_wire(wire.clone()),
        ));
        // Elections start from fenced's pre-vote (crate::replication::election),
        // not from openraft's timer.
        raft.runtime_config().elect(false);
        raft.runtime_config().heartbeat(false);
        let election = Election::new(
            cfg.id,
            Duration::from_millis(cfg.election_timeout_ms),
            Duration::from_millis(cfg.election_timeout_ms * 2),
            log.clone(),
        )
        .with_tls(tls.clone())
        .with_reachability(Arc::clone(&reachability))
        .with_repair(Arc::clone(&repair_gate))
        .with_wire(wire);
        let election = match cfg.election_check_ms {
            Some(ms) => election.with_check_interval(Duration::from_millis(ms)),
            None => election,
        };
        let election = Arc::new(match &sim {
            Some(sim) => election.with_jitter_seed(sim.seed),
            None => election,
        });

        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        let join = match (&cfg.join, initialized) {
            (Some(_), true) => {
                tracing::info!(
                    node = cfg.id,
                    "the data dir holds this node's state: --join is ignored, the node \
                     rejoins as itself"
                );
                None
            }
            // A node being repaired is a member already: the fence checked.
            (Some(_), false) if repair_gate.repairing() => None,
            (join, _) => join.clone(),
        };
        let proposer = Proposer::start(
            raft.clone(),
            Arc::clone(&shared),
            Arc::clone(&counters),
            Arc::clone(&time),
            cfg.proposer,
        );
        let ctx = NodeContext::new(
            Replica {
                id: cfg.id,
                raft: raft.clone(),
                shared: Arc::clone(&shared),
                proposer: proposer.clone(),
                time: Arc::clone(&time),
                log: log.clone(),
            },
            CallPolicy {
                auth: Arc::clone(&auth),
                limits: cfg.limits,
                identity_bounds: fenced_core::IdentityBounds {
                    max_leases_per_identity: cfg.max_leases_per_identity,
                    max_waiters_per_identity: cfg.max_waiters_per_identity,
                },
                request_timeout: cfg.request_timeout,
            },
            parking,
            Arc::clone(&counters),
        )
        .with_forwarding(tls.clone(), reachability)
        .with_early_answers(early_answers)
        .with_watchers(Watchers::new(
            cfg.max_watchers,
            cfg.max_watchers_per_identity,
            cfg.watch_buffer,
        ))
        .with_repair(Arc::clone(&repair_gate));

        let stop = CancellationToken::new();
        let snapshot_by_bytes = tokio::spawn(snapshot_every_bytes(
            raft.clone(),
            log,
            cfg.snapshot_log_bytes,
            stop.clone(),
        ));
        let tasks = vec![
            tokio::spawn(run_leader_watch(raft.clone(), Arc::clone(&time))),
            tokio::spawn(run_ticker(
                raft.clone(),
                Arc::clone(&shared),
                time,
                proposer,
                cfg.proposer.wall,
            )),
            // After the two tasks above, which shutdown aborts first; this
            // one ends with `stop`.
            tokio::spawn({
                let election = Arc::clone(&election);
                let (raft, stop) = (raft.clone(), stop.clone());
                async move { election.run(raft, stop).await }
            }),
            tokio::spawn(crate::replication::heartbeat::run(
                raft.clone(),
                Duration::from_millis(cfg.heartbeat_ms),
                stop.clone(),
            )),
            snapshot_by_bytes,
        ];
        let mut tasks = tasks;
        if repair_gate.repairing() {
            let fence_term = match repair_step {
                Some(crate::repair::marker::Step::CatchUp { term }) => term,
                _ => 0,
            };
            let repairing = crate::repair::run::Repairing {
                me: cfg.id,
                fence_term,
                data_dir: cfg.data_dir.clone(),
                dir: directory,
                peers,
                gate: Arc::clone(&repair_gate),
                floor: Arc::clone(&floor),
            };
            tasks.push(tokio::spawn(crate::repair::run::finish(
                repairing,
                raft.clone(),
                Arc::clone(&shared),
                stop.clone(),
            )));
        }
        let peer = RaftPeer {
            raft: raft.clone(),
            election,
            floor,
            max_snapshot_bytes: cfg.server_limits.max_snapshot_bytes,
            counters: Arc::clone(&ctx.counters.limits),
            repair: repair_gate,
        };
        Ok(NodeCore {
            ctx,
            peer,
            auth,
            tls,
            members,
            join,
            stop,
            tasks,
        })
    }
}

impl RunningNode {
    /// Starts the node: binds its listeners, then as [`RunningNode::start_on`].
    pub async fn start(cfg: NodeConfig) -> Result<Self, NodeError> {
        let listeners = Listeners::bind(&cfg)?;
        Self::start_on(cfg, listeners).await
    }

    /// Starts the node on listeners already bound: opens storage, writes the
    /// initial membership on a pristine data dir, starts Raft and serves.
    pub async fn start_on(cfg: NodeConfig, listeners: Listeners) -> Result<Self, NodeError> {
        let client_listener = tokio_listener(listeners.client)?;
        let peer_listener = tokio_listener(listeners.peer)?;
        let metrics_listener = listeners.metrics.map(tokio_listener).transpose()?;
        let NodeCore {
            ctx,
            peer,
            auth,
            tls,
            members,
            join,
            stop,
            mut tasks,
        } = NodeCore::open(&cfg, None).await?;
        let (raft, counters) = (ctx.replica.raft.clone(), Arc::clone(&ctx.counters));
        let mut join_refused = None;
        if tls.is_some() {
            // Set before either port accepts, then kept up to date.
            let initial = cfg.initial_cluster.keys().copied().collect();
            members.set_retired(ctx.replica.shared.retired_ids().ids());
            members.refresh(&raft, &initial);
            tasks.push(tokio::spawn(follow_retired(
                members.clone(),
                ctx.replica.shared.subscribe_retired(),
                stop.clone(),
            )));
            tasks.push(tokio::spawn(membership::vouch_for_refused(
                members.clone(),
                raft.clone(),
                cfg.id,
                tls.clone(),
                stop.clone(),
            )));
            tasks.push(tokio::spawn(members.follow(
                raft.clone(),
                initial,
                stop.clone(),
            )));
        }
        let (health_reporter, health_server) = tonic_health::server::health_reporter();
        tasks.push(tokio::spawn(health::watch(
            raft.clone(),
            cfg.id,
            health_reporter,
            Arc::clone(&counters),
            // A follower calls an election after at most this long without
            // hearing from its leader; the leader gives up serving as soon.
            Duration::from_millis(cfg.election_timeout_ms * 2),
            stop.clone(),
        )));
        let mut status_page_url = None;
        if let Some(listener) = metrics_listener {
            let metrics_tls = tls.as_ref().filter(|_| cfg.metrics_tls);
            let status_page = crate::observe::status_page::availability(
                listener.local_addr().ok(),
                metrics_tls.is_some(),
                auth.enabled(),
            );
            if let Err(why) = &status_page {
                tracing::warn!(reason = %why, "status page off");
            }
            if let (Ok(()), Ok(addr)) = (&status_page, listener.local_addr()) {
                let client_addr = cfg
                    .initial_cluster
                    .get(&cfg.id)
                    .map(|n| n.client_addr.clone())
                    .unwrap_or_else(|| cfg.listen.to_string());
                status_page_url = Some(crate::observe::status_page::url_of(
                    addr,
                    metrics_tls.is_some(),
                    &client_addr,
                ));
            }
            tasks.push(tokio::spawn(metrics::serve(
                listener,
                ctx.clone(),
                metrics_tls.map(|t| t.metrics.clone()),
                status_page,
                stop.clone(),
            )));
        }

        let outer_timeout = Duration::from_millis(cfg.limits.wait_max_ms) + cfg.request_timeout * 2;
        if auth.enabled() || auth.revokes() {
            tasks.push(tokio::spawn(auth::reload_on_sighup(auth, stop.clone())));
        }
        let lock = |peer| {
            LockServer::new(LockService::new(ctx.clone(), peer))
                .max_decoding_message_size(LOCK_MESSAGE_MAX_BYTES)
        };
        let cluster = |peer| {
            ClusterServer::new(
                ClusterService::new(ctx.clone(), peer).with_status_page(status_page_url.clone()),
            )
            .max_decoding_message_size(CLIENT_MESSAGE_MAX_BYTES)
        };
        let saving = Arc::new(tokio::sync::Semaphore::new(1));
        let maintenance = |peer| {
            MaintenanceServer::new(MaintenanceService::new(
                ctx.clone(),
                peer,
                Arc::clone(&saving),
            ))
            .max_decoding_message_size(CLIENT_MESSAGE_MAX_BYTES)
        };
        let kv = |peer| {
            KvServer::new(KvService::new(ctx.clone(), peer))
                .max_decoding_message_size(KV_MESSAGE_MAX_BYTES)
        };
        let limit_counters = Arc::clone(&ctx.counters.limits);
        let connection_limit = |port| {
            ConnectionLimit::new(
                port,
                cfg.server_limits.max_connections,
                cfg.server_limits.idle_timeout,
                Arc::clone(&limit_counters),
            )
        };
        let admission = |port| {
            crate::security::admission::Admission::new(
                port,
                cfg.server_limits.max_pending_handshakes,
                cfg.server_limits.max_pending_handshakes_per_source,
                Arc::clone(&limit_counters),
            )
        };
        let rpc_metrics = |port| {
            crate::counters::rpc_metrics::RpcMetricsLayer::new(Arc::clone(&ctx.counters.rpc), port)
        };
        let reflection_v1 =
            crate::rpc::reflection::v1(Arc::clone(&ctx.policy.auth)).map_err(NodeError::Config)?;
        let reflection_v1alpha = crate::rpc::reflection::v1alpha(Arc::clone(&ctx.policy.auth))
            .map_err(NodeError::Config)?;
        // The JSON API answers what no gRPC service routes, on the same
        // port, so TLS, admission and connection limits are gRPC's.
        let json = crate::rpc::json::JsonApi::new(
            LockService::new(ctx.clone(), false),
            KvService::new(ctx.clone(), false),
            ClusterService::new(ctx.clone(), false).with_status_page(status_page_url.clone()),
            Arc::clone(&ctx.policy.auth),
            crate::rpc::json::Bounds {
                lock: LOCK_MESSAGE_MAX_BYTES,
                kv: KV_MESSAGE_MAX_BYTES,
                client: CLIENT_MESSAGE_MAX_BYTES,
            },
        )
        .map_err(NodeError::Config)?;
        let client_routes = tonic::service::Routes::new(health_server.clone())
            .add_service(lock(false))
            .add_service(cluster(false))
            .add_service(kv(false))
            .add_service(maintenance(false))
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .into_axum_router()
            .fallback_service(crate::rpc::json::JsonService(Arc::new(json)));
        let client_router = cfg
            .server_limits
            .server()
            // HTTP/1.1 for JSON callers; gRPC stays on HTTP/2.
            .accept_http1(true)
            .timeout(outer_timeout)
            .layer(rpc_metrics(Port::Client))
            .add_routes(tonic::service::Routes::from(client_routes));
        let client_server: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
            match &tls {
                Some(t) => Box::pin(client_router.serve_with_incoming_shutdown(
                    tls::incoming(
                        client_listener,
                        t.client.clone(),
                        admission(Port::Client),
                        connection_limit(Port::Client),
                        stop.clone(),
                    ),
                    stop.clone().cancelled_owned(),
                )),
                None => Box::pin(
                    client_router.serve_with_incoming_shutdown(
                        // Accepted sockets get TCP_NODELAY: tonic ignores
                        // `Server::tcp_nodelay` with an incoming stream, and Nagle's
                        // algorithm holds back small replies behind unacknowledged
                        // ones, adding latency to every call.
                        connection_limit(Port::Client)
                            .incoming(TcpIncoming::from(client_listener).with_nodelay(Some(true))),
                        stop.clone().cancelled_owned(),
                    ),
                ),
            };
        // The peer port carries Raft (plain frames) and, over gRPC, the
        // requests followers forward; the accept loop routes each connection.
        let (peer_grpc_tx, peer_grpc_rx) = tokio::sync::mpsc::channel(64);
        tasks.push(tokio::spawn(peer_listener::accept(
            peer_listener,
            peer,
            tls.clone(),
            admission(Port::Peer),
            connection_limit(Port::Peer),
            peer_grpc_tx,
            stop.clone(),
        )));
        let peer_server = cfg
            .server_limits
            .server()
            .timeout(outer_timeout)
            .layer(rpc_metrics(Port::Peer))
            .add_service(health_server)
            .add_service(lock(true))
            .add_service(cluster(true))
            .add_service(kv(true))
            .add_service(maintenance(true))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::ReceiverStream::new(peer_grpc_rx),
                stop.clone().cancelled_owned(),
            );
        let id = cfg.id;
        tasks.push(tokio::spawn(async move {
            if let Err(e) = client_server.await {
                tracing::error!(node = id, error = %e, "client listener failed");
            }
        }));
        tasks.push(tokio::spawn(async move {
            if let Err(e) = peer_server.await {
                tracing::error!(node = id, error = %e, "peer listener failed");
            }
        }));
        tracing::info!(
            node = cfg.id,
            client = %cfg.listen,
            peer = %cfg.peer_listen,
            metrics = ?cfg.metrics_listen,
            tls = tls.is_some(),
            data_dir = %cfg.data_dir.display(),
            "node started"
        );
        // One line once the node knows a leader: what an operator waits for.
        tasks.push(tokio::spawn({
            let (raft, stop) = (raft.clone(), stop.clone());
            async move {
                let wait = raft.wait(Some(Duration::from_secs(365 * 24 * 3600)));
                let leader = wait.metrics(|m| m.current_leader.is_some(), "a leader is known");
                tokio::select! {
                    _ = stop.cancelled() => {}
                    Ok(m) = leader => tracing::info!(
                        node = id,
                        leader = m.current_leader,
                        term = m.current_term,
                        "ready to serve client requests"
                    ),
                }
            }
        }));
        if let Some(join) = join {
            // Never `initialize`: the membership comes from the cluster.
            let (tx, rx) = tokio::sync::oneshot::channel();
            join_refused = Some(rx);
            let (raft, tls, stop) = (raft.clone(), tls.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                if let Err(JoinRefused::Fatal(e)) = membership::join(raft, join, tls, stop).await {
                    let _ = tx.send(e);
                }
            }));
        }
        Ok(Self {
            ctx,
            stop,
            tasks,
            peer_tls: tls,
            // Catch-up, one round trip and an election; an election timeout
            // and a lease would otherwise pass before a follower stands.
            handover_within: Duration::from_millis(cfg.election_timeout_ms * 4),
            join_refused,
        })
    }

    /// When this node leads: stops proposing and hands leadership to a
    /// caught-up follower (crate::peer::handoff), within a bound; returns the new
    /// leader. Call before [`RunningNode::shutdown`] on SIGTERM.
    pub async fn hand_over_leadership(&self) -> Option<NodeId> {
        if self.ctx.replica.raft.metrics().borrow().state != openraft::ServerState::Leader {
            return None;
        }
        self.ctx.replica.proposer.stop_for_handover();
        crate::peer::handoff::hand_over(
            &self.ctx.replica.raft,
            self.peer_tls.clone(),
            self.handover_within,
        )
        .await
    }

    /// Resolves with the reason when the cluster refused this node's
    /// `--join` for good (its id is a voter's, an address is taken); never
    /// otherwise.
    pub fn join_refused(&mut self) -> impl std::future::Future<Output = String> + Send + 'static {
        let rx = self.join_refused.take();
        async move {
            match rx {
                Some(rx) => match rx.await {
                    Ok(e) => e,
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        }
    }

    /// Waits until a leader is known, up to `timeout`; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Option<NodeId> {
        self.ctx
            .replica
            .raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
            .ok()
            .and_then(|m| m.current_leader)
    }

    /// Resolves once this node's Raft core has stopped on an error; see
    /// [`raft_failure`].
    /// A failed write of the cluster-time file counts the same.
    pub fn failure(&self) -> impl std::future::Future<Output = Fatal<NodeId>> + Send + 'static {
        storage_failure(&self.ctx)
    }

    /// Stops serving, then stops Raft; storage is closed when this returns.
    pub async fn shutdown(self) {
        self.stop.cancel();
        // Watch streams never end by themselves: end them, so the listeners
        // can finish.
        self.ctx.watchers.close();
        let mut tasks = self.tasks.into_iter();
        // The leader watch and the ticker never end by themselves.
        for background in tasks.by_ref().take(2) {
            background.abort();
        }
        // Listeners finish the requests in flight, for a short while.
        for t in tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Err(e) = self.ctx.replica.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        tracing::info!(node = self.ctx.replica.id, "node stopped");
    }
}

/// Tells the peer port's admission each retired id as the state machine
/// applies (or installs) it, until `stop`.
async fn follow_retired(
    members: Members,
    mut retired: tokio::sync::watch::Receiver<crate::peer::retired::RetiredIds>,
    stop: CancellationToken,
) {
    loop {
        members.set_retired(retired.borrow_and_update().ids());
        tokio::select! {
            _ = stop.cancelled() => return,
            r = retired.changed() => if r.is_err() { return },
        }
    }
}

/// Creates the data directory and the two stores' directories readable by
/// this user only (0700): they hold every live owner id.
fn private_dirs(data_dir: &Path) -> std::io::Result<()> {
    for dir in [
        data_dir.to_path_buf(),
        data_dir.join(LOG_DIR),
        data_dir.join(STATE_DIR),
    ] {
        crate::storage::data_format::private_dir(&dir)?;
    }
    Ok(())
}

/// Builds a snapshot whenever `budget` bytes of log were appended since
/// the last one was seen, however few entries they are: openraft counts
/// entries only (`snapshot_logs`), and one entry holds up to 4,096
/// commands, so the log a restart re-applies had no bound in bytes
/// (docs/SCALING.md, "One group's capacity"). Ends with `stop`.
async fn snapshot_every_bytes(raft: Raft, log: LogStore, budget: u64, stop: CancellationToken) {
    let mut metrics = raft.metrics();
    let mut seen = metrics.borrow().snapshot;
    let mut since = log.appended_bytes();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let appended = log.appended_bytes();
        let snapshot = metrics.borrow_and_update().snapshot;
        if snapshot != seen {
            (seen, since) = (snapshot, appended);
        } else if appended.saturating_sub(since) >= budget {
            tracing::info!(
                bytes = appended - since,
                "log grew past its budget: building a snapshot"
            );
            if raft.trigger().snapshot().await.is_err() {
                return;
            }
            since = appended;
        }
    }
}

/// Where a node being repaired finds the members: its initial cluster's
/// client addresses, and its `--join` endpoints.
fn repair_directory(cfg: &NodeConfig) -> crate::repair::run::Directory {
    crate::repair::run::Directory {
        by_id: cfg
            .initial_cluster
            .iter()
            .filter(|(id, n)| **id != cfg.id && !n.client_addr.is_empty())
            .map(|(id, n)| (*id, n.client_addr.clone()))
            .collect(),
        unnamed: cfg
            .join
            .as_ref()
            .map(|j| j.endpoints.clone())
            .unwrap_or_default(),
    }
}

/// Resolves once the node of `ctx` stopped on a storage error: its Raft
/// core ([`raft_failure`]), or a failed write of its cluster-time file.
pub fn storage_failure(
    ctx: &NodeContext,
) -> impl std::future::Future<Output = Fatal<NodeId>> + Send + 'static {
    let raft = raft_failure(ctx.replica.raft.clone());
    let floor = Arc::clone(ctx.replica.time.floor());
    async move {
        tokio::select! {
            e = raft => e,
            e = floor.failed() => Fatal::StorageError(StorageError::from(
                StorageIOError::write(AnyError::new(&*e)),
            )),
        }
    }
}

/// Resolves once `raft`'s core has stopped on an error, with that error:
/// openraft 0.9 stops its core for good on any storage error (a log append
/// or fdatasync that failed with ENOSPC or EIO, a state machine or snapshot
/// write), and on a panic inside it. The node then answers nothing useful
/// until restarted. A clean shutdown never resolves it.
pub async fn raft_failure(raft: Raft) -> Fatal<NodeId> {
    let mut metrics = raft.metrics();
    loop {
        if let Err(e) = &metrics.borrow_and_update().running_state {
            if !matches!(e, Fatal::Stopped) {
                return e.clone();
            }
        }
        if metrics.changed().await.is_err() {
            // The core is gone; its last word is in the final value.
            if let Err(e) = &metrics.borrow().running_state {
                if !matches!(e, Fatal::Stopped) {
                    return e.clone();
                }
            }
            return std::future::pending().await;
        }
    }
}

/// The part of `data_dir` a storage failure was in, from the subject openraft
/// names in the error ("when Write Logs: ..."): the Raft log for log entries
/// and the vote, the state directory for the state machine and snapshots;
/// `data_dir` itself when the error names neither.
pub fn failed_path(data_dir: &Path, error: &Fatal<NodeId>) -> PathBuf {
    let text = error.to_string();
    let subject = text
        .strip_prefix("when ")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .map(|s| s.split(['(', ':']).next().unwrap_or(s));
    match subject {
        Some("Logs" | "Log" | "LogIndex" | "Vote") => data_dir.join(LOG_DIR),
        Some("StateMachine" | "Snapshot" | "Apply") => data_dir.join(STATE_DIR),
        _ => data_dir.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use openraft::{AnyError, StorageError, StorageIOError};

    use super::*;

    fn fatal(e: StorageIOError<NodeId>) -> Fatal<NodeId> {
        Fatal::StorageError(StorageError::from(e))
    }

    #[test]
    #[allow(clippy::expect_used)]
    fn data_directories_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        // An existing directory with a looser mode is tightened too.
        std::fs::create_dir_all(data.join(STATE_DIR)).expect("mkdir");
        std::fs::set_permissions(data.join(STATE_DIR), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        private_dirs(&data).expect("private_dirs");
        for d in [data.clone(), data.join(LOG_DIR), data.join(STATE_DIR)] {
            let mode = std::fs::metadata(&d).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}: {mode:o}", d.display());
        }
    }

    #[test]
    fn a_storage_failure_names_the_store_it_was_in() {
        let dir = Path::new("/data");
        let enospc = || AnyError::new(&std::io::Error::from_raw_os_error(28));
        assert_eq!(
            failed_path(dir, &fatal(StorageIOError::write_logs(enospc()))),
            dir.join("raft-log")
        );
        assert_eq!(
            failed_path(dir, &fatal(StorageIOError::write_vote(enospc()))),
            dir.join("raft-log")
        );
        assert_eq!(
            failed_path(dir, &fatal(StorageIOError::write_snapshot(None, enospc()))),
            dir.join("state")
        );
        assert_eq!(
            failed_path(dir, &fatal(StorageIOError::write_state_machine(enospc()))),
            dir.join("state")
        );
        assert_eq!(failed_path(dir, &Fatal::Panicked), dir);
    }
}
