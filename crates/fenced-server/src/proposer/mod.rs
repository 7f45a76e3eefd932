//! The leader's write path: stamps commands with cluster time and coalesces
//! concurrent ones into one log entry (a batch), so the cluster is not capped
//! at one fsync per operation; answers each caller with its own outcome.
//! What goes into an entry is decided in [`batcher`]; this file only moves
//! proposals between the callers, the batcher and Raft.

mod batcher;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use fenced_core::{Batch, ClusterTime, Command, CommandOutcome, Outcome};
use openraft::{error::ClientWriteError, ServerState};
use tokio::sync::{mpsc, oneshot, Semaphore};

use self::batcher::Batcher;
use crate::{
    clock::ClusterClock,
    counters::Counters,
    state_machine::Shared,
    types::{Node, NodeId, Raft},
};

/// Why a proposal has no outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    #[error("not the leader")]
    NotLeader { leader: Option<(NodeId, Node)> },
    #[error("the proposal queue is full (max_pending {0}); retry with backoff")]
    QueueFull(usize),
    #[error("the outcome is unknown ({0}); retry with the same owner_id")]
    Unknown(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The caller's deadline passed before the command was proposed: nothing
    /// was written.
    #[error("the caller's deadline passed before the command was proposed; nothing was written")]
    DeadlineExceeded,
    /// The applied outcome is not of the command's own type: a bug (the
    /// table answers every command with its own, see
    /// [`fenced_core::CommandOutcome`]).
    #[error("internal error: {0}")]
    Internal(String),
}

type Reply = oneshot::Sender<Result<(Outcome, ClusterTime), ProposeError>>;

struct Proposal {
    /// `None` is a tick: an entry that only advances cluster time.
    command: Option<Command>,
    reply: Option<Reply>,
    /// When the caller stops waiting; past it the command is not proposed.
    deadline: Option<Instant>,
}

impl batcher::Queued for Proposal {
    fn kv_bytes(&self) -> usize {
        self.command.as_ref().map_or(0, Command::kv_bytes)
    }
    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

/// The most bytes of fenced-store keys and values in one log entry (one
/// largest put always fits): openraft sends up to 300 entries in one
/// AppendEntries, and that message must stay under the peer port's frame
/// bound (`network::RAFT_MESSAGE_MAX_BYTES`, 64 MiB).
pub const MAX_ENTRY_KV_BYTES: usize = 3 * fenced_core::KV_VALUE_MAX_BYTES;

/// Tuning of the write path.
#[derive(Debug, Clone, Copy)]
pub struct ProposerConfig {
    /// Most commands waiting for a batch; beyond it callers get RESOURCE_EXHAUSTED.
    pub max_pending: usize,
    /// Most commands in one log entry.
    pub max_batch: usize,
    /// Log entries proposed and not yet applied, at most.
    pub max_in_flight: usize,
    /// Clock-rate skew for fault-injection tests only; 0 otherwise.
    pub clock_skew_ppm: i64,
    /// Where the wall-clock times people read come from.
    pub wall: WallSource,
}

/// The leader's wall clock, read only for the times shown to people
/// (`fenced_core::WallClock`), never for expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WallSource {
    /// The system clock.
    System,
    /// `unix_ms` plus the cluster time: the simulation, whose runs must
    /// depend on the seed alone, not on the date.
    Simulated { unix_ms: u64 },
}

impl WallSource {
    /// Milliseconds since the Unix epoch when the cluster time is `at` (0
    /// for a clock set before the epoch), at most `MAX_UNIX_MS`.
    pub fn now_ms(self, at: ClusterTime) -> u64 {
        let ms = match self {
            WallSource::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            WallSource::Simulated { unix_ms } => unix_ms.saturating_add(at.as_millis()),
        };
        ms.min(fenced_core::MAX_UNIX_MS)
    }
}

/// Handle used by the services to propose commands.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Proposal>,
    max_pending: usize,
    deadline_drops: Arc<AtomicU64>,
    /// Set while leadership is handed over: nothing more is proposed.
    handing_over: Arc<AtomicBool>,
}

