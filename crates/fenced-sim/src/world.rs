//! The simulated cluster: three real nodes, started, stopped and restarted
//! on their data dirs, and the faults a seed draws for them.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use fenced_jepsen::check::invariants::NodeFinal;
use fenced_server::{
    node::{NodeConfig, NodeCore, Simulated},
    repair::RepairGate,
    rpc::{LockService, NodeContext},
    state_machine::parking::Parking,
    state_machine::{self, StateMachine},
    storage::data_format::{LOG_DIR, STATE_DIR},
    storage::log_store::LogStore,
    types::{Node, NodeId},
};
use openraft::storage::RaftLogStorage;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken as Stop;

use crate::{
    check,
    disk::{self, DiskFaults, IoFault},
    net::Net,
    workload, FaultClass, Rng, SimConfig, Verdict,
};

struct Running {
    ctx: NodeContext,
    stop: Stop,
    tasks: Vec<JoinHandle<()>>,
    /// Set once the node's Raft stopped on a storage error (its process
    /// would exit, for its supervisor to start again).
    failed: Arc<AtomicBool>,
    repair: Arc<RepairGate>,
}

/// The nodes, their data dirs, and what each one's clock and disk do.
pub struct Cluster {
    dir: PathBuf,
    rng: Rng,
    net: Arc<Net>,
    members: BTreeMap<NodeId, Node>,
    skew_ppm: BTreeMap<NodeId, i64>,
    snapshot_logs: u64,
    running: Mutex<BTreeMap<NodeId, Running>>,
    /// Which node's disk errs now.
    faults: Arc<DiskFaults>,
    /// Repairs so far: each moves a damaged directory to a name of its own.
    repairs: AtomicU64,
    /// Node crashes and restarts, for the report.
    pub log: Mutex<Vec<String>>,
    /// What a stopped node's data dir or its restart showed wrong.
    pub findings: Mutex<Vec<String>>,
}

const IDS: [NodeId; 3] = [1, 2, 3];

/// How long a start may take: a repair's fence waits for both other
/// voters, who run unless a bug stopped one for good.
const START_WITHIN: Duration = Duration::from_secs(60);

/// How long a restart waits for the crashed instance's last tasks to let
/// go of its log.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Runs `open` until it no longer finds the node's log locked, at most
/// [`LOCK_WAIT`]. A crashed node's last tasks (a message it was answering,
/// its state machine's worker) hold its log for a moment after the crash,
/// where a killed process would have let go at once: this waits for them
/// as a restart waits for the old process to die.
async fn once_unlocked<T, E, F>(mut open: impl FnMut() -> F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut waited = Duration::ZERO;
    loop {
        match open().await {
            Err(e) if e.to_string().contains("already locked") && waited < LOCK_WAIT => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                waited += Duration::from_millis(10);
            }
            done => return done,
        }
    }
}

impl Cluster {
    pub fn ids(&self) -> Vec<NodeId> {
        IDS.to_vec()
    }

    /// `what` with paths inside the run's temporary directory made
    /// relative to it: the same seed must note the same faults.
    fn relative(&self, what: String) -> String {
        what.replace(&format!("{}/", self.dir.display()), "")
    }

    fn note(&self, what: String) {
        let what = self.relative(what);
        tracing::info!(fault = %what, "simulation");
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    /// The Lock service of node `id`, if it runs.
    pub fn service(&self, id: NodeId) -> Option<LockService> {
        self.context(id).map(|ctx| LockService::new(ctx, false))
    }

    fn context(&self, id: NodeId) -> Option<NodeContext> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.get(&id).map(|r| r.ctx.clone())
    }

    /// Restarts node `id`; a failure is a finding, and the node stays down.
    async fn restart(&self, id: NodeId) {
        if let Err(e) = self.start(id).await {
            self.finding(format!("n{id} did not restart: {e:#}"));
        }
    }

