//! One run: network, cluster, workload, nemesis, final state, checks and the
//! summary.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::{atomic::AtomicU64, Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use fenced_proto::v1::{kv_client::KvClient, lock_client::LockClient};
use fenced_resource::FenceStore;
use fenced_testkit::{RunSettings, Within};
use serde::Serialize;

use crate::{
    check::{
        invariants::{self, Finding, GrantStats, NodeFinal, WriteStats},
        kv::{self, KvStats},
        linear::{self, Linearizable},
    },
    cluster::{self, Cluster, NodeSettings},
    history::{self, Op, Recorder, F},
    membership::Members,
    nemesis::{self, FaultRecord, LeaderLog, Nemesis, Step},
    net::Net,
    workload::{self, Ctx},
};

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub profile: String,
    pub seed: u64,
    pub duration: Duration,
    pub warmup: Duration,
    pub hold: Duration,
    pub quiet: Duration,
    /// Idle time (no writes) before each fault that moves leadership.
    pub idle: Duration,
    pub fenced_bin: PathBuf,
    pub out: PathBuf,
    pub long_workers: u32,
    pub short_workers: u32,
    pub long_slots: usize,
    pub short_ttl_ms: u64,
    /// Lock operations per second that must complete before any fault.
    pub throughput_floor: f64,
    /// Clock-rate error allowed between harness and cluster time.
    pub rho: f64,
    pub lin_budget: u64,
    /// The bug planted in every node, for a canary run.
    pub canary: Option<fenced_core::canary::Canary>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "PASS")]
    Pass,
    #[serde(rename = "FAIL")]
    Fail,
    #[serde(rename = "UNKNOWN")]
    Unknown,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Unknown => "UNKNOWN",
        })
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct OpCounts {
    pub attempted: usize,
    pub ok: usize,
    pub fail: usize,
    pub unknown: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub profile: String,
    pub seed: u64,
    pub fenced_bin: String,
    /// The bug planted in the nodes, if this is a canary run.
    pub canary: Option<String>,
    pub duration_s: f64,
    pub ops: BTreeMap<String, OpCounts>,
    pub faults: Vec<FaultRecord>,
    /// Membership profile: each step of each change, with the faults
    /// installed while it ran.
    pub membership_steps: Vec<Step>,
    pub leader_changes: usize,
    pub longest_unavailability_ms: u64,
    pub pre_fault_ops_per_s: f64,
    pub grants: GrantStats,
    pub writes: WriteStats,
    pub kv: KvStats,
    pub invariants: Vec<Finding>,
    pub linearizability: String,
    pub lin_resources: usize,
    pub counterexample: Option<String>,
    pub gates: Vec<(String, bool)>,
    pub verdict: Verdict,
}

/// Counts of an op type: ok = success, fail = a definite refusal.
fn count_ops(ops: &[Op]) -> BTreeMap<String, OpCounts> {
    let mut out = BTreeMap::new();
    for f in F::ALL {
        let mut c = OpCounts::default();
        for op in ops.iter().filter(|o| o.f == f) {
            c.attempted += 1;
            match &op.answer {
                None => c.unknown += 1,
                Some(a) if a.is_success() => c.ok += 1,
                Some(_) => c.fail += 1,
            }
        }
        out.insert(f.name().to_string(), c);
    }
    out
}

/// The longest stretch, after the warm-up, in which no lock operation
/// completed with a definite answer.
fn longest_gap_ms(ops: &[Op], from_ns: u64, to_ns: u64) -> u64 {
    let mut t: Vec<u64> = ops
        .iter()
        .filter(|o| o.f != F::Write)
        .filter_map(|o| o.complete_ns)
        .filter(|&c| c >= from_ns && c <= to_ns)
        .collect();
    t.push(from_ns);
    t.push(to_ns);
    t.sort_unstable();
    t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) / 1_000_000
}