impl Proposer {
    /// Starts the proposer task.
    pub fn start(
        raft: Raft,
        shared: Arc<Shared>,
        counters: Arc<Counters>,
        time: Arc<ClusterClock>,
        config: ProposerConfig,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.max_pending.max(1));
        let deadline_drops = Arc::new(AtomicU64::new(0));
        let handing_over = Arc::new(AtomicBool::new(false));
        tokio::spawn(run(
            Writes {
                raft,
                shared,
                counters,
                time,
            },
            config,
            rx,
            Arc::clone(&deadline_drops),
            Arc::clone(&handing_over),
        ));
        Self {
            tx,
            max_pending: config.max_pending,
            deadline_drops,
            handing_over,
        }
    }

    /// Stops proposing for good (the node is stopping and hands its
    /// leadership over): the log stops growing so a follower can catch up
    /// and win. Callers are told there is no leader right now and retry.
    pub fn stop_for_handover(&self) {
        self.handing_over.store(true, Ordering::SeqCst);
    }

    /// Proposes one command and waits for its applied outcome, of the
    /// command's own type `T`. A command still queued when `deadline`
    /// passes is dropped unwritten ([`ProposeError::DeadlineExceeded`]).
    pub async fn propose<T: CommandOutcome>(
        &self,
        command: Command,
        deadline: Option<Instant>,
    ) -> Result<(T, ClusterTime), ProposeError> {
        let (outcome, now) = self.propose_any(command, deadline).await?;
        let outcome = T::from_outcome(outcome).map_err(|other| {
            tracing::error!(outcome = ?other, "an outcome is not of its command's type");
            ProposeError::Internal(format!(
                "the outcome {other:?} is not of its command's type"
            ))
        })?;
        Ok((outcome, now))
    }

    async fn propose_any(
        &self,
        command: Command,
        deadline: Option<Instant>,
    ) -> Result<(Outcome, ClusterTime), ProposeError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(Proposal {
                command: Some(command),
                reply: Some(reply),
                deadline,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => ProposeError::QueueFull(self.max_pending),
                mpsc::error::TrySendError::Closed(_) => {
                    ProposeError::Unavailable("shutting down".into())
                }
            })?;
        rx.await
            .map_err(|_| ProposeError::Unknown("the proposer stopped".into()))?
    }

    /// Proposes an entry that only advances cluster time (to end waits and
    /// expire leases someone is waiting for).
    pub fn tick(&self) {
        let _ = self.tx.try_send(Proposal {
            command: None,
            reply: None,
            deadline: None,
        });
    }

    /// Proposes a wall-clock anchor (read again when its entry is stamped);
    /// nobody waits for it.
    pub fn anchor_wall_clock(&self, unix_ms: u64) {
        let _ = self.tx.try_send(Proposal {
            command: Some(Command::WallClock { unix_ms }),
            reply: None,
            deadline: None,
        });
    }

    /// Counts a command dropped unwritten because its caller's deadline
    /// passed (by the proposer, or by a follower before forwarding it).
    pub fn note_deadline_drop(&self) {
        self.deadline_drops.fetch_add(1, Ordering::Relaxed);
    }

    /// Proposals waiting in the queue for the proposer task.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Commands dropped so far because their caller's deadline passed.
    pub fn deadline_drops(&self) -> u64 {
        self.deadline_drops.load(Ordering::Relaxed)
    }
}

/// The current leader as this node knows it.
pub fn leader_of(raft: &Raft) -> Option<(NodeId, Node)> {
    let m = raft.metrics().borrow().clone();
    let id = m.current_leader?;
    let node = m.membership_config.membership().get_node(&id)?.clone();
    Some((id, node))
}

/// Makes sure this node is leader with a running clock; returns the term.
pub(crate) async fn ensure_clock(raft: &Raft, time: &ClusterClock) -> Result<u64, ProposeError> {
    let (state, term) = {
        let m = raft.metrics();
        let m = m.borrow();
        (m.state, m.current_term)
    };
    if state != ServerState::Leader {
        return Err(ProposeError::NotLeader {
            leader: leader_of(raft),
        });
    }
    if time.stamp(term).is_some() {
        return Ok(term);
    }
    // A new term: wait until everything committed before it is applied, so
    // the clock starts from the latest cluster time any entry carried.
    raft.ensure_linearizable()
        .await
        .map_err(|e| match e.forward_to_leader() {
            Some(f) => ProposeError::NotLeader {
                leader: f.leader_id.zip(f.leader_node.clone()),
            },
            None => ProposeError::Unavailable(e.to_string()),
        })?;
    let (base, applied) = time.start(term);
    tracing::info!(
        term,
        cluster_time_ms = base.as_millis(),
        last_applied_ms = applied.as_millis(),
        "leader clock started"
    );
    Ok(term)
}

/// What the proposer task writes through and reads: Raft, the applied
/// state (for the wall-clock anchor), its counters and the leader clock.
struct Writes {
    raft: Raft,
    shared: Arc<Shared>,
    counters: Arc<Counters>,
    time: Arc<ClusterClock>,
}

