//! `fencectl kv`: fenced writes to the cluster's own key-value store.

use std::{io::Read, path::PathBuf};

use clap::Subcommand;
use fenced_client::{Client, ClientError, KvRefusal, KvWrite, LostReason, Token};
use fenced_core::KV_VALUE_MAX_BYTES;
use serde_json::json;

use crate::{owner_id, token, Report};

#[derive(Subcommand)]
pub enum KvCmd {
    /// Write VALUE (or --value-file) under KEY, fenced by your lease: applied
    /// only if (--resource, --owner-id, --token) is the resource's current
    /// lease when the write is decided. Exit 3 if refused.
    #[command(after_help = "Examples:
  fencectl kv put config/active primary-b --resource failover --owner-id $OWNER --token 7
  fencectl kv put report --value-file report.json --resource reports --owner-id $OWNER --token 3")]
    Put {
        /// The key, 1 to 512 bytes of UTF-8.
        key: String,
        /// The value, at most 64 KiB (or --value-file).
        #[arg(required_unless_present = "value_file")]
        value: Option<String>,
        /// Read the value from this file (`-`: standard input), at most 64 KiB.
        #[arg(long, conflicts_with = "value")]
        value_file: Option<PathBuf>,
        /// The resource whose lease fences the write (1 to 200 bytes); the
        /// key stays bound to it.
        #[arg(long)]
        resource: String,
        /// The owner id the lease was granted to.
        #[arg(long = "owner-id", alias = "owner")]
        owner_id: String,
        /// The lease's fencing token.
        #[arg(long)]
        token: u64,
    },
    /// Print KEY's value (raw bytes; --json adds the writing lease's resource
    /// and token). Exit 3 if the key has no value.
    #[command(after_help = "Examples:
  fencectl kv get config/active
  fencectl --json kv get config/active --allow-stale")]
    Get {
        /// The key, 1 to 512 bytes of UTF-8.
        key: String,
        /// Answer from any node, possibly behind the leader.
        #[arg(long)]
        allow_stale: bool,
    },
    /// Remove KEY, fenced like a put.
    #[command(after_help = "Examples:
  fencectl kv delete config/active --resource failover --owner-id $OWNER --token 7")]
    Delete {
        /// The key, 1 to 512 bytes of UTF-8.
        key: String,
        /// The resource whose lease fences the delete (the key's own).
        #[arg(long)]
        resource: String,
        /// The owner id the lease was granted to.
        #[arg(long = "owner-id", alias = "owner")]
        owner_id: String,
        /// The lease's fencing token.
        #[arg(long)]
        token: u64,
    },
}

/// The value from a file or standard input, refused locally past its bound.
fn read_value(path: &PathBuf) -> Result<Vec<u8>, ClientError> {
    let fail = |e: std::io::Error| {
        ClientError::InvalidArgument(format!("value file {}: {e}", path.display()))
    };
    let source: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).map_err(fail)?)
    };
    let mut value = Vec::new();
    source
        .take(KV_VALUE_MAX_BYTES as u64 + 1)
        .read_to_end(&mut value)
        .map_err(fail)?;
    if value.len() > KV_VALUE_MAX_BYTES {
        return Err(ClientError::InvalidArgument(format!(
            "value: must be at most {KV_VALUE_MAX_BYTES} bytes, {} holds more",
            path.display()
        )));
    }
    Ok(value)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_report(op: &str, key: &str, resource: &str, token: Token, outcome: KvWrite) -> Report {
    match outcome {
        KvWrite::Applied {
            revision, existed, ..
        } => Report {
            value: json!({"status": "applied", "key": key, "resource": resource, "token": token,
                "revision": revision, "existed": existed}),
            text: format!("{op} {key}: applied at revision {revision} (token {token})"),
            code: 0,
        },
        KvWrite::Refused(reason) => {
            let mut value = json!({"status": "refused", "key": key, "resource": resource,
                "token": token, "reason": reason.as_str()});
            let mut text = format!("{op} {key}: refused, token {token} {}", reason.as_str());
            match &reason {
                KvRefusal::Lease(LostReason::Superseded { current_token }) => {
                    value["current_token"] = json!(current_token);
                    text.push_str(&format!(" (current token {current_token})"));
                }
                KvRefusal::KeyHasNewerToken { key_token } => {
                    value["key_token"] = json!(key_token);
                    text.push_str(&format!(
                        " (stale: the key was last written or deleted with token {key_token})"
                    ));
                }
                KvRefusal::KeyOfAnotherResource { key_resource } => {
                    value["key_resource"] = json!(key_resource.as_str());
                    text.push_str(&format!(
                        " (the key belongs to resource {key_resource}; only its holder writes it)"
                    ));
                }
                _ => {}
            }
            Report {
                value,
                text,
                code: 3,
            }
        }
    }
}

pub async fn execute(
    client: &Client,
    command: KvCmd,
    json_out: bool,
) -> Result<Report, ClientError> {
    match command {
        KvCmd::Put {
            key,
            value,
            value_file,
            resource,
            owner_id: owner,
            token: token_value,
        } => {
            let value = match (value, value_file) {
                (_, Some(path)) => read_value(&path)?,
                (Some(v), None) => v.into_bytes(),
                (None, None) => {
                    return Err(ClientError::InvalidArgument(
                        "value: give VALUE or --value-file".into(),
                    ))
                }
            };
            let (owner, token) = (owner_id(&owner)?, token(token_value)?);
            let outcome = client.kv_put(&key, &value, &resource, owner, token).await?;
            Ok(write_report("put", &key, &resource, token, outcome))
        }
        KvCmd::Delete {
            key,
            resource,
            owner_id: owner,
            token: token_value,
        } => {
            let (owner, token) = (owner_id(&owner)?, token(token_value)?);
            let outcome = client.kv_delete(&key, &resource, owner, token).await?;
            Ok(write_report("delete", &key, &resource, token, outcome))
        }
        KvCmd::Get { key, allow_stale } => match client.kv_get_with(&key, allow_stale).await? {
            None => Ok(Report {
                value: json!({"status": "not_found", "key": key}),
                text: format!("{key}: no value"),
                code: 3,
            }),
            Some(read) if json_out => {
                let mut value = json!({"status": "found", "key": key, "resource": read.resource,
                    "token": read.token, "revision": read.revision, "value_hex": hex(&read.value)});
                if let Ok(text) = std::str::from_utf8(&read.value) {
                    value["value"] = json!(text);
                }
                Ok(Report {
                    value,
                    text: String::new(),
                    code: 0,
                })
            }
            Some(read) => {
                // The value as it is, so `fencectl kv get k > file` round-trips;
                // on a terminal a newline after it keeps the prompt apart.
                use std::io::{IsTerminal, Write};
                let mut out = std::io::stdout().lock();
                let newline = out.is_terminal() && !read.value.ends_with(b"\n");
                out.write_all(&read.value)
                    .and_then(|()| {
                        if newline {
                            out.write_all(b"\n")
                        } else {
                            Ok(())
                        }
                    })
                    .and_then(|()| out.flush())
                    .map_err(|e| ClientError::InvalidArgument(format!("stdout: {e}")))?;
                Ok(Report::printed(0))
            }
        },
    }
}
