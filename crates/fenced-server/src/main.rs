//! `fenced`: run a node of a cluster, or a local three-node cluster.

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};
use fenced_server::{
    config::RunSettings,
    node::{NodeConfig, RunningNode},
    types::Node,
};
use tracing_subscriber::EnvFilter;

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
    /// 7101, 7102, 7103 on 127.0.0.1).
    Dev {
        /// Where the three nodes keep their data (kept across runs).
        #[arg(long, env = "FENCED_DEV_DATA_DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Run one node of a cluster.
    Run {
        /// A TOML file with the same settings; flags and FENCED_* win over it.
        #[arg(long, env = "FENCED_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        settings: Box<RunSettings>,
    },
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
            NodeConfig::new(
                i,
                data_dir.join(format!("node{i}")),
                ([127, 0, 0, 1], 7100 + i as u16).into(),
                ([127, 0, 0, 1], 7200 + i as u16).into(),
                members.clone(),
            )
        })
        .collect()
}

async fn run(cli: Cli) -> Result<(), String> {
    let configs = match cli.command {
        Command::Dev { data_dir } => {
            let dir = data_dir.unwrap_or_else(|| std::env::temp_dir().join("fenced-dev"));
            println!("fenced dev: three nodes, data under {}", dir.display());
            dev_configs(dir)
        }
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
    for (node, id, listen, peer, dir) in &nodes {
        let leader = node.wait_for_leader(Duration::from_secs(30)).await;
        println!(
            "node {id} ready: client {listen}, peer {peer}, data {}, leader {}",
            dir.display(),
            leader.map_or("none yet".to_string(), |l| l.to_string())
        );
    }
    shutdown_signal().await;
    tracing::info!("shutting down");
    for (node, ..) in nodes {
        node.shutdown().await;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fenced: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fenced: {e}");
            ExitCode::from(2)
        }
    }
}