async fn wait_for_leader(ids: &[u64], within: Duration) -> Result<u64> {
    let deadline = Instant::now() + within;
    loop {
        if let Some((l, _)) = nemesis::find_leader(ids).await {
            return Ok(l);
        }
        if Instant::now() > deadline {
            anyhow::bail!("no leader within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every node answers with the same applied index twice in a row.
async fn converge(ids: &[u64], within: Duration) -> Result<Vec<(u64, u64, u64)>> {
    let deadline = Instant::now() + within;
    let mut previous: Option<Vec<(u64, u64, u64)>> = None;
    loop {
        let mut all = Vec::new();
        for &id in ids {
            if let Some(s) = cluster::status_with_digest(id, Duration::from_secs(1)).await {
                all.push((id, s.last_applied, s.state_digest));
            }
        }
        let same = all.len() == ids.len() && all.windows(2).all(|w| w[0].1 == w[1].1);
        if same && previous.as_ref() == Some(&all) {
            return Ok(all);
        }
        previous = Some(all.clone());
        if Instant::now() > deadline {
            // Report what there is: the digest check then fails with the details.
            return Ok(all);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The faults of `records` installed at some time in `[from, to]`, each as
/// "f3 kill-leader n2 (1.2 s)" with the length of the overlap.
pub fn overlapping(from: u64, to: u64, records: &[FaultRecord]) -> Vec<String> {
    records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.skipped.is_none())
        .filter_map(|(i, r)| {
            let (a, b) = (from.max(r.installed_ns), to.min(r.healed_ns));
            (a < b).then(|| {
                format!(
                    "f{i} {} {} ({:.1} s)",
                    r.fault,
                    r.target,
                    (b - a) as f64 / 1e9
                )
            })
        })
        .collect()
}

/// Each member's own view of the membership: (voters, learners), sorted,
/// or None when it does not answer.
async fn membership_views(ids: &[u64]) -> Vec<(u64, Option<(Vec<u64>, Vec<u64>)>)> {
    let mut out = Vec::new();
    for &id in ids {
        let view = cluster::status(id, Duration::from_secs(2)).await.map(|s| {
            let mut voters: Vec<u64> = s.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
            let mut learners: Vec<u64> = s
                .members
                .iter()
                .filter(|m| !m.voter)
                .map(|m| m.id)
                .collect();
            voters.sort_unstable();
            learners.sort_unstable();
            (voters, learners)
        });
        out.push((id, view));
    }
    out
}

/// Node slots (ids and addresses) a profile's network has: three, or room
/// for the nodes the membership profile adds.
fn slots_of(profile: &str) -> u64 {
    if profile == "membership" {
        crate::membership::MEMBER_SLOTS
    } else {
        3
    }
}

pub async fn run(cfg: &RunConfig) -> Result<Summary> {
    let faults = nemesis::profile_faults(&cfg.profile)
        .with_context(|| format!("unknown profile {:?}", cfg.profile))?;
    let dir = cfg.out.join(format!("{}-{}", cfg.profile, cfg.seed));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let clocks = matches!(cfg.profile.as_str(), "clock" | "all");
    let long_ttl_ms = (cfg.duration.as_millis() as u64 + 300_000).min(3_600_000);
    // The snapshots profile snapshots every 50 entries: several times a
    // second under the workload.
    let snapshot_logs = if matches!(cfg.profile.as_str(), "snapshots" | "disk" | "damage") {
        50
    } else {
        200
    };
    // Authentication on: every call carries the run's token.
    let (auth_tokens, auth_policy) = crate::auth::write_files(&dir)?;
    let node_settings = RunSettings {
        // Often enough that a node killed a few seconds into a run
        // restarts from a snapshot (and a lagging one is sent one), not
        // only by replaying the whole log.
        snapshot_logs: Some(Within::new(snapshot_logs)?),
        request_timeout_ms: Some(Within::new(3000)?),
        auth_tokens: Some(auth_tokens),
        auth_policy: Some(auth_policy),
        ..RunSettings::default()
    };
    // TLS on: certificates from the binary under test, for the addresses
    // the nodes listen on.
    // The membership profile adds nodes with new ids, each in a slot of
    // its own on the test network.
    let slots = slots_of(&cfg.profile);
    let node_hosts: Vec<(u64, String)> = (1..=slots)
        .map(|id| (id, crate::net::node_addr(id)))
        .collect();
    let pki = crate::tls::make_pki(&cfg.fenced_bin, &dir.join("pki"), &node_hosts)
        .context("making the run's certificates")?;
    crate::tls::install(crate::tls::client_tls(&pki)?);
    let settings = NodeSettings {
        pki,
        settings: node_settings,
        skew_ppm: if clocks {
            vec![20_000, -20_000, 20_000]
        } else {
            Vec::new()
        },
        faketime: clocks,
        // Each data directory a file system of its own, so that one can
        // fill up (the disk profile's full disk).
        disk_of_its_own: matches!(cfg.profile.as_str(), "disk" | "damage" | "full-disk"),
        canary: cfg.canary,
    };
    tracing::info!(profile = cfg.profile, seed = cfg.seed, dir = %dir.display(), "run starting");
    let net = Net::create(slots).context("creating the test network (needs root, ip and nft)")?;
    let cluster = Cluster::new(&cfg.fenced_bin, &dir, 3, settings)?;
    let ids = cluster.ids();
    let cluster = Arc::new(tokio::sync::Mutex::new(cluster));
    cluster.lock().await.start_all()?;
    let result = run_in(cfg, &dir, &net, cluster.clone(), &ids, faults, long_ttl_ms).await;
    cluster.lock().await.stop_all();
    for d in cluster.lock().await.data_dirs() {
        let _ = std::fs::remove_dir_all(d);
    }
    drop(net);
    let summary = result?;
    let text = render(&summary);
    std::fs::write(dir.join("summary.txt"), &text).context("writing summary.txt")?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary).context("summary json")?,
    )
    .context("writing summary.json")?;
    if summary.verdict == Verdict::Pass {
        let _ = std::fs::remove_file(dir.join("history.jsonl"));
        for id in 1..=slots {
            let _ = std::fs::remove_file(dir.join(format!("n{id}.log")));
        }
        for d in ["resource", "pki"] {
            let _ = std::fs::remove_dir_all(dir.join(d));
        }
    }
    Ok(summary)
}

async fn run_in(
    cfg: &RunConfig,
    dir: &Path,
    net: &Net,
    cluster: Arc<tokio::sync::Mutex<Cluster>>,
    ids: &[u64],
    faults: Vec<Fault>,
    long_ttl_ms: u64,
) -> Result<Summary> {
    let slots = slots_of(&cfg.profile);
    wait_for_leader(ids, Duration::from_secs(30))
        .await
        .with_context(|| format!("cluster did not elect a leader; see {}", dir.display()))?;
    // The run must exercise the cluster as deployed: TLS only, auth on.
    for &id in ids {
        let addr = cluster::client_addr(id);
        crate::tls::check_enforced(&addr)
            .await
            .with_context(|| format!("TLS gate, node {id}"))?;
        crate::auth::check_enforced(&addr)
            .await
            .with_context(|| format!("authentication gate, node {id}"))?;
    }
    let start = Instant::now();
    let rec = Recorder::create(&dir.join("history.jsonl"), start)?;
    let store = Arc::new(
        FenceStore::open(dir.join("resource")).context("opening the protected resource store")?,
    );
    let mut clients = Vec::new();
    let mut kv_clients = Vec::new();
    for &id in ids {
        let channel = cluster::channel(&cluster::client_addr(id))?;
        clients.push((id, LockClient::new(channel.clone())));
        kv_clients.push((id, KvClient::new(channel)));
    }
    let ctx = Arc::new(Ctx {
        rec: rec.clone(),
        store,
        clients: std::sync::RwLock::new(clients),
        kv_clients: std::sync::RwLock::new(kv_clients),
        stop: Default::default(),
        freeze: Default::default(),
        idle: Default::default(),
        down: Mutex::new(Vec::new()),
        long_ttl_ms,
        short_ttl_ms: cfg.short_ttl_ms,
        slots: (0..cfg.long_slots).map(|_| AtomicU64::new(0)).collect(),
        past: Default::default(),
    });
    let leaders = Arc::new(LeaderLog::default());
    let stop_monitor = Arc::new(tokio::sync::Notify::new());
    // Every slot: nodes that join become leaders too.
    let monitor = tokio::spawn(nemesis::monitor(
        (1..=slots).collect(),
        leaders.clone(),
        rec.clone(),
        stop_monitor.clone(),
    ));
    let workers = workload::spawn(&ctx, cfg.seed, cfg.long_workers, cfg.short_workers);

    tokio::time::sleep(cfg.warmup).await;
    let warm_ns = rec.now_ns();
    let members = Members::new(ids.to_vec());
    let mut nem = Nemesis::new(
        net,
        cluster.clone(),
        ctx.clone(),
        leaders.clone(),
        rec.clone(),
        cfg.seed,
        cfg.hold,
        members.clone(),
        cfg.idle,
    );
    // The membership profile changes the members while the faults run:
    // a second nemesis, no idle periods of its own (the writers are the
    // fault nemesis's to hold).
    let changing = cfg.profile == "membership";
    let (live_tx, live_rx) = tokio::sync::watch::channel(false);
    if changing {
        nem.live = Some(live_tx);
    }
    let mut changer = Nemesis::new(
        net,
        cluster.clone(),
        ctx.clone(),
        leaders.clone(),
        rec.clone(),
        cfg.seed ^ 0x6d65_6d62,
        cfg.hold,
        members.clone(),
        Duration::ZERO,
    );
    let recovery = Duration::from_secs(6);
    let fault_loop = async {
        let mut records = Vec::new();
        let mut order = faults.clone();
        if !order.is_empty() {
            let k = nem.rng.usize(..order.len());
            order.rotate_left(k);
        }
        let mut i = 0usize;
        while !order.is_empty() && start.elapsed() + recovery < cfg.duration {
            let fault = order[i % order.len()];
            records.push(nem.run(fault, &format!("f{i}")).await);
            i += 1;
            tokio::time::sleep(cfg.quiet).await;
        }
        records
    };
    let change_loop = async {
        let mut records = Vec::new();
        if !changing {
            return records;
        }
        let mut order = nemesis::membership_changes();
        let k = changer.rng.usize(..order.len());
        order.rotate_left(k);
        let mut j = 0usize;
        while start.elapsed() + recovery < cfg.duration {
            // Two changes in three wait for a fault to be installed and
            // start up to 1.5 s into it; the rest start whenever they come.
            if changer.rng.u32(..3) < 2 {
                let mut live = live_rx.clone();
                let _ = tokio::time::timeout(Duration::from_secs(15), live.wait_for(|l| *l)).await;
                tokio::time::sleep(Duration::from_millis(changer.rng.u64(0..1500))).await;
            }
            // Every change adds at most one node: stop when no new id is
            // left (a long run), rather than reuse one.
            if start.elapsed() + recovery >= cfg.duration
                || changer.next_id > crate::membership::MEMBER_SLOTS
            {
                break;
            }
            let change = order[j % order.len()];
            records.push(changer.run(change, &format!("m{j}")).await);
            j += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        records
    };
    let (mut records, changes) = tokio::join!(fault_loop, change_loop);
    let mut steps = std::mem::take(&mut changer.steps);
    for s in &mut steps {
        s.during = overlapping(s.start_ns, s.end_ns, &records);
    }
    let mut nemesis_log = String::new();
    let mut all: Vec<&FaultRecord> = records.iter().chain(changes.iter()).collect();
    all.sort_by_key(|r| r.installed_ns);
    for r in all {
        nemesis_log.push_str(&serde_json::to_string(r).unwrap_or_default());
        nemesis_log.push('\n');
    }
    for s in &steps {
        nemesis_log.push_str(&serde_json::to_string(s).unwrap_or_default());
        nemesis_log.push('\n');
    }
    // The members at the end: the membership profile changed them.
    let mut members = members.ids();
    members.sort_unstable();
    let ids = members.as_slice();
    let remaining = cfg.duration.saturating_sub(start.elapsed());
    tokio::time::sleep(remaining.max(Duration::from_secs(2))).await;

    ctx.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in workers {
        if tokio::time::timeout(Duration::from_secs(15), w)
            .await
            .is_err()
        {
            tracing::warn!("a worker did not stop within 15 s");
        }
    }
    let end_ns = rec.now_ns();
    std::fs::write(dir.join("nemesis.jsonl"), &nemesis_log).context("writing nemesis.jsonl")?;

    // Final state: everything healed and running, then converged.
    net.heal()?;
    {
        let mut c = cluster.lock().await;
        for &id in ids {
            if c.is_running(id) {
                let _ = c.signal(id, nix::sys::signal::Signal::SIGCONT);
            } else {
                c.start(id)?;
            }
        }
    }
    let _ = wait_for_leader(ids, Duration::from_secs(30)).await;
    let statuses = converge(ids, Duration::from_secs(30)).await?;
    let final_views = membership_views(ids).await;
    stop_monitor.notify_one();
    let _ = monitor.await;
    let (events, write_error) = rec.finish();
    if let Some(e) = write_error {
        anyhow::bail!("writing the history failed: {e}");
    }
    let ops = history::pair(&events);
    let resources: BTreeSet<&str> = ops.iter().map(|o| o.resource.as_str()).collect();
    let mut finals = Vec::new();
    for (id, applied, digest) in &statuses {
        let mut last_tokens = BTreeMap::new();
        for r in &resources {
            last_tokens.insert(r.to_string(), cluster::local_last_token(*id, r).await?);
        }
        finals.push(NodeFinal {
            node: *id,
            last_applied: *applied,
            digest: *digest,
            last_tokens,
        });
    }

    // Checks.
    let (final_finding, grants) = invariants::final_state(&ops, &finals);
    let (write_finding, writes) = invariants::fenced_writes(&ops);
    let (kv_finding, kv) = kv::puts_fenced(&ops, cfg.rho, kv::ELECTION_SLACK_MS * 1_000_000);
    let (phantom_finding, _) = kv::no_phantom_values(&ops);
    let findings = vec![
        invariants::tokens_unique(&ops),
        invariants::grants_ordered(&ops),
        final_finding,
        invariants::digests_equal(&finals),
        write_finding,
        invariants::renew_keeps_token(&ops, cfg.rho),
        invariants::leases_respected(&ops, cfg.rho),
        invariants::ended_leases_stay_ended(&ops),
        invariants::cluster_time_monotonic(&ops),
        invariants::cluster_time_not_ahead(&ops, cfg.rho),
        kv_finding,
        kv::key_tokens_monotonic(&ops),
        phantom_finding,
    ];
    let mut findings = findings;
    // The checks of single faults, listed when a fault of theirs ran.
    let fault_checks: [fn(&[FaultRecord]) -> invariants::Finding; 3] = [
        invariants::damage_refused,
        invariants::full_disk_stops,
        invariants::short_pause_keeps_leader,
    ];
    findings.extend(
        fault_checks
            .iter()
            .map(|check| check(&records))
            .filter(|f| f.checked > 0),
    );
    let (lin, lin_resources) = linear::check_long_resources(&ops, cfg.lin_budget);
    let mut counterexample = None;
    let lin_text = match &lin {
        Linearizable::Pass => "PASS".to_string(),
        Linearizable::Unknown { steps } => {
            format!("UNKNOWN (search budget exhausted after {steps} steps)")
        }
        Linearizable::Fail(c) => {
            let by_id: BTreeMap<u64, &Op> = ops.iter().map(|o| (o.id, o)).collect();
            let mut text = format!("resource {}: not linearizable\nmodel state after the longest linearizable prefix: {}\nlast operations of that prefix:\n", c.resource, c.state);
            for id in c.longest_prefix.iter().rev().take(12).rev() {
                let _ = writeln!(text, "  {:?}", by_id.get(id));
            }
            text.push_str("could not place:\n");
            for id in &c.stuck_on {
                let _ = writeln!(text, "  {:?}", by_id.get(id));
            }
            counterexample = Some(text);
            format!("FAIL (resource {})", c.resource)
        }
    };
    if counterexample.is_none() {
        if let Some(f) = findings.iter().find(|f| !f.violations.is_empty()) {
            counterexample = Some(format!("{}: {}", f.name, f.violations[0]));
        }
    }

    // Coverage gates.
    let pre_fault_ops = ops
        .iter()
        .filter(|o| o.f != F::Write && o.complete_ns.is_some_and(|c| c <= warm_ns))
        .count();
    let pre_fault_ops_per_s = pre_fault_ops as f64 / (warm_ns as f64 / 1e9).max(0.001);
    // Requests sent in a window, past a slack for those already at the gate.
    let sent_between = |from: u64, to: u64, counts: &dyn Fn(&Op) -> bool| {
        let slack = 300_000_000;
        ops.iter()
            .filter(|o| counts(o) && o.invoke_ns > from + slack && o.invoke_ns < to)
            .count()
    };
    for r in records
        .iter_mut()
        .filter(|r| r.fault.starts_with("pause-clients"))
    {
        let invoked = sent_between(
            r.installed_ns,
            r.released_ns.unwrap_or(r.healed_ns),
            &|_| true,
        );
        r.took_effect = r.took_effect && invoked == 0;
        r.evidence = format!("{invoked} requests sent while the workers were paused");
    }
    for r in records.iter_mut() {
        let Some((from, to)) = r.idle_ns else {
            continue;
        };
        let writes = sent_between(from, to, &|o| {
            !matches!(o.f, F::Describe | F::Write | F::KvGet)
        });
        let reads = sent_between(from, to, &|o| o.f == F::Describe);
        r.took_effect = r.took_effect && writes == 0 && reads > 0;
        let _ = write!(
            r.evidence,
            "; idle {} ms before it: {writes} lock writes and {reads} describes sent",
            (to - from) / 1_000_000
        );
    }
    let mut gates = vec![(
        format!(
            "pre-fault throughput {pre_fault_ops_per_s:.0} ops/s >= floor {:.0}",
            cfg.throughput_floor
        ),
        pre_fault_ops_per_s >= cfg.throughput_floor,
    )];
    gates.push((
        format!(
            "stale writes exercised and rejected: {}",
            writes.stale_rejected
        ),
        writes.stale_rejected > 0,
    ));
    gates.push((
        format!(
            "late kv puts exercised and refused: {} (values read: {})",
            kv.late_refused, kv.reads_found
        ),
        kv.late_refused > 0 && kv.reads_found > 0,
    ));
    if changing {
        let (overlapped, total) = (
            steps.iter().filter(|s| !s.during.is_empty()).count(),
            steps.len(),
        );
        let kinds = |k: &[&str]| {
            steps
                .iter()
                .filter(|s| s.during.iter().any(|d| k.iter().any(|k| d.contains(k))))
                .count()
        };
        gates.push((
            format!(
                "membership steps run while a fault was installed: {overlapped} of {total} \
                 (during a partition {}, a kill {}, a pause {})",
                kinds(&["isolate", "minority"]),
                kinds(&["kill"]),
                kinds(&["pause"]),
            ),
            overlapped > 0,
        ));
    }
    let disagree: Vec<String> = final_views
        .iter()
        .filter(|(_, v)| v.as_ref() != Some(&(ids.to_vec(), Vec::new())))
        .map(|(id, v)| format!("n{id}: {v:?}"))
        .collect();
    gates.push((
        format!(
            "final membership: every member reports voters {ids:?} and no learner{}{}",
            if disagree.is_empty() { "" } else { "; not: " },
            disagree.join(", ")
        ),
        disagree.is_empty(),
    ));
    records.extend(changes);
    records.sort_by_key(|r| r.installed_ns);
    if !faults.is_empty() {
        let bad: Vec<String> = records
            .iter()
            .filter(|r| !r.took_effect || r.skipped.is_some())
            .map(|r| r.fault.clone())
            .collect();
        gates.push((
            format!(
                "every scheduled fault took effect ({} of {}{}{})",
                records.len() - bad.len(),
                records.len(),
                if bad.is_empty() { "" } else { "; not: " },
                bad.join(", ")
            ),
            bad.is_empty() && !records.is_empty(),
        ));
    }
    let leader_changes = leaders
        .changes
        .lock()
        .map(|c| c.len().saturating_sub(1))
        .unwrap_or(0);
    let violated = findings.iter().any(|f| !f.violations.is_empty());
    let gates_ok = gates.iter().all(|(_, ok)| *ok);
    let verdict = if violated || matches!(lin, Linearizable::Fail(_)) || !gates_ok {
        Verdict::Fail
    } else if matches!(lin, Linearizable::Unknown { .. }) {
        Verdict::Unknown
    } else {
        Verdict::Pass
    };
    if let Some(c) = &counterexample {
        std::fs::write(dir.join("counterexample.txt"), c).context("writing counterexample.txt")?;
    }
    Ok(Summary {
        profile: cfg.profile.clone(),
        seed: cfg.seed,
        fenced_bin: cfg.fenced_bin.display().to_string(),
        canary: cfg.canary.map(|c| c.to_string()),
        duration_s: end_ns as f64 / 1e9,
        ops: count_ops(&ops),
        faults: records,
        membership_steps: steps,
        leader_changes,
        longest_unavailability_ms: longest_gap_ms(&ops, warm_ns, end_ns),
        pre_fault_ops_per_s,
        grants,
        writes,
        kv,
        invariants: findings,
        linearizability: lin_text,
        lin_resources,
        counterexample,
        gates,
        verdict,
    })
}

use crate::nemesis::Fault;

/// The summary as a person reads it.
pub fn render(s: &Summary) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "== fenced-jepsen {} (seed {}) — {}",
        s.profile, s.seed, s.verdict
    );
    let _ = writeln!(
        t,
        "binary {}{}; {:.0} s of workload",
        s.fenced_bin,
        s.canary
            .as_ref()
            .map_or(String::new(), |c| format!(" with canary {c} planted")),
        s.duration_s
    );
    let _ = writeln!(t, "operations         attempted      ok    fail  unknown");
    for (name, c) in &s.ops {
        let _ = writeln!(
            t,
            "  {name:<16} {:>9} {:>7} {:>7} {:>8}",
            c.attempted, c.ok, c.fail, c.unknown
        );
    }
    let installed = s.faults.iter().filter(|f| f.skipped.is_none()).count();
    let _ = writeln!(
        t,
        "faults: {installed} installed, {} skipped, {} without evidence of effect",
        s.faults.len() - installed,
        s.faults.iter().filter(|f| !f.took_effect).count()
    );
    for f in &s.faults {
        let _ = writeln!(
            t,
            "  {:>7.1}s–{:>5.1}s {:<22} {:<28} {}{}",
            f.installed_ns as f64 / 1e9,
            f.healed_ns as f64 / 1e9,
            f.fault,
            f.target,
            if f.took_effect { "ok: " } else { "NO EFFECT: " },
            f.skipped.as_deref().unwrap_or(&f.evidence)
        );
    }
    if !s.membership_steps.is_empty() {
        let _ = writeln!(
            t,
            "membership steps against the faults installed while they ran:"
        );
        for m in &s.membership_steps {
            let _ = writeln!(
                t,
                "  {:>7.1}s–{:>5.1}s {:<20} {:<7} n{:<3} {}{} — {}",
                m.start_ns as f64 / 1e9,
                m.end_ns as f64 / 1e9,
                m.change,
                m.step,
                m.node,
                if m.ok { "ok" } else { "FAILED" },
                if m.retries > 0 {
                    format!(
                        " after {} retries ({})",
                        m.retries,
                        m.retried.first().map_or("", String::as_str)
                    )
                } else {
                    String::new()
                },
                if m.during.is_empty() {
                    "no fault installed".to_string()
                } else {
                    format!("during {}", m.during.join(", "))
                }
            );
        }
    }
    let _ = writeln!(
        t,
        "leader changes {}; longest unavailability {} ms; pre-fault {:.0} ops/s",
        s.leader_changes, s.longest_unavailability_ms, s.pre_fault_ops_per_s
    );
    let _ = writeln!(
        t,
        "grants acknowledged {}, max token {}, missing {}, phantom {}",
        s.grants.acknowledged, s.grants.max_token, s.grants.missing, s.grants.phantom
    );
    let _ = writeln!(
        t,
        "fenced writes accepted {}, rejected {}, stale sent {}, stale rejected {}, stale accepted {}",
        s.writes.accepted, s.writes.rejected, s.writes.stale_sent, s.writes.stale_rejected, s.writes.stale_accepted
    );
    let _ = writeln!(
        t,
        "kv puts applied {}, refused {}, unknown {}, late sent {}, late refused {}; values read {}",
        s.kv.applied,
        s.kv.refused,
        s.kv.unknown,
        s.kv.late_sent,
        s.kv.late_refused,
        s.kv.reads_found
    );
    let _ = writeln!(t, "invariants:");
    for f in &s.invariants {
        let _ = writeln!(
            t,
            "  {:<50} {:>6} checked, {} violations",
            f.name,
            f.checked,
            f.violations.len()
        );
    }
    let _ = writeln!(
        t,
        "linearizability ({} resources): {}",
        s.lin_resources, s.linearizability
    );
    let _ = writeln!(t, "coverage gates:");
    for (g, ok) in &s.gates {
        let _ = writeln!(t, "  [{}] {g}", if *ok { "ok" } else { "FAILED" });
    }
    if let Some(c) = &s.counterexample {
        let _ = writeln!(t, "first counterexample:\n{c}");
    }
    let _ = writeln!(t, "verdict: {}", s.verdict);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(name: &str, installed_ns: u64, healed_ns: u64, skipped: bool) -> FaultRecord {
        FaultRecord {
            fault: name.into(),
            target: "n1".into(),
            installed_ns,
            healed_ns,
            evidence: String::new(),
            took_effect: !skipped,
            skipped: skipped.then(|| "no leader to target".into()),
            released_ns: None,
            idle_ns: None,
            damage_refused: None,
            full_disk_stopped: None,
            leader_kept: None,
        }
    }

    /// One fault that held, one that did not (the only violation, named
    /// after `failed`), one the checker does not judge; returns the finding.
    fn judged(
        held: &str,
        failed: &str,
        unjudged: FaultRecord,
        mark: impl Fn(&mut FaultRecord, bool),
        check: impl Fn(&[FaultRecord]) -> invariants::Finding,
    ) -> invariants::Finding {
        let mut ok = fault(held, 1, 2, false);
        mark(&mut ok, true);
        let mut bad = fault(failed, 3, 4, false);
        mark(&mut bad, false);
        let found = check(&[ok, bad, unjudged]);
        assert_eq!(found.checked, 2);
        assert_eq!(found.violations.len(), 1, "{:?}", found.violations);
        assert!(found.violations[0].starts_with(&format!("{failed} on n1")));
        found
    }

    #[test]
    fn a_short_leader_pause_that_elected_another_is_a_violation() {
        let found = judged(
            "pause-leader-300ms",
            "pause-leader-300ms",
            fault("pause-leader-5000ms", 5, 6, false),
            |r, ok| r.leader_kept = Some(ok),
            invariants::short_pause_keeps_leader,
        );
        assert!(found.violations[0].contains("another node was elected"));
    }

    #[test]
    fn a_damaged_file_that_was_not_refused_is_a_violation() {
        judged(
            "damage-random",
            "damage-leader",
            fault("kill-leader", 5, 6, false),
            |r, ok| r.damage_refused = Some(ok),
            invariants::damage_refused,
        );
    }

    #[test]
    fn a_node_that_ran_on_past_a_full_disk_is_a_violation() {
        let mut damaged = fault("damage-leader", 5, 6, false);
        damaged.damage_refused = Some(false);
        judged(
            "full-disk-random",
            "full-disk-leader",
            damaged,
            |r, ok| r.full_disk_stopped = Some(ok),
            invariants::full_disk_stops,
        );
    }

    #[test]
    fn a_step_overlaps_only_the_faults_installed_while_it_ran() {
        let s = 1_000_000_000;
        let faults = vec![
            fault("isolate-leader", 10 * s, 15 * s, false),
            fault("kill-leader", 20 * s, 23 * s, false),
            fault("leader-minority", 30 * s, 35 * s, true),
        ];
        // Ends before the first fault, and between two.
        assert!(overlapping(2 * s, 10 * s, &faults).is_empty());
        assert!(overlapping(15 * s, 20 * s, &faults).is_empty());
        // A skipped fault was never installed.
        assert!(overlapping(31 * s, 33 * s, &faults).is_empty());
        assert_eq!(
            overlapping(14 * s, 21 * s, &faults),
            vec![
                "f0 isolate-leader n1 (1.0 s)".to_string(),
                "f1 kill-leader n1 (1.0 s)".to_string()
            ]
        );
        assert_eq!(
            overlapping(21 * s, 22 * s, &faults),
            vec!["f1 kill-leader n1 (1.0 s)".to_string()]
        );
    }
}
