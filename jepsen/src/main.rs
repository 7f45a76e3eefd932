//! `fenced-jepsen`: runs fault-injection profiles against real fenced nodes
//! and checks the recorded histories. Needs root (network namespaces,
//! nftables).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use fenced_jepsen::run::{self, RunConfig, Verdict};

#[derive(Parser)]
#[command(
    name = "fenced-jepsen",
    about = "Fault-injection runs against a real fenced cluster"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one or more profiles (partition, pause, kill, clock, snapshots, disk
    /// or its halves damage and full-disk, membership, all, none).
    Run(RunArgs),
    /// Remove namespaces and interfaces, and unmount the nodes' own disks,
    /// left by an interrupted run.
    Cleanup,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Comma-separated profiles, run one after another.
    #[arg(long, default_value = "partition,pause,kill,clock")]
    profiles: String,
    /// Seeds: each profile runs once per seed.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Workload duration per run, seconds.
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    /// Fault-free warm-up, seconds (throughput floor measured here).
    #[arg(long, default_value_t = 6)]
    warmup_s: u64,
    /// How long a partition or clock fault is held, seconds.
    #[arg(long, default_value_t = 5)]
    hold_s: u64,
    /// Quiet time between faults, seconds.
    #[arg(long, default_value_t = 3)]
    quiet_s: u64,
    /// Idle time before each fault that moves leadership: no request that
    /// writes to the log, only describes (0: none). Above the short TTL.
    #[arg(long, default_value_t = 4000)]
    idle_ms: u64,
    /// The fenced binary to test.
    #[arg(long, default_value = "target/debug/fenced")]
    fenced_bin: PathBuf,
    /// Where runs keep their summaries and, on failure, history and logs.
    #[arg(long, default_value = "target/jepsen")]
    out: PathBuf,
    #[arg(long, default_value_t = 5)]
    long_workers: u32,
    #[arg(long, default_value_t = 3)]
    short_workers: u32,
    #[arg(long, default_value_t = 3)]
    long_slots: usize,
    #[arg(long, default_value_t = 2000)]
    short_ttl_ms: u64,
    #[arg(long, default_value_t = 20.0)]
    throughput_floor: f64,
    /// Clock-rate error allowed (0.05 = 5%: covers the ±2% skew faults).
    #[arg(long, default_value_t = 0.05)]
    rho: f64,
    /// Search steps per resource before linearizability is UNKNOWN.
    #[arg(long, default_value_t = 5_000_000)]
    lin_budget: u64,
    /// Expect every run to FAIL (a canary build): exit 0 only if a checker
    /// (not merely a coverage gate) failed each one.
    #[arg(long)]
    expect_fail: bool,
    /// Plant this bug in every node (`FENCED_CANARY`; the binary must be
    /// built with the `canaries` feature). Goes with --expect-fail.
    #[arg(long)]
    canary: Option<fenced_core::canary::Canary>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCED_JEPSEN_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,fenced_resource=error")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fenced-jepsen: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<ExitCode> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Cleanup => {
            fenced_jepsen::net::teardown(fenced_jepsen::membership::MEMBER_SLOTS);
            fenced_jepsen::cluster::unmount_leftover_disks();
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            rt.block_on(campaign(a))
        }
    }
}

async fn campaign(a: RunArgs) -> Result<ExitCode> {
    let fenced_bin = std::fs::canonicalize(&a.fenced_bin)
        .with_context(|| format!("fenced binary {}", a.fenced_bin.display()))?;
    let mut results = Vec::new();
    for seed in &a.seeds {
        for profile in a
            .profiles
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let cfg = RunConfig {
                profile: profile.to_string(),
                seed: *seed,
                duration: Duration::from_secs(a.duration_s),
                warmup: Duration::from_secs(a.warmup_s),
                hold: Duration::from_secs(a.hold_s),
                quiet: Duration::from_secs(a.quiet_s),
                idle: Duration::from_millis(a.idle_ms),
                fenced_bin: fenced_bin.clone(),
                out: a.out.clone(),
                long_workers: a.long_workers,
                short_workers: a.short_workers,
                long_slots: a.long_slots,
                short_ttl_ms: a.short_ttl_ms,
                throughput_floor: a.throughput_floor,
                rho: a.rho,
                lin_budget: a.lin_budget,
                canary: a.canary,
            };
            let summary = tokio::select! {
                s = run::run(&cfg) => s.with_context(|| format!("profile {profile}, seed {seed}"))?,
                _ = tokio::signal::ctrl_c() => {
                    fenced_jepsen::net::teardown(fenced_jepsen::membership::MEMBER_SLOTS);
                    anyhow::bail!("interrupted");
                }
            };
            println!("{}", run::render(&summary));
            // A canary must be caught by a checker, not only by a gate.
            let caught = summary.linearizability.starts_with("FAIL")
                || summary.invariants.iter().any(|f| !f.violations.is_empty());
            let verdict = match summary.verdict {
                Verdict::Fail if a.expect_fail && !caught => Verdict::Unknown,
                v => v,
            };
            results.push((profile.to_string(), *seed, verdict));
        }
    }
    println!("== campaign");
    let mut all_as_expected = true;
    for (p, s, v) in &results {
        let expected = if a.expect_fail {
            *v == Verdict::Fail
        } else {
            *v == Verdict::Pass
        };
        all_as_expected &= expected;
        println!(
            "  {p:<10} seed {s:<6} {v}{}",
            if a.expect_fail {
                " (a FAIL is expected)"
            } else {
                ""
            }
        );
    }
    Ok(if all_as_expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
