//! Faults: partitions (nftables), pauses (SIGSTOP/SIGCONT), crashes
//! (SIGKILL and restart), wall-clock jumps and strobes (libfaketime), and the
//! proof that each one took effect.

use std::{
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use serde::Serialize;

use fenced_proto::v1::{kv_client::KvClient, lock_client::LockClient};

use crate::{
    cluster::{self, Cluster, LIBFAKETIME},
    history::Recorder,
    membership::{self, Claim, Members},
    net::{node_addr, node_ns, Net, HARNESS_ADDR},
    workload::Ctx,
};

/// One scheduled fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// The leader cut off from its peers and from the clients.
    IsolateLeader,
    /// The leader alone on one side; clients still reach it.
    LeaderMinority,
    /// The leader and one follower against the other follower.
    LeaderMajority,
    /// Two nodes cannot talk to each other; the third sees both.
    Bridge,
    /// The leader's packets reach its peers; theirs never reach it.
    OneWayLeader,
    /// Random loss (percent) on every peer link, both directions.
    Loss(u32),
    PauseLeader {
        ms: u64,
    },
    PauseFollower {
        ms: u64,
    },
    PauseClients {
        ms: u64,
    },
    KillLeader,
    KillRandom,
    /// The leader is stopped past two elections (its successor is killed
    /// and restarted while it is stopped), woken, and the leader that
    /// granted since is killed at once: the woken node's clock ran on while
    /// it was stopped, ahead of its successors', and the next election is
    /// decided with its vote.
    StaleLeaderWakes,
    /// The leader's wall clock jumps by `secs` (negative: backwards).
    WallJump {
        secs: i64,
    },
    /// Every node's wall clock swings back and forth.
    WallStrobe,
    /// A new node (a new id) joins with `--join` as a learner and is
    /// promoted (a follower is removed first when there are five voters).
    AddNode,
    /// The leader is removed; the voters left elect another (a node is
    /// added first when there are three voters).
    RemoveLeader,
    /// A follower is removed (a node is added first at three voters).
    RemoveFollower,
    /// A follower is killed, removed, and a new node with a new id joins
    /// and is promoted in its place.
    ReplaceNode,
    /// The leader (one bit of its Raft log flipped) or any member (one bit
    /// of its snapshot, or of its log before it has one) is killed, damaged
    /// and started again: it must refuse, and `fenced repair` and a start
    /// must bring it back.
    Damage {
        leader: bool,
    },
    /// A member is killed and its data directory deleted (a lost disk); it
    /// is started again as it was and must repair itself.
    Wipe,
    /// The leader's (or any member's) disk fills up while it runs: it must
    /// stop with the storage exit code, acknowledging nothing it could not
    /// write, and vote again once space is freed and it is started again.
    FullDisk {
        leader: bool,
    },
}

impl Fault {
    pub fn name(&self) -> String {
        match self {
            Fault::IsolateLeader => "isolate-leader".into(),
            Fault::LeaderMinority => "leader-minority".into(),
            Fault::LeaderMajority => "leader-majority".into(),
            Fault::Bridge => "bridge".into(),
            Fault::OneWayLeader => "one-way-leader".into(),
            Fault::Loss(p) => format!("loss-{p}%"),
            Fault::PauseLeader { ms } => format!("pause-leader-{ms}ms"),
            Fault::PauseFollower { ms } => format!("pause-follower-{ms}ms"),
            Fault::PauseClients { ms } => format!("pause-clients-{ms}ms"),
            Fault::KillLeader => "kill-leader".into(),
            Fault::KillRandom => "kill-random".into(),
            Fault::StaleLeaderWakes => "stale-leader-wakes".into(),
            Fault::WallJump { secs } => format!("wall-jump-{secs:+}s"),
            Fault::WallStrobe => "wall-strobe".into(),
            Fault::AddNode => "add-node".into(),
            Fault::RemoveLeader => "remove-leader".into(),
            Fault::RemoveFollower => "remove-follower".into(),
            Fault::ReplaceNode => "replace-node".into(),
            Fault::Damage { leader: true } => "damage-leader".into(),
            Fault::Damage { leader: false } => "damage-random".into(),
            Fault::Wipe => "wipe-random".into(),
            Fault::FullDisk { leader: true } => "full-disk-leader".into(),
            Fault::FullDisk { leader: false } => "full-disk-random".into(),
        }
    }

    /// Whether it is a membership change rather than a fault.
    pub fn changes_members(&self) -> bool {
        matches!(
            self,
            Fault::AddNode | Fault::RemoveLeader | Fault::RemoveFollower | Fault::ReplaceNode
        )
    }

    /// Whether the fault is meant to move leadership. Such a fault comes
    /// after an idle period: a new leader then starts its clock long after
    /// the last log entry was stamped, the case in which cluster time could
    /// run backwards and revive leases that had run out.
    pub fn moves_leader(&self) -> bool {
        match self {
            Fault::IsolateLeader
            | Fault::LeaderMinority
            | Fault::KillLeader
            | Fault::KillRandom
            | Fault::StaleLeaderWakes
            | Fault::RemoveLeader
            | Fault::Damage { leader: true }
            | Fault::FullDisk { leader: true } => true,
            Fault::PauseLeader { ms } => *ms >= 4500,
            _ => false,
        }
    }
}

