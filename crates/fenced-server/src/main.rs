//! `fenced`: run a node of a cluster, or a local three-node cluster.

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};
use fenced_server::{
    auth, certs,
    config::RunSettings,
    health,
    node::{failed_path, NodeConfig, RunningNode},
    tls::TlsSettings,
    types::Node,
};
use tracing_subscriber::EnvFilter;

// glibc's malloc and free were a sixth of a loaded leader's CPU (HTTP/2
// frames, headers and futures are many small, short-lived allocations);
// see docs/DECISIONS.md "The node allocates with mimalloc".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code when the node stopped because its storage failed (a write or
/// sync to its data directory failed, e.g. ENOSPC or EIO); sysexits'
/// EX_IOERR.
const EXIT_STORAGE_FAILED: u8 = 74;

#[derive(Parser)]
#[command(
    name = "fenced",
    version,
    about = "A lock service whose every grant carries a fencing token"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(
        long,
        env = "FENCED_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    /// Threads that run the node's tasks; 0: one on a machine with at most
    /// two cores (cheaper than waking a second thread for every message),
    /// one per core otherwise. Disk syncs and snapshot writes have threads
    /// of their own either way.
    #[arg(
        long,
        env = "FENCED_WORKER_THREADS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u16).range(0..=1024),
        global = true
    )]
    worker_threads: u16,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local three-node cluster with zero configuration (client ports
    /// 7101, 7102, 7103 and metrics ports 9101, 9102, 9103 on 127.0.0.1).
    Dev {
        /// Where the three nodes keep their data (kept across runs).
        #[arg(long, env = "FENCED_DEV_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Ask a node whether it is serving (grpc.health.v1); exits 0 when it
    /// is, 1 when it is not or does not answer. For container health checks.
    Healthcheck {
        /// The node's client (or peer) address, host:port.
        #[arg(
            long,
            env = "FENCED_HEALTHCHECK_ENDPOINT",
            default_value = "127.0.0.1:7101"
        )]
        endpoint: String,
        /// The health service to ask about: "" (the node as a whole, SERVING
        /// once it is in a cluster with a leader) or "liveness" (SERVING while
        /// the process runs).
        #[arg(long, default_value = "")]
        service: String,
        /// Give up after this many ms.
        #[arg(long, default_value_t = 2_000)]
        timeout_ms: u64,
        /// With TLS on: a certificate the node accepts (its own will do),
        /// as for `fenced run`, so the node's own settings serve.
        #[arg(long, env = "FENCED_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
        tls_cert: Option<PathBuf>,
        #[arg(long, env = "FENCED_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
        tls_key: Option<PathBuf>,
        #[arg(long, env = "FENCED_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
        tls_ca: Option<PathBuf>,
    },
    /// Make a CA, node and client certificates for TLS (tests and small
    /// deployments): ECDSA P-256 keys, the CA valid 10 years, the others
    /// --days (365 unless given); keys and certificates 0600, DIR 0700.
    Certs {
        #[command(subcommand)]
        what: certs::CertsCommand,
    },
    /// Make and hash bearer tokens for the `auth_tokens` file.
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Run one node of a cluster.
    Run {
        /// A TOML file with the same settings; flags and FENCED_* win over it.
        #[arg(long, env = "FENCED_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        settings: Box<RunSettings>,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Print the SHA-256 (hex) of the token read from stdin, for `sha256`.
    HashToken,
    /// Print a new random token and its SHA-256; give the token to the
    /// client, put the hash in the tokens file.
    NewToken,
}

