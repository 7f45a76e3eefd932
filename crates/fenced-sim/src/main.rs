//! `fenced-sim`: runs seeds of the deterministic simulation and prints one
//! line per seed; exits 1 when a seed fails (or, with `--must-fail`, when
//! none does: the check a run with a planted canary must not pass).

use std::{process::ExitCode, time::Duration};

use clap::Parser;
use fenced_sim::{FaultClass, SimConfig};

#[derive(Parser)]
#[command(about = "Deterministic simulation of a three-node fenced cluster")]
struct Args {
    /// First seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many seeds, from --seed on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Simulated seconds of load and faults per seed.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Succeed only if some seed fails (for a planted canary).
    #[arg(long)]
    must_fail: bool,
    /// Print the faults of each seed.
    #[arg(long)]
    verbose: bool,
    /// Run each seed this many times and fail when its histories differ.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Write each seed's history to DIR/seed-N.jsonl (fenced-jepsen's format).
    #[arg(long)]
    history_dir: Option<std::path::PathBuf>,
    /// Draw only these classes of fault (comma-separated; all by default):
    /// a canary run names those that can show its bug.
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultClass>,
    /// Plant this bug in the nodes (a build with the `canaries` feature
    /// only): with --must-fail, a seed must catch it.
    #[arg(long)]
    canary: Option<fenced_core::canary::Canary>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.verbose {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            // Plain text when stderr is a file.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            // Real time means nothing here; the lines' order is the run's.
            .without_time()
            .init();
    }
    if let Some(canary) = args.canary {
        if let Err(e) = fenced_core::canary::plant(canary) {
            eprintln!("fenced-sim: {e}");
            return ExitCode::from(2);
        }
    }
    let mut cfg = SimConfig {
        duration: Duration::from_secs(args.seconds),
        ..SimConfig::default()
    };
    if !args.faults.is_empty() {
        cfg.classes = FaultClass::set(&args.faults);
    }
    let mut failed = 0;
    for seed in args.seed..args.seed.saturating_add(args.seeds) {
        let started = std::time::Instant::now();
        let mut runs = Vec::new();
        for _ in 0..args.repeat.max(1) {
            match fenced_sim::run(seed, &cfg) {
                Ok(v) => runs.push(v),
                Err(e) => {
                    println!("seed {seed}: the run itself failed: {e:#}");
                    return ExitCode::from(2);
                }
            }
        }
        let hashes: Vec<u64> = runs.iter().map(fenced_sim::Verdict::history_hash).collect();
        let Some(v) = runs.pop() else { continue };
        if hashes.iter().any(|h| *h != hashes[0]) {
            println!("seed {seed}: FAIL: the replays' histories differ: {hashes:016x?}");
            failed += 1;
            continue;
        }
        println!("{} [{:.1?}]", v.summary(), started.elapsed());
        if let Some(dir) = &args.history_dir {
            if let Err(e) = write_history(dir, &v) {
                println!("seed {seed}: history not written: {e}");
            }
        }
        if args.verbose {
            for f in &v.faults {
                println!("  {f}");
            }
        }
        if v.failure().is_some() {
            failed += 1;
            if args.must_fail {
                break;
            }
        }
    }
    match (args.must_fail, failed) {
        (false, 0) => ExitCode::SUCCESS,
        (false, n) => {
            println!("{n} of {} seeds FAILED", args.seeds);
            ExitCode::FAILURE
        }
        (true, 0) => {
            println!("no seed failed: the simulation missed this build's fault");
            ExitCode::FAILURE
        }
        (true, _) => {
            println!("a seed failed, as it must with a canary planted");
            ExitCode::SUCCESS
        }
    }
}

fn write_history(dir: &std::path::Path, v: &fenced_sim::Verdict) -> anyhow::Result<()> {
    use std::io::Write as _;
    std::fs::create_dir_all(dir)?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(
        dir.join(format!("seed-{}.jsonl", v.seed)),
    )?);
    for e in &v.events {
        serde_json::to_writer(&mut out, e)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
