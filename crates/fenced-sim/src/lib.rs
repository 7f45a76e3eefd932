//! Deterministic simulation of a three-node fenced cluster.
//!
//! Every node is the real server code: [`fenced_server::node::NodeCore`]
//! (raft-log and the state machine on disk, openraft, the cluster clock, the
//! proposer, early replication, the pre-vote) and the real Lock service,
//! called in process. What is simulated is what a seed must decide: the
//! network between the nodes ([`net`]), when each fsync is answered
//! (flushed while the one simulation thread waits, answered after a drawn
//! latency), every clock (tokio's paused clock, each node's rate skewed),
//! and the faults ([`world`]): partitions, frozen nodes, crashes (between an
//! fsync and its answer too, tearing what that fsync wrote, and while a
//! snapshot is put in place), restarts, and the disk's own faults
//! ([`disk`]): damage at rest repaired from the peers, a lost data dir,
//! EIO and ENOSPC while a node runs. The storage rule is watched on every running node. Everything
//! runs on one thread, so a seed replays exactly: the same seed gives the
//! same history, event for event, which `tests/seeds.rs` checks.
//!
//! The history is fenced-jepsen's, and so are the checkers run on it
//! ([`check`]).

pub mod check;
pub mod disk;
pub mod net;
pub mod workload;
pub mod world;

use std::{
    ops::Range,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use fenced_server::blocking::DiskWork;

pub use check::Verdict;

/// The run's one source of randomness, shared by everything the seed
/// decides; drawn from in an order the single thread fixes.
#[derive(Clone)]
pub struct Rng(Arc<Mutex<fastrand::Rng>>);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))))
    }

    pub fn lock(&self) -> MutexGuard<'_, fastrand::Rng> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A latency: `slow_percent` of draws in `slow_us`, the rest in
    /// `fast_us` (microseconds). The network, the log's fsync and the
    /// other file writes each draw theirs this way.
    pub fn latency(&self, slow_percent: u32, slow_us: Range<u64>, fast_us: Range<u64>) -> Duration {
        let mut r = self.lock();
        let us = if r.u32(..100) < slow_percent {
            r.u64(slow_us)
        } else {
            r.u64(fast_us)
        };
        Duration::from_micros(us)
    }
}

/// A class of fault the nemesis draws from ([`world`] says what each does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultClass {
    /// A node cut off from the others.
    Isolate,
    /// One direction between two nodes cut.
    Cut,
    /// A node frozen (a paused process).
    Freeze,
    /// A node crashed and restarted.
    Crash,
    /// A stale leader waking into the next election.
    StaleLeader,
    /// A node crashed again as it catches up (a snapshot install).
    CrashAgain,
    /// A flipped bit or zeroed sector in a stopped node's files.
    Damage,
    /// A stopped node's data dir lost.
    Wipe,
    /// EIO or ENOSPC while a node runs.
    DiskErrors,
    /// A follower's failed flush while the other follower is cut off.
    FollowerDiskError,
}

impl FaultClass {
    /// Every class, in the order the nemesis numbers them.
    pub const ALL: [FaultClass; 10] = [
        FaultClass::Isolate,
        FaultClass::Cut,
        FaultClass::Freeze,
        FaultClass::Crash,
        FaultClass::StaleLeader,
        FaultClass::CrashAgain,
        FaultClass::Damage,
        FaultClass::Wipe,
        FaultClass::DiskErrors,
        FaultClass::FollowerDiskError,
    ];

    fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// The set of `classes`, as [`SimConfig::classes`] holds it.
    pub fn set(classes: &[FaultClass]) -> u16 {
        classes.iter().fold(0, |set, c| set | c.bit())
    }

    /// The classes of `set`, in the nemesis's order.
    pub fn of(set: u16) -> Vec<FaultClass> {
        Self::ALL
            .iter()
            .copied()
            .filter(|c| set & c.bit() != 0)
            .collect()
    }
}

/// One run's shape.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// Simulated time the workload and the faults run for.
    pub duration: Duration,
    /// Client workers on short-TTL leases, and on long-TTL ones.
    pub short_workers: u32,
    pub long_workers: u32,
    pub short_ttl_ms: u64,
    pub long_ttl_ms: u64,
    /// A snapshot every this many log entries (small: snapshots, purges
    /// and installs happen under the faults).
    pub snapshot_logs: u64,
    /// Each node's clock runs up to this fast or slow, in ppm.
    pub max_skew_ppm: i64,
    /// Faults on, or a quiet run.
    pub faults: bool,
    /// The classes of fault drawn ([`FaultClass::set`]); all by default.
    /// A canary run names those that can show its bug, to show it sooner.
    pub classes: u16,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(30),
            short_workers: 4,
            long_workers: 2,
            short_ttl_ms: 2_000,
            long_ttl_ms: 600_000,
            snapshot_logs: 64,
            max_skew_ppm: 20_000,
            faults: true,
            classes: FaultClass::set(&FaultClass::ALL),
        }
    }
}

/// Runs one seed to its verdict. Must be called from a thread with no
/// tokio runtime; every node of the run shares the runtime it builds.
pub fn run(seed: u64, cfg: &SimConfig) -> anyhow::Result<Verdict> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // The order `select!` polls its branches in, and a watch channel wakes
    // its waiters in, come from the runtime's random source: seeded, they
    // replay (.cargo/config.toml compiles tokio with this API).
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let rt = builder.build()?;
    let dir = tempfile::tempdir()?;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    watchdog(seed, Arc::clone(&done));
    // Snapshot and cluster-time writes run inline on this thread, each
    // after a drawn latency (a slow one now and then). Putting a snapshot
    // in place is slow more often: a build finishing late, or an install
    // still under way after openraft purged the log for it, are the races
    // the snapshot writer and the purge horizon must survive.
    // A node's disk that errs (world's I/O faults) fails the work before
    // it begins.
    let disk = Rng::new(seed ^ 0x5eed_d15c);
    let faults = Arc::new(disk::DiskFaults::new(dir.path().to_path_buf()));
    let errs = Arc::clone(&faults);
    fenced_server::blocking::simulate_on_this_thread(Some(Arc::new(
        move |work, at: &std::path::Path| {
            errs.work(work, at)?;
            Ok(match work {
                DiskWork::SnapshotStore | DiskWork::SnapshotInstall => {
                    disk.latency(30, 50_000..600_000, 200..3_000)
                }
                _ => disk.latency(10, 20_000..400_000, 200..3_000),
            })
        },
    )));
    let verdict = rt.block_on(world::run(seed, *cfg, dir.path().to_path_buf(), faults));
    fenced_server::blocking::simulate_on_this_thread(None);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    // Nodes' tasks end with the runtime, before their files go.
    drop(rt);
    verdict
}

/// Real time a seed may take. Simulated time only moves while the one
/// thread is free; a run that blocks it (a lock held across a wait, a
/// deadlock in the code under test) would otherwise hang its caller.
const SEED_REAL_TIME_LIMIT: Duration = Duration::from_secs(600);

fn watchdog(seed: u64, done: Arc<std::sync::atomic::AtomicBool>) {
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        while started.elapsed() < SEED_REAL_TIME_LIMIT {
            if done.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!(
            "fenced-sim: seed {seed} made no end in {SEED_REAL_TIME_LIMIT:?} of real time: \
             its one thread is blocked"
        );
        std::process::exit(3);
    });
}