/// What happened to one fault, for the nemesis log and the coverage gate.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub fault: String,
    pub target: String,
    pub installed_ns: u64,
    pub healed_ns: u64,
    /// Evidence that the fault took effect, or why it did not.
    pub evidence: String,
    pub took_effect: bool,
    /// Set when the fault could not be installed at all.
    pub skipped: Option<String>,
    /// Client pauses: when the workers were let go again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_ns: Option<u64>,
    /// The idle period before the fault (no writes to the cluster's log):
    /// from when the writers were held to when the fault let them go.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_ns: Option<(u64, u64)>,
    /// A damaged file: whether the node refused it by its checksum, naming
    /// the next step (checked by `invariants::damage_refused`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damage_refused: Option<bool>,
    /// A full disk: whether the node stopped with the storage exit code
    /// while its disk was full (checked by `invariants::full_disk_stops`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_disk_stopped: Option<bool>,
    /// A leader paused for at most [`KEEPS_LEADER_MS`], every other voter
    /// up: whether no other node was elected (checked by
    /// `invariants::short_pause_keeps_leader`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_kept: Option<bool>,
}

/// The longest leader pause after which the same leader must still lead:
/// with the default settings a follower's lease is 400 ms from the last
/// heartbeat it heard and heartbeats are 50 ms apart, so a 300 ms stop
/// leaves the followers at most 350 ms without one, 50 ms of margin for the
/// signals and the leader's wake-up (docs/decisions/replication.md, "The
/// election timeout is 200 ms").
pub const KEEPS_LEADER_MS: u64 = 300;

/// Leader observations: (time, leader id, term), one per change seen.
#[derive(Default)]
pub struct LeaderLog {
    pub changes: Mutex<Vec<(u64, u64, u64)>>,
}

impl LeaderLog {
    fn latest_term(&self) -> u64 {
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .map_or(0, |c| c.2)
    }
}

/// The leader as the nodes report it: the self-declared leader of the
/// highest term among the running nodes.
pub async fn find_leader(ids: &[u64]) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    for &id in ids {
        if let Some(s) = cluster::status(id, Duration::from_millis(400)).await {
            if s.role == "leader" && best.is_none_or(|(_, t)| s.term > t) {
                best = Some((id, s.term));
            }
        }
    }
    best
}

/// Polls the nodes and records each new (leader, term).
pub async fn monitor(
    ids: Vec<u64>,
    log: Arc<LeaderLog>,
    rec: Recorder,
    stop: Arc<tokio::sync::Notify>,
) {
    loop {
        if let Some((leader, term)) = find_leader(&ids).await {
            let mut c = log.changes.lock().unwrap_or_else(PoisonError::into_inner);
            if c.last().is_none_or(|(_, l, t)| *l != leader || *t != term) {
                tracing::info!(leader, term, "leader observed");
                c.push((rec.now_ns(), leader, term));
            }
        }
        tokio::select! {
            _ = stop.notified() => return,
            _ = tokio::time::sleep(Duration::from_millis(150)) => {}
        }
    }
}

/// One step of a membership change, for the timeline of changes against
/// faults: a new node joining as a learner, its promotion, a removal.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The change it belongs to ("m3 replace-node").
    pub change: String,
    /// "join", "promote" or "remove".
    pub step: &'static str,
    pub node: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub ok: bool,
    /// Refusals and errors retried, in order (the first few).
    pub retried: Vec<String>,
    pub retries: usize,
    /// The faults installed while it ran (filled in by the run).
    pub during: Vec<String>,
}

pub struct Nemesis<'a> {
    pub net: &'a Net,
    pub cluster: Arc<tokio::sync::Mutex<Cluster>>,
    pub ctx: Arc<Ctx>,
    pub leaders: Arc<LeaderLog>,
    pub rec: Recorder,
    pub rng: fastrand::Rng,
    pub hold: Duration,
    /// The members, shared with a nemesis running beside this one.
    pub members: Arc<Members>,
    /// Idle time before a fault that moves leadership (zero: none).
    pub idle: Duration,
    /// Lets the writers go at the end of an idle period.
    pub idle_release: Option<tokio::sync::oneshot::Sender<()>>,
    /// The id the next node that joins gets (ids are never reused).
    pub next_id: u64,
    /// Set while a fault is installed, for changes that wait for one.
    pub live: Option<tokio::sync::watch::Sender<bool>>,
    /// The steps of the membership changes made so far.
    pub steps: Vec<Step>,
    /// The tag and name of the fault or change running.
    current: String,
}

/// Refusals kept per step in the timeline.
const RETRIES_KEPT: usize = 3;

