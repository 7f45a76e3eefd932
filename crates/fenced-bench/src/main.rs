//! `fenced-bench`: fenced side by side with etcd's lock service and the
//! article's lease table on PostgreSQL, on the same machine in the same run.
//! Prints figures per scenario and one comparison table; checks token order
//! on every grant and fails (exit 1) on a violation or an exceeded budget.
//!
//! This file parses the arguments and runs the scenarios (one file each
//! under scenarios/) for every system and round.

mod load;
mod procs;
mod report;
mod scenarios;
mod sut;
mod systems;

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{bail, Result};
use clap::Parser;
use fenced_bench::check::TokenLedger;
use fenced_testkit::Within;

use report::{Outcome, Table};
use systems::Kind;

#[derive(Parser, Debug, Clone)]
#[command(about = "Benchmarks fenced against etcd's lock and the article's PostgreSQL lease table")]
pub struct Args {
    /// Systems to measure, in order: fenced, etcd, postgres (one node),
    /// postgres-sync (a primary with one synchronous standby).
    #[arg(long, value_delimiter = ',', default_value = "fenced")]
    pub systems: Vec<String>,
    /// Scenarios: s1 s2 s3 s4 s5 s6 rolling budgets validate million repair
    /// soak (validate, million, repair and soak: fenced only, not run
    /// unless named).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "s1,s2,s3,s4,s5,s6,rolling,budgets"
    )]
    pub scenarios: Vec<String>,
    /// Seconds each measured run lasts.
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// Rounds of every system in turn (fenced, etcd, postgres, fenced, ...);
    /// the table shows each figure's median over the rounds, so a shared
    /// machine's slow minutes weigh on every system alike.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Client counts for S2.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub s2_clients: Vec<usize>,
    /// Client counts for the validate scenario (ValidateToken, one pair per
    /// call), then one run of ValidateTokens batches at the last count.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub validate_clients: Vec<usize>,
    /// Pairs per ValidateTokens call in the validate scenario's batch run.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(2..=256))]
    pub validate_batch: u64,
    /// Client counts for S3.
    #[arg(long, value_delimiter = ',', default_value = "2,16,64")]
    pub s3_clients: Vec<usize>,
    /// Fixed rate (cycles per second in all) for S1 and S2 instead of a
    /// closed loop; latency is then measured from each intended start.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Live leases renewed in S4.
    #[arg(long, default_value_t = 100_000)]
    pub s4_leases: usize,
    /// Clients holding S4's leases. On fenced each is one fenced_client
    /// Client whose leases live with its session, which its keeper keeps
    /// alive in one KeepAlive call per interval; the anchors renew over 256
    /// connections lease by lease.
    #[arg(long, default_value_t = 64)]
    pub s4_clients: usize,
    /// TTL of S4's leases; each is renewed every TTL/3.
    #[arg(long, default_value_t = 10_000)]
    pub s4_ttl_ms: u64,
    /// Clients taking leases during the rolling restart.
    #[arg(long, default_value_t = 16)]
    pub rolling_clients: usize,
    /// Live leases for the memory and restart budgets.
    #[arg(long, default_value_t = 100_000)]
    pub budget_leases: usize,
    /// Live leases the million scenario fills a cluster with before it
    /// restarts it (docs/SCALING.md).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub million_leases: u64,
    /// Live leases in the cluster whose follower the repair scenario damages
    /// and rebuilds (docs/BENCHMARKS.md, "A damaged node").
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub repair_leases: u64,
    /// How long the soak runs (docs/BENCHMARKS.md, "Soak"): an hour by
    /// hand, two minutes in .ci/run.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(30..=604_800))]
    pub soak_s: u64,
    /// Clients of the soak's steady load.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub soak_clients: u64,
    /// Clients filling the cluster in the million scenario.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub million_clients: u64,
    /// The `fenced` binary (a release build); default: next to this binary.
    #[arg(long)]
    pub fenced_bin: Option<PathBuf>,
    /// The `etcd` binary.
    #[arg(long, default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// Use a running fenced cluster instead of starting one (no CPU, S6 or
    /// budget figures then).
    #[arg(long, value_delimiter = ',')]
    pub fenced_endpoints: Vec<String>,
    /// Use a running etcd cluster instead of starting one.
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// Use a running PostgreSQL (libpq key=value string) instead of starting one.
    #[arg(long)]
    pub pg_url: Option<String>,
    /// The OS user PostgreSQL runs as when the benchmark runs as root.
    #[arg(long, default_value = "postgres")]
    pub pg_os_user: String,
    /// Run the fenced cluster with TLS on both ports (certificates made by
    /// `fenced certs` in the work dir), every client over https: what TLS
    /// costs, against a run without it.
    #[arg(long)]
    pub fenced_tls: bool,
    // The next four take the server's own types: a bound that drifts from
    // `fenced run`'s does not compile where they are passed on.
    /// The started fenced cluster's `--snapshot-logs` (default: the
    /// server's): what snapshots of a large table cost, measured apart.
    #[arg(long)]
    pub fenced_snapshot_logs: Option<Within<10, 10_000_000>>,
    /// The started fenced cluster's `--election-timeout-ms` (default: the
    /// server's): what failover and spurious elections cost, measured apart.
    #[arg(long)]
    pub fenced_election_timeout_ms: Option<Within<50, 60_000>>,
    /// The started fenced cluster's `--heartbeat-ms` (default: the server's).
    #[arg(long)]
    pub fenced_heartbeat_ms: Option<Within<10, 59_999>>,
    /// The started fenced cluster's `--election-check-ms` (default: the
    /// server's).
    #[arg(long)]
    pub fenced_election_check_ms: Option<Within<10, 60_000>>,
    /// Where the SVG chart of the run goes (throughput by client count,
    /// latency percentiles per scenario); its path is printed.
    #[arg(long, default_value = "fenced-bench.svg")]
    pub chart: PathBuf,
    /// Find each cluster's leader before measuring and put it first in the
    /// clients' endpoint lists (fenced and etcd alike; PostgreSQL is one
    /// server). Off: clients get every endpoint as configured and discover
    /// nothing in advance, as users configure them.
    #[arg(long, conflicts_with = "follower_first")]
    pub find_leader: bool,
    /// Put a follower first in the clients' endpoint lists (fenced and etcd
    /// alike): what a client pays when its first endpoint is not the leader.
    #[arg(long)]
    pub follower_first: bool,
    /// Where the clusters keep their data (default: a temporary directory).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// One system's round: starts it (or reaches it), runs every scenario
