//! `fenced-bench`: fenced side by side with etcd's lock service and the
//! article's lease table on PostgreSQL, on the same machine in the same run.
//! Prints figures per scenario and one comparison table; checks token order
//! on every grant and fails (exit 1) on a violation or an exceeded budget.

mod million;
mod procs;
mod rolling;
mod scenarios;
mod systems;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Parser;
use fenced_bench::{
    chart::{self, ChartData, LatencyRow, Series},
    check::TokenLedger,
    stats::Recorder,
};
use fenced_client::Client;

use procs::{LocalCluster, LocalPostgres};
use scenarios::{CycleLoad, Run};
use systems::{Kind, Target};

#[derive(Parser, Debug, Clone)]
#[command(about = "Benchmarks fenced against etcd's lock and the article's PostgreSQL lease table")]
struct Args {
    /// Systems to measure, in order: fenced, etcd, postgres.
    #[arg(long, value_delimiter = ',', default_value = "fenced")]
    systems: Vec<String>,
    /// Scenarios: s1 s2 s3 s4 s5 s6 rolling budgets validate million
    /// (validate and million: fenced only, not run unless named).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "s1,s2,s3,s4,s5,s6,rolling,budgets"
    )]
    scenarios: Vec<String>,
    /// Seconds each measured run lasts.
    #[arg(long, default_value_t = 10.0)]
    duration_s: f64,
    /// Rounds of every system in turn (fenced, etcd, postgres, fenced, ...);
    /// the table shows each figure's median over the rounds, so a shared
    /// machine's slow minutes weigh on every system alike.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Client counts for S2.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    s2_clients: Vec<usize>,
    /// Client counts for the validate scenario (ValidateToken, one pair per
    /// call), then one run of ValidateTokens batches at the last count.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    validate_clients: Vec<usize>,
    /// Pairs per ValidateTokens call in the validate scenario's batch run.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(2..=256))]
    validate_batch: u64,
    /// Client counts for S3.
    #[arg(long, value_delimiter = ',', default_value = "2,16,64")]
    s3_clients: Vec<usize>,
    /// Fixed rate (cycles per second in all) for S1 and S2 instead of a
    /// closed loop; latency is then measured from each intended start.
    #[arg(long)]
    rate: Option<f64>,
    /// Live leases renewed in S4.
    #[arg(long, default_value_t = 100_000)]
    s4_leases: usize,
    /// Clients holding S4's leases. On fenced each is one fenced_client
    /// Client whose leases live with its session, which its keeper keeps
    /// alive in one KeepAlive call per interval; the anchors renew over 256
    /// connections lease by lease.
    #[arg(long, default_value_t = 64)]
    s4_clients: usize,
    /// TTL of S4's leases; each is renewed every TTL/3.
    #[arg(long, default_value_t = 10_000)]
    s4_ttl_ms: u64,
    /// Clients taking leases during the rolling restart.
    #[arg(long, default_value_t = 16)]
    rolling_clients: usize,
    /// Live leases for the memory and restart budgets.
    #[arg(long, default_value_t = 100_000)]
    budget_leases: usize,
    /// Live leases the million scenario fills a cluster with before it
    /// restarts it (docs/SCALING.md).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    million_leases: u64,
    /// Clients filling the cluster in the million scenario.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096))]
    million_clients: u64,
    /// The `fenced` binary (a release build); default: next to this binary.
    #[arg(long)]
    fenced_bin: Option<PathBuf>,
    /// The `etcd` binary.
    #[arg(long, default_value = "etcd")]
    etcd_bin: PathBuf,
    /// Use a running fenced cluster instead of starting one (no CPU, S6 or
    /// budget figures then).
    #[arg(long, value_delimiter = ',')]
    fenced_endpoints: Vec<String>,
    /// Use a running etcd cluster instead of starting one.
    #[arg(long, value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// Use a running PostgreSQL (libpq key=value string) instead of starting one.
    #[arg(long)]
    pg_url: Option<String>,
    /// The OS user PostgreSQL runs as when the benchmark runs as root.
    #[arg(long, default_value = "postgres")]
    pg_os_user: String,
    /// Run the fenced cluster with TLS on both ports (certificates made by
    /// `fenced certs` in the work dir), every client over https: what TLS
    /// costs, against a run without it.
    #[arg(long)]
    fenced_tls: bool,
    /// Where the SVG chart of the run goes (throughput by client count,
    /// latency percentiles per scenario); its path is printed.
    #[arg(long, default_value = "fenced-bench.svg")]
    chart: PathBuf,
    /// Find each cluster's leader before measuring and put it first in the
    /// clients' endpoint lists (fenced and etcd alike; PostgreSQL is one
    /// server). Off: clients get every endpoint as configured and discover
    /// nothing in advance, as users configure them.
    #[arg(long, conflicts_with = "follower_first")]
    find_leader: bool,
    /// Put a follower first in the clients' endpoint lists (fenced and etcd
    /// alike): what a client pays when its first endpoint is not the leader.
    #[arg(long)]
    follower_first: bool,
    /// Where the clusters keep their data (default: a temporary directory).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// One figure of the comparison table: what each round measured.
#[derive(Debug, Clone)]
struct Figure {
    values: Vec<f64>,
    higher_is_better: bool,
}

impl Figure {
    /// The median of the rounds.
    fn value(&self) -> f64 {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }
}

#[derive(Default)]
struct Table {
    /// row label -> system -> figure, in insertion order of labels.
    rows: Vec<(String, BTreeMap<Kind, Figure>)>,
    /// For the chart: scenario -> system -> p50, p99, p999 (ms), in
    /// insertion order of scenarios.
    percentiles: Vec<(String, BTreeMap<Kind, [Figure; 3]>)>,
}

impl Table {
    fn put(&mut self, label: &str, kind: Kind, value: f64, higher_is_better: bool) {
        let row = match self.rows.iter().position(|(l, _)| l == label) {
            Some(i) => &mut self.rows[i].1,
            None => {
                self.rows.push((label.to_string(), BTreeMap::new()));
                let last = self.rows.len() - 1;
                &mut self.rows[last].1
            }
        };
        row.entry(kind)
            .or_insert_with(|| Figure {
                values: Vec::new(),
                higher_is_better,
            })
            .values
            .push(value);
    }

    /// Notes `op`'s p50, p99 and p999 in `run` for the chart.
    fn put_percentiles(&mut self, scenario: &str, kind: Kind, run: &Run, op: &str) {
        let i = match self.percentiles.iter().position(|(s, _)| s == scenario) {
            Some(i) => i,
            None => {
                self.percentiles
                    .push((scenario.to_string(), BTreeMap::new()));
                self.percentiles.len() - 1
            }
        };
        let figures = self.percentiles[i].1.entry(kind).or_insert_with(|| {
            std::array::from_fn(|_| Figure {
                values: Vec::new(),
                higher_is_better: false,
            })
        });
        for (figure, q) in figures.iter_mut().zip([0.5, 0.99, 0.999]) {
            figure
                .values
                .push(micros_ms(run.rec.quantile_micros(op, q)));
        }
    }