    /// Starts node `id` on its data dir (a restart when it has one).
    pub async fn start(&self, id: NodeId) -> anyhow::Result<()> {
        let unused = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut cfg = NodeConfig::new(
            id,
            self.dir.join(format!("n{id}")),
            unused,
            unused,
            self.members.clone(),
        );
        cfg.snapshot_logs = self.snapshot_logs;
        cfg.proposer.clock_skew_ppm = self.skew_ppm.get(&id).copied().unwrap_or(0);
        // The date shown to people, from cluster time: the run depends on
        // the seed alone.
        cfg.proposer.wall = fenced_server::proposer::WallSource::Simulated {
            unix_ms: 1_800_000_000_000,
        };
        let fsync_rng = self.rng.clone();
        let faults = Arc::clone(&self.faults);
        let sim = Simulated {
            wire: self.net.wire(id),
            // Mostly a millisecond or two; now and then a slow disk; an
            // error while the node's disk errs.
            fsync: Arc::new(move || {
                faults.flush(id)?;
                Ok(fsync_rng.latency(2, 20_000..300_000, 200..2_500))
            }),
            status: self.net.status_asker(id),
            seed: self.rng.lock().u64(..),
        };
        // A node being repaired waits in its start for the other voters;
        // one that never comes back (a bug a canary plants) must end the
        // wait, not the run.
        let opened = tokio::time::timeout(
            START_WITHIN,
            once_unlocked(|| NodeCore::open(&cfg, Some(sim.clone()))),
        )
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "node {id} did not start within {START_WITHIN:?} (a repair's fence unanswered)"
            )
        })?;
        let core = opened.map_err(|e| anyhow::anyhow!("node {id} did not start: {e}"))?;
        let failed = Arc::new(AtomicBool::new(false));
        let mut tasks = core.tasks;
        let failure = fenced_server::node::storage_failure(&core.ctx);
        let flag = Arc::clone(&failed);
        tasks.push(tokio::spawn(async move {
            let e = failure.await;
            tracing::info!(node = id, error = %e, "simulation: node stopped on a storage error");
            flag.store(true, Ordering::SeqCst);
        }));
        self.net.attach(id, core.peer.clone(), core.ctx.clone());
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                id,
                Running {
                    ctx: core.ctx,
                    stop: core.stop,
                    tasks,
                    failed,
                    repair: Arc::clone(&core.peer.repair),
                },
            );
        Ok(())
    }

    fn data_dir(&self, id: NodeId) -> PathBuf {
        self.dir.join(format!("n{id}"))
    }

    /// Whether node `id` runs with its Raft stopped on a storage error.
    fn has_failed(&self, id: NodeId) -> bool {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running
            .get(&id)
            .is_some_and(|r| r.failed.load(Ordering::SeqCst))
    }

    /// Starts node `id` on a data dir damaged while it was stopped. A node
    /// must refuse damage it reads (by its checksum, naming the next
    /// step); it is then repaired as an operator would: `fenced repair`'s
    /// own code, then a start.
    async fn start_damaged(&self, id: NodeId, damage: &disk::Damage) {
        match self.start(id).await {
            Ok(()) if damage.must_refuse => self.finding(format!(
                "n{id} started on damaged data ({damage}): damage must be refused by its checksum"
            )),
            Ok(()) => self.note(format!("n{id} started; nothing it loads was damaged")),
            Err(e) => {
                let text = format!("{e:#}");
                if !text.contains("fenced repair") {
                    return self.finding(format!(
                        "n{id} refused {damage} without naming the next step: {text}"
                    ));
                }
                self.note(format!(
                    "n{id} refused its damaged data; fenced repair, then start"
                ));
                let seq = self.repairs.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = disk::prepare_repair(&self.data_dir(id), id, seq) {
                    return self.finding(format!("n{id}: fenced repair failed: {e}"));
                }
                self.restart(id).await;
            }
        }
    }

    /// The storage rule every crash must leave intact: the log on disk is
    /// never purged past the snapshot on disk, else a restart that must
    /// re-apply the entries between finds them gone (and the node cannot
    /// start without a peer that still has them). Read from the stopped
    /// node's data dir, as its restart will.
    async fn check_disk(&self, id: NodeId) {
        let dir = self.dir.join(format!("n{id}"));
        let log = match once_unlocked(|| async { LogStore::open(&dir.join(LOG_DIR)) }).await {
            Ok(log) => log,
            Err(e) => return self.finding(format!("n{id}: its log does not open: {e}")),
        };
        let purged = match RaftLogStorage::get_log_state(&mut log.clone()).await {
            Ok(state) => state.last_purged_log_id,
            Err(e) => return self.finding(format!("n{id}: its log does not read: {e}")),
        };
        let snapshot = match StateMachine::open(
            &dir.join(STATE_DIR),
            Parking::new(1),
            log.purge_horizon(),
            fenced_core::DEFAULT_HISTORY_PER_RESOURCE,
        ) {
            Ok(sm) => sm.shared().last_applied(),
            Err(e) => return self.finding(format!("n{id}: its snapshot does not open: {e}")),
        };
        tracing::debug!(node = id, ?purged, ?snapshot, "disk after the crash");
        if purged > snapshot {
            self.finding(format!(
                "n{id} crashed with its log purged to {purged:?} past its snapshot at {snapshot:?}"
            ));
        }
    }

    /// The storage rule at every moment, not only at the crashes the
    /// nemesis draws: on each running node the log on disk is never purged
    /// past the snapshot file on disk, so a crash at any instant would
    /// leave a node that restarts. A state that breaks it is reported
    /// once per node.
    async fn watch_disks(self: Arc<Self>, stop: Arc<AtomicBool>) {
        let mut reported = std::collections::BTreeSet::new();
        while !stop.load(Ordering::SeqCst) {
            for id in IDS {
                let Some(ctx) = self.context(id) else {
                    continue;
                };
                let Ok(state) = RaftLogStorage::get_log_state(&mut ctx.replica.log.clone()).await
                else {
                    continue;
                };
                let snapshot = ctx.replica.shared.snapshot_on_disk();
                if state.last_purged_log_id > snapshot && reported.insert(id) {
                    self.finding(format!(
                        "n{id} ran with its log purged to {:?} past its snapshot on disk at \
                         {snapshot:?}: a crash then would leave it unable to restart",
                        state.last_purged_log_id
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn finding(&self, what: String) {
        let what = self.relative(what);
        self.note(what.clone());
        self.findings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
    }

    /// Stops node `id` at once: its tasks end where they are, fsyncs whose
    /// answers were on their way are never answered (their entries are on
    /// disk), nothing else is written.
    pub async fn crash(&self, id: NodeId) {
        self.await_flush_window(id).await;
        self.net.detach(id);
        let running = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if let Some(r) = running {
            // Read before anything yields: what the flushes whose answers
            // are still on their way wrote, which the crash may tear.
            let torn = r
                .ctx
                .replica
                .log
                .unanswered_tail()
                .filter(|_| self.rng.lock().bool());
            // Before anything yields: a snapshot write waiting on the
            // simulated disk must not land after the crash.
            r.ctx.replica.shared.halt_writes();
            r.stop.cancel();
            for t in &r.tasks {
                t.abort();
            }
            let _ = r.ctx.replica.raft.shutdown().await;
            drop(r);
            if let Some(tail) = torn {
                self.tear(id, &tail).await;
            }
            self.check_disk(id).await;
        }
    }

    /// Half the crashes first wait, up to 100 ms, for a moment when the
    /// node has a flush whose answer is on its way: such a crash may tear
    /// the log's tail, and by chance alone it came once in about twenty
    /// seeds, too seldom for a run of a dozen to test it.
    async fn await_flush_window(&self, id: NodeId) {
        if !self.rng.lock().bool() {
            return;
        }
        for _ in 0..100 {
            let in_flush = self
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&id)
                .is_none_or(|r| r.ctx.replica.log.unanswered_tail().is_some());
            if in_flush {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Tears the tail of a crashed node's log, once its last tasks let go.
    async fn tear(&self, id: NodeId, tail: &fenced_server::storage::log_store::UnansweredTail) {
        let dir = self.data_dir(id).join(LOG_DIR);
        let locked =
            once_unlocked(|| async { fenced_server::storage::log_store::LockedLog::lock(&dir) })
                .await;
        drop(locked);
        match disk::tear(tail, &self.rng) {
            Ok(Some(what)) => self.note(format!("n{id} crashed mid-flush: {what}")),
            Ok(None) => {}
            Err(e) => self.finding(format!("n{id}: tearing its log failed: {e}")),
        }
    }

    /// Lets node `id` catch up for `within`, starting a snapshot build of
    /// its own after `build_after`; with `at_purge`, returns early at the
    /// first moment its Raft counts the log purged past what its state
    /// machine applied (a snapshot received, its install not done). Says
    /// which moment it returned at.
    async fn catch_up_with_build(
        &self,
        id: NodeId,
        build_after: Duration,
        at_purge: bool,
        within: Duration,
    ) -> &'static str {
        let started = tokio::time::Instant::now();
        let mut built = false;
        let mut purged_seen = false;
        while started.elapsed() < within {
            let Some(ctx) = self.context(id) else {
                return "it was down";
            };
            if !built && started.elapsed() >= build_after {
                built = true;
                let _ = ctx.replica.raft.trigger().snapshot().await;
            }
            let m = ctx.replica.raft.metrics().borrow().clone();
            if m.purged.is_some() && m.purged > ctx.replica.shared.last_applied() {
                if at_purge {
                    return "its log purged past its applied state";
                }
                purged_seen = true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if purged_seen {
            "caught up after a snapshot install"
        } else {
            "no snapshot install seen"
        }
    }

    fn leader(&self) -> Option<NodeId> {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.values().find_map(|r| {
            let m = r.ctx.replica.raft.metrics().borrow().clone();
            (m.state == openraft::ServerState::Leader).then_some(m.id)
        })
    }

    /// A node drawn from all three; with `leader_first`, the leader half
    /// the time (when there is one).
    fn pick(&self, leader_first: bool) -> NodeId {
        let mut r = self.rng.lock();
        match self.leader() {
            Some(l) if leader_first && r.bool() => l,
            _ => IDS[r.usize(..IDS.len())],
        }
    }

    /// Waits until no running node is still repairing: a repaired node
    /// votes again once it caught up, within `disk::REPAIR_WITHIN`, else
    /// that is a finding. `after` says what the wait follows.
    async fn await_repairs(&self, after: &str) {
        let repaired_by = tokio::time::Instant::now() + disk::REPAIR_WITHIN;
        loop {
            let repairing: Vec<NodeId> = {
                let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
                running
                    .iter()
                    .filter(|(_, r)| r.repair.repairing())
                    .map(|(id, _)| *id)
                    .collect()
            };
            if repairing.is_empty() {
                return;
            }
            if tokio::time::Instant::now() > repaired_by {
                return self.finding(format!(
                    "{repairing:?} still repairing {:?} after {after}",
                    disk::REPAIR_WITHIN
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What every node holds once the faults are over and all caught up.
    async fn finals(&self, resources: &[String]) -> anyhow::Result<Vec<NodeFinal>> {
        // A repaired node votes again once it caught up: by now it must.
        self.await_repairs("the faults ended").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let applied: Vec<Option<u64>> = IDS
                .iter()
                .map(|id| {
                    self.context(*id)
                        .and_then(|c| c.replica.shared.last_applied().map(|l| l.index))
                })
                .collect();
            let leader = self.leader().and_then(|l| self.context(l));
            let committed = leader.and_then(|c| {
                c.replica
                    .raft
                    .metrics()
                    .borrow()
                    .last_applied
                    .map(|l| l.index)
            });
            if committed.is_some() && applied.iter().all(|a| *a == committed) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("the nodes did not converge within 60 s: applied {applied:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut finals = Vec::new();
        for id in IDS {
            let Some(c) = self.context(id) else { continue };
            let (applied, snapshot) = c.replica.shared.table_snapshot();
            let now = c.replica.shared.now();
            let last_tokens = resources
                .iter()
                .map(|r| {
                    let t = c
                        .replica
                        .shared
                        .describe(r, now)
                        .last_token
                        .map_or(0, |t| t.get());
                    (r.clone(), t)
                })
                .collect();
            finals.push(NodeFinal {
                node: id,
                last_applied: applied.map_or(0, |l| l.index),
                digest: state_machine::digest(&snapshot),
                last_tokens,
            });
        }
        Ok(finals)
    }
}

/// Draws and applies faults until `until`, one at a time, each healed
/// before the next: a cut-off node, a one-way cut, a frozen node (a paused
/// process: nothing in or out, its clock running on, so that it wakes with
/// its clock jumped ahead), a crash and restart, a stale leader waking into
/// the next election, a crash again as a restarted node catches up.
async fn nemesis(c: &Cluster, until: tokio::time::Instant, classes: &[FaultClass]) {
    if classes.is_empty() {
        return;
    }
    while tokio::time::Instant::now() < until {
        // One node's loss at a time: a node still repairing is a fault not
        // yet healed, and a second loss on top of it (two of three data
        // dirs gone) is beyond what a three-node cluster survives.
        c.await_repairs("its repair began").await;
        let (quiet, hold, class) = {
            let mut r = c.rng.lock();
            let class = classes[r.usize(..classes.len())];
            (r.u64(500..2_500), r.u64(300..5_000), class)
        };
        tokio::time::sleep(Duration::from_millis(quiet)).await;
        let hold = Duration::from_millis(hold);
        match class {
            FaultClass::Isolate => {
                let n = c.pick(true);
                c.note(format!("isolate n{n} for {hold:?}"));
                c.net.isolate(n, &IDS);
                tokio::time::sleep(hold).await;
                c.net.heal();
            }
            FaultClass::Cut => {
                let (a, b) = (c.pick(true), c.pick(false));
                if a != b {
                    c.note(format!("cut n{a} -> n{b} for {hold:?}"));
                    c.net.cut(a, b);
                    tokio::time::sleep(hold).await;
                    c.net.heal();
                }
            }
            FaultClass::Freeze => {
                let n = c.pick(true);
                c.note(format!("freeze n{n} for {hold:?}"));
                c.net.freeze(n);
                tokio::time::sleep(hold).await;
                c.net.thaw_all();
            }
            FaultClass::Crash => {
                let n = c.pick(true);
                c.note(format!("crash n{n}, restart after {hold:?}"));
                c.crash(n).await;
                tokio::time::sleep(hold).await;
                c.restart(n).await;
            }
            FaultClass::StaleLeader => {
                // The stale leader wakes: a leader frozen past an election
                // comes back with its clock run on, then the leader that
                // replaced it is cut off, so the woken one votes (and may
                // stand) in the election after.
                let Some(old) = c.leader() else { continue };
                // Drawn before any wait: the one thread must never sleep
                // holding the run's random source.
                let (freeze, settle) = {
                    let mut r = c.rng.lock();
                    (r.u64(1_500..5_000), r.u64(100..800))
                };
                let freeze = Duration::from_millis(freeze);
                c.note(format!("freeze leader n{old} for {freeze:?}"));
                c.net.freeze(old);
                tokio::time::sleep(freeze).await;
                c.net.thaw_all();
                tokio::time::sleep(Duration::from_millis(settle)).await;
                if let Some(new) = c.leader().filter(|l| *l != old) {
                    c.note(format!("then isolate leader n{new} for {hold:?}"));
                    c.net.isolate(new, &IDS);
                    tokio::time::sleep(hold).await;
                    c.net.heal();
                }
            }
            FaultClass::CrashAgain => {
                // Down long enough for the leader's snapshot to pass it,
                // then down again as it catches up: at the moment Raft has
                // purged its log for a snapshot not yet applied (a crash
                // between the purge and the install), or at a drawn moment.
                let n = c.pick(false);
                c.note(format!("crash n{n}, restart after {hold:?}, crash again"));
                c.crash(n).await;
                tokio::time::sleep(hold).await;
                c.restart(n).await;
                // A snapshot of its own started as it catches up, as
                // openraft starts one every so many entries: a build that
                // may meet the install of the leader's snapshot. Then the
                // second crash: at once when Raft counts the log purged for
                // a snapshot whose install is not done, or once caught up.
                let (build_after, at_purge) = {
                    let mut r = c.rng.lock();
                    (Duration::from_millis(r.u64(0..300)), r.u64(0..2) == 0)
                };
                let at = c
                    .catch_up_with_build(n, build_after, at_purge, Duration::from_secs(3))
                    .await;
                c.note(format!("crash n{n} again ({at})"));
                c.crash(n).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
                c.restart(n).await;
            }
            FaultClass::Damage => {
                // Damage at rest: a bit or a sector of a stopped node's
                // files (the leader's half the time), found at its start.
                let n = c.pick(true);
                c.crash(n).await;
                let damage = disk::damage(&c.data_dir(n), &c.rng);
                tokio::time::sleep(hold).await;
                match damage {
                    Ok(Some(d)) => {
                        c.note(format!("crash n{n}, damage {d}, restart after {hold:?}"));
                        c.start_damaged(n, &d).await;
                    }
                    Ok(None) => c.restart(n).await,
                    Err(e) => c.finding(format!("n{n}: damaging its files failed: {e}")),
                }
            }
            FaultClass::Wipe => {
                // Its data dir lost (a replaced disk): it must repair itself
                // from the others, not start a cluster of its own.
                let n = c.pick(true);
                c.note(format!(
                    "crash n{n}, lose its data dir, restart after {hold:?}"
                ));
                c.crash(n).await;
                if let Err(e) = std::fs::remove_dir_all(c.data_dir(n)) {
                    c.finding(format!("n{n}: removing its data dir failed: {e}"));
                }
                tokio::time::sleep(hold).await;
                c.restart(n).await;
            }
            FaultClass::DiskErrors => {
                // Its disk errs while it runs: EIO on reads and writes, or
                // full. A write that fails is never acknowledged; a node
                // whose Raft stopped on it is started again afterwards.
                let n = c.pick(true);
                let fault = if c.rng.lock().bool() {
                    IoFault::Eio
                } else {
                    IoFault::Full
                };
                c.note(format!("n{n}'s disk answers {fault:?} for {hold:?}"));
                c.faults.set(n, Some(fault));
                tokio::time::sleep(hold).await;
                c.faults.set(n, None);
                if c.has_failed(n) {
                    c.note(format!("n{n} stopped on a storage error: restart"));
                    c.crash(n).await;
                    c.restart(n).await;
                }
            }
            FaultClass::FollowerDiskError => {
                // A follower's disk errs while the other follower is cut
                // off: only its acknowledgements could let the leader
                // commit. Then the leader and it crash, and it starts again
                // with the other follower: what it acknowledged must be
                // there (a failed flush reported done would lose it).
                let Some(leader) = c.leader() else { continue };
                let others: Vec<NodeId> = IDS.iter().copied().filter(|i| *i != leader).collect();
                let (f, g) = if c.rng.lock().bool() {
                    (others[0], others[1])
                } else {
                    (others[1], others[0])
                };
                c.note(format!(
                    "isolate n{g}, n{f}'s disk answers Eio for {hold:?}, then crash leader n{leader} \
                     and n{f}"
                ));
                c.net.isolate(g, &IDS);
                c.faults.set(f, Some(IoFault::Eio));
                tokio::time::sleep(hold).await;
                c.crash(leader).await;
                c.crash(f).await;
                c.faults.set(f, None);
                c.net.heal();
                c.restart(f).await;
                let settle = Duration::from_millis(c.rng.lock().u64(1_000..3_000));
                tokio::time::sleep(settle).await;
                c.restart(leader).await;
            }
        }
    }
}

/// One run of `seed`: start, load under faults, heal, converge, check.
pub async fn run(
    seed: u64,
    cfg: SimConfig,
    dir: PathBuf,
    faults: Arc<DiskFaults>,
) -> anyhow::Result<Verdict> {
    let rng = Rng::new(seed);
    let net = Net::new(rng.clone());
    let members: BTreeMap<NodeId, Node> = IDS
        .iter()
        .map(|id| {
            (
                *id,
                Node {
                    peer_addr: format!("sim-n{id}:7001"),
                    client_addr: format!("sim-n{id}:7000"),
                },
            )
        })
        .collect();
    let skew_ppm = IDS
        .iter()
        .map(|id| {
            let max = cfg.max_skew_ppm.max(0);
            (*id, rng.lock().i64(-max..=max))
        })
        .collect();
    let cluster = Arc::new(Cluster {
        dir,
        rng: rng.clone(),
        net,
        members,
        skew_ppm,
        snapshot_logs: cfg.snapshot_logs,
        running: Mutex::default(),
        faults,
        repairs: AtomicU64::new(0),
        log: Mutex::default(),
        findings: Mutex::default(),
    });
    for id in IDS {
        cluster.start(id).await?;
    }
    let history = Arc::new(workload::History::new());
    let stop = Arc::new(AtomicBool::new(false));
    let w = Arc::new(workload::Workload {
        cluster: Arc::clone(&cluster),
        history: Arc::clone(&history),
        stop: Arc::clone(&stop),
        short_ttl_ms: cfg.short_ttl_ms,
        long_ttl_ms: cfg.long_ttl_ms,
    });
    let workers = workload::spawn(&w, &rng, cfg.short_workers, cfg.long_workers);
    let disks = tokio::spawn(Arc::clone(&cluster).watch_disks(Arc::clone(&stop)));
    let until = tokio::time::Instant::now() + cfg.duration;
    if cfg.faults {
        nemesis(&cluster, until, &FaultClass::of(cfg.classes)).await;
    }
    tokio::time::sleep_until(until).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.await;
    }
    let _ = disks.await;
    cluster.net.heal();
    cluster.net.thaw_all();
    for id in IDS {
        if cluster.context(id).is_none() {
            cluster.restart(id).await;
        }
    }
    let events = history.events();
    let resources: Vec<String> = {
        let set: std::collections::BTreeSet<&str> =
            events.iter().map(|e| e.resource.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    };
    let finals = cluster.finals(&resources).await;
    for id in IDS {
        cluster.crash(id).await;
    }
    let faults = cluster
        .log
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let node_findings = cluster
        .findings
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Ok(check::verdict(seed, events, finals, faults, node_findings))
}