impl<'a> Nemesis<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        net: &'a Net,
        cluster: Arc<tokio::sync::Mutex<Cluster>>,
        ctx: Arc<Ctx>,
        leaders: Arc<LeaderLog>,
        rec: Recorder,
        seed: u64,
        hold: Duration,
        members: Arc<Members>,
        idle: Duration,
    ) -> Nemesis<'a> {
        let next_id = members.ids().iter().max().copied().unwrap_or(0) + 1;
        Nemesis {
            net,
            cluster,
            ctx,
            leaders,
            rec,
            rng: fastrand::Rng::with_seed(seed),
            hold,
            members,
            idle,
            idle_release: None,
            next_id,
            live: None,
            steps: Vec::new(),
            current: String::new(),
        }
    }

    fn ids(&self) -> Vec<u64> {
        self.members.ids()
    }

    async fn leader(&self) -> Option<u64> {
        for _ in 0..25 {
            if let Some((l, _)) = find_leader(&self.ids()).await {
                return Some(l);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    fn others(&self, id: u64) -> Vec<u64> {
        self.ids().into_iter().filter(|&n| n != id).collect()
    }

    fn step(
        &mut self,
        step: &'static str,
        node: u64,
        start_ns: u64,
        ok: bool,
        retried: Vec<String>,
    ) {
        self.steps.push(Step {
            change: self.current.clone(),
            step,
            node,
            start_ns,
            end_ns: self.rec.now_ns(),
            ok,
            retries: retried.len(),
            retried: retried.into_iter().take(RETRIES_KEPT).collect(),
            during: Vec::new(),
        });
    }

    /// A new node joins as a learner and is promoted; it becomes a member
    /// the workload and the other faults use.
    async fn grow(&mut self) -> Result<String> {
        let id = self.next_id;
        if id > membership::MEMBER_SLOTS {
            anyhow::bail!(
                "no unused node id left (ids up to {})",
                membership::MEMBER_SLOTS
            );
        }
        self.next_id += 1;
        let t0 = self.rec.now_ns();
        self.cluster.lock().await.add_joining(id)?;
        let mut added_retries = Vec::new();
        membership::add_learner(&self.ids(), id, Duration::from_secs(30), &mut added_retries)
            .await?;
        let joined = membership::wait_joined(&self.ids(), id, Duration::from_secs(30)).await;
        self.step("join", id, t0, joined.is_ok(), Vec::new());
        let joined = joined?;
        let t1 = self.rec.now_ns();
        let started = std::time::Instant::now();
        let mut retried = Vec::new();
        let promoted =
            membership::promote(&self.ids(), id, Duration::from_secs(30), &mut retried).await;
        let retries = retried.len();
        self.step("promote", id, t1, promoted.is_ok(), retried);
        promoted?;
        let channel = cluster::channel(&cluster::client_addr(id))?;
        self.ctx
            .kv_clients
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, KvClient::new(channel.clone())));
        self.ctx
            .clients
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, LockClient::new(channel)));
        self.members.add(id);
        Ok(format!(
            "n{id} joined as a learner after {} ms, promoted after {} ms more ({retries} refusals retried)",
            joined.as_millis(),
            started.elapsed().as_millis()
        ))
    }

    /// Removes member `id` (claimed by the caller) and stops it for good.
    async fn shrink(&mut self, id: &Claim) -> Result<String> {
        let id = id.id;
        let t0 = self.rec.now_ns();
        let mut retried = Vec::new();
        let removed =
            membership::remove(&self.ids(), id, Duration::from_secs(30), &mut retried).await;
        let retries = retried.len();
        self.step("remove", id, t0, removed.is_ok(), retried);
        removed?;
        self.members.remove(id);
        self.ctx
            .clients
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(n, _)| *n != id);
        self.ctx
            .kv_clients
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(n, _)| *n != id);
        self.cluster.lock().await.forget(id)?;
        Ok(format!("n{id} removed ({retries} refusals retried)"))
    }

    /// Claims a follower no fault works on, for a removal.
    async fn claim_follower(&mut self) -> Result<Claim> {
        for _ in 0..50 {
            let (l, _) = self.require_leader().await?;
            let o = self.others(l);
            if let Some(c) = self.members.claim_any(&o, &mut self.rng, "change") {
                return Ok(c);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::bail!("every follower stayed busy with a fault for 10 s")
    }

    /// Keeps three to five voters around a change of one: grows before a
    /// removal at three, shrinks before an addition at five.
    async fn make_room(&mut self, adding: bool) -> Result<String> {
        let n = self.ids().len();
        if adding && n >= 5 {
            let f = self.claim_follower().await?;
            return Ok(format!("{}; ", self.shrink(&f).await?));
        }
        if !adding && n <= 3 {
            return Ok(format!("{}; ", self.grow().await?));
        }
        Ok(String::new())
    }

    async fn membership_fault(&mut self, fault: Fault, r: &mut FaultRecord) -> Result<()> {
        // A replacement adds the new node before it removes the dead one,
        // so the voters never drop below three: it needs room for one.
        let mut evidence = self
            .make_room(matches!(fault, Fault::AddNode | Fault::ReplaceNode))
            .await?;
        match fault {
            Fault::AddNode => {
                r.installed_ns = self.rec.now_ns();
                r.target = format!("n{}", self.next_id);
                evidence.push_str(&self.grow().await?);
                r.took_effect = true;
            }
            Fault::RemoveLeader => {
                // The leader, unless a fault is killing or pausing it: then
                // wait for that to end (or for another leader).
                let mut claimed = None;
                for _ in 0..50 {
                    let (l, term) = self.require_leader().await?;
                    if let Some(c) = self.members.claim(l, "change") {
                        claimed = Some((c, term));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let (l, term) = claimed.ok_or_else(|| {
                    anyhow::anyhow!("the leader stayed busy with a fault for 15 s")
                })?;
                r.target = format!("n{}", l.id);
                r.installed_ns = self.rec.now_ns();
                evidence.push_str(&self.shrink(&l).await?);
                self.end_idle(r);
                let mut moved = None;
                for _ in 0..50 {
                    if let Some((n, t)) = find_leader(&self.ids()).await {
                        if n != l.id && t > term {
                            moved = Some((n, t));
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                evidence.push_str(&format!("; leader after it: {moved:?}"));
                r.took_effect = moved.is_some();
            }
            Fault::RemoveFollower => {
                let f = self.claim_follower().await?;
                r.target = format!("n{}", f.id);
                r.installed_ns = self.rec.now_ns();
                evidence.push_str(&self.shrink(&f).await?);
                r.took_effect = true;
            }
            Fault::ReplaceNode => {
                let dead = self.claim_follower().await?;
                r.target = format!("n{}", dead.id);
                r.installed_ns = self.rec.now_ns();
                let killed = self.cluster.lock().await.kill9(dead.id)?;
                self.ctx
                    .down
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(dead.id);
                evidence.push_str(&format!("n{} killed: {killed}; ", dead.id));
                evidence.push_str(&self.grow().await?);
                evidence.push_str("; ");
                evidence.push_str(&self.shrink(&dead).await?);
                self.ctx
                    .down
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .retain(|&n| n != dead.id);
                // The replacement joined and the dead node left (each step
                // fails the fault otherwise), whether this kill or an
                // earlier one stopped it.
                r.took_effect = true;
            }
            _ => {}
        }
        let voters = membership::members(&self.ids()).await.map(|m| {
            m.iter()
                .filter(|(_, v)| *v)
                .map(|(id, _)| *id)
                .collect::<Vec<_>>()
        });
        evidence.push_str(&format!("; voters now {voters:?}"));
        r.evidence = evidence;
        Ok(())
    }

    /// Claims the leader (or with `leader` false any member) for a process
    /// fault, waiting up to 5 s while a membership change works on it; then
    /// any member no change works on. Returns the claim and the leader.
    async fn claim_for_fault(&mut self, leader: bool) -> Result<(Claim, u64, u64)> {
        for _ in 0..25 {
            let (l, term) = self.require_leader().await?;
            let c = if leader {
                self.members.claim(l, "fault")
            } else {
                let ids = self.ids();
                self.members.claim_any(&ids, &mut self.rng, "fault")
            };
            if let Some(c) = c {
                return Ok((c, l, term));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (l, term) = self.require_leader().await?;
        let ids = self.ids();
        let c = self
            .members
            .claim_any(&ids, &mut self.rng, "fault")
            .ok_or_else(|| anyhow::anyhow!("every member is busy with a membership change"))?;
        Ok((c, l, term))
    }
    /// Cuts `a` and `b` apart in both directions.
    fn cut(&self, a: u64, b: u64, tag: &str) -> Result<()> {
        self.net.drop_from(a, &node_addr(b), 100, tag)?;
        self.net.drop_from(b, &node_addr(a), 100, tag)
    }

    /// Installs `fault`, holds it, heals it; returns its record.
    pub async fn run(&mut self, fault: Fault, tag: &str) -> FaultRecord {
        let mut record = FaultRecord {
            fault: fault.name(),
            target: String::new(),
            installed_ns: self.rec.now_ns(),
            healed_ns: 0,
            evidence: String::new(),
            took_effect: false,
            skipped: None,
            released_ns: None,
            idle_ns: None,
            damage_refused: None,
            full_disk_stopped: None,
            leader_kept: None,
        };
        self.current = format!("{tag} {}", fault.name());
        if !self.idle.is_zero() && fault.moves_leader() {
            self.start_idle(&mut record).await;
        }
        if let Some(live) = &self.live {
            live.send_replace(true);
        }
        if let Err(e) = self.apply(fault, tag, &mut record).await {
            record.skipped = Some(format!("{e:#}"));
        }
        self.end_idle(&mut record);
        // Whatever happened, leave the network whole; a membership change
        // installs no rule, and must not lift the partition that the fault
        // nemesis beside it holds.
        let healed = if fault.changes_members() {
            Ok(())
        } else {
            self.net.heal()
        };
        if let Err(e) = healed {
            record.evidence.push_str(&format!("; heal failed: {e:#}"));
            record.took_effect = false;
        }
        record.healed_ns = self.rec.now_ns();
        if let Some(live) = &self.live {
            live.send_replace(false);
        }
        tracing::info!(
            fault = record.fault,
            target = record.target,
            took_effect = record.took_effect,
            evidence = record.evidence,
            skipped = record.skipped.as_deref().unwrap_or(""),
            "fault healed"
        );
        record
    }

    /// Holds every writer for the idle time (the reader goes on), then
    /// returns with them still held: the fault lets them go once installed.
    async fn start_idle(&mut self, r: &mut FaultRecord) {
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let _g = ctx.idle.write().await;
            let _ = held_tx.send(());
            let _ = release_rx.await;
        });
        let _ = held_rx.await;
        let from = self.rec.now_ns();
        r.idle_ns = Some((from, from));
        self.idle_release = Some(release_tx);
        tokio::time::sleep(self.idle).await;
    }

    /// Ends the idle period, if one is running.
    fn end_idle(&mut self, r: &mut FaultRecord) {
        if let Some(tx) = self.idle_release.take() {
            // The end is stamped before the writers go: their first
            // requests are not in the idle window.
            if let Some((from, _)) = r.idle_ns {
                r.idle_ns = Some((from, self.rec.now_ns()));
            }
            let _ = tx.send(());
        }
    }

    async fn require_leader(&self) -> Result<(u64, u64)> {
        let l = self
            .leader()
            .await
            .ok_or_else(|| anyhow::anyhow!("no leader to target"))?;
        Ok((l, self.leaders.latest_term()))
    }

    /// Waits `wait`; returns the nodes of `among` seen down (killed) at
    /// some time during it.
    async fn down_among(&self, among: &[u64], wait: Duration) -> std::collections::BTreeSet<u64> {
        let mut down = std::collections::BTreeSet::new();
        let until = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < until {
            down.extend(
                self.ctx
                    .down
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .copied()
                    .filter(|n| among.contains(n)),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        down
    }

    /// The leader of a term after `term` and that term, once seen within
    /// `within`.
    async fn leader_after(&self, term: u64, within: Duration) -> Option<(u64, u64)> {
        let until = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < until {
            let latest = self.leaders.latest_term();
            if latest > term {
                if let Some(l) = self.leader().await {
                    return Some((l, latest));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// Tells the workload node `id` is down (its calls are expected to fail).
    fn mark_down(&self, id: u64) {
        self.ctx
            .down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
    }

    /// Tells the workload node `id` is up again.
    fn mark_up(&self, id: u64) {
        self.ctx
            .down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&n| n != id);
    }

    /// `kill -9` of node `id`, known down to the workload until it is
    /// started again after `down`.
    async fn kill_and_restart(&self, id: u64, down: Duration) -> Result<bool> {
        let killed = self.cluster.lock().await.kill9(id)?;
        self.mark_down(id);
        tokio::time::sleep(down).await;
        self.cluster.lock().await.start(id)?;
        self.mark_up(id);
        Ok(killed)
    }

    /// A disk fault: kill, damage or delete the data, start; a damaged node
    /// must refuse and is then repaired with `fenced repair`; a wiped one
    /// repairs itself. Took effect when the damage was refused (or the
    /// wipe noticed) and the node voted again within 30 s. Whether a damaged
    /// file was refused by its checksum (with the next step) is recorded for
    /// the checker, `invariants::damage_refused`.
    async fn damage(&mut self, fault: Fault, r: &mut FaultRecord) -> Result<()> {
        let (claim, _, _) = self
            .claim_for_fault(fault == Fault::Damage { leader: true })
            .await?;
        let target = claim.id;
        r.target = format!("n{target}");
        let dir = self.cluster.lock().await.data_dir(target)?;
        r.installed_ns = self.rec.now_ns();
        let killed = self.cluster.lock().await.kill9(target)?;
        self.end_idle(r);
        self.mark_down(target);
        let what = if fault == Fault::Wipe {
            // Its contents: the directory may be a mount point.
            empty_dir(&dir).with_context(|| format!("deleting {}", dir.display()))?;
            "data directory deleted".to_string()
        } else {
            // A member's snapshot, the leader's log: both kinds of file
            // every round.
            flip_a_bit(
                &dir,
                fault == Fault::Damage { leader: false },
                &mut self.rng,
            )?
        };
        // The refusal must be the checksum's (or raft-log's CRC's), with
        // its next step: a decoder that happens to choke on the damage
        // does not count.
        let by_checksum = |log: &str| log.matches(REPAIR_STEP).count();
        let before = by_checksum(&self.cluster.lock().await.log_of(target));
        let started = tokio::time::Instant::now();
        self.cluster.lock().await.start(target)?;
        let mut refused = None;
        if fault != Fault::Wipe {
            for _ in 0..100 {
                if let Some(status) = self.cluster.lock().await.exited(target)? {
                    refused = Some(status);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if refused.is_some() {
                self.cluster.lock().await.repair(target)?;
                self.cluster.lock().await.start(target)?;
            }
        }
        self.mark_up(target);
        let mut repaired = None;
        for _ in 0..300 {
            if let Some(s) = cluster::status(target, Duration::from_millis(300)).await {
                if !s.repairing && s.last_applied > 0 {
                    repaired = Some(started.elapsed());
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let noticed = match fault {
            Fault::Wipe => self
                .cluster
                .lock()
                .await
                .log_of(target)
                .contains("its data was lost"),
            _ => {
                let by_its_checksum = refused.is_some_and(|s| !s.success())
                    && by_checksum(&self.cluster.lock().await.log_of(target)) > before;
                r.damage_refused = Some(by_its_checksum);
                true
            }
        };
        r.evidence = format!(
            "killed: {killed}; {what}; refused at start: {refused:?}; voting again after {repaired:?}"
        );
        r.took_effect = killed && noticed && repaired.is_some();
        drop(claim);
        Ok(())
    }

    /// A full disk: a file fills the node's data directory (a file system
    /// of its own, `Cluster::new`) while it runs, for 3 to 6 s. The node
    /// must stop with the storage exit code meanwhile (a write it cannot
    /// make is never acknowledged); the file is removed, the node started
    /// as its supervisor would, and it must vote again within 30 s.
    async fn fill_disk(&mut self, leader: bool, r: &mut FaultRecord) -> Result<()> {
        let (claim, _, _) = self.claim_for_fault(leader).await?;
        let target = claim.id;
        r.target = format!("n{target}");
        let dir = self.cluster.lock().await.data_dir(target)?;
        let filler = dir.join(FILLER);
        let hold = Duration::from_millis(self.rng.u64(3_000..6_000));
        r.installed_ns = self.rec.now_ns();
        self.end_idle(r);
        let filled = fill(&filler);
        let started = tokio::time::Instant::now();
        let mut stopped = None;
        while started.elapsed() < hold {
            if let Some(status) = self.cluster.lock().await.exited(target)? {
                stopped = Some(status);
                self.mark_down(target);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stopped_after = started.elapsed();
        tokio::time::sleep(hold.saturating_sub(stopped_after)).await;
        let _ = std::fs::remove_file(&filler);
        r.healed_ns = self.rec.now_ns();
        self.cluster.lock().await.start(target)?;
        self.mark_up(target);
        let mut voting = None;
        for _ in 0..300 {
            if let Some(s) = cluster::status(target, Duration::from_millis(300)).await {
                if !s.repairing && s.last_applied > 0 && s.leader_id != 0 {
                    voting = Some(started.elapsed());
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let by_storage_code = stopped.is_some_and(|s| s.code() == Some(EXIT_STORAGE_FAILED));
        r.full_disk_stopped = Some(by_storage_code);
        r.evidence = format!(
            "filled: {filled:?}; stopped: {stopped:?} after {stopped_after:?}; back voting \
             after {voting:?}"
        );
        r.took_effect = filled.is_ok() && voting.is_some();
        drop(claim);
        Ok(())
    }

    /// Waits for the hold time; true if a newer term than `term` was observed.
    async fn hold_and_watch(&self, hold: Duration, term: u64) -> bool {
        tokio::time::sleep(hold).await;
        self.leaders.latest_term() > term
    }

    async fn apply(&mut self, fault: Fault, tag: &str, r: &mut FaultRecord) -> Result<()> {
        match fault {
            Fault::AddNode | Fault::RemoveLeader | Fault::RemoveFollower | Fault::ReplaceNode => {
                self.membership_fault(fault, r).await?;
            }
            Fault::IsolateLeader | Fault::LeaderMinority | Fault::OneWayLeader => {
                let (l, term) = self.require_leader().await?;
                r.target = format!("n{l}");
                r.installed_ns = self.rec.now_ns();
                for o in self.others(l) {
                    if fault == Fault::OneWayLeader {
                        self.net.drop_from(l, &node_addr(o), 100, tag)?;
                    } else {
                        self.cut(l, o, tag)?;
                    }
                }
                if fault == Fault::IsolateLeader {
                    self.net.drop_from(l, HARNESS_ADDR, 100, tag)?;
                }
                self.end_idle(r);
                let voters = self.ids().len();
                let cut_off = self.others(l);
                // A membership change beside this fault may kill a node on
                // the majority side (a replacement): watch for it.
                let down = self.down_among(&cut_off, self.hold).await;
                let new_term = self.leaders.latest_term() > term;
                let dropped = self.net.dropped(tag)?;
                r.evidence = format!("{dropped} packets dropped; new leader elected: {new_term}");
                // Without a majority of the voters up on the other side, no
                // leader can be elected there: the cut is the evidence.
                let majority_left = cut_off.len() - down.len() > voters / 2;
                if !majority_left {
                    r.evidence.push_str(&format!(
                        "; no majority of {voters} voters on the other side: {down:?} down during it"
                    ));
                }
                r.took_effect =
                    dropped > 0 && (new_term || fault == Fault::OneWayLeader || !majority_left);
            }
            Fault::LeaderMajority => {
                let (l, _) = self.require_leader().await?;
                let others = self.others(l);
                let lone = others[self.rng.usize(..others.len())];
                r.target = format!("n{lone} alone");
                r.installed_ns = self.rec.now_ns();
                for o in self.others(lone) {
                    self.cut(lone, o, tag)?;
                }
                tokio::time::sleep(self.hold).await;
                let dropped = self.net.dropped(tag)?;
                r.evidence = format!("{dropped} packets dropped");
                r.took_effect = dropped > 0;
            }
            Fault::Bridge => {
                // The leader on one side: followers never talk to each other,
                // so a cut between two followers would change nothing.
                let (a, _) = self.require_leader().await?;
                let mut others = self.others(a);
                self.rng.shuffle(&mut others);
                let (b, c) = (others[0], others[1]);
                r.target = format!("n{a} | n{c}, n{b} sees both");
                r.installed_ns = self.rec.now_ns();
                self.cut(a, c, tag)?;
                tokio::time::sleep(self.hold).await;
                let dropped = self.net.dropped(tag)?;
                r.evidence = format!("{dropped} packets dropped");
                r.took_effect = dropped > 0;
            }
            Fault::Loss(p) => {
                r.target = format!("{p}% on every peer link");
                r.installed_ns = self.rec.now_ns();
                for a in self.ids() {
                    for b in self.others(a) {
                        self.net.drop_from(a, &node_addr(b), p, tag)?;
                    }
                }
                tokio::time::sleep(self.hold).await;
                let dropped = self.net.dropped(tag)?;
                r.evidence = format!("{dropped} packets dropped");
                r.took_effect = dropped > 0;
            }
            Fault::PauseLeader { ms } | Fault::PauseFollower { ms } => {
                let (claim, l, term) = if matches!(fault, Fault::PauseLeader { .. }) {
                    self.claim_for_fault(true).await?
                } else {
                    let (l, term) = self.require_leader().await?;
                    let o = self.others(l);
                    let c = self
                        .members
                        .claim_any(&o, &mut self.rng, "fault")
                        .ok_or_else(|| anyhow::anyhow!("every follower is busy with a change"))?;
                    (c, l, term)
                };
                let target = claim.id;
                r.target = if matches!(fault, Fault::PauseLeader { .. }) && target != l {
                    format!("n{target} (the leader n{l} was being removed)")
                } else {
                    format!("n{target}")
                };
                r.installed_ns = self.rec.now_ns();
                let stopped = {
                    let c = self.cluster.lock().await;
                    c.signal(target, Signal::SIGSTOP)?;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    c.is_stopped(target)
                };
                self.end_idle(r);
                let voters = self.ids().len();
                let rest = self.others(target);
                let down = self
                    .down_among(&rest, Duration::from_millis(ms.saturating_sub(50)))
                    .await;
                self.cluster.lock().await.signal(target, Signal::SIGCONT)?;
                // Give an election that the pause caused time to be seen.
                let new_term = self.hold_and_watch(Duration::from_millis(1500), term).await;
                r.evidence =
                    format!("stopped state seen: {stopped}; new leader elected: {new_term}");
                // A leader paused past its followers' leases must be
                // replaced. A follower stands once it has not heard from a
                // leader for its lease (election_timeout_max, 400 ms by
                // default) and a pre-vote majority agrees; 4.5 s leaves
                // room for a cluster run with a longer election timeout.
                // Not without a majority of the voters up while it lasted
                // (a replacement beside it killed one).
                let majority_left = rest.len() - down.len() > voters / 2;
                if !majority_left {
                    r.evidence.push_str(&format!(
                        "; no majority of {voters} voters without it: {down:?} down during it"
                    ));
                }
                let needs_election = matches!(fault, Fault::PauseLeader { ms } if ms >= 4500)
                    && target == l
                    && majority_left;
                r.took_effect = stopped && (new_term || !needs_election);
                // An election after a pause shorter than the followers'
                // lease is one that nothing caused.
                if matches!(fault, Fault::PauseLeader { ms } if ms <= KEEPS_LEADER_MS)
                    && stopped
                    && target == l
                    && down.is_empty()
                {
                    r.leader_kept = Some(!new_term);
                }
                drop(claim);
            }
            Fault::StaleLeaderWakes => {
                let (claim, l, term) = self.claim_for_fault(true).await?;
                let paused = claim.id;
                r.target = format!("n{paused}");
                r.installed_ns = self.rec.now_ns();
                let stopped = {
                    let c = self.cluster.lock().await;
                    c.signal(paused, Signal::SIGSTOP)?;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    c.is_stopped(paused)
                };
                self.end_idle(r);
                let wait = Duration::from_secs(8);
                let mut steps = Vec::new();
                // Two elections while it is stopped; it is woken whatever
                // happened.
                let stopped_phase = async {
                    let mut second = None;
                    if let Some((l1, t1)) = self.leader_after(term, wait).await {
                        steps.push(format!("n{l1} elected in term {t1}"));
                        if l1 != paused {
                            let killed = self
                                .kill_and_restart(l1, Duration::from_millis(200))
                                .await?;
                            steps.push(format!("n{l1} killed: {killed}, restarted"));
                            second = self.leader_after(t1, wait).await;
                        }
                    }
                    // The workers get grants from the second successor.
                    tokio::time::sleep(Duration::from_millis(1_000)).await;
                    Ok::<_, anyhow::Error>(second)
                }
                .await;
                self.cluster.lock().await.signal(paused, Signal::SIGCONT)?;
                let second = stopped_phase?;
                let mut third = None;
                if let Some((l2, t2)) = second {
                    steps.push(format!("n{l2} elected in term {t2}"));
                    if l2 != paused {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let killed = self
                            .kill_and_restart(l2, Duration::from_millis(1_500))
                            .await?;
                        steps.push(format!("n{paused} woken, n{l2} killed at once: {killed}"));
                        third = self.leader_after(t2, wait).await;
                    }
                }
                if let Some((l3, t3)) = third {
                    steps.push(format!("n{l3} elected in term {t3}"));
                }
                r.evidence = format!("n{l} stopped: {stopped}; {}", steps.join("; "));
                r.took_effect = stopped && third.is_some();
                drop(claim);
            }
            Fault::PauseClients { ms } => {
                r.target = "all client workers".into();
                let guard = self.ctx.freeze.write().await;
                r.installed_ns = self.rec.now_ns();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                r.released_ns = Some(self.rec.now_ns());
                drop(guard);
                r.evidence =
                    "workers held at their next request (checked against the history)".into();
                r.took_effect = true;
            }
            Fault::KillLeader | Fault::KillRandom => {
                let (claim, l, term) = self.claim_for_fault(fault == Fault::KillLeader).await?;
                let target = claim.id;
                r.target = if fault == Fault::KillLeader && target != l {
                    format!("n{target} (the leader n{l} was being removed)")
                } else {
                    format!("n{target}")
                };
                let loads = self.cluster.lock().await.snapshot_loads(target);
                r.installed_ns = self.rec.now_ns();
                let killed = self.cluster.lock().await.kill9(target)?;
                self.end_idle(r);
                self.mark_down(target);
                let down = Duration::from_millis(self.rng.u64(1000..=3000));
                let mut new_term = self.hold_and_watch(down, term).await;
                self.cluster.lock().await.start(target)?;
                self.mark_up(target);
                let mut back = false;
                for _ in 0..50 {
                    if cluster::status(target, Duration::from_millis(300))
                        .await
                        .is_some()
                    {
                        back = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // A dead leader's term ends even if it restarts before the
                // election completes: wait for the new term to be seen.
                for _ in 0..50 {
                    if new_term {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    new_term = self.leaders.latest_term() > term;
                }
                let from_snapshot = self.cluster.lock().await.snapshot_loads(target) > loads;
                // A leader that comes back before its followers' election
                // timers fire resumes leadership in the same term (openraft
                // restores a leader whose committed vote is its own): the
                // kill still took effect, and this is its evidence.
                let mut resumed = false;
                if !new_term && target == l {
                    for _ in 0..30 {
                        if let Some(s) = cluster::status(target, Duration::from_millis(300)).await {
                            if s.role == "leader" && s.term == term {
                                resumed = true;
                                break;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                r.evidence = format!(
                    "killed: {killed}; down {} ms; answering again: {back}; new leader elected: {new_term}; resumed leadership in term {term}: {resumed}; restarted from a snapshot: {from_snapshot}",
                    down.as_millis()
                );
                r.took_effect = killed && back && (new_term || resumed || target != l);
                drop(claim);
            }
            Fault::Damage { .. } | Fault::Wipe => self.damage(fault, r).await?,
            Fault::FullDisk { leader } => self.fill_disk(leader, r).await?,
            Fault::WallJump { secs } => {
                let (l, _) = self.require_leader().await?;
                r.target = format!("n{l}");
                r.installed_ns = self.rec.now_ns();
                self.cluster
                    .lock()
                    .await
                    .set_wall_offset(l, &format!("{secs:+}"))?;
                let seen = probe_wall_offset(l, self.cluster.lock().await.faketime_file(l)).await;
                tokio::time::sleep(self.hold).await;
                self.cluster.lock().await.set_wall_offset(l, "+0")?;
                r.evidence = format!("wall clock under libfaketime seen {seen:?} s off");
                r.took_effect = seen.is_some_and(|s| (s - secs).abs() <= 5);
            }
            Fault::WallStrobe => {
                r.target = "all nodes".into();
                r.installed_ns = self.rec.now_ns();
                let deadline = tokio::time::Instant::now() + self.hold;
                let mut flips = 0u32;
                let mut seen = None;
                while tokio::time::Instant::now() < deadline {
                    let offset = if flips.is_multiple_of(2) {
                        "+120"
                    } else {
                        "-120"
                    };
                    {
                        let c = self.cluster.lock().await;
                        for id in self.ids() {
                            c.set_wall_offset(id, offset)?;
                        }
                    }
                    if flips == 0 {
                        let file = self.cluster.lock().await.faketime_file(self.ids()[0]);
                        seen = probe_wall_offset(self.ids()[0], file).await;
                    }
                    flips += 1;
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                let c = self.cluster.lock().await;
                for id in self.ids() {
                    c.set_wall_offset(id, "+0")?;
                }
                r.evidence = format!("{flips} swings of ±120 s; first swing seen {seen:?} s off");
                r.took_effect = flips > 2 && seen.is_some_and(|s| (s - 120).abs() <= 5);
            }
        }
        Ok(())
    }
}

/// Reads the wall clock the way node `id` sees it (same namespace, same
/// libfaketime settings); returns its offset from the real one in seconds.
async fn probe_wall_offset(id: u64, file: Option<std::path::PathBuf>) -> Option<i64> {
    let file = file?;
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &node_ns(id), "env"])
        .arg(format!("LD_PRELOAD={LIBFAKETIME}"))
        .arg("FAKETIME_DONT_FAKE_MONOTONIC=1")
        .arg("FAKETIME_NO_CACHE=1")
        .arg(format!("FAKETIME_TIMESTAMP_FILE={}", file.display()))
        .args(["date", "+%s"])
        .output()
        .await
        .ok()?;
    let faked: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    let real = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs(),
    )
    .ok()?;
    Some(faked - real)
}

/// The membership changes of the membership profile, cycled beside its
/// faults; the voters stay between three and five.
pub fn membership_changes() -> Vec<Fault> {
    vec![
        Fault::AddNode,
        Fault::RemoveFollower,
        Fault::ReplaceNode,
        Fault::RemoveLeader,
    ]
}

/// What every refusal of a damaged file says to do next (the node's
/// `checksum::NEXT_STEP`).
const REPAIR_STEP: &str = "fenced repair --data-dir";

/// Flips one bit of the snapshot's content (with `snapshot`, when there is
/// one: between the frame's magic and its trailer, where only the CRC can
/// tell) or of the largest file of the Raft log, at a random offset; says
/// which.
/// The file a full disk is made of, in the node's data directory.
const FILLER: &str = "disk-filler";
/// `fenced`'s exit code for a failed storage (docs/OPERATIONS.md).
const EXIT_STORAGE_FAILED: i32 = 74;

/// Writes `path` until its file system is full; how many MiB it holds. An
/// error other than ENOSPC, or no end within 4 GiB, is returned.
fn fill(path: &Path) -> Result<u64> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let block = vec![0x5au8; 1 << 20];
    for mib in 0..4096u64 {
        if let Err(e) = f.write_all(&block).and_then(|()| f.sync_data()) {
            if e.raw_os_error() == Some(28) {
                return Ok(mib);
            }
            return Err(e).with_context(|| format!("filling {}", path.display()));
        }
    }
    anyhow::bail!(
        "{} did not fill within 4 GiB: not a file system of its own",
        path.display()
    )
}

/// Deletes what `dir` holds, leaving `dir` (a mount point cannot go).
fn empty_dir(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn flip_a_bit(dir: &Path, snapshot: bool, rng: &mut fastrand::Rng) -> Result<String> {
    let snapshot_file = dir.join("state/snapshot.bin");
    let (file, margins) = if snapshot && snapshot_file.is_file() {
        (snapshot_file, (8, 12))
    } else {
        (
            std::fs::read_dir(dir.join("raft-log"))?
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .max_by_key(|e| e.metadata().map_or(0, |m| m.len()))
                .map(|e| e.path())
                .context("no file in raft-log")?,
            (0, 0),
        )
    };
    let mut bytes = std::fs::read(&file)?;
    let end = bytes.len().saturating_sub(margins.1);
    anyhow::ensure!(end > margins.0, "{} is too short to damage", file.display());
    let at = rng.usize(margins.0..end);
    if let Some(b) = bytes.get_mut(at) {
        *b ^= 1 << rng.u8(0..8);
    }
    std::fs::write(&file, &bytes)?;
    Ok(format!(
        "flipped a bit of {} at offset {at}",
        file.display()
    ))
}

/// The faults of a profile, in order; the campaign cycles through them.
pub fn profile_faults(profile: &str) -> Option<Vec<Fault>> {
    let partition = vec![
        Fault::IsolateLeader,
        Fault::LeaderMinority,
        Fault::Bridge,
        Fault::OneWayLeader,
        Fault::LeaderMajority,
        Fault::Loss(35),
    ];
    let pause = vec![
        Fault::StaleLeaderWakes,
        Fault::PauseLeader { ms: 5000 },
        Fault::PauseClients { ms: 3000 },
        Fault::PauseFollower { ms: 3000 },
        Fault::PauseLeader { ms: 300 },
    ];
    let kill = vec![Fault::KillLeader, Fault::KillRandom];
    // Run with a snapshot every 50 entries (run.rs): restarts and lagging
    // followers go through snapshot install and restore all the time.
    let snapshots = vec![
        Fault::KillLeader,
        Fault::PauseFollower { ms: 3000 },
        Fault::KillRandom,
        Fault::PauseLeader { ms: 5000 },
        Fault::PauseLeader { ms: 300 },
    ];
    let clock = vec![
        Fault::WallJump { secs: 3600 },
        Fault::WallStrobe,
        Fault::KillLeader,
        Fault::WallJump { secs: -3600 },
    ];
    // The faults that run while membership_changes() change the members:
    // any three in a row hold a partition and a kill.
    let membership = vec![
        Fault::IsolateLeader,
        Fault::KillLeader,
        Fault::LeaderMinority,
        Fault::KillRandom,
        Fault::PauseLeader { ms: 5000 },
    ];
    // The disk profile's halves, each a profile of its own too, for the
    // canary that only it shows.
    let damage = vec![
        Fault::Damage { leader: false },
        Fault::Damage { leader: true },
        Fault::Wipe,
    ];
    let full_disk = vec![
        Fault::FullDisk { leader: false },
        Fault::FullDisk { leader: true },
    ];
    Some(match profile {
        "none" => Vec::new(),
        "membership" => membership,
        "partition" => partition,
        "pause" => pause,
        "kill" => kill,
        "clock" => clock,
        "snapshots" => snapshots,
        // Run with a snapshot every 50 entries, like "snapshots": a damaged
        // byte falls in the snapshot or in the log.
        "disk" => [damage, full_disk].concat(),
        "damage" => damage,
        "full-disk" => full_disk,
        "all" => [partition, pause, kill, clock].concat(),
        _ => return None,
    })
}
