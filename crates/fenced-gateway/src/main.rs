//! `fenced-gateway`: the write gateway as a process.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use clap::Parser;
use fenced_gateway::{
    gateway::{Limits, State},
    metrics::Metrics,
    serve, upstream,
};
use fenced_http::{Serializer, SqliteLedger};
use fenced_resource::current::{first_line_of, ClusterOptions, CurrentCheck};
use fenced_server::security::auth::{Auth, AuthConfig};
use http::{HeaderValue, Uri};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "fenced-gateway",
    version,
    about = "Forwards fenced requests to one upstream and refuses stale tokens",
    after_help = "Example:\n  fenced-gateway --listen 127.0.0.1:7400 --upstream http://127.0.0.1:8080 \\\n    \
                  --data-dir /var/lib/fenced-gateway --cluster 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
)]
struct Cli {
    /// Address callers reach the gateway on.
    #[arg(long, env = "FENCED_GATEWAY_LISTEN")]
    listen: SocketAddr,
    /// The upstream's base URL (http:// or https://); request paths are
    /// appended to it.
    #[arg(long, env = "FENCED_GATEWAY_UPSTREAM")]
    upstream: String,
    /// Where the ledger (the highest token forwarded per resource) lives.
    #[arg(long, env = "FENCED_GATEWAY_DATA_DIR")]
    data_dir: PathBuf,
    /// This gateway's certificate (PEM): TLS for callers.
    #[arg(long, env = "FENCED_GATEWAY_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "FENCED_GATEWAY_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) of callers' certificates; a verified one names the caller.
    #[arg(long, env = "FENCED_GATEWAY_CLIENT_CA", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// A deny list of client certificates (the nodes' `tls_deny` format),
    /// reread on SIGHUP; a listed certificate is refused at its next request.
    #[arg(long, env = "FENCED_GATEWAY_TLS_DENY", requires = "client_ca")]
    tls_deny: Option<PathBuf>,
    /// Require a client certificate from every caller.
    #[arg(
        long,
        env = "FENCED_GATEWAY_REQUIRE_CLIENT_CERT",
        requires = "client_ca"
    )]
    require_client_cert: bool,
    /// Bearer tokens (hashed) and roles, as the nodes' auth_tokens.
    #[arg(long, env = "FENCED_GATEWAY_AUTH_TOKENS")]
    auth_tokens: Option<PathBuf>,
    /// Roles and certificate identities, as the nodes' auth_policy; a
    /// caller needs `lock` on the resource.
    #[arg(long, env = "FENCED_GATEWAY_AUTH_POLICY")]
    auth_policy: Option<PathBuf>,
    /// The lock cluster's nodes, host:port, comma-separated.
    #[arg(long, env = "FENCED_GATEWAY_CLUSTER", value_delimiter = ',')]
    cluster: Vec<String>,
    /// The cluster's CA (PEM): TLS to the cluster.
    #[arg(long, env = "FENCED_GATEWAY_CLUSTER_CA")]
    cluster_ca: Option<PathBuf>,
    /// This gateway's certificate for the cluster (PEM).
    #[arg(long, env = "FENCED_GATEWAY_CLUSTER_CERT", requires_all = ["cluster_key", "cluster_ca"])]
    cluster_cert: Option<PathBuf>,
    #[arg(long, env = "FENCED_GATEWAY_CLUSTER_KEY", requires_all = ["cluster_cert", "cluster_ca"])]
    cluster_key: Option<PathBuf>,
    /// A file whose first line is a bearer token with `read` on the resources.
    #[arg(long, env = "FENCED_GATEWAY_CLUSTER_TOKEN_FILE")]
    cluster_token_file: Option<PathBuf>,
    /// Check no token with the cluster (tests, one host): any token a
    /// caller sends can raise a resource's highest for ever.
    #[arg(
        long,
        env = "FENCED_GATEWAY_STANDALONE_NO_CLUSTER_CHECK",
        conflicts_with = "cluster"
    )]
    standalone_no_cluster_check: bool,
    /// How long a cluster check may take, ms (100 to 60000).
    #[arg(long, env = "FENCED_GATEWAY_CURRENT_TIMEOUT_MS", default_value_t = 2_000,
        value_parser = clap::value_parser!(u64).range(100..=60_000))]
    current_timeout_ms: u64,
    /// The upstream's CA (PEM); default: the system's roots.
    #[arg(long, env = "FENCED_GATEWAY_UPSTREAM_CA")]
    upstream_ca: Option<PathBuf>,
    /// A client certificate for the upstream (PEM).
    #[arg(long, env = "FENCED_GATEWAY_UPSTREAM_CERT", requires = "upstream_key")]
    upstream_cert: Option<PathBuf>,
    #[arg(long, env = "FENCED_GATEWAY_UPSTREAM_KEY", requires = "upstream_cert")]
    upstream_key: Option<PathBuf>,
    /// A file whose first line is the Authorization value the gateway sends
    /// the upstream (callers' own credentials are never passed on).
    #[arg(long, env = "FENCED_GATEWAY_UPSTREAM_AUTHORIZATION_FILE")]
    upstream_authorization_file: Option<PathBuf>,
    /// The largest request body, bytes (1 to 67108864).
    #[arg(long, env = "FENCED_GATEWAY_MAX_BODY_BYTES", default_value_t = 1 << 20,
        value_parser = clap::value_parser!(u64).range(1..=(64 << 20)))]
    max_body_bytes: u64,
    /// The largest upstream answer body, bytes (1 to 67108864).
    #[arg(long, env = "FENCED_GATEWAY_MAX_RESPONSE_BYTES", default_value_t = 4 << 20,
        value_parser = clap::value_parser!(u64).range(1..=(64 << 20)))]
    max_response_bytes: u64,
    /// How long a caller may take to send its body, ms (100 to 600000).
    #[arg(long, env = "FENCED_GATEWAY_BODY_TIMEOUT_MS", default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(100..=600_000))]
    body_timeout_ms: u64,
    /// The longest upstream call, ms (100 to 600000).
    #[arg(long, env = "FENCED_GATEWAY_UPSTREAM_TIMEOUT_MS", default_value_t = 30_000,
        value_parser = clap::value_parser!(u64).range(100..=600_000))]
    upstream_timeout_ms: u64,
    /// The longest wait for a resource's turn, ms (1 to 600000).
    #[arg(long, env = "FENCED_GATEWAY_TURN_WAIT_MS", default_value_t = 60_000,
        value_parser = clap::value_parser!(u64).range(1..=600_000))]
    turn_wait_ms: u64,
    /// The most caller connections at once (1 to 100000).
    #[arg(long, env = "FENCED_GATEWAY_MAX_CONNECTIONS", default_value_t = 1_024,
        value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_connections: u64,
    /// The most resources with a request in progress or waiting (1 to 10000000).
    #[arg(long, env = "FENCED_GATEWAY_MAX_RESOURCES", default_value_t = 65_536,
        value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    max_resources: u64,
    /// Where `/metrics` is served (Prometheus text); off by default. With
    /// TLS on, it needs a client certificate signed by --client-ca.
    #[arg(long, env = "FENCED_GATEWAY_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Plain text when stderr is a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fenced-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fenced-gateway: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let tls_on = cli.tls_cert.is_some();
    let auth_config = AuthConfig {
        tokens: cli.auth_tokens.clone(),
        policy: cli.auth_policy.clone(),
    };
    // Secure by default: off loopback, TLS and authentication or no start.
    if !cli.listen.ip().is_loopback() {
        if !tls_on {
            return Err(format!(
                "listen: refusing plaintext on {}, which is not a loopback address; add \
                 --tls-cert and --tls-key",
                cli.listen
            ));
        }
        if !auth_config.enabled() {
            return Err(format!(
                "listen: {} is not a loopback address and no caller is authenticated; add \
                 --auth-policy and/or --auth-tokens",
                cli.listen
            ));
        }
    }
    if let Some(m) = cli.metrics_listen {
        if !m.ip().is_loopback() && cli.client_ca.is_none() {
            return Err(format!(
                "metrics_listen: {m} is not a loopback address; it needs TLS with client \
                 certificates (--tls-cert, --tls-key, --client-ca)"
            ));
        }
    }
    if cli.standalone_no_cluster_check && !cli.listen.ip().is_loopback() {
        return Err(format!(
            "standalone_no_cluster_check: refused off loopback ({}): any caller's token would \
             be believed; give --cluster",
            cli.listen
        ));
    }
    let upstream_uri: Uri = cli
        .upstream
        .parse()
        .map_err(|e| format!("upstream: {:?} is not a URL: {e}", cli.upstream))?;
    if !matches!(upstream_uri.scheme_str(), Some("http" | "https"))
        || upstream_uri.authority().is_none()
    {
        return Err(format!(
            "upstream: must be http://host[:port][/path] or https://..., got {:?}",
            cli.upstream
        ));
    }
    if upstream_uri.query().is_some() {
        return Err(
            "upstream: must not carry a query; request paths and queries are appended".into(),
        );
    }
    let revocations = Arc::new(fenced_server::security::revocation::Revocations::load(
        cli.tls_deny.as_deref(),
    )?);
    let auth = Arc::new(Auth::load(auth_config)?.with_revocations(revocations));
    if !auth.enabled() {
        tracing::warn!(
            "no auth files: every caller on {} may use every resource",
            cli.listen
        );
    }
    let cluster = if cli.standalone_no_cluster_check {
        tracing::warn!(
            "--standalone-no-cluster-check: tokens are not checked with the lock cluster; any \
             token a caller sends is believed"
        );
        None
    } else {
        let identity = match (&cli.cluster_cert, &cli.cluster_key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            _ => None,
        };
        let files = ClusterOptions::from_files(
            cli.cluster.clone(),
            cli.cluster_ca.as_deref(),
            identity,
            cli.cluster_token_file.as_deref(),
        )?;
        Some(CurrentCheck::new(ClusterOptions {
            timeout: Duration::from_millis(cli.current_timeout_ms),
            ..files
        })?)
    };
    std::fs::create_dir_all(&cli.data_dir)
        .map_err(|e| format!("data_dir: {}: {e}", cli.data_dir.display()))?;
    let ledger_path = cli.data_dir.join("gateway-ledger.sqlite");
    let ledger = SqliteLedger::open(&ledger_path)
        .map_err(|e| format!("data_dir: {}: {e}", ledger_path.display()))?;
    let client = upstream::client(
        cli.upstream_ca.as_deref(),
        cli.upstream_cert
            .as_deref()
            .zip(cli.upstream_key.as_deref()),
        Duration::from_millis(cli.upstream_timeout_ms),
    )?;
    let upstream_authorization = cli
        .upstream_authorization_file
        .as_deref()
        .map(|p| {
            let line = first_line_of("upstream_authorization_file", p)?;
            HeaderValue::from_str(&line).map_err(|_| {
                format!(
                    "upstream_authorization_file: {}: not a header value",
                    p.display()
                )
            })
        })
        .transpose()?;
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(c), Some(k)) => Some(serve::server_tls(
            c,
            k,
            cli.client_ca.as_deref(),
            cli.require_client_cert,
        )?),
        _ => None,
    };
    let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let metrics = Arc::new(Metrics::default());
    let state = Arc::new(State {
        upstream: upstream_uri,
        client,
        upstream_authorization,
        auth: Arc::clone(&auth),
        cluster,
        ledger: Arc::new(ledger),
        turns: Serializer::new(size(cli.max_resources)),
        limits: Limits {
            max_body_bytes: size(cli.max_body_bytes),
            max_response_bytes: size(cli.max_response_bytes),
            body_timeout: Duration::from_millis(cli.body_timeout_ms),
            turn_wait: Duration::from_millis(cli.turn_wait_ms),
            upstream_timeout: Duration::from_millis(cli.upstream_timeout_ms),
        },
        metrics: Arc::clone(&metrics),
        forwards: Arc::new(tokio::sync::Semaphore::new(size(cli.max_connections))),
    });
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("listen: {}: {e}", cli.listen))?;
    let stop = CancellationToken::new();
    if let Some(addr) = cli.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("metrics_listen: {addr}: {e}"))?;
        let metrics_tls = match (&cli.tls_cert, &cli.tls_key, &cli.client_ca) {
            (Some(c), Some(k), Some(ca)) => Some(serve::server_tls(c, k, Some(ca), true)?),
            _ => None,
        };
        tokio::spawn(serve::serve_metrics(
            l,
            metrics_tls,
            metrics,
            Arc::clone(&auth),
            stop.clone(),
        ));
    }
    tokio::spawn(fenced_server::security::auth::reload_on_sighup(
        Arc::clone(&auth),
        stop.clone(),
    ));
    tracing::info!(listen = %cli.listen, upstream = %cli.upstream, "fenced-gateway: serving");
    let served = tokio::spawn(serve::serve_callers(
        listener,
        tls,
        state,
        size(cli.max_connections),
        stop.clone(),
    ));
    fenced_os::stop_signal().await;
    stop.cancel();
    // Returns once the connections in progress have ended (or the grace).
    let _ = served.await;
    Ok(())
}
