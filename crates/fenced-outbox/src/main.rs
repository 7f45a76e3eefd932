//! `fenced-outbox`: runs the outbox's migration, or a dispatcher.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use fenced_client::{Client, TlsOptions};
use fenced_outbox::{
    decide::RetryPolicy,
    metrics::{self, TlsFlags},
    Dispatcher, HttpDelivery, Settings, Store,
};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    version,
    about = "A fenced outbox: migrate the table, or run a dispatcher that delivers it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Creates fenced-sql's tables and the outbox table (idempotent).
    Migrate {
        #[command(flatten)]
        database: Database,
    },
    /// Delivers the outbox while this process holds the dispatcher lease;
    /// stands by while another one does.
    Dispatch(Box<Dispatch>),
}

#[derive(clap::Args)]
struct Database {
    /// `sqlite:PATH`, `postgres://USER@HOST/DB` or `host=... dbname=...`
    /// (PostgreSQL without TLS: loopback or a Unix socket).
    #[arg(long, env = "FENCED_OUTBOX_DATABASE", hide_env_values = true)]
    database: String,
}

#[derive(clap::Args)]
struct Dispatch {
    #[command(flatten)]
    database: Database,
    /// The cluster's client endpoints, `host:port,...`.
    #[arg(
        long,
        env = "FENCED_OUTBOX_CLUSTER",
        value_delimiter = ',',
        required = true
    )]
    cluster: Vec<String>,
    /// The CA of the cluster's nodes (TLS to the cluster).
    #[arg(long, env = "FENCED_OUTBOX_CLUSTER_CA")]
    cluster_ca: Option<PathBuf>,
    /// This client's certificate, for a cluster that requires one.
    #[arg(long, env = "FENCED_OUTBOX_CLUSTER_CERT", requires = "cluster_key")]
    cluster_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, env = "FENCED_OUTBOX_CLUSTER_KEY", requires = "cluster_cert")]
    cluster_key: Option<PathBuf>,
    /// The dispatcher's name: its lease is `outbox-dispatcher:<name>`, one
    /// active dispatcher per name.
    #[arg(long, env = "FENCED_OUTBOX_NAME")]
    name: String,
    /// The dispatcher lease's TTL: how soon a standby takes over from one
    /// that died.
    #[arg(long, env = "FENCED_OUTBOX_LEASE_TTL", default_value = "10s",
          value_parser = duration_in(Duration::from_secs(1), Duration::from_secs(3600)))]
    lease_ttl: Duration,
    /// How often an idle dispatcher looks for due operations.
    #[arg(long, env = "FENCED_OUTBOX_POLL_INTERVAL", default_value = "200ms",
          value_parser = duration_in(Duration::from_millis(10), Duration::from_secs(60)))]
    poll_interval: Duration,
    /// Most operations taken per look (each up to 1 MiB held in memory).
    #[arg(long, env = "FENCED_OUTBOX_BATCH", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    batch: u32,
    /// Every delivery attempt (connect, TLS, request, answer) within this.
    #[arg(long, env = "FENCED_OUTBOX_REQUEST_TIMEOUT", default_value = "10s",
          value_parser = duration_in(Duration::from_millis(100), Duration::from_secs(300)))]
    request_timeout: Duration,
    /// The first wait after a transient failure; it doubles per attempt.
    #[arg(long, env = "FENCED_OUTBOX_RETRY_BASE", default_value = "500ms",
          value_parser = duration_in(Duration::from_millis(10), Duration::from_secs(3600)))]
    retry_base: Duration,
    /// The longest wait between attempts.
    #[arg(long, env = "FENCED_OUTBOX_RETRY_CAP", default_value = "5m",
          value_parser = duration_in(Duration::from_millis(10), Duration::from_secs(86400)))]
    retry_cap: Duration,
    /// Attempts after which a transient failure is final (`failed`);
    /// unset: retry without end.
    #[arg(long, env = "FENCED_OUTBOX_MAX_ATTEMPTS",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_attempts: Option<u32>,
    /// The CA (PEM) that signed the certificates of https:// destinations.
    #[arg(long, env = "FENCED_OUTBOX_DESTINATION_CA")]
    destination_ca: Option<PathBuf>,
    /// Where `/metrics` is served; off loopback only with the three TLS
    /// flags below.
    #[arg(
        long,
        env = "FENCED_OUTBOX_METRICS_LISTEN",
        default_value = "127.0.0.1:9752"
    )]
    metrics_listen: SocketAddr,
    /// The metrics listener's certificate (PEM).
    #[arg(long, env = "FENCED_OUTBOX_METRICS_TLS_CERT")]
    metrics_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "FENCED_OUTBOX_METRICS_TLS_KEY")]
    metrics_tls_key: Option<PathBuf>,
    /// The CA that signed the scrapers' client certificates (required).
    #[arg(long, env = "FENCED_OUTBOX_METRICS_CLIENT_CA")]
    metrics_client_ca: Option<PathBuf>,
}