/// asked for in order, checks the token order of every grant.
async fn run_system(
    args: &Args,
    kind: Kind,
    dir: &std::path::Path,
    table: &mut Table,
    out: &mut Outcome,
) -> Result<()> {
    let sut = sut::start_system(args, kind, dir).await?;
    println!("== {} ==", kind.name());
    let mut cx = scenarios::Ctx {
        args,
        kind,
        dir,
        duration: Duration::from_secs_f64(args.duration_s),
        ledger: Arc::new(TokenLedger::new()),
        sut,
        table,
        out,
    };
    for name in scenarios::ALL {
        if args.scenarios.iter().any(|s| s.eq_ignore_ascii_case(name)) {
            scenarios::run(name, &mut cx).await?;
        }
    }
    println!(
        "[{}] token order checked on {} resources: no violation",
        kind.name(),
        cx.ledger.resources()
    );
    for (run, n) in cx.sut.take_elections() {
        cx.out.failures.push(format!(
            "{}: {n} election(s) during {run}, a run that injects no fault (target: none)",
            kind.name()
        ));
    }
    if let Some(mut c) = cx.sut.cluster.take() {
        c.kill_all();
    }
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
        // Plain text when stderr is a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    // On SIGINT or SIGTERM the run is dropped, which stops every process it
    // started (they are killed when their handles drop).
    let outcome = tokio::select! {
        r = run(args) => r,
        () = fenced_os::stop_signal() => Err(anyhow::anyhow!("interrupted; stopped what this run started")),
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
    let mut out = Outcome::default();
    if let Some(s) = args
        .scenarios
        .iter()
        .find(|s| !scenarios::ALL.iter().any(|n| n.eq_ignore_ascii_case(s)))
    {
        bail!(
            "--scenarios: unknown scenario {s:?}; known: {}",
            scenarios::ALL.join(", ")
        );
    }
    let mut kinds = Vec::new();
    for s in &args.systems {
        kinds.push(match s.to_ascii_lowercase().as_str() {
            "fenced" => Kind::Fenced,
            "etcd" => Kind::Etcd,
            "postgres" | "postgresql" | "pg" => Kind::Postgres,
            "postgres-sync" | "pg-sync" => Kind::PostgresSync,
            other => bail!("unknown system {other:?}: fenced, etcd, postgres or postgres-sync"),
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
            // A directory per system: the two PostgreSQL systems would
            // otherwise meet in one data directory.
            let system_dir = round_dir.join(kind.name());
            std::fs::create_dir_all(&system_dir)?;
            run_system(&args, kind, &system_dir, &mut table, &mut out).await?;
        }
    }
    table.print();
    if args.rounds > 1 {
        println!("(each figure: the median of {} rounds)", args.rounds);
    }
    report::write_chart(&args, &table)?;
    println!();
    report::targets(&table);
    for f in &out.failures {
        println!("BUDGET EXCEEDED: {f}");
    }
    Ok(out.failures.is_empty())
}
