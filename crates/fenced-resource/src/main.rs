//! `fenced-resource`: the protected resource as a service.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Parser, Subcommand};
use fenced_resource::{
    current::{ClusterOptions, CurrentCheck},
    service::ResourceService,
    FenceStore, Mode,
};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "fenced-resource",
    version,
    about = "A store that refuses writes from stale lock owners"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the FencedResource gRPC API over a store in DATA_DIR.
    Serve {
        /// Address to listen on, e.g. 127.0.0.1:7300.
        #[arg(long, env = "FENCED_RESOURCE_LISTEN")]
        listen: SocketAddr,
        /// Where the store keeps its data (created if missing).
        #[arg(long, env = "FENCED_RESOURCE_DATA_DIR")]
        data_dir: PathBuf,
        /// Contract of a new key whose first write names none:
        /// allow_equal or strict.
        #[arg(
            long,
            env = "FENCED_RESOURCE_DEFAULT_MODE",
            default_value = "allow_equal"
        )]
        default_mode: Mode,
        #[command(flatten)]
        tls: TlsArgs,
        #[command(flatten)]
        current: CurrentArgs,
    },
}

/// "Still current" checks against the lock cluster.
#[derive(clap::Args)]
struct CurrentArgs {
    /// Before applying a write, ask the lock cluster (ValidateToken) that
    /// its token is still the current lease; refuse it otherwise, and when
    /// the cluster cannot answer.
    #[arg(long, env = "FENCED_RESOURCE_REQUIRE_CURRENT", requires = "cluster")]
    require_current: bool,
    /// Check only keys starting with this (repeatable; default every key).
    #[arg(
        long = "require-current-prefix",
        env = "FENCED_RESOURCE_REQUIRE_CURRENT_PREFIX",
        value_delimiter = ',',
        requires = "require_current"
    )]
    require_current_prefix: Vec<String>,
    /// Comma-separated host:port of the lock cluster's nodes.
    #[arg(long, env = "FENCED_RESOURCE_CLUSTER", value_delimiter = ',')]
    cluster: Vec<String>,
    /// The CA (PEM) of the cluster's certificates: TLS to the cluster.
    #[arg(long, env = "FENCED_RESOURCE_CLUSTER_CA")]
    cluster_ca: Option<PathBuf>,
    /// This service's certificate and key (PEM) for the cluster.
    #[arg(long, env = "FENCED_RESOURCE_CLUSTER_CERT", requires_all = ["cluster_key", "cluster_ca"])]
    cluster_cert: Option<PathBuf>,
    #[arg(long, env = "FENCED_RESOURCE_CLUSTER_KEY", requires_all = ["cluster_cert", "cluster_ca"])]
    cluster_key: Option<PathBuf>,
    /// A file whose first line is a bearer token with the `read` role.
    #[arg(long, env = "FENCED_RESOURCE_CLUSTER_TOKEN_FILE")]
    cluster_token_file: Option<PathBuf>,
    /// How long one check may take in all, ms (100 to 60000).
    #[arg(long, env = "FENCED_RESOURCE_CURRENT_TIMEOUT_MS", default_value_t = 2_000,
        value_parser = clap::value_parser!(u64).range(100..=60_000))]
    current_timeout_ms: u64,
    /// The most checks in flight; beyond, writes are refused (1 to 100000).
    #[arg(long, env = "FENCED_RESOURCE_CURRENT_CHECKS_IN_FLIGHT", default_value_t = 1_024,
        value_parser = clap::value_parser!(u64).range(1..=100_000))]
    current_checks_in_flight: u64,
}

impl CurrentArgs {
    fn check(&self) -> Result<Option<CurrentCheck>, String> {
        if !self.require_current {
            return Ok(None);
        }
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let bearer = match &self.cluster_token_file {
            None => None,
            Some(p) => {
                let text = String::from_utf8(read(p)?)
                    .map_err(|_| format!("{}: not UTF-8", p.display()))?;
                Some(
                    text.lines()
                        .next()
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .ok_or_else(|| format!("cluster_token_file {}: empty", p.display()))?
                        .to_string(),
                )
            }
        };
        let identity_pem = match (&self.cluster_cert, &self.cluster_key) {
            (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
            _ => None,
        };
        CurrentCheck::new(ClusterOptions {
            endpoints: self.cluster.clone(),
            ca_pem: self.cluster_ca.as_ref().map(read).transpose()?,
            identity_pem,
            bearer,
            key_prefixes: self.require_current_prefix.clone(),
            timeout: std::time::Duration::from_millis(self.current_timeout_ms),
            max_in_flight: usize::try_from(self.current_checks_in_flight).unwrap_or(usize::MAX),
        })
        .map(Some)
    }
}

/// TLS on the gRPC port: all three files, or none (plaintext).
#[derive(clap::Args)]
struct TlsArgs {
    /// The service's certificate (PEM), e.g. from `fenced certs node`.
    #[arg(long, env = "FENCED_RESOURCE_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "FENCED_RESOURCE_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs client certificates.
    #[arg(long, env = "FENCED_RESOURCE_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// Require a client certificate signed by --tls-ca (optional otherwise).
    #[arg(long, env = "FENCED_RESOURCE_CLIENT_CERT_AUTH", requires = "tls_ca")]
    client_cert_auth: bool,
}

impl TlsArgs {
    /// tonic's TLS settings, when TLS is on.
    fn config(&self) -> Result<Option<ServerTlsConfig>, String> {
        let (Some(cert), Some(key), Some(ca)) = (&self.tls_cert, &self.tls_key, &self.tls_ca)
        else {
            return Ok(None);
        };
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        Ok(Some(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(read(cert)?, read(key)?))
                .client_ca_root(Certificate::from_pem(read(ca)?))
                .client_auth_optional(!self.client_cert_auth),
        ))
    }
}

async fn shutdown_signal() {
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
        _ = term => {}
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("FENCED_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let Command::Serve {
        listen,
        data_dir,
        default_mode,
        tls,
        current,
    } = cli.command;

    let tls = match tls.config() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fenced-resource: TLS: {e}");
            return ExitCode::from(2);
        }
    };
    let store = match FenceStore::open_with_mode(&data_dir, default_mode) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("fenced-resource: cannot open {}: {e}", data_dir.display());
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fenced-resource: {e}");
            return ExitCode::from(1);
        }
    };
    // The cluster's channels need the runtime to exist.
    let current = {
        let _runtime = runtime.enter();
        match current.check() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("fenced-resource: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let result = runtime.block_on(async {
        tracing::info!(%listen, data_dir = %data_dir.display(), %default_mode, tls = tls.is_some(), "fenced-resource serving");
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls)?;
        }
        let mut service = ResourceService::new(store);
        if let Some(check) = current {
            tracing::info!("writes need a token still current on the lock cluster");
            service = service.with_current_check(check);
        }
        server
            .add_service(service.into_server())
            .serve_with_shutdown(listen, shutdown_signal())
            .await
    });
    match result {
        Ok(()) => {
            tracing::info!("fenced-resource stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fenced-resource: {e}");
            ExitCode::from(1)
        }
    }
}
