//! `fencectl`: take, renew, release and inspect fenced leases from a shell,
//! and write to the cluster's fenced key-value store.
//!
//! Exit codes: 0 success, 3 an expected refusal (held, lost, not holder),
//! 4 a lease lost under `lock` or `run`, 5 refused by authentication or
//! permission, 6 no node answered or none could serve the call within
//! --timeout (worth retrying later), 1 another error, 2 a usage error.

use std::{path::PathBuf, process::ExitCode, time::Duration};

mod hold;
mod kv;
mod member;
mod observe;
mod resource;
mod snapshot;
mod supervise;
mod waiting;
mod when;

use clap::{CommandFactory, Parser, Subcommand};
use fenced_client::{
    AcquireOutcome, Client, ClientError, LostReason, OwnerId, ReleaseOutcome, RenewOutcome,
    TlsOptions, Token, DEV_ENDPOINTS,
};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "fencectl",
    version,
    about = "Leases with fencing tokens, from the command line",
    after_help = "Examples:
  fencectl acquire demo --ttl 30s          take a lease (talks to `fenced dev` by default)
  fencectl status                          the cluster as each node sees it
  fencectl --endpoints 10.0.0.1:7101,10.0.0.2:7101 --cacert ca.pem describe demo
  fencectl run demo --ttl 30s -- ./nightly-job.sh

Exit codes: 0 success, 3 an expected refusal (held, ended, lost, not holder),
4 a lease lost under lock or run, 5 refused by authentication or permission,
6 no node answered or none could serve within --timeout, 1 another error,
2 a usage error or a request out of bounds."
)]
struct Cli {
    /// Comma-separated host:port of cluster nodes (any node will do).
    #[arg(long, env = "FENCED_ENDPOINTS", global = true, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Print one JSON object instead of text (and no progress lines).
    #[arg(long, global = true)]
    json: bool,
    /// No progress lines on stderr while waiting for a held resource.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// How long a command may take in all, retries included. When every
    /// endpoint refuses the connection, a command fails at once (exit 6).
    #[arg(long, global = true, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The bearer token that authenticates this client (the nodes' tokens
    /// file lists its hash: `fenced auth hash-token`),
    /// sent with every call. Not the fencing token: that is `--token` of
    /// renew, release, validate, kv and resource.
    #[arg(
        long = "auth-token",
        env = "FENCED_TOKEN",
        hide_env_values = true,
        global = true
    )]
    auth_token: Option<String>,
    /// A file holding the bearer token (its first line).
    #[arg(
        long = "auth-token-file",
        env = "FENCED_TOKEN_FILE",
        global = true,
        conflicts_with = "auth_token"
    )]
    token_file: Option<std::path::PathBuf>,
    /// The old spelling of --auth-token, before the subcommand: still taken
    /// for this release, with a warning.
    #[arg(long = "token", hide = true, conflicts_with = "token_file")]
    legacy_auth_token: Option<String>,
    /// The old spelling of --auth-token-file.
    #[arg(long = "token-file", hide = true, conflicts_with = "auth_token")]
    legacy_token_file: Option<std::path::PathBuf>,
    /// The CA (PEM) that signed the nodes' certificates: turns TLS on
    /// (endpoints are then https://).
    #[arg(
        long = "cacert",
        id = "tls_cacert",
        env = "FENCED_CACERT",
        global = true
    )]
    tls_cacert: Option<PathBuf>,
    /// This client's certificate (PEM), for a cluster that requires one.
    #[arg(long = "cert", id = "tls_cert", env = "FENCED_CERT", global = true)]
    tls_cert: Option<PathBuf>,
    /// This client's private key (PEM).
    #[arg(long = "key", id = "tls_key", env = "FENCED_KEY", global = true)]
    tls_key: Option<PathBuf>,
    /// What the job is, for people, sent with acquire, lock and run: the
    /// status page and describe show it beside the lease while it lives
    /// (1 to 64 bytes of UTF-8, no control characters; it decides nothing).
    #[arg(long = "label", env = "FENCED_JOB_LABEL", global = true)]
    job_label: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

