//! `fenced`: run a node of a cluster, or a local three-node cluster.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use fenced_server::{
    node::config::{self, RunSettings},
    node::dev::{self, DevEnd, NodeLogFiles},
    node::{failed_path, RunningNode},
    observe::health,
    observe::raft_noise::QuietRaftNoise,
    security::auth,
    security::certs,
    security::tls::TlsSettings,
    tools::backup,
    tools::disk_check,
};
use tracing_subscriber::{
    fmt::MakeWriter, layer::SubscriberExt, util::SubscriberInitExt, EnvFilter,
};

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
    about = "A lock service whose every grant carries a fencing token",
    after_help = "Examples:
  fenced dev                         a local three-node cluster on 127.0.0.1:7101-7103
  fenced dev --fresh --nodes 5       five nodes, starting from empty data
  fenced run --config /etc/fenced/fenced.toml
  fenced healthcheck --endpoint 127.0.0.1:7101
  fenced completions bash > ~/.local/share/bash-completion/completions/fenced"
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
    /// Start a local cluster (three nodes unless --nodes) in this process, with
    /// zero configuration: plaintext on 127.0.0.1, client ports 7101.., peer
    /// ports 7201.., metrics ports 9101.. (from --base-port). Prints every
    /// node's addresses, then one line when a leader serves; node logs go to
    /// files under the data dir. Ctrl-C stops it.
    #[command(after_help = "Examples:
  fenced dev                              three nodes, data kept across runs
  fenced dev --fresh                      start from empty data
  fenced dev --nodes 5 --base-port 8100   five nodes on 127.0.0.1:8101-8105
  fenced dev --verbose                    node logs in this terminal")]
    Dev {
        /// Where the nodes keep their data and logs (kept across runs);
        /// default: fenced-dev in the temporary directory.
        #[arg(long, env = "FENCED_DEV_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// How many nodes: 1, 3 or 5.
        #[arg(long, default_value = "3", value_parser = dev::parse_node_count)]
        nodes: u8,
        /// Node i listens for clients on BASE+i, for peers on BASE+100+i and
        /// for metrics on BASE+2000+i (1024-63000).
        #[arg(
            long,
            env = "FENCED_DEV_BASE_PORT",
            default_value_t = dev::DEFAULT_BASE_PORT,
            value_parser = clap::value_parser!(u16).range(1024..=i64::from(dev::MAX_BASE_PORT))
        )]
        base_port: u16,
        /// Start from empty data: remove the data dir first. Only a
        /// directory `fenced dev` made (it holds a .fenced-dev file) is
        /// removed; any other is refused.
        #[arg(long)]
        fresh: bool,
        /// Node logs to this terminal (stderr) instead of files.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Ask a node whether it is serving (grpc.health.v1); exits 0 when it
    /// is, 1 when it is not or does not answer. For container health checks.
    #[command(after_help = "Examples:
  fenced healthcheck --endpoint 127.0.0.1:7101
  fenced healthcheck --endpoint 127.0.0.1:7101 --service liveness
  fenced healthcheck --endpoint node1:7101 --tls-cert node-1.pem --tls-key node-1-key.pem --tls-ca ca.pem")]
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
    #[command(after_help = "Examples:
  fenced certs ca --dir ./pki
  fenced certs node --dir ./pki --id 1 --host node1.internal --host 10.0.0.1
  fenced certs client --dir ./pki --name billing")]
    Certs {
        #[command(subcommand)]
        what: certs::CertsCommand,
    },
    /// Make and hash bearer tokens for the `auth_tokens` file.
    #[command(
        subcommand,
        after_help = "Examples:
  fenced auth new-token
  printf %s \"$TOKEN\" | fenced auth hash-token"
    )]
    Auth(AuthCommand),
    /// Lay down the data directory of one node of a new cluster from a
    /// backup (`fencectl snapshot save`). Run it for every node of the new
    /// cluster with the same file and --initial-cluster, then start them
    /// with `fenced run`. The checksum and version are checked first; a
    /// non-empty data dir is refused; nothing is written unless all is.
    /// Every token the new cluster grants is above --token-floor, or by
    /// default above the backup's last token plus a gap (docs/OPERATIONS.md).
    #[command(after_help = "Examples:
  fenced restore --from backup.fncd --data-dir /var/lib/fenced --node-id 1 \\
    --initial-cluster 1=n1:7201/n1:7101,2=n2:7201/n2:7101,3=n3:7201/n3:7101
  fenced restore --from backup.fncd --data-dir /var/lib/fenced --node-id 1 \\
    --initial-cluster 1=n1:7201/n1:7101 --token-floor 5000000")]
    Restore {
        /// The backup file.
        #[arg(long)]
        from: PathBuf,
        /// The new node's data directory (missing or empty).
        #[arg(long)]
        data_dir: PathBuf,
        /// This node's id in --initial-cluster.
        #[arg(long, alias = "id")]
        node_id: u64,
        /// The new cluster, as for `fenced run`: ID=HOST:PEERPORT[/HOST:CLIENTPORT],...
        #[arg(long)]
        initial_cluster: String,
        /// Every token granted after the restore is above this (at least
        /// the backup's last token, at most 2^62). Default: last token +
        /// the gap.
        #[arg(long, value_parser = backup::parse_token_floor)]
        token_floor: Option<u64>,
    },
    /// Last resort after losing a majority for good: make a one-node
    /// cluster of this node from its own data directory (every entry in its
    /// log applied, tokens raised as for a restore). The old directory is
    /// kept beside it as DIR.before-recover-<ms>. The node must be stopped.
    #[command(after_help = "Examples:
  fenced recover --force-new-cluster --data-dir /var/lib/fenced --node-id 3 \\
    --initial-cluster 3=n3:7201/n3:7101")]
    Recover {
        /// Required: says you mean it (docs/OPERATIONS.md).
        #[arg(long, required = true)]
        force_new_cluster: bool,
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, alias = "id")]
        node_id: u64,
        /// This node alone: ID=HOST:PEERPORT[/HOST:CLIENTPORT].
        #[arg(long)]
        initial_cluster: String,
        /// As for `fenced restore` (at least the survivor's last token, at
        /// most 2^62).
        #[arg(long, value_parser = backup::parse_token_floor)]
        token_floor: Option<u64>,
    },
    /// Verify every file of a stopped node's data directory (the format
    /// file, the Raft log's records, the snapshot, the cluster time): one
    /// line per file, exit 0 when all are whole, 1 when one is damaged, 2
    /// when the directory cannot be checked (missing, or a node runs on it).
    #[command(after_help = "Examples:
  fenced check --data-dir /var/lib/fenced")]
    Check {
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Ready a stopped node whose data is damaged or lost to be rebuilt
    /// from its peers under the same id: moves what the data directory
    /// holds into DIR/damaged-<unix time>/ (kept, never deleted) and marks
    /// the directory. Start the node as usual
    /// afterwards; it takes no part in votes until it has caught up
    /// (docs/OPERATIONS.md, "A damaged node").
    #[command(after_help = "Examples:
  fenced repair --data-dir /var/lib/fenced --node-id 3")]
    Repair {
        #[arg(long)]
        data_dir: PathBuf,
        /// This node's id, as in its configuration.
        #[arg(long)]
        node_id: u64,
    },
    /// Run one node of a cluster.
    #[command(after_help = "Examples:
  fenced run --config /etc/fenced/fenced.toml
  fenced run --id 1 --data-dir /var/lib/fenced --listen 0.0.0.0:7101 --peer-listen 0.0.0.0:7201 \\
    --initial-cluster 1=10.0.0.1:7201/10.0.0.1:7101,2=10.0.0.2:7201/10.0.0.2:7101,3=10.0.0.3:7201/10.0.0.3:7101 \\
    --tls-cert /etc/fenced/node-1.pem --tls-key /etc/fenced/node-1-key.pem --tls-ca /etc/fenced/ca.pem")]
    Run {
        /// A TOML file with the same settings; flags and FENCED_* win over it.
        #[arg(long, env = "FENCED_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        settings: Box<RunSettings>,
    },
    /// Print a shell completion script for fenced.
    #[command(after_help = "Examples:
  fenced completions bash > ~/.local/share/bash-completion/completions/fenced
  fenced completions zsh > \"${fpath[1]}/_fenced\"
  fenced completions fish > ~/.config/fish/completions/fenced.fish")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the OpenAPI document of the HTTP/JSON API (each node also serves
    /// it at /v1/openapi.json on its client port).
    #[command(after_help = "Examples:
  fenced openapi > openapi.json")]
    Openapi,
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Print the SHA-256 (hex) of the token read from stdin, for `sha256`.
    #[command(after_help = "Examples:
  printf %s \"$TOKEN\" | fenced auth hash-token")]
    HashToken,
    /// Print a new random token and its SHA-256; give the token to the
    /// client, put the hash in the tokens file.
    #[command(after_help = "Examples:
  fenced auth new-token")]
    NewToken,
    /// Load auth files (policies or tokens) as `fenced run` would and say
    /// what they grant; exits 2 with the file and field at fault otherwise.
    #[command(after_help = "Examples:
  fenced auth check-policy /etc/fenced/policy.toml
  fenced auth check-policy policy.toml tokens.toml")]
    CheckPolicy {
        /// The files, merged as --auth-policy and --auth-tokens merge them.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
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
        AuthCommand::CheckPolicy { files } => {
            let policy = auth::Policy::load_all(&files)?;
            for (identity, grants) in policy.identities() {
                println!(
                    "{identity}: admin {}, lock {:?}, read {:?}",
                    grants.admin, grants.lock, grants.read
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Colour codes only for a person at a terminal: stderr redirected to a
/// file or a journal gets plain text, and NO_COLOR turns them off anyway.
fn colour_on_stderr() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none()
}

/// Logs to `writer`, without openraft's noise about unreachable peers and
/// stale votes (fenced_server::observe::raft_noise says why that is no loss).
fn init_logging<W>(format: LogFormat, writer: W, ansi: bool)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_env("FENCED_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.finish().with(QuietRaftNoise).init(),
        LogFormat::Json => builder.json().finish().with(QuietRaftNoise).init(),
    }
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

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let cfg = match cli.command {
        Command::Dev {
            data_dir,
            nodes,
            base_port,
            ..
        } => {
            let dir = dev_dir(data_dir);
            let layout = dev::layout(&dir, nodes, base_port);
            let default_ports = base_port == dev::DEFAULT_BASE_PORT;
            return match dev::run(&layout, default_ports, fenced_os::stop_signal()).await? {
                DevEnd::Stopped => {
                    println!(
                        "\nfenced dev: stopped {nodes} node{}; data kept in {} (--fresh starts empty)",
                        if nodes == 1 { "" } else { "s" },
                        dir.display()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                DevEnd::StorageFailed(id, path, error) => {
                    eprintln!(
                        "fenced dev: node {id}'s storage failed at {}: {error}; stopped",
                        path.display()
                    );
                    Ok(ExitCode::from(EXIT_STORAGE_FAILED))
                }
            };
        }
        Command::Openapi => {
            let text = fenced_server::rpc::json::openapi::text()?;
            std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())
                .map_err(|e| format!("openapi: {e}"))?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Completions { shell } => {
            // Into memory first: a closed stdout (`| head`) is an error, not a panic.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "fenced", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)
                .map_err(|e| format!("completions: {e}"))?;
            return Ok(ExitCode::SUCCESS);
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
                    deny: None,
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
        Command::Check { data_dir } => {
            let reports = disk_check::check_data_dir(&data_dir).map_err(|e| e.to_string())?;
            for report in &reports {
                println!("{report}");
            }
            return Ok(if disk_check::all_whole(&reports) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            });
        }
        Command::Repair { data_dir, node_id } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let done = fenced_server::repair::prepare::prepare(&data_dir, node_id, now)
                .map_err(|e| e.to_string())?;
            if let Some(aside) = &done.moved_to {
                println!("moved what the data directory held to {}", aside.display());
            }
            println!(
                "{} is marked for the repair of node {node_id}; start the node as usual: \
                 it waits for the other voters, takes the log from the leader and votes \
                 again once caught up (fencectl status shows repairing until then)",
                data_dir.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        Command::Restore {
            from,
            data_dir,
            node_id,
            initial_cluster,
            token_floor,
        } => {
            let members = config::parse_initial_cluster(&initial_cluster)?;
            let (body, laid) = backup::restore(&from, &data_dir, node_id, &members, token_floor)
                .map_err(|e| e.to_string())?;
            println!(
                "restored {} into {} for node {node_id} of {:?}: backup applied index {}, last token {}, {} live leases, cluster time {} ms; tokens from now on are above {}",
                from.display(),
                laid.data_dir.display(),
                laid.members,
                body.last_applied.map_or(0, |l| l.index),
                body.last_token,
                laid.state.live_leases,
                laid.state.cluster_time.as_millis(),
                laid.state.last_token,
            );
            return Ok(ExitCode::SUCCESS);
        }
        Command::Recover {
            force_new_cluster: _,
            data_dir,
            node_id,
            initial_cluster,
            token_floor,
        } => {
            let members = config::parse_initial_cluster(&initial_cluster)?;
            let me = match (members.len(), members.get(&node_id)) {
                (1, Some(me)) => me.clone(),
                _ => {
                    return Err(format!(
                        "--initial-cluster: must name this node ({node_id}) and no other"
                    ))
                }
            };
            let (kept, export, laid) = backup::recover(&data_dir, node_id, me, token_floor)
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "recovered {} as a one-node cluster of node {node_id}: survivor's last token {}, {} live leases; tokens from now on are above {}; the old data is in {}",
                laid.data_dir.display(),
                export.last_token,
                laid.state.live_leases,
                laid.state.last_token,
                kept.display(),
            );
            return Ok(ExitCode::SUCCESS);
        }
        Command::Run { config, settings } => {
            let settings = match config {
                Some(path) => settings.or_file(RunSettings::from_file(&path)?)?,
                None => *settings,
            };
            settings.into_node_config()?
        }
    };
    let (id, dir) = (cfg.id, cfg.data_dir.clone());
    // A node being repaired may wait in its start for the other voters:
    // a stop signal ends that wait too.
    let mut node = tokio::select! {
        started = RunningNode::start(cfg) => started.map_err(|e| format!("node {id}: {e}"))?,
        _ = fenced_os::stop_signal() => {
            tracing::info!(node = id, "stopped before the node started");
            return Ok(ExitCode::SUCCESS);
        }
    };
    // Resolves only if the cluster refused this node's --join for good.
    let join_refused = node.join_refused();
    // A node whose storage failed is of no use until restarted: exit so
    // that systemd, compose or Kubernetes restart it.
    tokio::select! {
        _ = fenced_os::stop_signal() => {}
        reason = join_refused => {
            tracing::error!(node = id, "{reason}; stopping");
            node.shutdown().await;
            return Err(format!("node {id}: {reason}"));
        }
        error = node.failure() => {
            tracing::error!(
                node = id,
                path = %failed_path(&dir, &error).display(),
                "storage failed: {error}; stopping so a supervisor restarts the node"
            );
            // CANARY (planted in a `canaries` build, `canary::on`): the
            // node stays up past a failed write.
            if fenced_core::canary::on(fenced_core::canary::Canary::SurviveStorageFailure) {
                std::future::pending::<()>().await;
            }
            return Ok(ExitCode::from(EXIT_STORAGE_FAILED));
        }
    }
    tracing::info!("shutting down");
    // A leader hands over first, so the cluster does not wait out an
    // election timeout; a follower just stops.
    node.hand_over_leadership().await;
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// `fenced dev`'s data directory: the one given, or fenced-dev in the
/// temporary directory.
fn dev_dir(data_dir: Option<PathBuf>) -> PathBuf {
    data_dir.unwrap_or_else(|| std::env::temp_dir().join("fenced-dev"))
}

/// Before anything else of `fenced dev`: the data dir (emptied with
/// --fresh), the banner, and where the logs go.
fn prepare_dev(cli: &Cli) -> Result<(), String> {
    let Command::Dev {
        data_dir,
        nodes,
        base_port,
        fresh,
        verbose,
    } = &cli.command
    else {
        init_logging(cli.log_format, std::io::stderr, colour_on_stderr());
        return Ok(());
    };
    let dir = dev_dir(data_dir.clone());
    dev::prepare_dir(&dir, *fresh)?;
    let layout = dev::layout(&dir, *nodes, *base_port);
    if *verbose {
        init_logging(cli.log_format, std::io::stderr, colour_on_stderr());
    } else {
        init_logging(cli.log_format, NodeLogFiles::open(&dir, &layout)?, false);
    }
    print!("{}", dev::banner(&dir, &layout, *verbose));
    Ok(())
}

/// Plants the bug `FENCED_CANARY` names, for a canary run of the fault
/// campaign. A build without the `canaries` feature refuses the variable
/// rather than run as if the bug were there.
fn plant_canary() -> Result<(), String> {
    match std::env::var("FENCED_CANARY") {
        Ok(name) => fenced_core::canary::plant(name.parse()?),
        Err(std::env::VarError::NotPresent) => Ok(()),
        Err(e) => Err(format!("FENCED_CANARY: {e}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = plant_canary() {
        eprintln!("fenced: {e}");
        return ExitCode::from(2);
    }
    // Everything the node writes (the Raft log's chunk files, snapshots,
    // the cluster-time file, certificates) is its owner's alone: files 0600,
    // directories 0700, also where a library creates them.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    if let Err(e) = prepare_dev(&cli) {
        eprintln!("fenced dev: {e}");
        return ExitCode::from(2);
    }
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
