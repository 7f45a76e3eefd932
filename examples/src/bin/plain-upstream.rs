//! A destination that cannot check a token, like a third-party API: it
//! applies every POST it gets and appends it to a log file, one line per
//! write: `<idempotency-key> <body>`. The gateway stands in front of it.

use std::{io::Write, net::SocketAddr, path::PathBuf, sync::Arc};

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    Router,
};
use clap::Parser;

#[derive(Parser)]
#[command(about = "An upstream that applies every write it gets")]
struct Cli {
    #[arg(long, default_value = "127.0.0.1:7600")]
    listen: SocketAddr,
    /// Where each applied write is appended.
    #[arg(long)]
    log: PathBuf,
}

async fn apply(
    State(log): State<Arc<PathBuf>>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, &'static str) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let line = format!("{key} {}\n", body.replace('\n', " "));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log.as_path())
        .and_then(|mut f| f.write_all(line.as_bytes()));
    match written {
        Ok(()) => (StatusCode::OK, "applied\n"),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "not applied\n"),
    }
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let cli = Cli::parse();
    let app = Router::new().fallback(apply).with_state(Arc::new(cli.log));
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("listen: {e}"))?;
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}
