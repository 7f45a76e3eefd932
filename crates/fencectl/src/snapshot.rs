//! `fencectl snapshot save FILE`: a backup of the cluster's state, from the
//! leader, written atomically (temporary file, fsync, rename, fsync of the
//! directory) once its length and SHA-256 match what the leader announced.

use std::path::PathBuf;

use clap::Subcommand;
use fenced_client::{Client, ClientError};
use fenced_os::write_atomically;
use serde_json::json;
use sha2::{Digest, Sha256};

/// The largest backup accepted (the servers' own bound).
const MAX_BACKUP_BYTES: u64 = 1 << 31;

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Save a consistent backup of the whole state to FILE (admin role);
    /// restore it with `fenced restore --from FILE`.
    #[command(after_help = "Examples:
  fencectl --auth-token \"$ADMIN_TOKEN\" snapshot save /backups/fenced.fncd
  fenced restore --from /backups/fenced.fncd --data-dir /var/lib/fenced --node-id 1 \\
    --initial-cluster 1=n1:7201/n1:7101,2=n2:7201/n2:7101,3=n3:7201/n3:7101")]
    Save {
        /// Where to write the backup: whole, through a temporary file
        /// beside it, or not at all.
        file: PathBuf,
    },
}

pub async fn execute(
    client: &Client,
    command: SnapshotCmd,
) -> Result<(serde_json::Value, String), ClientError> {
    match command {
        SnapshotCmd::Save { file } => {
            let (summary, bytes) = client.save_snapshot(MAX_BACKUP_BYTES).await?;
            if Sha256::digest(&bytes).as_slice() != summary.sha256.as_slice() {
                return Err(ClientError::Server(
                    "snapshot save: the bytes received do not match the leader's SHA-256; \
                     nothing was written"
                        .into(),
                ));
            }
            write_atomically(&file, &bytes).map_err(|e| {
                ClientError::InvalidArgument(format!("FILE {}: {e}", file.display()))
            })?;
            Ok((
                json!({"file": file, "bytes": summary.total_bytes,
                    "applied_index": summary.applied_index, "last_token": summary.last_token,
                    "live_leases": summary.live_leases, "cluster_time_ms": summary.cluster_time_ms,
                    "format_version": summary.format_version}),
                format!(
                    "saved {} ({} bytes): applied index {}, last token {}, {} live leases",
                    file.display(),
                    summary.total_bytes,
                    summary.applied_index,
                    summary.last_token,
                    summary.live_leases
                ),
            ))
        }
    }
}