async fn run(
    Writes {
        raft,
        shared,
        counters,
        time,
    }: Writes,
    config: ProposerConfig,
    mut rx: mpsc::Receiver<Proposal>,
    deadline_drops: Arc<AtomicU64>,
    handing_over: Arc<AtomicBool>,
) {
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut batcher = Batcher::new(batcher::Limits {
        max_batch: config.max_batch,
        max_kv_bytes: MAX_ENTRY_KV_BYTES,
    });
    loop {
        let first = match batcher.take_carried() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => break,
            },
        };
        // While the previous entry is in flight, callers keep queueing: the
        // next batch grows with the load.
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            break;
        };
        let proposals = batcher.fill(first, || rx.try_recv().ok());
        if handing_over.load(Ordering::SeqCst) {
            answer_all(proposals, &ProposeError::NotLeader { leader: None });
            continue;
        }
        let term = match ensure_clock(&raft, &time).await {
            Ok(term) => term,
            Err(e) => {
                answer_all(proposals, &e);
                continue;
            }
        };
        let Some(stamp) = time.stamp(term) else {
            answer_all(
                proposals,
                &ProposeError::Unavailable("leadership changed".into()),
            );
            continue;
        };
        let (expired, proposals) = batcher::split_expired(proposals, Instant::now());
        if !expired.is_empty() {
            deadline_drops.fetch_add(expired.len() as u64, Ordering::Relaxed);
            for p in &expired {
                if let Some(c) = &p.command {
                    // The owner id is a capability: debug level only.
                    tracing::debug!(resource = ?c.resource(), owner_id = ?c.owner_id(), term,
                        "command dropped unproposed: its caller's deadline passed");
                }
            }
            answer_all(expired, &ProposeError::DeadlineExceeded);
            if proposals.is_empty() {
                continue;
            }
        }
        let (mut commands, mut replies): (Vec<Command>, Vec<Option<Reply>>) = proposals
            .into_iter()
            .filter_map(|p| p.command.map(|c| (c, p.reply)))
            .unzip();
        let unix_ms = config.wall.now_ms(stamp);
        if batcher::anchor_first(
            &mut commands,
            shared.wall_needs_anchor(stamp, unix_ms),
            unix_ms,
        ) {
            replies.insert(0, None);
        }
        batcher::stamp_wall_anchors(&mut commands, unix_ms);
        let from_clients = batcher::from_clients(&commands);
        if from_clients > 0 {
            counters.batch_commands.observe(from_clients as u64);
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let result = raft.client_write(Batch { stamp, commands }).await;
            drop(permit);
            match result {
                Ok(resp) => {
                    let outcomes = resp.data.0;
                    for (reply, outcome) in replies.into_iter().zip(outcomes) {
                        if let Some(reply) = reply {
                            let _ = reply.send(Ok((outcome, stamp)));
                        }
                    }
                }
                Err(e) => {
                    let err = match e.api_error() {
                        Some(ClientWriteError::ForwardToLeader(f)) => ProposeError::NotLeader {
                            leader: f.leader_id.zip(f.leader_node.clone()),
                        },
                        _ => ProposeError::Unknown(e.to_string()),
                    };
                    for reply in replies.into_iter().flatten() {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
        });
    }
}

fn answer_all(proposals: Vec<Proposal>, err: &ProposeError) {
    for p in proposals {
        if let Some(reply) = p.reply {
            let _ = reply.send(Err(err.clone()));
        }
    }
}

/// Starts the leader clock as soon as this node becomes leader, not at its
/// first write: until the clock runs, reads and ticks would see time stand
/// still and leases would outlive their TTL by however long no write came.
pub async fn run_leader_watch(raft: Raft, time: Arc<ClusterClock>) {
    let mut metrics = raft.metrics();
    loop {
        let (state, term) = {
            let m = metrics.borrow_and_update();
            (m.state, m.current_term)
        };
        if state == ServerState::Leader {
            time.became_leader(term);
            if time.stamp(term).is_none() {
                if let Err(e) = ensure_clock(&raft, &time).await {
                    tracing::debug!(term, error = %e, "leader clock not started");
                }
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Proposes ticks on the leader when a wait ends or any lease expires, so
/// parked callers are answered on time and every expiry is recorded, with a
/// revision, within a tick of its time (docs/DECISIONS.md, "Expiries are
/// swept by the leader").
///
/// Once a second (the first time as soon as it leads) it also compares the
/// leader's wall clock with the replicated anchors and proposes a new one
/// when they drift apart or there is none (see `fenced_core::WallClock`);
/// a second is ample for the last proposal to be applied.
pub async fn run_ticker(
    raft: Raft,
    shared: Arc<Shared>,
    time: Arc<ClusterClock>,
    proposer: Proposer,
    wall: WallSource,
) {
    const WALL_CHECK_EVERY: Duration = Duration::from_secs(1);
    let mut interval = tokio::time::interval(Duration::from_millis(20));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // The first look comes as soon as this node leads, then one a second.
    let mut next_wall_check = tokio::time::Instant::now();
    loop {
        interval.tick().await;
        let term = raft.metrics().borrow().current_term;
        let Some(now) = time.stamp(term) else {
            continue;
        };
        if tokio::time::Instant::now() >= next_wall_check {
            next_wall_check = tokio::time::Instant::now() + WALL_CHECK_EVERY;
            let unix_ms = wall.now_ms(now);
            if shared.wall_needs_anchor(now, unix_ms) {
                tracing::debug!(
                    term,
                    cluster_time_ms = now.as_millis(),
                    "anchoring the wall clock"
                );
                proposer.anchor_wall_clock(unix_ms);
            }
        }
        if shared.next_sweep().is_some_and(|wakeup| now >= wakeup) {
            proposer.tick();
        }
    }
}