    /// The chart's data: S2 throughput by client count, and every noted
    /// scenario's percentiles (medians over the rounds).
    fn chart(&self, title: String, s2_clients: &[usize]) -> ChartData {
        let mut kinds: Vec<Kind> = self
            .rows
            .iter()
            .flat_map(|(_, r)| r.keys().copied())
            .collect();
        kinds.sort();
        kinds.dedup();
        let throughput = kinds
            .iter()
            .map(|&kind| Series {
                system: kind.name().to_string(),
                points: s2_clients
                    .iter()
                    .filter_map(|&n| {
                        Some((n, self.get(&format!("S2 {n} clients: cycles/s"), kind)?))
                    })
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        let latency = self
            .percentiles
            .iter()
            .flat_map(|(scenario, by_kind)| {
                by_kind.iter().map(|(kind, [p50, p99, p999])| LatencyRow {
                    scenario: scenario.clone(),
                    system: kind.name().to_string(),
                    p50: p50.value(),
                    p99: p99.value(),
                    p999: p999.value(),
                })
            })
            .collect();
        ChartData {
            title,
            throughput,
            latency,
        }
    }

    fn get(&self, label: &str, kind: Kind) -> Option<f64> {
        self.rows
            .iter()
            .find(|(l, _)| l == label)
            .and_then(|(_, r)| r.get(&kind))
            .map(Figure::value)
    }

    /// How many times better fenced is than `other` on a row (> 1: better).
    fn ratio(&self, label: &str, other: Kind) -> Option<f64> {
        let row = &self.rows.iter().find(|(l, _)| l == label)?.1;
        let f = row.get(&Kind::Fenced)?;
        let o = row.get(&other)?;
        if f.higher_is_better {
            (o.value() > 0.0).then(|| f.value() / o.value())
        } else {
            (f.value() > 0.0).then(|| o.value() / f.value())
        }
    }

    fn print(&self) {
        let cell = |v: Option<f64>| match v {
            Some(v) if v.is_finite() && v.abs() >= 100.0 => format!("{v:.0}"),
            Some(v) if v.is_finite() => format!("{v:.2}"),
            Some(_) => "inf".into(),
            None => "-".into(),
        };
        let ratio = |v: Option<f64>| v.map_or("-".into(), |r| format!("{r:.2}x"));
        println!();
        println!(
            "| scenario | fenced | etcd | PostgreSQL | fenced vs etcd | fenced vs PostgreSQL |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        for (label, _) in &self.rows {
            println!(
                "| {label} | {} | {} | {} | {} | {} |",
                cell(self.get(label, Kind::Fenced)),
                cell(self.get(label, Kind::Etcd)),
                cell(self.get(label, Kind::Postgres)),
                ratio(self.ratio(label, Kind::Etcd)),
                ratio(self.ratio(label, Kind::Postgres)),
            );
        }
        println!("(ratios: how many times better fenced is; > 1 means fenced is faster)");
    }
}

/// What the systems' own processes did during a run.
struct Probe {
    pids: Vec<u32>,
    fenced: Option<Client>,
    ticks_per_second: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct ProbeSample {
    cpu_micros: u64,
    log_syncs: u64,
    applied_entries: u64,
    applied_commands: u64,
}

impl Probe {
    async fn sample(&self) -> ProbeSample {
        let mut s = ProbeSample {
            cpu_micros: procs::cpu_micros(&self.pids, self.ticks_per_second),
            ..Default::default()
        };
        if let Some(client) = &self.fenced {
            let mut max_entries = 0;
            let mut max_commands = 0;
            for (_, status) in client.status_of_each().await {
                if let Ok(st) = status {
                    s.log_syncs += st.log_syncs;
                    // The most advanced node's counts (all apply the same log).
                    if st.applied_entries >= max_entries {
                        max_entries = st.applied_entries;
                        max_commands = st.applied_commands;
                    }
                }
            }
            s.applied_entries = max_entries;
            s.applied_commands = max_commands;
        }
        s
    }
}

fn ms(micros: Option<u64>) -> String {
    micros.map_or("-".into(), |m| format!("{:.2}", m as f64 / 1000.0))
}

fn quantiles(rec: &Recorder, op: &str) -> String {
    format!(
        "{} p50/p99/p999 {}/{}/{} ms",
        op,
        ms(rec.quantile_micros(op, 0.5)),
        ms(rec.quantile_micros(op, 0.99)),
        ms(rec.quantile_micros(op, 0.999)),
    )
}

/// Prints one run's figures.
fn report(kind: Kind, name: &str, run: &Run, before: ProbeSample, after: ProbeSample) {
    let ops = run.ops.max(1) as f64;
    let mut line = format!(
        "[{}] {name}: {:.0} ops/s ({} ops in {:.1} s), errors {}",
        kind.name(),
        run.ops_per_second(),
        run.ops,
        run.elapsed.as_secs_f64(),
        run.rec.errors
    );
    for (op, _) in run.rec.ops() {
        line.push_str("; ");
        line.push_str(&quantiles(&run.rec, op));
    }
    let cpu = after.cpu_micros.saturating_sub(before.cpu_micros);
    if cpu > 0 {
        line.push_str(&format!("; server CPU {:.0} µs/op", cpu as f64 / ops));
    }
    if kind == Kind::Fenced && after.applied_entries > before.applied_entries {
        let entries = after.applied_entries - before.applied_entries;
        let commands = after
            .applied_commands
            .saturating_sub(before.applied_commands);
        let syncs = after.log_syncs.saturating_sub(before.log_syncs);
        line.push_str(&format!(
            "; {:.1} commands/entry; {:.3} fsyncs/op (all nodes)",
            commands as f64 / entries as f64,
            syncs as f64 / ops
        ));
    }
    for (k, v) in &run.extra {
        line.push_str(&format!("; {k} {v:.2}"));
    }
    println!("{line}");
    if let Some(e) = &run.rec.first_error {
        println!("    first error: {e}");
    }
}

/// A system under test and what the benchmark started for it.
struct Sut {
    target: Target,
    cluster: Option<LocalCluster>,
    _postgres: Option<LocalPostgres>,
    probe: Probe,
}

impl Sut {
    async fn measure<F, Fut>(&self, name: &str, f: F) -> Result<Run>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Run>>,
    {
        let before = self.probe.sample().await;
        let run = f()
            .await
            .with_context(|| format!("{} {name}", self.target.kind().name()))?;
        let after = self.probe.sample().await;
        report(self.target.kind(), name, &run, before, after);
        Ok(run)
    }
}

fn fenced_bin(args: &Args) -> Result<PathBuf> {
    if let Some(b) = &args.fenced_bin {
        return Ok(b.clone());
    }
    let exe = std::env::current_exe().context("locating this binary")?;
    let dir = exe.parent().context("binary directory")?;
    let bin = dir.join("fenced");
    if !bin.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p fenced-server --bin fenced` or pass --fenced-bin",
            bin.display()
        );
    }
    Ok(bin)
}

async fn wait_until<F, Fut>(within: Duration, what: &str, mut f: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            bail!("{what}: not within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The fenced endpoints with the leader first.
async fn fenced_leader_first(endpoints: &[String]) -> Result<(Vec<String>, u64)> {
    let client = systems::fenced_client(endpoints)?;
    let statuses = client.status_of_each().await;
    let leader = statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .map(|s| s.leader_id)
        .find(|id| *id != 0)
        .context("fenced has no leader")?;
    let mut list: Vec<(String, bool)> = statuses
        .iter()
        .map(|(e, s)| {
            let is_leader = s.as_ref().map(|s| s.node_id == leader).unwrap_or(false);
            (e.clone(), is_leader)
        })
        .collect();
    list.sort_by_key(|(_, l)| !*l);
    Ok((list.into_iter().map(|(e, _)| e).collect(), leader))
}

/// Whether the run looks for each cluster's leader before measuring.
fn discovers(args: &Args) -> bool {
    args.find_leader || args.follower_first
}

/// The clients' endpoint list from `leader_first` (every endpoint, the
/// leader first): the leader first, or last with a follower first.
fn arrange(args: &Args, mut leader_first: Vec<String>) -> Vec<String> {
    if args.follower_first {
        leader_first.rotate_left(1);
    }
    leader_first
}

async fn fenced_has_leader(endpoints: &[String]) -> bool {
    let Ok(client) = systems::fenced_client(endpoints) else {
        return false;
    };
    let st = client.status_of_each().await;
    let leaders: Vec<u64> = st
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok().map(|s| s.leader_id))
        .collect();
    leaders.len() == endpoints.len() && leaders.iter().all(|l| *l != 0 && *l == leaders[0])
}

/// Writes every dirty page to disk before a system starts. A few GB of
/// writeback (a build, or the system measured before) stalls the next
/// system's fdatasyncs, by half a second in a test, charged to whoever
/// runs next.
async fn flush_earlier_writes() {
    match tokio::process::Command::new("sync").status().await {
        Ok(s) if s.success() => {}
        Ok(s) => tracing::warn!(status = %s, "sync failed; earlier writes may slow this run"),
        Err(e) => tracing::warn!(error = %e, "sync not run; earlier writes may slow this run"),
    }
}

async fn start_system(args: &Args, kind: Kind, dir: &std::path::Path) -> Result<Sut> {
    flush_earlier_writes().await;
    let ticks = procs::clock_ticks_per_second();
    match kind {
        Kind::Fenced => {
            let (endpoints, cluster) = if args.fenced_endpoints.is_empty() {
                let mut c = LocalCluster::fenced(fenced_bin(args)?, dir)?;
                if args.fenced_tls {
                    systems::use_fenced_tls(c.use_tls()?);
                    println!("fenced: TLS on both ports, every client over https");
                }
                c.start_all()?;
                let eps = c.endpoints();
                if let Err(e) = wait_until(Duration::from_secs(20), "fenced leader", || {
                    fenced_has_leader(&eps)
                })
                .await
                {
                    bail!("{e}\n{}", c.log_tail());
                }
                (eps, Some(c))
            } else {
                (args.fenced_endpoints.clone(), None)
            };
            let endpoints = if discovers(args) {
                arrange(args, fenced_leader_first(&endpoints).await?.0)
            } else {
                endpoints
            };
            println!("fenced clients' endpoints: {}", endpoints.join(","));
            let pids = cluster.as_ref().map(LocalCluster::pids).unwrap_or_default();
            Ok(Sut {
                probe: Probe {
                    pids,
                    fenced: Some(systems::fenced_client(&endpoints)?),
                    ticks_per_second: ticks,
                },
                target: Target::Fenced { endpoints },
                cluster,
                _postgres: None,
            })
        }
        Kind::Etcd => {
            let (endpoints, cluster) = if args.etcd_endpoints.is_empty() {
                let mut c = LocalCluster::etcd(args.etcd_bin.clone(), dir)?;
                c.start_all()?;
                let eps = c.endpoints();
                if let Err(e) = wait_until(Duration::from_secs(30), "etcd leader", || {
                    systems::etcd_ready(&eps)
                })
                .await
                {
                    bail!("{e}\n{}", c.log_tail());
                }
                (eps, Some(c))
            } else {
                (args.etcd_endpoints.clone(), None)
            };
            let endpoints = if discovers(args) {
                arrange(args, systems::etcd_leader_first(&endpoints).await?)
            } else {
                endpoints
            };
            println!("etcd clients' endpoints: {}", endpoints.join(","));
            let pids = cluster.as_ref().map(LocalCluster::pids).unwrap_or_default();
            Ok(Sut {
                probe: Probe {
                    pids,
                    fenced: None,
                    ticks_per_second: ticks,
                },
                target: Target::Etcd { endpoints },
                cluster,
                _postgres: None,
            })
        }
        Kind::Postgres => {
            let (url, pg) = match &args.pg_url {
                Some(u) => (u.clone(), None),
                None => {
                    let pg = LocalPostgres::start(dir, &args.pg_os_user)?;
                    (pg.url(), Some(pg))
                }
            };
            let target = Target::Postgres { url };
            wait_until(Duration::from_secs(30), "PostgreSQL ready", || {
                let t = target.clone();
                async move { t.prepare().await.is_ok() }
            })
            .await?;
            let pids = pg.as_ref().and_then(|p| p.proc.pid()).into_iter().collect();
            Ok(Sut {
                probe: Probe {
                    pids,
                    fenced: None,
                    ticks_per_second: ticks,
                },
                target,
                cluster: None,
                _postgres: pg,
            })
        }
    }
}

struct Outcome {
    failures: Vec<String>,
}

#[allow(clippy::too_many_lines)]
async fn run_system(
    args: &Args,
    kind: Kind,
    dir: &std::path::Path,
    table: &mut Table,
    out: &mut Outcome,
) -> Result<()> {
    let want = |s: &str| args.scenarios.iter().any(|x| x.eq_ignore_ascii_case(s));
    let duration = Duration::from_secs_f64(args.duration_s);
    let ledger = Arc::new(TokenLedger::new());
    let mut sut = start_system(args, kind, dir).await?;
    let ttl = Duration::from_secs(10);
    println!("== {} ==", kind.name());

    if want("s1") {
        let load = CycleLoad {
            clients: 1,
            duration,
            rate_per_second: args.rate.map(|r| r.min(1000.0)),
            resources_per_client: 0,
            ttl,
        };
        let t = sut.target.clone();
        let l = Arc::clone(&ledger);
        let run = sut
            .measure("S1 one client, fresh resources", || async move {
                scenarios::cycles(&t, load, l, "s1", None).await
            })
            .await?;
        table.put(
            "S1 cycle p50 (ms)",
            kind,
            micros_ms(run.rec.quantile_micros("cycle", 0.5)),
            false,
        );
        table.put(
            "S1 cycle p99 (ms)",
            kind,
            micros_ms(run.rec.quantile_micros("cycle", 0.99)),
            false,
        );
        table.put("S1 cycles/s", kind, run.ops_per_second(), true);
        table.put_percentiles("S1 1 client, cycle", kind, &run, "cycle");
    }

    if let (true, systems::Target::Fenced { endpoints }) = (want("validate"), &sut.target) {
        let batch = usize::try_from(args.validate_batch).unwrap_or(64);
        let runs = args
            .validate_clients
            .iter()
            .map(|&n| (n, 1))
            .chain(args.validate_clients.last().map(|&n| (n, batch)));
        for (n, batch) in runs {
            let e = endpoints.clone();
            let name = if batch > 1 {
                format!("validate {n} clients, batches of {batch}")
            } else {
                format!("validate {n} clients")
            };
            let run = sut
                .measure(&name, || async move {
                    scenarios::validate(&e, n, batch, duration).await
                })
                .await?;
            table.put(
                &format!("{name}: checks/s"),
                kind,
                run.ops_per_second(),
                true,
            );
            table.put(
                &format!("{name}: call p99 (ms)"),
                kind,
                micros_ms(run.rec.quantile_micros("validate", 0.99)),
                false,
            );
        }
    }

    let mut s2_max_64 = None;
    if want("s2") {
        for &n in &args.s2_clients {
            let load = CycleLoad {
                clients: n,
                duration,
                rate_per_second: args.rate,
                resources_per_client: 8,
                ttl,
            };
            let t = sut.target.clone();
            let l = Arc::clone(&ledger);
            let run = sut
                .measure(&format!("S2 {n} clients, uncontended"), || async move {
                    scenarios::cycles(&t, load, l, "s2", None).await
                })
                .await?;
            table.put(
                &format!("S2 {n} clients: cycles/s"),
                kind,
                run.ops_per_second(),
                true,
            );
            table.put(
                &format!("S2 {n} clients: cycle p99 (ms)"),
                kind,
                micros_ms(run.rec.quantile_micros("cycle", 0.99)),
                false,
            );
            table.put_percentiles(&format!("S2 {n} clients, cycle"), kind, &run, "cycle");
            if n == 64 {
                s2_max_64 = Some(run.ops_per_second());
                let _ = run.rec.count("cycle");
            }
        }
    }

    if want("s3") {
        for &n in &args.s3_clients {
            let t = sut.target.clone();
            let l = Arc::clone(&ledger);
            let run = sut
                .measure(&format!("S3 {n} clients, one resource"), || async move {
                    scenarios::contended(&t, n, duration, l).await
                })
                .await?;
            table.put(
                &format!("S3 {n} clients: hand-offs/s"),
                kind,
                run.ops_per_second(),
                true,
            );
            table.put(
                &format!("S3 {n} clients: wait p99 (ms)"),
                kind,
                micros_ms(run.rec.quantile_micros("wait", 0.99)),
                false,
            );
            table.put_percentiles(&format!("S3 {n} clients, wait"), kind, &run, "wait");
            if let Some(f) = run.extra.get("fairness_max_over_min") {
                table.put(
                    &format!("S3 {n} clients: max/min grants per client"),
                    kind,
                    *f,
                    false,
                );
            }
        }
    }

    if want("s4") {
        s4(args, &sut, kind, duration, s2_max_64, &ledger, table).await?;
    }

    if want("s5") && kind == Kind::Fenced {
        let run = s5(&sut.target, duration, &ledger).await?;
        for (k, v) in &run.extra {
            println!("[fenced] S5 {k}: {v:.2}");
        }
        if let Some(v) = run.extra.get("checked writes/s") {
            table.put("S5 fenced writes/s (token checked)", kind, *v, true);
        }
        if let Some(v) = run.extra.get("plain writes/s") {
            table.put("S5 same writes/s without the check", kind, *v, true);
        }
        if let Some(v) = run.extra.get("check overhead p50 (%)") {
            table.put("S5 token check overhead p50 (%)", kind, *v, false);
        }
    }

    if want("s6") && kind != Kind::Postgres {
        if let Some(cluster) = sut.cluster.as_mut() {
            let (recovery_s, run) = s6(&sut.target, cluster, duration, &ledger, kind).await?;
            table.put(
                "S6 seconds until a grant after leader kill",
                kind,
                recovery_s,
                false,
            );
            table.put(
                "S6 cycle p999 across the kill (ms)",
                kind,
                micros_ms(run.rec.quantile_micros("cycle", 0.999)),
                false,
            );
            if kind == Kind::Fenced && recovery_s > 3.0 {
                out.failures.push(format!(
                    "S6: a grant took {recovery_s:.2} s after the leader died (budget: 3 x 1 s election timeout)"
                ));
            }
        }
    }

    if want("rolling") && kind == Kind::Fenced {
        if let Some(cluster) = sut.cluster.as_mut() {
            rolling_restart(args, cluster, &ledger, table, out).await?;
        }
    }

    if want("budgets") && kind == Kind::Fenced && args.fenced_endpoints.is_empty() {
        // A fresh cluster of its own: stop this one first.
        if let Some(c) = sut.cluster.as_mut() {
            c.kill_all();
        }
        budgets(args, dir, table, out).await?;
    }
    if want("million") && kind == Kind::Fenced && args.fenced_endpoints.is_empty() {
        if let Some(c) = sut.cluster.as_mut() {
            c.kill_all();
        }
        let n = usize::try_from(args.million_leases)?;
        let clients = usize::try_from(args.million_clients)?;
        let f = million::run(fenced_bin(args)?, dir, n, clients).await?;
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        table.put(
            &format!("million: fill {n} leases (s)"),
            Kind::Fenced,
            f.fill_s,
            false,
        );
        table.put(
            &format!("million: max node RSS with {n} leases (MB)"),
            Kind::Fenced,
            max(&f.rss_mb),
            false,
        );
        table.put(
            "million: max node peak RSS (MB)",
            Kind::Fenced,
            max(&f.peak_rss_mb),
            false,
        );
        table.put(
            "million: SIGTERM of the three nodes (s)",
            Kind::Fenced,
            f.shutdown_s,
            false,
        );
        table.put(
            "million: restart to serving (s)",
            Kind::Fenced,
            f.serving_s,
            false,
        );
        table.put(
            "million: restart to every node loaded (s)",
            Kind::Fenced,
            f.all_loaded_s,
            false,
        );
        table.put(
            "million: max node RSS after restart (MB)",
            Kind::Fenced,
            max(&f.rss_after_restart_mb),
            false,
        );
        if max(&f.rss_mb) > 400.0 {
            out.failures.push(format!(
                "million: a node used {:.1} MB with {} leases (target 400 MB)",
                max(&f.rss_mb),
                f.leases
            ));
        }
        if f.serving_s > 5.0 {
            out.failures.push(format!(
                "million: the restarted cluster served after {:.3} s (target 5 s)",
                f.serving_s
            ));
        }
    }
    println!(
        "[{}] token order checked on {} resources: no violation",
        kind.name(),
        ledger.resources()
    );
    if let Some(mut c) = sut.cluster.take() {
        c.kill_all();
    }
    Ok(())
}

/// Connections S4's renewals are spread over. Each renews its share of the
/// leases one after another, so each must finish a renewal within
/// `TTL / 3 / (leases / workers)`: 10,000 leases, TTL 6 s over 256
/// connections leave 51 ms per renewal, far above any system's latency here.
const S4_RENEW_WORKERS: usize = 256;

fn micros_ms(m: Option<u64>) -> f64 {
    m.map_or(f64::NAN, |m| m as f64 / 1000.0)
}

/// S4: S2 at 64 clients (closed loop) alone, then while `--s4-leases`
/// leases are kept alive; reports both runs' throughput and p99, their
/// ratios, and the renewals' latency. fenced keeps the leases as
/// applications do, through `--s4-clients` clients' keepers (one session
/// each, kept alive once per interval);
/// the anchors renew lease by lease (etcd: one lease per key).
async fn s4(
    args: &Args,
    sut: &Sut,
    kind: Kind,
    duration: Duration,
    _s2_max_64: Option<f64>,
    ledger: &Arc<TokenLedger>,
    table: &mut Table,
) -> Result<()> {
    let ttl = Duration::from_millis(args.s4_ttl_ms);
    let load = CycleLoad {
        clients: 64,
        duration,
        rate_per_second: None,
        resources_per_client: 8,
        ttl: Duration::from_secs(10),
    };
    let t = sut.target.clone();
    let l = Arc::clone(ledger);
    let base = sut
        .measure("S4 baseline: S2 64 clients alone", || async move {
            scenarios::cycles(&t, load, l, "s4base", None).await
        })
        .await?;
    let setup = Instant::now();
    let renewer = if kind == Kind::Fenced {
        Renewer::Kept(
            scenarios::keeper_load(
                &sut.target,
                args.s4_leases,
                args.s4_clients,
                ttl,
                Arc::clone(ledger),
            )
            .await?,
        )
    } else {
        let stop = Arc::new(AtomicBool::new(false));
        let renewed = Arc::new(AtomicU64::new(0));
        let task = scenarios::renew_load(
            &sut.target,
            args.s4_leases,
            S4_RENEW_WORKERS,
            ttl,
            Arc::clone(ledger),
            Arc::clone(&stop),
            Arc::clone(&renewed),
        )
        .await?;
        Renewer::Each {
            stop,
            renewed,
            task,
        }
    };
    println!(
        "[{}] S4: {} leases acquired in {:.1} s over {} clients; renewing every {} ms",
        kind.name(),
        args.s4_leases,
        setup.elapsed().as_secs_f64(),
        if kind == Kind::Fenced {
            args.s4_clients
        } else {
            S4_RENEW_WORKERS
        },
        args.s4_ttl_ms / 3
    );
    // Let two renewal rounds pass before measuring: the leases granted over
    // the set-up settle into one call per client and interval.
    tokio::time::sleep(2 * ttl / 3).await;
    let (r0, c0) = renewer.renewed_and_calls();
    if let Renewer::Kept(kept) = &renewer {
        kept.take_latencies(&mut Recorder::new());
    }
    let t = sut.target.clone();
    let l = Arc::clone(ledger);
    let loaded = sut
        .measure("S4 S2 64 clients with the leases renewed", || async move {
            scenarios::cycles(&t, load, l, "s4", None).await
        })
        .await?;
    let (r1, c1) = renewer.renewed_and_calls();
    let secs = loaded.elapsed.as_secs_f64().max(1e-9);
    let (rec, lost) = renewer.finish().await?;
    println!(
        "[{}] S4 renewals: {:.0} leases/s in {:.0} calls/s during the loaded run, errors {}, leases lost {lost}; {}",
        kind.name(),
        (r1 - r0) as f64 / secs,
        (c1 - c0) as f64 / secs,
        rec.errors,
        quantiles(&rec, "renew")
    );
    if let Some(e) = &rec.first_error {
        println!("    first renew error: {e}");
    }
    let (b_ops, l_ops) = (base.ops_per_second(), loaded.ops_per_second());
    let b99 = micros_ms(base.rec.quantile_micros("cycle", 0.99));
    let l99 = micros_ms(loaded.rec.quantile_micros("cycle", 0.99));
    println!(
        "[{}] S4: S2 64 clients {b_ops:.0} cycles/s, p99 {b99:.1} ms alone; {l_ops:.0} cycles/s, p99 {l99:.1} ms with {} leases renewed: throughput x{:.2}, p99 x{:.2}",
        kind.name(),
        args.s4_leases,
        l_ops / b_ops.max(1e-9),
        l99 / b99
    );
    table.put(
        "S4 renew p99 (ms)",
        kind,
        micros_ms(rec.quantile_micros("renew", 0.99)),
        false,
    );
    table.put("S4 S2 cycles/s alone", kind, b_ops, true);
    table.put("S4 S2 cycles/s with renewals", kind, l_ops, true);
    table.put(
        "S4 S2 throughput kept (loaded/alone)",
        kind,
        l_ops / b_ops.max(1e-9),
        true,
    );
    table.put("S4 S2 cycle p99 alone (ms)", kind, b99, false);
    table.put("S4 S2 cycle p99 with renewals (ms)", kind, l99, false);
    table.put("S4 S2 p99 slowdown (loaded/alone)", kind, l99 / b99, false);
    table.put("S4 renewal calls/s", kind, (c1 - c0) as f64 / secs, false);
    Ok(())
}

/// How S4's leases are kept alive.
enum Renewer {
    /// fenced: by the clients' keepers.
    Kept(scenarios::KeptLeases),
    /// The anchors: a renewal per lease per interval.
    Each {
        stop: Arc<AtomicBool>,
        renewed: Arc<AtomicU64>,
        task: tokio::task::JoinHandle<Result<Recorder>>,
    },
}

impl Renewer {
    /// Leases renewed and calls made so far.
    fn renewed_and_calls(&self) -> (u64, u64) {
        match self {
            Renewer::Kept(k) => k.renewed_and_calls(),
            Renewer::Each { renewed, .. } => {
                let n = renewed.load(Ordering::Relaxed);
                (n, n)
            }
        }
    }

    /// Stops renewing; the renewals' latencies and the leases lost.
    async fn finish(self) -> Result<(Recorder, usize)> {
        match self {
            Renewer::Kept(kept) => {
                let mut rec = Recorder::new();
                kept.take_latencies(&mut rec);
                let lost = kept.lost();
                if lost > 0 {
                    rec.error(|| format!("{lost} of {} leases lost", kept.len()));
                }
                kept.release_all().await;
                Ok((rec, lost))
            }
            Renewer::Each { stop, task, .. } => {
                stop.store(true, Ordering::Relaxed);
                let rec = task.await.context("renew task")??;
                Ok((rec, 0))
            }
        }
    }
}

/// S5: writes through fenced-resource's FenceStore with a real token, against
/// the same write to the same kind of store (sled, flushed) without a check.
async fn s5(target: &Target, duration: Duration, ledger: &Arc<TokenLedger>) -> Result<Run> {
    use fenced_core::{OwnerId, ResourceName, Token};
    let mut session = target.session(false).await?;
    let resource = format!("s5-{}", scenarios::nonce());
    let grant = session
        .acquire(&resource, Duration::from_secs(60), Duration::ZERO)
        .await?
        .context("S5 lease held")?;
    ledger.record(&resource, grant.token)?;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(fenced_resource::FenceStore::open(dir.path().join("fence"))?);
    // The same store and the same durability (sled flush, then fdatasync of
    // its data file, as FenceStore does), without the read-compare-decide.
    let plain = sled::open(dir.path().join("plain"))?;
    let plain_file = std::fs::File::open(dir.path().join("plain").join("db"))
        .context("opening the plain store's data file")?;
    let name = ResourceName::new(&resource).map_err(|e| anyhow::anyhow!("{e}"))?;
    let token = Token::new(grant.token).map_err(|e| anyhow::anyhow!("{e}"))?;
    let owner = OwnerId::random();
    let half = duration / 2;
    let value = vec![7u8; 256];
    let res = tokio::task::spawn_blocking(move || -> Result<(Recorder, u64, Recorder, u64)> {
        let mut checked = Recorder::new();
        let mut n_checked: u64 = 0;
        let end = Instant::now() + half;
        while Instant::now() < end {
            let mut v = value.clone();
            v[..8].copy_from_slice(&n_checked.to_le_bytes());
            let w = fenced_resource::Write::for_resource(name.clone(), token, owner, v);
            let t = Instant::now();
            match store.write(&w)? {
                fenced_resource::WriteOutcome::Accepted { .. } => {}
                other => bail!("S5: the lease holder's write was not accepted: {other:?}"),
            }
            checked.record("write", t.elapsed());
            n_checked += 1;
        }
        let mut unchecked = Recorder::new();
        let mut n_plain: u64 = 0;
        let end = Instant::now() + half;
        while Instant::now() < end {
            let t = Instant::now();
            // A changing value, so every write really writes.
            let mut v = value.clone();
            v[..8].copy_from_slice(&n_plain.to_le_bytes());
            plain.insert(name.as_str().as_bytes(), v)?;
            plain.flush()?;
            plain_file.sync_data()?;
            unchecked.record("write", t.elapsed());
            n_plain += 1;
        }
        Ok((checked, n_checked, unchecked, n_plain))
    })
    .await
    .context("S5 writer")??;
    let _ = session.release(&resource, &grant).await;
    let (checked, n_checked, unchecked, n_plain) = res;
    let secs = half.as_secs_f64();
    let mut extra = BTreeMap::new();
    extra.insert("checked writes/s", n_checked as f64 / secs);
    extra.insert("plain writes/s", n_plain as f64 / secs);
    let p50c = micros_ms(checked.quantile_micros("write", 0.5));
    let p50p = micros_ms(unchecked.quantile_micros("write", 0.5));
    extra.insert("checked write p50 (ms)", p50c);
    extra.insert(
        "checked write p99 (ms)",
        micros_ms(checked.quantile_micros("write", 0.99)),
    );
    extra.insert("plain write p50 (ms)", p50p);
    extra.insert(
        "plain write p99 (ms)",
        micros_ms(unchecked.quantile_micros("write", 0.99)),
    );
    extra.insert("check overhead p50 (%)", (p50c / p50p - 1.0) * 100.0);
    Ok(Run {
        ops: n_checked,
        elapsed: half,
        rec: checked,
        extra,
    })
}

/// S6: S2 with 16 clients; the leader is killed a third of the way in.
async fn s6(
    target: &Target,
    cluster: &mut LocalCluster,
    duration: Duration,
    ledger: &Arc<TokenLedger>,
    kind: Kind,
) -> Result<(f64, Run)> {
    // A third before the kill, two thirds (at least 12 s) after it: long
    // enough to see a client wait out a request lost in the election.
    let total = duration.max(Duration::from_secs(18));
    if matches!(target, Target::Postgres { .. }) {
        bail!("S6 needs a cluster");
    }
    let times = Arc::new(Mutex::new(Vec::new()));
    let load = CycleLoad {
        clients: 16,
        duration: total,
        rate_per_second: None,
        resources_per_client: 8,
        ttl: Duration::from_secs(10),
    };
    let t = target.clone();
    let l = Arc::clone(ledger);
    let tm = Arc::clone(&times);
    let task = tokio::spawn(async move { scenarios::cycles(&t, load, l, "s6", Some(tm)).await });
    tokio::time::sleep(total / 3).await;
    // The leader now, not the one found at start: earlier scenarios may
    // have moved it, and killing a follower would measure no outage.
    let leader_addr = match target {
        Target::Fenced { endpoints } => fenced_leader_first(endpoints).await?.0,
        Target::Etcd { endpoints } => systems::etcd_leader_first(endpoints).await?,
        Target::Postgres { .. } => bail!("S6 needs a cluster"),
    }
    .into_iter()
    .next()
    .context("no endpoint")?;
    let leader_id = cluster
        .members
        .iter()
        .find(|m| m.client_addr() == leader_addr)
        .map(|m| m.id)
        .context("leader is not a member this benchmark started")?;
    let killed_at = Instant::now();
    cluster.kill(leader_id);
    let run = task.await.context("S6 load")??;
    // Recovery: the first grant of an acquire sent after the kill. Replies
    // that were already on their way when the leader died do not count.
    let times = times
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let recovery_s = times
        .iter()
        .filter(|(sent, _)| *sent > killed_at)
        .map(|(_, granted)| (*granted - killed_at).as_secs_f64())
        .fold(f64::INFINITY, f64::min);
    let window_s = (total - total / 3).as_secs_f64();
    let resumed = if recovery_s.is_finite() {
        format!("grants resumed {recovery_s:.3} s after the kill")
    } else {
        format!("no acquire sent after the kill was granted within the {window_s:.0} s left")
    };
    println!(
        "[{}] S6 leader {leader_id} killed: {resumed}; {} cycles/s across; errors {}; {}",
        kind.name(),
        run.ops_per_second() as u64,
        run.rec.errors,
        quantiles(&run.rec, "cycle")
    );
    if let Some(e) = &run.rec.first_error {
        println!("    first error: {e}");
    }
    cluster.spawn(leader_id)?;
    Ok((recovery_s, run))
}

/// Every node restarted in turn (SIGTERM, start, catch up) under load.
async fn rolling_restart(
    args: &Args,
    cluster: &mut LocalCluster,
    ledger: &Arc<TokenLedger>,
    table: &mut Table,
    out: &mut Outcome,
) -> Result<()> {
    let r = rolling::rolling_restart(
        cluster,
        args.rolling_clients,
        Duration::from_secs(1),
        ledger,
    )
    .await?;
    for (id, stopped, back) in &r.restarts {
        println!(
            "[fenced] rolling restart: node {id} exited {:.0} ms after SIGTERM, caught up {:.0} ms after its start",
            stopped.as_secs_f64() * 1e3,
            back.as_secs_f64() * 1e3
        );
    }
    let gap_ms = r.longest_gap.as_secs_f64() * 1e3;
    println!(
        "[fenced] rolling restart of {} nodes, {} clients listing every endpoint: {} grants, longest gap between grants {gap_ms:.0} ms (target under 1000 ms), {} calls failed after the client's retries (target 0)",
        r.restarts.len(),
        args.rolling_clients,
        r.grants,
        r.errors
    );
    table.put(
        "Rolling restart: longest gap between grants (ms)",
        Kind::Fenced,
        gap_ms,
        false,
    );
    table.put(
        "Rolling restart: calls failed after retries",
        Kind::Fenced,
        r.errors as f64,
        false,
    );
    if r.errors > 0 {
        out.failures.push(format!(
            "rolling restart: {} calls failed after the client's retries; first: {:?}",
            r.errors, r.first_errors
        ));
    }
    Ok(())
}

/// docs/DESIGN.md §8: memory with many live leases, start-up, restart.
async fn budgets(
    args: &Args,
    dir: &std::path::Path,
    table: &mut Table,
    out: &mut Outcome,
) -> Result<()> {
    let bdir = dir.join("budgets");
    std::fs::create_dir_all(&bdir)?;
    let mut c = LocalCluster::fenced(fenced_bin(args)?, &bdir)?;
    let started = Instant::now();
    c.start_all()?;
    let eps = c.endpoints();
    // Each node serves (answers Status) once it is up.
    let mut serve_s: f64 = 0.0;
    for e in &eps {
        let client = systems::fenced_client([e.as_str()])?;
        wait_until(Duration::from_secs(10), "empty node serving", || {
            let client = client.clone();
            async move {
                !client
                    .status_of_each()
                    .await
                    .iter()
                    .any(|(_, s)| s.is_err())
            }
        })
        .await?;
        serve_s = serve_s.max(started.elapsed().as_secs_f64());
    }
    wait_until(Duration::from_secs(20), "fenced leader", || {
        fenced_has_leader(&eps)
    })
    .await?;
    let first_grant = started.elapsed().as_secs_f64();
    println!(
        "[fenced] budgets: empty nodes serve after {serve_s:.3} s (bound 1 s); leader elected after {first_grant:.3} s"
    );
    table.put(
        "budget: empty node serves after (s)",
        Kind::Fenced,
        serve_s,
        false,
    );
    if serve_s > 1.0 {
        out.failures.push(format!(
            "start-up: an empty node served after {serve_s:.3} s (bound 1 s)"
        ));
    }
    let (leader_first, _) = fenced_leader_first(&eps).await?;
    let target = Target::Fenced {
        endpoints: leader_first,
    };
    let rss_before: Vec<u64> = c
        .pids()
        .iter()
        .filter_map(|p| procs::rss_bytes(*p))
        .collect();
    let n = args.budget_leases;
    let load_start = Instant::now();
    fill(&target, n).await?;
    println!(
        "[fenced] budgets: {n} live leases acquired in {:.1} s",
        load_start.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after: Vec<u64> = c
        .pids()
        .iter()
        .filter_map(|p| procs::rss_bytes(*p))
        .collect();
    let max_after = rss_after.iter().copied().max().unwrap_or(0);
    let per_lease = rss_after
        .iter()
        .zip(&rss_before)
        .map(|(a, b)| a.saturating_sub(*b))
        .max()
        .unwrap_or(0) as f64
        / n.max(1) as f64;
    let client = systems::fenced_client(&eps)?;
    let statuses = client.status_of_each().await;
    let log_len = statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .map(|s| s.last_log_index)
        .max()
        .unwrap_or(0);
    println!(
        "[fenced] budgets: RSS per node {} MB with {n} leases (bound 150 MB); {per_lease:.0} bytes per lease; log index {log_len}",
        rss_after.iter().map(|r| format!("{:.1}", *r as f64 / 1e6)).collect::<Vec<_>>().join("/"),
    );
    table.put(
        &format!("budget: max node RSS with {n} leases (MB)"),
        Kind::Fenced,
        max_after as f64 / 1e6,
        false,
    );
    table.put(
        "budget: memory per lease (bytes)",
        Kind::Fenced,
        per_lease,
        false,
    );
    if max_after > 150_000_000 {
        out.failures.push(format!(
            "memory: a node used {:.1} MB with {n} leases (bound 150 MB)",
            max_after as f64 / 1e6
        ));
    }
    // Restart the whole cluster (kill -9) and time until every node has
    // the leases back and a new grant succeeds.
    c.kill_all();
    let restarted = Instant::now();
    c.start_all()?;
    let eps2 = eps.clone();
    wait_until(Duration::from_secs(30), "restart", || {
        let eps = eps2.clone();
        async move {
            let Ok(client) = systems::fenced_client(&eps) else {
                return false;
            };
            let st = client.status_of_each().await;
            st.iter().all(|(_, s)| {
                s.as_ref()
                    .map(|s| s.live_leases >= n as u64 && s.leader_id != 0)
                    .unwrap_or(false)
            })
        }
    })
    .await?;
    let mut session = target_for(&eps).await?.session(false).await?;
    let probe = format!("budget-probe-{}", scenarios::nonce());
    session
        .acquire(&probe, Duration::from_secs(10), Duration::ZERO)
        .await?
        .context("probe held after restart")?;
    let restart_s = restarted.elapsed().as_secs_f64();
    println!("[fenced] budgets: restart with {n} leases and log index {log_len}: serving (all leases back, a grant) after {restart_s:.3} s (bound 5 s)");
    table.put(
        &format!("budget: restart with {n} leases, serving after (s)"),
        Kind::Fenced,
        restart_s,
        false,
    );
    if restart_s > 5.0 {
        out.failures.push(format!(
            "restart: serving after {restart_s:.3} s (bound 5 s)"
        ));
    }
    c.kill_all();
    Ok(())
}

async fn target_for(eps: &[String]) -> Result<Target> {
    let (endpoints, _) = fenced_leader_first(eps).await?;
    Ok(Target::Fenced { endpoints })
}

/// Acquires `n` fresh leases for an hour from 64 clients.
async fn fill(target: &Target, n: usize) -> Result<()> {
    let clients = 64;
    let prefix = format!("budget-{}", scenarios::nonce());
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut s = target.session(false).await?;
        let next = Arc::clone(&next);
        let prefix = prefix.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n as u64 {
                    return Ok::<_, anyhow::Error>(());
                }
                let r = format!("{prefix}:{i}");
                s.acquire(&r, Duration::from_secs(3600), Duration::ZERO)
                    .await?
                    .with_context(|| format!("{r} held"))?;
            }
        }));
    }
    for t in tasks {
        t.await.context("fill task")??;
    }
    Ok(())
}

fn targets(table: &Table) {
    let check = |what: &str, ok: Option<bool>| {
        println!(
            "target {what}: {}",
            match ok {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "not measured",
            }
        );
    };
    let r = |l: &str, k| table.ratio(l, k);
    check(
        "S2 64 clients cycles/s >= 3x etcd",
        r("S2 64 clients: cycles/s", Kind::Etcd).map(|x| x >= 3.0),
    );
    check(
        "S2 64 clients cycles/s > PostgreSQL",
        r("S2 64 clients: cycles/s", Kind::Postgres).map(|x| x > 1.0),
    );
    check(
        "S2 64 clients p99 <= half of etcd's",
        r("S2 64 clients: cycle p99 (ms)", Kind::Etcd).map(|x| x >= 2.0),
    );
    check(
        "S1 p50 <= half of etcd's",
        r("S1 cycle p50 (ms)", Kind::Etcd).map(|x| x >= 2.0),
    );
    check(
        "S3 16 clients hand-offs/s >= 5x etcd",
        r("S3 16 clients: hand-offs/s", Kind::Etcd).map(|x| x >= 5.0),
    );
    check(
        "rolling restart: longest gap between grants under 1 s",
        table
            .get(
                "Rolling restart: longest gap between grants (ms)",
                Kind::Fenced,
            )
            .map(|ms| ms < 1_000.0),
    );
}

/// Writes the chart where `--chart` says and prints its path.
fn write_chart(args: &Args, table: &Table) -> Result<()> {
    let title = format!(
        "fenced-bench: {} s per run, {} round{}{}{}",
        args.duration_s,
        args.rounds,
        if args.rounds == 1 { "" } else { "s (medians)" },
        if args.fenced_tls {
            ", fenced with TLS"
        } else {
            ""
        },
        if cfg!(debug_assertions) {
            ", DEBUG build: the figures mean nothing"
        } else {
            ""
        },
    );
    let svg = chart::render(&table.chart(title, &args.s2_clients));
    std::fs::write(&args.chart, svg).with_context(|| format!("chart {}", args.chart.display()))?;
    println!("chart: {}", args.chart.display());
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCED_BENCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    // On SIGINT or SIGTERM the run is dropped, which stops every process it
    // started (they are killed when their handles drop).
    let outcome = tokio::select! {
        r = run(args) => r,
        () = stop_signal() => Err(anyhow::anyhow!("interrupted; stopped what this run started")),
    };
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fenced-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

async fn run(args: Args) -> Result<bool> {
    let tmp;
    let dir = match &args.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = tempfile::Builder::new().prefix("fenced-bench").tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let mut table = Table::default();
    let mut out = Outcome {
        failures: Vec::new(),
    };
    let mut kinds = Vec::new();
    for s in &args.systems {
        kinds.push(match s.to_ascii_lowercase().as_str() {
            "fenced" => Kind::Fenced,
            "etcd" => Kind::Etcd,
            "postgres" | "postgresql" | "pg" => Kind::Postgres,
            other => bail!("unknown system {other:?}: fenced, etcd or postgres"),
        });
    }
    for round in 1..=args.rounds {
        if args.rounds > 1 {
            println!("==== round {round} of {} ====", args.rounds);
        }
        // Every round starts each system afresh, on data of its own.
        let round_dir = if args.rounds > 1 {
            dir.join(format!("round{round}"))
        } else {
            dir.to_path_buf()
        };
        std::fs::create_dir_all(&round_dir)?;
        for &kind in &kinds {
            run_system(&args, kind, &round_dir, &mut table, &mut out).await?;
        }
    }
    table.print();
    if args.rounds > 1 {
        println!("(each figure: the median of {} rounds)", args.rounds);
    }
    write_chart(&args, &table)?;
    println!();
    targets(&table);
    for f in &out.failures {
        println!("BUDGET EXCEEDED: {f}");
    }
    Ok(out.failures.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_is_the_median_of_its_rounds_and_ratios_compare_medians() {
        let mut t = Table::default();
        for v in [3.0, 1.0, 2.0] {
            t.put("cycle p50", Kind::Fenced, v, false);
        }
        for v in [9.0, 4.0, 5.0] {
            t.put("cycle p50", Kind::Etcd, v, false);
        }
        assert_eq!(t.get("cycle p50", Kind::Fenced), Some(2.0));
        assert_eq!(t.get("cycle p50", Kind::Etcd), Some(5.0));
        assert_eq!(t.ratio("cycle p50", Kind::Etcd), Some(2.5));
        t.put("cycles/s", Kind::Fenced, 10.0, true);
        t.put("cycles/s", Kind::Fenced, 30.0, true);
        t.put("cycles/s", Kind::Postgres, 40.0, true);
        assert_eq!(t.get("cycles/s", Kind::Fenced), Some(20.0));
        assert_eq!(t.ratio("cycles/s", Kind::Postgres), Some(0.5));
        assert_eq!(t.get("cycles/s", Kind::Etcd), None);
    }

    #[test]
    fn the_chart_takes_s2_throughput_by_clients_and_median_percentiles() {
        let mut t = Table::default();
        for (kind, scale) in [(Kind::Fenced, 2.0), (Kind::Etcd, 1.0)] {
            for n in [1, 16] {
                t.put(
                    &format!("S2 {n} clients: cycles/s"),
                    kind,
                    scale * n as f64,
                    true,
                );
            }
        }
        for micros in [1_000, 3_000, 2_000] {
            let mut rec = Recorder::new();
            rec.record("cycle", Duration::from_micros(micros));
            let run = Run {
                ops: 1,
                elapsed: Duration::from_secs(1),
                rec,
                extra: BTreeMap::new(),
            };
            t.put_percentiles("S1 1 client, cycle", Kind::Fenced, &run, "cycle");
        }
        let data = t.chart("title".into(), &[1, 16, 64]);
        assert_eq!(data.throughput.len(), 2);
        assert_eq!(data.throughput[0].system, "fenced");
        assert_eq!(data.throughput[0].points, vec![(1, 2.0), (16, 32.0)]);
        assert_eq!(data.throughput[1].points, vec![(1, 1.0), (16, 16.0)]);
        assert_eq!(data.latency.len(), 1);
        let row = &data.latency[0];
        assert_eq!(
            (row.scenario.as_str(), row.system.as_str()),
            ("S1 1 client, cycle", "fenced")
        );
        // The median of the three rounds, within the histogram's precision.
        assert!((row.p50 - 2.0).abs() < 0.01, "{row:?}");
    }
}
