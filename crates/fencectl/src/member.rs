//! `fencectl member list|add|promote|remove` (admin), like etcd's
//! `etcdctl member`: a new node is added as a learner, promoted to voter
//! once it has caught up, and removed by id.

use std::time::{Duration, Instant};

use clap::Subcommand;
use fenced_client::{Client, ClientError};
use fenced_proto::v1;
use serde_json::{json, Value};

use crate::Report;

#[derive(Subcommand)]
pub enum MemberCmd {
    /// Every member: id, addresses, voter or learner, how far its log
    /// matches the leader's, and which one leads.
    #[command(after_help = "Examples:
  fencectl member list
  fencectl member list --json")]
    List,
    /// Add node ID as a learner (it receives the log but does not vote).
    /// Start it with `fenced run --join` and an empty data dir, before or
    /// after this.
    #[command(after_help = "Examples:
  fencectl member add 4 --peer 10.0.0.4:7201 --client 10.0.0.4:7101
  fenced run --id 4 --data-dir /var/lib/fenced --join 10.0.0.1:7101,10.0.0.2:7101")]
    Add {
        /// The new node's id (1 or more, never used before in this cluster).
        id: u64,
        /// Its peer (Raft) address, host:port, as the other nodes reach it.
        #[arg(long)]
        peer: String,
        /// Its client address, host:port, as clients reach it.
        #[arg(long, default_value = "")]
        client: String,
    },
    /// Make learner ID a voter. Refused while it lags the leader by more
    /// than the bound `member list` shows.
    #[command(after_help = "Examples:
  fencectl member promote 4
  fencectl member promote 4 --wait 60s")]
    Promote {
        /// The learner's node id.
        id: u64,
        /// Keep asking this long while the learner is still catching up.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
    /// Take node ID out of the cluster (a voter leaves the voters first;
    /// the leader may be removed, another one takes over). Refused for the
    /// last voter and when the voters left could not commit.
    #[command(after_help = "Examples:
  fencectl member remove 2")]
    Remove {
        /// The node id to remove (its id is retired for good).
        id: u64,
    },
}

fn member_json(m: &v1::Member) -> Value {
    json!({"id": m.id, "peer_addr": m.peer_addr, "client_addr": m.client_addr,
        "role": if m.voter { "voter" } else { "learner" }})
}

fn change_report(what: &str, id: u64, r: &v1::MembershipResponse) -> Report {
    let members: Vec<Value> = r.members.iter().map(member_json).collect();
    let list: Vec<String> = r
        .members
        .iter()
        .map(|m| format!("{}{}", m.id, if m.voter { "" } else { " (learner)" }))
        .collect();
    Report {
        value: json!({"status": what, "id": id, "log_index": r.log_index, "members": members}),
        text: format!(
            "{what} node {id} at log index {}; members: {}",
            r.log_index,
            list.join(", ")
        ),
        code: 0,
    }
}

/// The line `member list` ends with when ids were retired.
fn retired_line(ids: &[u64]) -> Option<String> {
    if ids.is_empty() {
        return None;
    }
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    Some(format!(
        "retired (removed, never added again): {}",
        ids.join(", ")
    ))
}

/// Whether a promotion was refused only because the learner is not caught
/// up yet (worth asking again).
fn still_catching_up(e: &ClientError) -> bool {
    matches!(e, ClientError::Server(m) if m.contains("lags the leader") || m.contains("has not answered the leader"))
}

pub async fn execute(client: &Client, command: MemberCmd) -> Result<Report, ClientError> {
    Ok(match command {
        MemberCmd::List => {
            let l = client.list_members().await?;
            let mut lines = vec![format!(
                "{:>4}  {:<22} {:<22} {:<8} {:>10} {:>8}  {}",
                "ID", "PEER", "CLIENT", "ROLE", "MATCH", "LAG", "LEADER"
            )];
            let mut members = Vec::new();
            for p in &l.members {
                let Some(m) = &p.member else { continue };
                let (matched, lag) = if p.matched {
                    (p.match_index.to_string(), p.lag.to_string())
                } else {
                    ("-".to_string(), "-".to_string())
                };
                lines.push(format!(
                    "{:>4}  {:<22} {:<22} {:<8} {:>10} {:>8}  {}",
                    m.id,
                    m.peer_addr,
                    m.client_addr,
                    if m.voter { "voter" } else { "learner" },
                    matched,
                    lag,
                    if p.leader { "*" } else { "" }
                ));
                let mut v = member_json(m);
                v["match_index"] = if p.matched {
                    json!(p.match_index)
                } else {
                    Value::Null
                };
                v["lag"] = if p.matched { json!(p.lag) } else { Value::Null };
                v["leader"] = json!(p.leader);
                members.push(v);
            }
            lines.push(format!(
                "leader {} term {} last index {}; a learner is promoted within {} entries",
                l.leader_id, l.term, l.last_log_index, l.promote_max_lag
            ));
            if let Some(retired) = retired_line(&l.retired_ids) {
                lines.push(retired);
            }
            Report {
                value: json!({"leader_id": l.leader_id, "term": l.term,
                    "last_log_index": l.last_log_index, "promote_max_lag": l.promote_max_lag,
                    "members": members, "retired_ids": l.retired_ids}),
                text: lines.join("\n"),
                code: 0,
            }
        }
        MemberCmd::Add {
            id,
            peer,
            client: c,
        } => {
            let r = client.add_learner(id, &peer, &c).await?;
            change_report("added learner", id, &r)
        }
        MemberCmd::Promote { id, wait } => {
            let until = Instant::now() + wait;
            let r = loop {
                match client.promote_learner(id).await {
                    Err(e) if still_catching_up(&e) && Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    r => break r?,
                }
            };
            change_report("promoted", id, &r)
        }
        MemberCmd::Remove { id } => {
            let r = client.remove_node(id).await?;
            change_report("removed", id, &r)
        }
    })
}
