//! A worker's side of the outbox: records one request to a destination that
//! cannot check a token, in the worker's own SQLite database, behind the
//! fenced-sql guard. Run it under `fencectl run` (which sets
//! FENCED_RESOURCE, FENCED_FENCING_TOKEN and FENCED_OWNER_ID); the
//! dispatcher (`fenced-outbox dispatch`) sends what it recorded.
//!
//! Exit: 0 recorded (or recorded before under this key), 3 refused as stale,
//! 1 other.

use std::process::ExitCode;

use clap::Parser;
use fenced_outbox::{Operation, Recorded};
use fenced_sql::{Contract, Fence};

#[derive(Parser)]
#[command(about = "Records one outbox operation under the lease in the environment")]
struct Cli {
    /// The worker's SQLite database.
    #[arg(long)]
    database: std::path::PathBuf,
    /// Where the dispatcher will POST the payload.
    #[arg(long)]
    destination: String,
    /// The operation's idempotency key (the same on every retry).
    #[arg(long)]
    key: String,
    /// The payload.
    #[arg(long)]
    payload: String,
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name}: not set (run under fencectl run)"))
}

fn run(cli: &Cli) -> Result<Recorded, String> {
    let resource = env("FENCED_RESOURCE")?;
    let token: u64 = env("FENCED_FENCING_TOKEN")?
        .parse()
        .map_err(|e| format!("FENCED_FENCING_TOKEN: {e}"))?;
    let owner = env("FENCED_OWNER_ID")?;
    let mut conn = rusqlite::Connection::open(&cli.database).map_err(|e| e.to_string())?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    fenced_outbox::sqlite::migrate(&mut conn).map_err(|e| e.to_string())?;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| e.to_string())?;
    let fence = Fence {
        resource: &resource,
        token,
        owner_id: &owner,
        operation_id: None,
        contract: Contract::AtLeast,
    };
    let op = Operation::post(&cli.destination, cli.payload.as_bytes(), &cli.key);
    let recorded = fenced_outbox::sqlite::record(&tx, &fence, &op).map_err(|e| e.to_string())?;
    // The business write of the same transaction would go here.
    tx.commit().map_err(|e| e.to_string())?;
    Ok(recorded)
}

fn main() -> ExitCode {
    match run(&Cli::parse()) {
        Ok(Recorded::Stale { highest }) => {
            eprintln!("refused: token is stale, {highest} was accepted since");
            ExitCode::from(3)
        }
        Ok(r) => {
            println!("{r:?}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("outbox-record: {e}");
            ExitCode::FAILURE
        }
    }
}
