//! The system under test: started (or reached) for a system's run, with
//! what the run samples from its processes.

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use fenced_client::Client;

use crate::{
    load::Run,
    procs::{self, EtcdCluster, LocalPostgres, Started},
    report::report,
    systems::{self, Kind, Target},
    Args,
};

/// What the systems' own processes did during a run.
pub struct Probe {
    pids: Vec<u32>,
    fenced: Option<Client>,
    ticks_per_second: u64,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ProbeSample {
    pub cpu_micros: u64,
    pub log_syncs: u64,
    pub applied_entries: u64,
    pub applied_commands: u64,
    /// The highest Raft term a node reports: each election raises it.
    pub term: u64,
}

impl ProbeSample {
    /// Elections between this sample and `later`: `None` when no fenced
    /// node reported a term (another system, or none reachable).
    pub fn elections_until(&self, later: &ProbeSample) -> Option<u64> {
        (self.term > 0).then(|| later.term.saturating_sub(self.term))
    }
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
                    s.term = s.term.max(st.term);
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

/// A system under test and what the benchmark started for it.
pub struct Sut {
    pub target: Target,
    pub cluster: Option<Started>,
    _postgres: Vec<LocalPostgres>,
    probe: Probe,
    /// Elections seen during a measured run (none of which injects a
    /// fault): the run's name and how many.
    elections: Mutex<Vec<(String, u64)>>,
}

impl Sut {
    /// The elections seen during measured runs so far, by run; none should
    /// happen that no fault caused.
    pub fn take_elections(&self) -> Vec<(String, u64)> {
        std::mem::take(
            &mut *self
                .elections
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    pub async fn measure<F, Fut>(&self, name: &str, f: F) -> Result<Run>
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
        if let Some(n) = before.elections_until(&after).filter(|n| *n > 0) {
            self.elections
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((name.to_string(), n));
        }
        Ok(run)
    }
}

pub fn fenced_bin(args: &Args) -> Result<PathBuf> {
    if let Some(b) = &args.fenced_bin {
        return Ok(b.clone());
    }
    let bin = fenced_testkit::bin_dir()?.join("fenced");
    if !bin.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p fenced-server --bin fenced` or pass --fenced-bin",
            bin.display()
        );
    }
    Ok(bin)
}

pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut f: F) -> Result<Duration>
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
pub async fn fenced_leader_first(endpoints: &[String]) -> Result<(Vec<String>, u64)> {
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

/// The fenced settings given on the command line (snapshot interval and
/// election timings), for a cluster this benchmark starts, and says which.
pub fn use_fenced_settings(args: &Args, c: &mut fenced_testkit::Cluster) {
    let settings = &mut c.spec_mut().settings;
    settings.snapshot_logs = args.fenced_snapshot_logs;
    settings.election_timeout_ms = args.fenced_election_timeout_ms;
    settings.heartbeat_ms = args.fenced_heartbeat_ms;
    settings.election_check_ms = args.fenced_election_check_ms;
    if let Some(n) = args.fenced_snapshot_logs {
        println!("fenced: a snapshot every {n} log entries");
    }
    if let Some(ms) = args.fenced_election_timeout_ms {
        println!("fenced: election timeout {ms} ms");
    }
    if let Some(ms) = args.fenced_heartbeat_ms {
        println!("fenced: heartbeat every {ms} ms");
    }
    if let Some(ms) = args.fenced_election_check_ms {
        println!("fenced: election checks every {ms} ms");
    }
}

pub async fn start_system(args: &Args, kind: Kind, dir: &Path) -> Result<Sut> {
    flush_earlier_writes().await;
    let ticks = procs::clock_ticks_per_second();
    match kind {
        Kind::Fenced => {
            let (endpoints, cluster) = if args.fenced_endpoints.is_empty() {
                let mut c = procs::fenced_cluster(&fenced_bin(args)?, dir, args.fenced_tls)?;
                use_fenced_settings(args, &mut c);
                if args.fenced_tls {
                    println!("fenced: TLS on both ports, every client over https");
                }
                c.start_all()?;
                c.wait_for_leader(Duration::from_secs(20)).await?;
                (c.endpoints(), Some(Started::Fenced(Box::new(c))))
            } else {
                (args.fenced_endpoints.clone(), None)
            };
            let endpoints = if discovers(args) {
                arrange(args, fenced_leader_first(&endpoints).await?.0)
            } else {
                endpoints
            };
            println!("fenced clients' endpoints: {}", endpoints.join(","));
            let pids = cluster.as_ref().map(Started::pids).unwrap_or_default();
            Ok(Sut {
                probe: Probe {
                    pids,
                    fenced: Some(systems::fenced_client(&endpoints)?),
                    ticks_per_second: ticks,
                },
                target: Target::Fenced { endpoints },
                cluster,
                _postgres: Vec::new(),
                elections: Default::default(),
            })
        }
        Kind::Etcd => {
            let (endpoints, cluster) = if args.etcd_endpoints.is_empty() {
                let mut c = EtcdCluster::new(args.etcd_bin.clone(), dir)?;
                c.start_all()?;
                let eps = c.endpoints();
                if let Err(e) = wait_until(Duration::from_secs(30), "etcd leader", || {
                    systems::etcd_ready(&eps)
                })
                .await
                {
                    bail!("{e}\n{}", c.log_tail());
                }
                (eps, Some(Started::Etcd(c)))
            } else {
                (args.etcd_endpoints.clone(), None)
            };
            let endpoints = if discovers(args) {
                arrange(args, systems::etcd_leader_first(&endpoints).await?)
            } else {
                endpoints
            };
            println!("etcd clients' endpoints: {}", endpoints.join(","));
            let pids = cluster.as_ref().map(Started::pids).unwrap_or_default();
            Ok(Sut {
                probe: Probe {
                    pids,
                    fenced: None,
                    ticks_per_second: ticks,
                },
                target: Target::Etcd { endpoints },
                cluster,
                _postgres: Vec::new(),
                elections: Default::default(),
            })
        }
        Kind::Postgres | Kind::PostgresSync => {
            let sync_standby = kind == Kind::PostgresSync;
            let (url, servers) = match &args.pg_url {
                Some(u) if !sync_standby => (u.clone(), Vec::new()),
                Some(_) => bail!(
                    "--pg-url names one server; postgres-sync starts its own primary and standby"
                ),
                None if sync_standby => {
                    let (primary, standby) =
                        LocalPostgres::start_with_sync_standby(dir, &args.pg_os_user)?;
                    println!(
                        "postgres-sync: primary on port {}, synchronous standby on port {}",
                        primary.port, standby.port
                    );
                    (primary.url(), vec![primary, standby])
                }
                None => {
                    let pg = LocalPostgres::start(dir, &args.pg_os_user)?;
                    (pg.url(), vec![pg])
                }
            };
            let target = Target::Postgres { url, sync_standby };
            wait_until(Duration::from_secs(30), "PostgreSQL ready", || {
                let t = target.clone();
                async move { t.prepare().await.is_ok() }
            })
            .await?;
            let pids = servers.iter().filter_map(|p| p.proc.pid()).collect();
            Ok(Sut {
                probe: Probe {
                    pids,
                    fenced: None,
                    ticks_per_second: ticks,
                },
                target,
                cluster: None,
                _postgres: servers,
                elections: Default::default(),
            })
        }
    }
}

pub async fn target_for(eps: &[String]) -> Result<Target> {
    let (endpoints, _) = fenced_leader_first(eps).await?;
    Ok(Target::Fenced { endpoints })
}

#[cfg(test)]
mod tests {
    use super::ProbeSample;

    fn at(term: u64) -> ProbeSample {
        ProbeSample {
            term,
            ..Default::default()
        }
    }

    #[test]
    fn elections_are_the_rise_of_the_term_and_none_without_one() {
        assert_eq!(at(3).elections_until(&at(3)), Some(0));
        assert_eq!(at(3).elections_until(&at(5)), Some(2));
        assert_eq!(at(0).elections_until(&at(5)), None);
        assert_eq!(at(4).elections_until(&at(0)), Some(0));
    }
}