/// `fenced auth ...`: prints to stdout.
fn auth_command(command: AuthCommand) -> Result<ExitCode, String> {
    match command {
        AuthCommand::HashToken => {
            let mut token = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut token)
                .map_err(|e| format!("reading the token from stdin: {e}"))?;
            // A trailing newline from `echo` or a file is not part of it.
            let token = token.trim();
            if token.is_empty() {
                return Err("no token on stdin".into());
            }
            println!("{}", auth::to_hex(&auth::hash_token(token)));
        }
        AuthCommand::NewToken => {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
            let token = format!("fenced_{}", auth::to_hex(&bytes));
            println!("token  {token}");
            println!("sha256 {}", auth::to_hex(&auth::hash_token(&token)));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("FENCED_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// `fenced healthcheck`: 0 when serving, 1 otherwise.
async fn healthcheck(
    endpoint: &str,
    service: &str,
    timeout: Duration,
    tls: Option<&TlsSettings>,
) -> ExitCode {
    match health::check(endpoint, service, timeout, tls).await {
        Ok(status) => {
            println!("{endpoint}: {}", status.as_str_name());
            if status == health::CheckedStatus::Serving {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("fenced healthcheck: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dev_configs(data_dir: PathBuf) -> Vec<NodeConfig> {
    let members: BTreeMap<u64, Node> = (1..=3)
        .map(|i| {
            (
                i,
                Node {
                    peer_addr: format!("127.0.0.1:{}", 7200 + i),
                    client_addr: format!("127.0.0.1:{}", 7100 + i),
                },
            )
        })
        .collect();
    (1..=3u64)
        .map(|i| {
            let mut cfg = NodeConfig::new(
                i,
                data_dir.join(format!("node{i}")),
                ([127, 0, 0, 1], 7100 + i as u16).into(),
                ([127, 0, 0, 1], 7200 + i as u16).into(),
                members.clone(),
            );
            cfg.metrics_listen = Some(([127, 0, 0, 1], 9100 + i as u16).into());
            cfg
        })
        .collect()
}

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let configs = match cli.command {
        Command::Dev { data_dir } => {
            let dir = data_dir.unwrap_or_else(|| std::env::temp_dir().join("fenced-dev"));
            println!("fenced dev: three nodes, data under {}", dir.display());
            dev_configs(dir)
        }
        Command::Healthcheck {
            endpoint,
            service,
            timeout_ms,
            tls_cert,
            tls_key,
            tls_ca,
        } => {
            let timeout = Duration::from_millis(timeout_ms);
            let tls = match (tls_cert, tls_key, tls_ca) {
                (Some(cert), Some(key), Some(ca)) => Some(TlsSettings {
                    cert,
                    key,
                    ca,
                    client_cert_auth: false,
                }),
                _ => None,
            };
            return Ok(healthcheck(&endpoint, &service, timeout, tls.as_ref()).await);
        }
        Command::Certs { what } => {
            for path in certs::run(&what)? {
                println!("{}", path.display());
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Auth(command) => return auth_command(command),
        Command::Run { config, settings } => {
            let settings = match config {
                Some(path) => settings.or_file(RunSettings::from_file(&path)?),
                None => *settings,
            };
            vec![settings.into_node_config()?]
        }
    };
    let mut nodes = Vec::new();
    for cfg in configs {
        let (id, listen, peer, dir) = (cfg.id, cfg.listen, cfg.peer_listen, cfg.data_dir.clone());
        let node = RunningNode::start(cfg)
            .await
            .map_err(|e| format!("node {id}: {e}"))?;
        nodes.push((node, id, listen, peer, dir));
    }
    let mut refusals = tokio::task::JoinSet::new();
    for (node, id, ..) in &mut nodes {
        let (id, refused) = (*id, node.join_refused());
        refusals.spawn(async move { (id, refused.await) });
    }
    for (node, id, listen, peer, dir) in &nodes {
        if node
            .ctx
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(id)
            .is_none()
        {
            println!(
                "node {id} started: client {listen}, peer {peer}, data {}, not a member yet",
                dir.display()
            );
            continue;
        }
        let leader = node.wait_for_leader(Duration::from_secs(30)).await;
        println!(
            "node {id} ready: client {listen}, peer {peer}, data {}, leader {}",
            dir.display(),
            leader.map_or("none yet".to_string(), |l| l.to_string())
        );
    }
    // A node whose storage failed is of no use until restarted: exit so
    // that systemd, compose or Kubernetes restart it.
    let mut failures = tokio::task::JoinSet::new();
    for (node, id, _, _, dir) in &nodes {
        let (id, dir, failure) = (*id, dir.clone(), node.failure());
        failures.spawn(async move { (id, dir, failure.await) });
    }
    tokio::select! {
        _ = shutdown_signal() => {}
        Some(Ok((id, reason))) = refusals.join_next() => {
            tracing::error!(node = id, "{reason}; stopping");
            for (node, ..) in nodes {
                node.shutdown().await;
            }
            return Err(format!("node {id}: {reason}"));
        }
        Some(Ok((id, dir, error))) = failures.join_next() => {
            tracing::error!(
                node = id,
                path = %failed_path(&dir, &error).display(),
                "storage failed: {error}; stopping so a supervisor restarts the node"
            );
            return Ok(ExitCode::from(EXIT_STORAGE_FAILED));
        }
    }
    tracing::info!("shutting down");
    for (node, ..) in nodes {
        node.shutdown().await;
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // Everything the node writes (the Raft log's chunk files, snapshots,
    // the cluster-time file, certificates) is its owner's alone: files 0600,
    // directories 0700, also where a library creates them.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = match cli.worker_threads {
        0 if cores <= 2 => 1,
        0 => cores,
        n => usize::from(n),
    };
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fenced: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    // Bounded: after a storage failure a task may still wait on the disk.
    runtime.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fenced: {e}");
            ExitCode::from(2)
        }
    }
}