/// The bearer token from `--auth-token`, `FENCED_TOKEN`, `--auth-token-file`
/// or `FENCED_TOKEN_FILE` (or the old `--token`/`--token-file` before the
/// subcommand, with a warning).
fn bearer_token(cli: &Cli) -> Result<Option<String>, ClientError> {
    if cli.legacy_auth_token.is_some() || cli.legacy_token_file.is_some() {
        eprintln!(
            "fencectl: warning: --token/--token-file before the subcommand are now \
             --auth-token/--auth-token-file; the old spelling goes in the next release"
        );
    }
    if let Some(t) = cli.legacy_auth_token.as_ref().or(cli.auth_token.as_ref()) {
        return Ok(Some(t.trim().to_string()));
    }
    let Some(path) = cli.legacy_token_file.as_ref().or(cli.token_file.as_ref()) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| ClientError::InvalidArgument(format!("token file {}: {e}", path.display())))?;
    match text.lines().next().map(str::trim) {
        Some(t) if !t.is_empty() => Ok(Some(t.to_string())),
        _ => Err(ClientError::InvalidArgument(format!(
            "token file {}: empty",
            path.display()
        ))),
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Take the lease on RESOURCE and a new fencing token.
    #[command(after_help = "Examples:
  fencectl acquire demo --ttl 30s
  fencectl acquire statement:2026-07 --ttl 2m --wait 10s
  fencectl --json acquire demo --ttl 30s --owner-id 5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21")]
    Acquire {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
        /// Lease length, e.g. 30s or 2m: between the cluster's bounds, 1s
        /// and 1h unless its operator changed them.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// This attempt's owner id; a new random one if omitted. Reuse it only
        /// to retry the same attempt.
        #[arg(long = "owner-id", alias = "owner")]
        owner_id: Option<String>,
        /// If another owner holds the resource, wait this long for it (0s:
        /// answer at once; at most 1h unless the operator changed it). While
        /// waiting, a line on stderr says who holds it and for how long.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
    /// Extend a lease you hold; the token stays the same.
    #[command(after_help = "Examples:
  fencectl renew demo --owner-id 5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21 --token 1 --ttl 30s")]
    Renew {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
        /// The owner id the lease was granted to.
        #[arg(long = "owner-id", alias = "owner")]
        owner_id: String,
        /// The lease's fencing token, as acquire printed it.
        #[arg(long)]
        token: u64,
        /// The lease's new length from now, e.g. 30s (1s to 1h unless the
        /// operator changed the bounds).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// End a lease you hold.
    #[command(after_help = "Examples:
  fencectl release demo --owner-id 5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21 --token 1")]
    Release {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
        /// The owner id the lease was granted to.
        #[arg(long = "owner-id", alias = "owner")]
        owner_id: String,
        /// The lease's fencing token, as acquire printed it.
        #[arg(long)]
        token: u64,
    },
    /// Show a resource's newest token and whether it is held.
    #[command(after_help = "Examples:
  fencectl describe demo
  fencectl --json describe demo")]
    Describe {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
    },
    /// Show the cluster as each endpoint sees it.
    #[command(after_help = "Examples:
  fencectl status
  fencectl --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 --json status")]
    Status,
    /// Print one line per ownership event (granted, released, expired) on
    /// resources starting with PREFIX, resuming on another node if one goes
    /// away. Needs the `read` role on PREFIX.
    #[command(after_help = "Examples:
  fencectl watch billing/
  fencectl watch billing/ --from 1842 --json
  fencectl watch '' --max-events 10")]
    Watch {
        /// Resource-name prefix; "" for every resource.
        prefix: String,
        /// Print events after this revision (0: from now). Pass the last
        /// revision printed to resume without a gap.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Exit 0 after printing this many events.
        #[arg(long)]
        max_events: Option<u64>,
    },
    /// Show the last grants of RESOURCE, newest first, and how each ended.
    #[command(after_help = "Examples:
  fencectl history billing/march
  fencectl history billing/march --limit 3 --json")]
    History {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
        /// At most this many (0: all the cluster keeps).
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
    /// Check that TOKEN is still the current lease of RESOURCE (exit 0), or
    /// say why not (exit 3).
    #[command(after_help = "Examples:
  fencectl validate billing/march 42
  fencectl validate billing/march 42 --json || echo \"no longer the holder\"")]
    Validate {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
        /// The fencing token to check.
        token: u64,
    },
    /// List, add, promote and remove cluster members (admin).
    #[command(
        subcommand,
        after_help = "Examples:
  fencectl member list
  fencectl member add 4 --peer 10.0.0.4:7201 --client 10.0.0.4:7101
  fencectl member promote 4 --wait 60s
  fencectl member remove 2"
    )]
    Member(member::MemberCmd),
    /// Backups of the cluster's state.
    #[command(
        subcommand,
        after_help = "Examples:
  fencectl snapshot save /backups/fenced-$(date -u +%Y%m%dT%H%M%SZ).fncd"
    )]
    Snapshot(snapshot::SnapshotCmd),
    /// Write to or read from a fenced-resource service.
    #[command(
        subcommand,
        after_help = "Examples:
  fencectl resource put invoice-7 --token 4 --owner-id $OWNER --value paid
  fencectl resource get invoice-7"
    )]
    Resource(resource::ResourceCmd),
    /// Fenced writes to the cluster's own key-value store.
    #[command(
        subcommand,
        after_help = "Examples:
  fencectl kv put config/active primary-b --resource failover --owner-id $OWNER --token 7
  fencectl kv get config/active"
    )]
    Kv(kv::KvCmd),
    /// Take the lease and hold it, renewing, until Ctrl-C (release) or loss
    /// (exit 4).
    #[command(after_help = "Examples:
  fencectl lock demo --ttl 30s
  fencectl lock demo --ttl 30s --wait 1m")]
    Lock {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
        /// Lease length, e.g. 30s or 2m: between the cluster's bounds, 1s
        /// and 1h unless its operator changed them.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// If another owner holds the resource, wait this long for it (0s:
        /// answer at once; at most 1h unless the operator changed it). While
        /// waiting, a line on stderr says who holds it and for how long.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
    /// Run COMMAND while holding the lease. The command gets FENCED_RESOURCE,
    /// FENCED_FENCING_TOKEN, FENCED_OWNER_ID and FENCED_ENDPOINTS, and runs in its own
    /// process group. If the lease is lost, on Ctrl-C or SIGTERM, when the
    /// command exits, and if fencectl dies, that whole group gets SIGTERM,
    /// then SIGKILL after --grace. Exit: the command's code (127 if it could
    /// not start), 4 if the lease was lost, 3 if not granted within --wait.
    #[command(after_help = "Examples:
  fencectl run demo --ttl 30s -- ./nightly-job.sh
  fencectl run billing-batch --ttl 1m --wait 5m --grace 10s -- python batch.py --month 2026-07")]
    Run {
        /// The resource's name, 1 to 200 bytes.
        resource: String,
        /// Lease length, renewed while the command runs, e.g. 30s or 2m:
        /// between the cluster's bounds, 1s and 1h unless its operator
        /// changed them.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// If another owner holds the resource, wait this long for it (0s:
        /// answer at once; at most 1h unless the operator changed it). While
        /// waiting, a line on stderr says who holds it and for how long.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Time between SIGTERM and SIGKILL; default half the safety margin.
        #[arg(long, value_parser = humantime::parse_duration)]
        grace: Option<Duration>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Print a shell completion script for fencectl.
    #[command(after_help = "Examples:
  fencectl completions bash > ~/.local/share/bash-completion/completions/fencectl
  fencectl completions zsh > \"${fpath[1]}/_fencectl\"
  fencectl completions fish > ~/.config/fish/completions/fencectl.fish")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The supervisor `run` starts between itself and the command.
    #[command(name = "__supervise", hide = true)]
    Supervise {
        /// The pid of the `fencectl run` that started it.
        #[arg(long)]
        parent: u32,
        #[arg(long)]
        grace_ms: u64,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// What a command prints and how it ends.
struct Report {
    value: Value,
    text: String,
    code: u8,
}

impl Report {
    /// A command that printed its own lines already.
    fn printed(code: u8) -> Report {
        Report {
            value: Value::Null,
            text: String::new(),
            code,
        }
    }
}

fn owner_id(text: &str) -> Result<OwnerId, ClientError> {
    OwnerId::parse(text).map_err(|e| ClientError::InvalidArgument(e.to_string()))
}

/// A `--token` argument: tokens start at 1.
fn token(value: u64) -> Result<Token, ClientError> {
    Token::new(value).map_err(|e| ClientError::InvalidArgument(e.to_string()))
}

/// How a command prints: one JSON object, and whether progress lines go
/// to stderr while it waits.
#[derive(Clone, Copy)]
pub struct Output {
    pub json: bool,
    pub talk: bool,
}

impl Output {
    /// Whether to say, while waiting up to `wait` for a held resource, who
    /// holds it (no wait, nothing to say).
    pub fn talks_while(self, wait: Duration) -> bool {
        self.talk && !wait.is_zero()
    }
}

async fn execute(
    client: &Client,
    tls: Option<&TlsOptions>,
    bearer: Option<&str>,
    command: Cmd,
    out: Output,
) -> Result<Report, ClientError> {
    let json_out = out.json;
    Ok(match command {
        Cmd::Resource(command) => return resource::execute(command, tls, bearer).await,
        Cmd::Snapshot(command) => {
            let (value, text) = snapshot::execute(client, command).await?;
            Report {
                value,
                text,
                code: 0,
            }
        }
        Cmd::Member(command) => return member::execute(client, command).await,
        Cmd::Kv(command) => return kv::execute(client, command, json_out).await,
        Cmd::Lock {
            resource,
            ttl,
            wait,
        } => {
            let code = hold::lock(client, &resource, ttl, wait, out).await?;
            return Ok(Report::printed(code));
        }
        Cmd::Run {
            resource,
            ttl,
            wait,
            grace,
            command,
        } => {
            let code = hold::run(client, &resource, ttl, wait, grace, &command, out).await?;
            return Ok(Report::printed(code));
        }
        Cmd::Completions { .. } => {
            return Err(ClientError::InvalidArgument(
                "completions are printed before any connection".into(),
            ))
        }
        Cmd::Supervise { .. } => {
            return Err(ClientError::InvalidArgument(
                "__supervise runs only as fencectl run's supervisor".into(),
            ))
        }
        Cmd::Acquire {
            resource,
            ttl,
            owner_id: owner,
            wait,
        } => {
            let owner = match owner {
                Some(o) => owner_id(&o)?,
                None => OwnerId::random(),
            };
            let acquired = waiting::while_waiting(
                client,
                &resource,
                out.talks_while(wait),
                client.acquire_once(&resource, owner, ttl, wait),
            );
            match acquired.await? {
                AcquireOutcome::Granted {
                    token,
                    expires_at_ms,
                    ttl_ms,
                    wall_time_unix_ms,
                    ..
                } => Report {
                    value: json!({"status": "granted", "resource": resource, "token": token,
                        "owner_id": owner.to_string(), "ttl_ms": ttl_ms, "expires_at_ms": expires_at_ms,
                        "granted_at": when::rfc3339(wall_time_unix_ms),
                        "wall_time_unix_ms": wall_time_unix_ms}),
                    text: format!(
                        "granted {resource}: token {token}, owner_id {owner}, ttl {ttl_ms} ms{}",
                        when::at(wall_time_unix_ms)
                    ),
                    code: 0,
                },
                AcquireOutcome::Held {
                    current_token,
                    remaining_ms,
                } => Report {
                    value: json!({"status": "held", "resource": resource, "current_token": current_token,
                        "remaining_ms": remaining_ms}),
                    text: format!(
                        "held {resource}: by token {current_token}, {remaining_ms} ms left"
                    ),
                    code: 3,
                },
                AcquireOutcome::Ended { reason } => ended_report(&resource, owner, reason),
            }
        }
        Cmd::Renew {
            resource,
            owner_id: owner,
            token: value,
            ttl,
        } => {
            let (owner, token) = (owner_id(&owner)?, token(value)?);
            let dated = client.renew_dated(&resource, owner, token, ttl).await?;
            let at = dated.wall_time_unix_ms;
            match dated.outcome {
                RenewOutcome::Renewed { expires_at, ttl_ms } => Report {
                    value: json!({"status": "renewed", "resource": resource, "token": token,
                        "ttl_ms": ttl_ms, "expires_at_ms": expires_at.as_millis(),
                        "renewed_at": when::rfc3339(at), "wall_time_unix_ms": at}),
                    text: format!(
                        "renewed {resource}: token {token}, ttl {ttl_ms} ms{}",
                        when::at(at)
                    ),
                    code: 0,
                },
                RenewOutcome::Lost(reason) => lost_report("lost", &resource, token, reason),
                // A refusal, like `held`: the lease lives with its session.
                RenewOutcome::KeptBySession => Report {
                    value: json!({"status": "kept_by_session", "resource": resource,
                        "token": token}),
                    text: format!(
                        "not renewed {resource}: token {token} is kept by its session; \
                         keep the session alive instead"
                    ),
                    code: 3,
                },
            }
        }
        Cmd::Release {
            resource,
            owner_id: owner,
            token: value,
        } => {
            let (owner, token) = (owner_id(&owner)?, token(value)?);
            let dated = client.release_dated(&resource, owner, token).await?;
            let at = dated.wall_time_unix_ms;
            match dated.outcome {
                ReleaseOutcome::Released => Report {
                    value: json!({"status": "released", "resource": resource, "token": token,
                        "released_at": when::rfc3339(at), "wall_time_unix_ms": at}),
                    text: format!("released {resource}: token {token}{}", when::at(at)),
                    code: 0,
                },
                ReleaseOutcome::NotHolder(reason) => {
                    lost_report("not_holder", &resource, token, reason)
                }
            }
        }
        Cmd::Describe { resource } => {
            let d = client.describe(&resource).await?;
            Report {
                value: json!({"resource": resource, "last_token": d.last_token, "held": d.held,
                    "remaining_ms": d.remaining_ms, "waiters": d.waiters,
                    "cluster_time_ms": d.cluster_time_ms,
                    "time": when::rfc3339(d.wall_time_unix_ms),
                    "label": (!d.label.is_empty()).then_some(&d.label)}),
                text: if d.held {
                    format!(
                        "{resource}: held, token {}, {} ms left, {} waiting{}",
                        d.last_token,
                        d.remaining_ms,
                        d.waiters,
                        if d.label.is_empty() {
                            String::new()
                        } else {
                            format!(", job {:?}", d.label)
                        }
                    )
                } else {
                    format!("{resource}: free, last token {}", d.last_token)
                },
                code: 0,
            }
        }
        Cmd::Watch {
            prefix,
            from,
            max_events,
        } => {
            let code = observe::watch(client, &prefix, from, max_events, json_out).await?;
            return Ok(Report::printed(code));
        }
        Cmd::History { resource, limit } => {
            let (value, text) = observe::history(client, &resource, limit).await?;
            Report {
                value,
                text,
                code: 0,
            }
        }
        Cmd::Validate {
            resource,
            token: value,
        } => {
            let (value, text, code) = observe::validate(client, &resource, token(value)?).await?;
            Report { value, text, code }
        }
        Cmd::Status => {
            let each = client.status_of_each_answered().await?;
            let mut nodes = Vec::new();
            let mut lines = Vec::new();
            let mut summary = None;
            for (endpoint, r) in each {
                match r {
                    Ok(s) => {
                        lines.push(format!(
                            "{endpoint}: node {} {} term {} leader {} applied {} leases {}{}",
                            s.node_id,
                            s.role,
                            s.term,
                            s.leader_id,
                            s.last_applied,
                            s.live_leases,
                            if s.repairing {
                                " repairing (no vote until caught up)"
                            } else {
                                ""
                            }
                        ));
                        let members: Vec<Value> = s
                            .members
                            .iter()
                            .map(|m| json!({"id": m.id, "peer_addr": m.peer_addr, "client_addr": m.client_addr, "voter": m.voter}))
                            .collect();
                        let node = json!({"endpoint": endpoint, "node_id": s.node_id, "role": s.role,
                            "leader_id": s.leader_id, "term": s.term, "last_applied": s.last_applied,
                            "live_leases": s.live_leases, "last_token": s.last_token, "log_syncs": s.log_syncs,
                            "applied_entries": s.applied_entries, "applied_commands": s.applied_commands,
                            "repairing": s.repairing, "members": members});
                        if summary.is_none() || s.role == "leader" {
                            summary = Some(node.clone());
                        }
                        nodes.push(node);
                    }
                    Err(e) => {
                        lines.push(format!("{endpoint}: {e}"));
                        nodes.push(json!({"endpoint": endpoint, "error": e.to_string()}));
                    }
                }
            }
            let Some(summary) = summary else {
                return Err(ClientError::Server(lines.join("; ")));
            };
            Report {
                value: json!({"leader_id": summary["leader_id"], "term": summary["term"],
                    "members": summary["members"], "last_applied": summary["last_applied"], "nodes": nodes}),
                text: lines.join("\n"),
                code: 0,
            }
        }
    })
}

fn lost_report(status: &str, resource: &str, token: Token, reason: LostReason) -> Report {
    let value =
        json!({"status": status, "resource": resource, "token": token, "reason": reason.as_str()});
    let text = format!("{status} {resource}: token {token}, {}", reason.as_str());
    refusal_report(value, text, reason)
}

/// An acquire whose owner id's lease already ended: nothing was granted.
fn ended_report(resource: &str, owner: OwnerId, reason: LostReason) -> Report {
    let value = json!({"status": "ended", "resource": resource, "owner_id": owner.to_string(),
        "reason": reason.as_str()});
    let text = format!(
        "ended {resource}: owner_id {owner} already had its lease, {}; use a new owner id",
        reason.as_str()
    );
    refusal_report(value, text, reason)
}

/// Adds the current token of a superseded lease; an expected refusal exits 3.
fn refusal_report(mut value: Value, mut text: String, reason: LostReason) -> Report {
    if let LostReason::Superseded { current_token } = reason {
        value["current_token"] = json!(current_token);
        text.push_str(&format!(" (current token {current_token})"));
    }
    Report {
        value,
        text,
        code: 3,
    }
}

/// Exit code when no node answered, or none could serve the call, within
/// --timeout: the one error worth retrying as it is.
const EXIT_UNAVAILABLE: u8 = 6;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The supervisor runs before and without the client's runtime.
    if let Cmd::Supervise {
        parent,
        grace_ms,
        command,
    } = &cli.command
    {
        return ExitCode::from(supervise::supervise(
            *parent,
            Duration::from_millis(*grace_ms),
            command,
        ));
    }
    if let Cmd::Completions { shell } = &cli.command {
        // Into memory first: a closed stdout (`| head`) is an error, not a panic.
        let mut script = Vec::new();
        clap_complete::generate(*shell, &mut Cli::command(), "fencectl", &mut script);
        return match std::io::Write::write_all(&mut std::io::stdout(), &script) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fencectl completions: {e}");
                ExitCode::from(1)
            }
        };
    }
    let endpoints: Vec<String> = if cli.endpoints.is_empty() {
        DEV_ENDPOINTS.iter().map(|s| s.to_string()).collect()
    } else {
        cli.endpoints.clone()
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencectl: {e}");
            return ExitCode::from(1);
        }
    };
    let json_out = cli.json;
    let out = Output {
        json: json_out,
        talk: !json_out && !cli.quiet,
    };
    let result = runtime.block_on(async {
        let tls = (cli.tls_cacert.is_some()
            || cli.tls_cert.is_some()
            || cli.tls_key.is_some()
            || endpoints.iter().any(|e| e.starts_with("https://")))
        .then(|| TlsOptions {
            ca: cli.tls_cacert.clone(),
            cert: cli.tls_cert.clone(),
            key: cli.tls_key.clone(),
        });
        // A person waits on fencectl: a cluster where nothing listens is
        // said at once, not after --timeout.
        let mut client = Client::with_tls(&endpoints, tls.as_ref())?
            .with_call_timeout(cli.timeout)
            .with_fail_fast(true);
        let bearer = bearer_token(&cli)?;
        if let Some(token) = &bearer {
            client = client.with_token(token)?;
        }
        if let Some(label) = &cli.job_label {
            client = client.with_job_label(label)?;
        }
        execute(&client, tls.as_ref(), bearer.as_deref(), cli.command, out).await
    });
    match result {
        Ok(report) => {
            if !report.value.is_null() && json_out {
                println!("{}", report.value);
            } else if !report.text.is_empty() {
                println!("{}", report.text);
            }
            ExitCode::from(report.code)
        }
        Err(e) => {
            if json_out {
                println!("{}", json!({"status": "error", "error": e.to_string()}));
            }
            eprintln!("fencectl: {e}");
            ExitCode::from(match e {
                ClientError::InvalidArgument(_) => 2,
                ClientError::NotGranted { .. } | ClientError::AttemptEnded { .. } => 3,
                // Not 4: `lock` and `run` exit 4 when the lease is lost.
                ClientError::Unauthenticated(_) | ClientError::PermissionDenied(_) => 5,
                ClientError::Unavailable(_) => EXIT_UNAVAILABLE,
                _ => 1,
            })
        }
    }
}
