//! `fenced-resource`: the protected resource as a service.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use clap::{Parser, Subcommand};
use fenced_resource::{
    current::{ClusterOptions, CurrentCheck},
    service::ResourceService,
    FenceStore, Mode,
};
use fenced_server::security::auth::{Auth, AuthConfig};
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
        auth: AuthArgs,
        #[command(flatten)]
        current: CurrentArgs,
    },
}

/// The cluster check: every write's token must be the current lease of its
/// owner id on the lock cluster.
#[derive(clap::Args)]
struct CurrentArgs {
    /// Check no write against a lock cluster: any token and owner id a
    /// caller sends is accepted and can raise a key's highest token for
    /// ever. For tests and single-host setups only; warned at every start.
    #[arg(
        long,
        env = "FENCED_RESOURCE_STANDALONE_NO_CLUSTER_CHECK",
        conflicts_with_all = ["cluster", "require_current"]
    )]
    standalone_no_cluster_check: bool,
    /// The cluster check is the default; kept so older command lines work.
    #[arg(long, env = "FENCED_RESOURCE_REQUIRE_CURRENT", hide = true)]
    require_current: bool,
    /// Comma-separated host:port of the lock cluster's nodes (required
    /// unless --standalone-no-cluster-check).
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
    /// The most checks one ValidateTokens call carries (1 to 256).
    #[arg(long, env = "FENCED_RESOURCE_CURRENT_BATCH_MAX", default_value_t = 256,
        value_parser = clap::value_parser!(u64).range(1..=256))]
    current_batch_max: u64,
    /// How long a call waits for more checks once it has one, µs (0 to
    /// 10000; 0: it takes what is queued).
    #[arg(long, env = "FENCED_RESOURCE_CURRENT_BATCH_WAIT_US", default_value_t = 0,
        value_parser = clap::value_parser!(u64).range(0..=10_000))]
    current_batch_wait_us: u64,
    /// The most ValidateTokens calls in flight (1 to 64); checks arriving
    /// while all are busy go together in the next one.
    #[arg(long, env = "FENCED_RESOURCE_CURRENT_CALLS_IN_FLIGHT", default_value_t = 4,
        value_parser = clap::value_parser!(u64).range(1..=64))]
    current_calls_in_flight: u64,
}

impl CurrentArgs {
    fn check(&self) -> Result<Option<CurrentCheck>, String> {
        if self.standalone_no_cluster_check {
            return Ok(None);
        }
        let identity = match (&self.cluster_cert, &self.cluster_key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            _ => None,
        };
        let files = ClusterOptions::from_files(
            self.cluster.clone(),
            self.cluster_ca.as_deref(),
            identity,
            self.cluster_token_file.as_deref(),
        )?;
        // Every bound was checked by clap; the conversions cannot fail.
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        CurrentCheck::new(ClusterOptions {
            timeout: Duration::from_millis(self.current_timeout_ms),
            max_in_flight: size(self.current_checks_in_flight),
            batch_max: size(self.current_batch_max),
            batch_wait: Duration::from_micros(self.current_batch_wait_us),
            calls_in_flight: size(self.current_calls_in_flight),
            ..files
        })
        .map(Some)
    }
}

/// Who may call: the lock nodes' auth files (tokens and roles, the same
/// format and prefixes). A put needs `lock`, a get `read`.
#[derive(clap::Args)]
struct AuthArgs {
    /// Bearer tokens (hashed) and their roles, as the nodes' auth_tokens.
    #[arg(long, env = "FENCED_RESOURCE_AUTH_TOKENS")]
    auth_tokens: Option<PathBuf>,
    /// Roles and certificate identities, as the nodes' auth_policy.
    #[arg(long, env = "FENCED_RESOURCE_AUTH_POLICY")]
    auth_policy: Option<PathBuf>,
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

/// Plaintext only on a loopback address: off it, a client's token, owner id
/// and value would cross the network readable and forgeable.
fn plaintext_allowed(listen: SocketAddr, tls: bool) -> Result<(), String> {
    if tls || listen.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "listen: refusing plaintext on {listen}, which is not a loopback address; add \
         --tls-cert, --tls-key and --tls-ca (e.g. from `fenced certs`), or listen on 127.0.0.1"
    ))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("FENCED_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Plain text when stderr is a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let Command::Serve {
        listen,
        data_dir,
        default_mode,
        tls,
        auth,
        current,
    } = cli.command;

    let tls = match tls.config() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fenced-resource: TLS: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = plaintext_allowed(listen, tls.is_some()) {
        eprintln!("fenced-resource: {e}");
        return ExitCode::from(2);
    }
    let auth = match Auth::load(AuthConfig {
        tokens: auth.auth_tokens,
        policy: auth.auth_policy,
    }) {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("fenced-resource: {e}");
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
        let mut service = ResourceService::new(store).with_auth(auth.clone());
        match current {
            Some(check) => {
                tracing::info!("every write needs a token the lock cluster answers as current");
                service = service.with_current_check(check);
            }
            None => tracing::warn!(
                "--standalone-no-cluster-check: writes are NOT checked against a lock cluster; \
                 any caller that may write can raise a key's highest token for ever"
            ),
        }
        if !auth.enabled() {
            tracing::warn!(%listen, "auth is off: any caller that reaches the port may write \
                (--auth-tokens/--auth-policy, or --client-cert-auth, restrict it)");
        }
        server
            .add_service(service.into_server())
            .serve_with_shutdown(listen, fenced_os::stop_signal())
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
