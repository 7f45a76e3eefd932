//! `fencectl watch`, `history` and `validate`: read what happened to leases.

use std::time::Duration;

use fenced_client::{Client, ClientError, OwnerId, Token};
use fenced_proto::v1::{self, watch_response::Body};
use serde_json::{json, Value};
use tonic::Code;

use crate::when::{rfc3339, when};

/// The name printed for an event kind.
pub fn kind_name(kind: i32) -> &'static str {
    match v1::EventKind::try_from(kind) {
        Ok(v1::EventKind::Granted) => "granted",
        Ok(v1::EventKind::Released) => "released",
        Ok(v1::EventKind::Expired) => "expired",
        Ok(v1::EventKind::Superseded) => "superseded",
        _ => "unspecified",
    }
}

fn owner_text(bytes: &[u8]) -> String {
    OwnerId::from_bytes(bytes).map_or_else(|_| "-".into(), |o| o.to_string())
}

fn event_line(e: &v1::WatchEvent, json_out: bool) -> String {
    let resource = String::from_utf8_lossy(&e.resource);
    let owner = owner_text(&e.owner_id);
    let kind = kind_name(e.kind);
    if json_out {
        json!({"revision": e.revision, "kind": kind, "resource": resource, "token": e.token,
            "owner_id": owner, "cluster_time_ms": e.cluster_time_ms,
            "time": rfc3339(e.wall_time_unix_ms), "wall_time_unix_ms": e.wall_time_unix_ms})
        .to_string()
    } else {
        format!(
            "{} {kind} {resource} token {} owner_id {owner} at {}",
            e.revision,
            e.token,
            when(e.wall_time_unix_ms, e.cluster_time_ms)
        )
    }
}

/// A stream error the next attempt cannot fix.
fn fatal(status: &tonic::Status) -> Option<ClientError> {
    let msg = status.message().to_string();
    match status.code() {
        Code::InvalidArgument => Some(ClientError::InvalidArgument(msg)),
        Code::PermissionDenied => Some(ClientError::PermissionDenied(msg)),
        Code::Unauthenticated => Some(ClientError::Unauthenticated(msg)),
        Code::ResourceExhausted => Some(ClientError::ResourceExhausted(msg)),
        _ => None,
    }
}

/// Prints one line per event on resources under `prefix`, after `from`
/// (0: from now), until `max_events` were printed (if given). A broken
/// stream, a node going away or a `FellBehind` resume from the last
/// revision printed, on any node: nothing is missed or printed twice.
pub async fn watch(
    client: &Client,
    prefix: &str,
    from: u64,
    max_events: Option<u64>,
    json_out: bool,
) -> Result<u8, ClientError> {
    let mut last = from;
    let mut printed = 0u64;
    if max_events == Some(0) {
        return Ok(0);
    }
    loop {
        let mut stream = client.watch(prefix, last).await?;
        loop {
            match stream.message().await {
                Ok(Some(msg)) => match msg.body {
                    Some(Body::Started(s)) => last = last.max(s.revision),
                    Some(Body::Event(e)) => {
                        println!("{}", event_line(&e, json_out));
                        last = e.revision;
                        printed += 1;
                        if max_events.is_some_and(|m| printed >= m) {
                            return Ok(0);
                        }
                    }
                    Some(Body::FellBehind(f)) => {
                        eprintln!(
                            "fencectl: fell behind after revision {}; resuming",
                            f.last_sent_revision
                        );
                        break;
                    }
                    Some(Body::Compacted(c)) => {
                        return Err(ClientError::Server(format!(
                            "revision {last} is no longer kept (the oldest is {}); \
                             watch again with --from {} or from now",
                            c.oldest_revision,
                            c.oldest_revision.saturating_sub(1)
                        )));
                    }
                    None => {}
                },
                Ok(None) => break,
                Err(status) => {
                    if let Some(e) = fatal(&status) {
                        return Err(e);
                    }
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last grants of `resource`.
pub async fn history(
    client: &Client,
    resource: &str,
    limit: u32,
) -> Result<(Value, String), ClientError> {
    let h = client.history(resource, limit).await?;
    let mut lines = Vec::new();
    let mut entries = Vec::new();
    for e in &h.entries {
        let owner = owner_text(&e.owner_id);
        let live = e.ended_at_ms == 0;
        entries.push(json!({"token": e.token, "owner_id": owner,
            "granted_at": rfc3339(e.granted_at_unix_ms), "granted_at_unix_ms": e.granted_at_unix_ms,
            "granted_at_ms": e.granted_at_ms,
            "ended_at": if live { None } else { rfc3339(e.ended_at_unix_ms) },
            "ended_at_unix_ms": e.ended_at_unix_ms, "ended_at_ms": e.ended_at_ms,
            "ended": if live { "live" } else { kind_name(e.ended) }}));
        let granted = when(e.granted_at_unix_ms, e.granted_at_ms);
        lines.push(if live {
            let held = h.cluster_time_ms.saturating_sub(e.granted_at_ms);
            format!(
                "token {} owner_id {owner} granted {granted}, live (held {})",
                e.token,
                humantime::format_duration(Duration::from_secs(held / 1000))
            )
        } else {
            let held = e.ended_at_ms.saturating_sub(e.granted_at_ms);
            format!(
                "token {} owner_id {owner} granted {granted}, {} {} after {}",
                e.token,
                kind_name(e.ended),
                when(e.ended_at_unix_ms, e.ended_at_ms),
                humantime::format_duration(Duration::from_millis(held))
            )
        });
    }
    if lines.is_empty() {
        lines.push(format!("{resource}: no grants remembered"));
    }
    Ok((
        json!({"resource": resource, "entries": entries, "cluster_time_ms": h.cluster_time_ms,
            "time": rfc3339(h.wall_time_unix_ms)}),
        lines.join("\n"),
    ))
}

/// Whether `token` is still current on `resource`: exit 0 if so, else 3.
pub async fn validate(
    client: &Client,
    resource: &str,
    token: Token,
) -> Result<(Value, String, u8), ClientError> {
    let v = client.validate_token(resource, token).await?;
    let state = match v1::TokenState::try_from(v.state) {
        Ok(v1::TokenState::Current) => "current",
        Ok(v1::TokenState::Superseded) => "superseded",
        Ok(v1::TokenState::Expired) => "expired",
        Ok(v1::TokenState::Released) => "released",
        Ok(v1::TokenState::Unknown) => "unknown",
        _ => "unspecified",
    };
    let text = if state == "current" {
        format!(
            "{resource}: token {token} is current, {} ms left",
            v.remaining_ms
        )
    } else {
        format!(
            "{resource}: token {token} is {state} (current token {})",
            v.current_token
        )
    };
    Ok((
        json!({"resource": resource, "token": token, "state": state,
            "current_token": v.current_token, "remaining_ms": v.remaining_ms,
            "cluster_time_ms": v.cluster_time_ms}),
        text,
        if state == "current" { 0 } else { 3 },
    ))
}
