//! Versioned objects with a fenced pointer: a worker writes its report as
//! an immutable version (harmless whoever writes it), then moves the
//! object's pointer to it, which the store refuses to a token older than the
//! pointer's. Run it under `fencectl run` (FENCED_RESOURCE,
//! FENCED_FENCING_TOKEN, FENCED_OWNER_ID); `--show` prints the object's
//! current content instead.
//!
//! Exit: 0 published, 3 refused (a newer owner published: stop), 1 other.

use std::process::ExitCode;

use clap::Parser;
use fenced_core::{OwnerId, ResourceName, Token};
use fenced_resource::{FenceStore, WriteOutcome};

#[derive(Parser)]
#[command(about = "Publishes a report version under the lease in the environment")]
struct Cli {
    /// The store's directory (one process at a time).
    #[arg(long)]
    store: std::path::PathBuf,
    /// The object, e.g. `report:q3`.
    #[arg(long)]
    object: String,
    /// The report's content.
    #[arg(long, required_unless_present = "show")]
    content: Option<String>,
    /// Print the current content and exit.
    #[arg(long)]
    show: bool,
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name}: not set (run under fencectl run)"))
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    let store = FenceStore::open(&cli.store).map_err(|e| e.to_string())?;
    if cli.show {
        let (_, content) = store
            .current_version(&cli.object)
            .map_err(|e| e.to_string())?
            .ok_or("nothing published")?;
        println!("{}", String::from_utf8_lossy(&content));
        return Ok(ExitCode::SUCCESS);
    }
    let resource = ResourceName::new(&env("FENCED_RESOURCE")?).map_err(|e| e.to_string())?;
    let token = env("FENCED_FENCING_TOKEN")?
        .parse::<u64>()
        .map_err(|e| format!("FENCED_FENCING_TOKEN: {e}"))
        .and_then(|t| Token::new(t).map_err(|e| e.to_string()))?;
    let owner = OwnerId::parse(&env("FENCED_OWNER_ID")?).map_err(|e| e.to_string())?;
    let content = cli.content.as_deref().unwrap_or_default();
    let id = store
        .put_version(&cli.object, content.as_bytes())
        .map_err(|e| e.to_string())?;
    match store
        .publish(&cli.object, &resource, token, owner, id)
        .map_err(|e| e.to_string())?
    {
        WriteOutcome::Rejected(r) => {
            eprintln!("refused: {r}");
            Ok(ExitCode::from(3))
        }
        outcome => {
            println!("published {} ({})", cli.object, outcome.status());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    run(&Cli::parse()).unwrap_or_else(|e| {
        eprintln!("publish-report: {e}");
        ExitCode::FAILURE
    })
}