/// A duration flag within `[min, max]`; clap names the flag in the error.
fn duration_in(min: Duration, max: Duration) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |s| {
        let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 500ms, 10s, 5m)"))?;
        if d < min || d > max {
            return Err(format!(
                "must be {} to {}, got {}",
                humantime::format_duration(min),
                humantime::format_duration(max),
                humantime::format_duration(d)
            ));
        }
        Ok(d)
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCED_OUTBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fenced-outbox: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fenced-outbox: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Migrate { database } => {
            let store = Store::open(&database.database)
                .await
                .map_err(|e| e.to_string())?;
            store.migrate().await.map_err(|e| e.to_string())?;
            tracing::info!("migrated");
            Ok(())
        }
        Command::Dispatch(d) => dispatch(*d).await,
    }
}

async fn dispatch(d: Dispatch) -> Result<(), String> {
    // Refusals first: nothing is opened when a flag is wrong.
    let flags = TlsFlags {
        cert: d.metrics_tls_cert.is_some(),
        key: d.metrics_tls_key.is_some(),
        client_ca: d.metrics_client_ca.is_some(),
    };
    let metrics_tls = match (
        metrics::tls_required(d.metrics_listen, flags)?,
        &d.metrics_tls_cert,
        &d.metrics_tls_key,
        &d.metrics_client_ca,
    ) {
        (true, Some(cert), Some(key), Some(ca)) => Some(metrics::tls_acceptor(cert, key, ca)?),
        _ => None,
    };
    let settings = Settings {
        name: d.name.clone(),
        lease_ttl: d.lease_ttl,
        poll_interval: d.poll_interval,
        batch: d.batch,
        retry: RetryPolicy {
            base: d.retry_base,
            cap: d.retry_cap.max(d.retry_base),
            max_attempts: d.max_attempts,
        },
    };
    settings.validate().map_err(|e| format!("--{e}"))?;
    let delivery = HttpDelivery::new(d.destination_ca.as_deref(), d.request_timeout)?;
    let tls = match (&d.cluster_ca, &d.cluster_cert, &d.cluster_key) {
        (None, None, None) => None,
        (Some(ca), cert, key) => {
            let mut options = TlsOptions::new().ca(ca);
            if let (Some(cert), Some(key)) = (cert, key) {
                options = options.identity(cert, key);
            }
            Some(options)
        }
        (None, _, _) => {
            return Err("--cluster-ca is required with --cluster-cert and --cluster-key".into())
        }
    };
    let client =
        Client::with_tls(&d.cluster, tls.as_ref()).map_err(|e| format!("--cluster: {e}"))?;
    let store = Store::open(&d.database.database)
        .await
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(d.metrics_listen)
        .await
        .map_err(|e| format!("--metrics-listen {}: {e}", d.metrics_listen))?;
    let dispatcher =
        Dispatcher::new(client, store.clone(), delivery, settings).map_err(|e| e.to_string())?;
    let shutdown = CancellationToken::new();
    tokio::spawn(metrics::serve(
        listener,
        metrics_tls,
        store,
        dispatcher.metrics(),
        shutdown.clone(),
    ));
    tokio::spawn(signals(shutdown.clone()));
    tracing::info!(name = %d.name, metrics = %d.metrics_listen, "dispatcher started");
    let result = dispatcher.run(shutdown.clone()).await;
    shutdown.cancel();
    result.map_err(|e| e.to_string())
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn signals(shutdown: CancellationToken) {
    fenced_os::stop_signal().await;
    tracing::info!("signal received: finishing the current delivery and releasing the lease");
    shutdown.cancel();
}
