//! A statement service of one's own, as a team would write it: it stores
//! account statements in its own SQLite table, and its write route is
//! guarded by `fenced_http::FenceLayer` with the cluster check, so a worker
//! that paused past its lease cannot overwrite the one that replaced it.
//!
//! ```console
//! $ statement-service --listen 127.0.0.1:7500 --data-dir /tmp/statements \
//!     --cluster 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
//! $ curl -X POST http://127.0.0.1:7500/statements/1842 -d 'July' \
//!     -H "x-fencing-resource: statement:account-1842:2026-07" \
//!     -H "x-fencing-token: $TOKEN" -H "x-fencing-owner: $OWNER"
//! ```

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
};

use axum::{
    extract::{Path, State},
    http::StatusCode,
    routing::post,
    Extension, Router,
};
use clap::Parser;
use fenced_http::{FenceLayer, Fenced, SqliteLedger};
use fenced_resource::current::{ClusterOptions, CurrentCheck};

#[derive(Parser)]
#[command(about = "An example service whose writes are fenced")]
struct Cli {
    /// Where to listen (loopback: this example has no TLS).
    #[arg(long, default_value = "127.0.0.1:7500")]
    listen: SocketAddr,
    /// Where the statements and the ledger live.
    #[arg(long)]
    data_dir: PathBuf,
    /// The lock cluster's nodes, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    cluster: Vec<String>,
}

type Db = Arc<Mutex<rusqlite::Connection>>;

/// Stores the statement: the layer already checked the token and recorded
/// it, and holds the resource's turn until this returns.
async fn write(
    State(db): State<Db>,
    Path(account): Path<String>,
    Extension(fenced): Extension<Fenced>,
    body: String,
) -> Result<String, (StatusCode, String)> {
    let db = db.lock().unwrap_or_else(PoisonError::into_inner);
    let token =
        i64::try_from(fenced.token.get()).map_err(|_| (StatusCode::BAD_REQUEST, "token".into()))?;
    db.execute(
        "INSERT INTO account_statements (account_id, content, written_with_token) VALUES (?1, ?2, ?3)
         ON CONFLICT (account_id) DO UPDATE SET content = ?2, written_with_token = ?3",
        rusqlite::params![account, body, token],
    )
    .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(format!("stored statement {account} with token {token}\n"))
}

/// Reads a statement back (not guarded: reading changes nothing).
async fn read(State(db): State<Db>, Path(account): Path<String>) -> Result<String, StatusCode> {
    let db = db.lock().unwrap_or_else(PoisonError::into_inner);
    db.query_row(
        "SELECT content FROM account_statements WHERE account_id = ?1",
        [account],
        |r| r.get::<_, String>(0),
    )
    .map_err(|_| StatusCode::NOT_FOUND)
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let cli = Cli::parse();
    if !cli.listen.ip().is_loopback() {
        return Err(format!(
            "listen: {} is not loopback; this example has no TLS",
            cli.listen
        ));
    }
    std::fs::create_dir_all(&cli.data_dir).map_err(|e| format!("data_dir: {e}"))?;
    let conn = rusqlite::Connection::open(cli.data_dir.join("statements.db"))
        .map_err(|e| e.to_string())?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
         CREATE TABLE IF NOT EXISTS account_statements (
             account_id TEXT PRIMARY KEY, content TEXT NOT NULL, written_with_token INTEGER NOT NULL)",
    )
    .map_err(|e| e.to_string())?;
    let ledger = SqliteLedger::open(&cli.data_dir.join("fences.db")).map_err(|e| e.to_string())?;
    let check = CurrentCheck::new(ClusterOptions {
        endpoints: cli.cluster,
        ..ClusterOptions::default()
    })?;
    let layer = FenceLayer::builder(ledger).cluster_check(check).build()?;
    let app = Router::new()
        .route("/statements/{account}", post(write).layer(layer).get(read))
        .with_state(Arc::new(Mutex::new(conn)));
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("listen: {e}"))?;
    println!("statement-service: listening on {}", cli.listen);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string())
}
