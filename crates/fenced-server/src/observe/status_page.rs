//! The node's status page, on the metrics listener: `/` is a static shell
//! for browsers, `/status` the view rendered here, for admins only.
//!
//! Browser authentication (docs/DECISIONS.md, "The status page: a static
//! shell, a rendered view, and the token in the URL fragment"): the shell
//! holds no data and needs no credential. Its script reads a token from the
//! URL fragment (`#token=…`, which a browser never sends), keeps it in
//! `sessionStorage`, removes it from the address bar, and fetches
//! `/status` with `Authorization: Bearer`. curl and scripts call `/status`
//! with the header themselves; a client certificate on the HTTPS metrics
//! port is an identity too. Everything rendered from state passes through
//! [`escape`]; a Content-Security-Policy admits only the page's own script
//! and style, by hash.

use std::{fmt::Write, sync::LazyLock};

use base64::Engine;
use fenced_core::{LeaseList, RESOURCE_NAME_MAX_BYTES};
use sha2::{Digest, Sha256};

use crate::{
    rpc::{role_name, NodeContext},
    types::NodeId,
};

/// The shell's path.
pub const SHELL_PATH: &str = "/";
/// The rendered view's path.
pub const STATUS_PATH: &str = "/status";
/// Lease rows shown when the request does not say.
pub const DEFAULT_ROWS: usize = 100;
/// The most lease rows one view shows; the rest are counted.
pub const MAX_ROWS: usize = 1_000;

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0 1.5em}\
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#f3f3f3}.warn{color:#a40}.note{color:#666}\
code{background:#f3f3f3;padding:0 .2em}";

const SCRIPT: &str = r#""use strict";
(function () {
  var KEY = "fenced-status-token";
  var fragment = new URLSearchParams(location.hash.slice(1));
  if (fragment.has("token")) {
    sessionStorage.setItem(KEY, fragment.get("token"));
    history.replaceState(null, "", location.pathname + location.search);
  }
  var prefix = document.getElementById("prefix");
  var state = document.getElementById("state");
  var params = new URLSearchParams(location.search);
  prefix.value = params.get("prefix") || "";
  var resource = params.get("resource");
  function refresh() {
    var query = new URLSearchParams();
    if (prefix.value) query.set("prefix", prefix.value);
    if (resource) query.set("resource", resource);
    var headers = {};
    var token = sessionStorage.getItem(KEY);
    if (token) headers.Authorization = "Bearer " + token;
    fetch("/status?" + query, { headers: headers, cache: "no-store" })
      .then(function (r) {
        return r.text().then(function (text) {
          if (!r.ok) {
            var hint = r.status === 401
              ? " (open this page as /#token=<admin token>, or present a client certificate)"
              : "";
            state.textContent = r.status + " " + text.trim() + hint;
            state.className = "warn";
            return;
          }
          var view = new DOMParser().parseFromString(text, "text/html").getElementById("status");
          if (view) document.getElementById("status").replaceWith(document.adoptNode(view));
          state.textContent = "updated " + new Date().toLocaleTimeString();
          state.className = "note";
        });
      })
      .catch(function (e) {
        state.textContent = "this node does not answer: " + e;
        state.className = "warn";
      });
  }
  document.getElementById("filter").addEventListener("submit", function (e) {
    e.preventDefault();
    var query = new URLSearchParams();
    if (prefix.value) query.set("prefix", prefix.value);
    resource = null;
    var search = query.toString();
    history.replaceState(null, "", location.pathname + (search ? "?" + search : ""));
    refresh();
  });
  refresh();
  setInterval(function () { if (!document.hidden) refresh(); }, 2000);
})();
"#;

fn sha256_source(text: &str) -> String {
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()))
    )
}

/// The shell's policy: its one script and one style, fetches to this
/// origin, nothing else (no frames, no forms sent, no base, no plugins).
pub static SHELL_CSP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        sha256_source(SCRIPT),
        sha256_source(STYLE)
    )
});

/// The view's policy: no script at all, its one style.
pub static STATUS_CSP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; style-src {}; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'",
        sha256_source(STYLE)
    )
});

static SHELL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>fenced status</title><style>{STYLE}</style></head><body>\n\
         <h1>fenced</h1>\n\
         <form id=\"filter\"><label>Resource prefix <input id=\"prefix\" maxlength=\"{RESOURCE_NAME_MAX_BYTES}\" \
         autocomplete=\"off\"></label> <button>Filter</button></form>\n\
         <p id=\"state\" class=\"note\" role=\"status\">loading</p>\n\
         <main id=\"status\"></main>\n\
         <script>{SCRIPT}</script>\n</body></html>\n"
    )
});

/// Whether this node serves the status page on its metrics listener at
/// `addr`: not when a bearer token would cross the network in clear (auth
/// on, plaintext, an address other than loopback). The error says why and
/// what to change.
pub fn availability(
    addr: Option<std::net::SocketAddr>,
    tls: bool,
    auth: bool,
) -> Result<(), String> {
    match addr {
        Some(a) if auth && !tls && !a.ip().is_loopback() => Err(format!(
            "the status page is off: the metrics listener {a} is plaintext on an address \
             other than loopback, and an admin token would cross the network in clear; \
             serve it over HTTPS with --metrics-tls"
        )),
        // With auth off nobody can be asked for admin: only loopback, where
        // the node's own host is the boundary.
        Some(a) if !auth && !a.ip().is_loopback() => Err(format!(
            "the status page is off: authentication is off and the metrics listener {a} is \
             not on loopback, so anyone who reaches it would read every live lease; turn \
             authentication on (--auth-policy, --auth-tokens) to serve it to admins"
        )),
        _ => Ok(()),
    }
}

/// The address others link to this node's page by: the metrics listener's
/// port, and its address unless that is a wildcard, else the host of this
/// node's client address (the name clients and peers reach it by).
pub fn url_of(listener: std::net::SocketAddr, tls: bool, client_addr: &str) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = if listener.ip().is_unspecified() {
        let host = client_addr
            .rsplit_once(':')
            .map_or(client_addr, |(host, _)| host);
        if host.is_empty() {
            listener.ip().to_string()
        } else {
            host.to_string()
        }
    } else {
        match listener.ip() {
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        }
    };
    format!("{scheme}://{host}:{}/", listener.port())
}

/// A page address another node gave, if it is one a link may carry: an
/// http(s) URL of printable characters, a name's length at most. Anything
/// else (a `javascript:` URL from a damaged peer) is not linked.
pub fn linkable(url: &str) -> Option<&str> {
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() <= 300
        && url.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(url)
}

/// What `/` says where the page is off: no script, so no token is sent.
pub fn unavailable(why: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>fenced status</title><style>{STYLE}</style></head><body>\n\
         <h1>fenced</h1>\n<p class=\"warn\">{}</p>\n</body></html>\n",
        escape(why)
    )
}

/// The shell: the same bytes for everyone, no data in it.
pub fn shell() -> &'static str {
    &SHELL
}

/// Makes `text` safe as HTML element content and as a quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What a `/status` request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Only resources whose names start with this.
    pub prefix: String,
    /// At most this many lease rows.
    pub rows: usize,
    /// The one resource whose history the view adds.
    pub resource: Option<String>,
}

impl Default for Query {
    fn default() -> Self {
        Self {
            prefix: String::new(),
            rows: DEFAULT_ROWS,
            resource: None,
        }
    }
}

/// Reads `prefix` and `rows` from a query string (form encoding, as a
/// browser's `URLSearchParams` writes it); the error names the field and
/// its bound.
pub fn parse_query(query: Option<&str>) -> Result<Query, String> {
    let mut parsed = Query::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value).ok_or_else(|| format!("{key}: not UTF-8 once decoded"))?;
        match key {
            "prefix" => {
                if value.len() > RESOURCE_NAME_MAX_BYTES {
                    return Err(format!(
                        "prefix: {} bytes, at most {RESOURCE_NAME_MAX_BYTES} (a resource name's bound)",
                        value.len()
                    ));
                }
                parsed.prefix = value;
            }
            "rows" => {
                parsed.rows = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_ROWS).contains(n))
                    .ok_or_else(|| {
                        format!("rows: {value:?} is not a number from 1 to {MAX_ROWS}")
                    })?;
            }
            "resource" => {
                let name =
                    fenced_core::ResourceName::new(&value).map_err(|e| format!("resource: {e}"))?;
                parsed.resource = Some(name.as_str().to_string());
            }
            other => {
                let other = decode(other).unwrap_or_default();
                return Err(format!(
                    "unknown parameter {other:?}: only `prefix`, `rows` and `resource` are read"
                ));
            }
        }
    }
    Ok(parsed)
}

fn decode(text: &str) -> Option<String> {
    let plus_as_space = text.replace('+', " ");
    percent_encoding::percent_decode_str(&plus_as_space)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

/// One member as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRow {
    pub id: NodeId,
    pub voter: bool,
    pub client_addr: String,
    pub peer_addr: String,
    /// The last log index known to be on that member: this node's applied
    /// index for itself; for the others, only a leader knows it.
    pub index: Option<u64>,
    /// How many entries of the leader's log that member lacks.
    pub lag: Option<u64>,
    /// The member's own status page, as it answered (checked by
    /// [`linkable`]); `None` when it serves none or did not answer.
    pub status_page: Option<String>,
}

/// Everything the view shows, read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusView {
    pub node_id: NodeId,
    pub state: &'static str,
    pub term: u64,
    pub leader: Option<(NodeId, String)>,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub cluster_time_ms: u64,
    /// The leader's wall clock at that cluster time, if the cluster has an
    /// anchor (for people; see `fenced_core::WallClock`).
    pub wall_time_unix_ms: Option<u64>,
    pub members: Vec<MemberRow>,
    pub query: Query,
    pub leases: LeaseList,
    /// The newest grants, releases and expiries under the prefix, newest
    /// first, at most [`RECENT_ROWS`].
    pub recent: Vec<Recent>,
    /// The history of the resource the query names.
    pub history: Option<History>,
}

/// The grants of one resource the table remembers, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    pub resource: String,
    pub entries: Vec<fenced_core::DatedHistoryEntry>,
    /// How many grants per resource the table keeps.
    pub kept: usize,
}

/// One recent grant or end, with the leader's wall clock at its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    pub change: fenced_core::Change,
    pub unix_ms: Option<u64>,
}

/// Rows of recent grants and ends the page shows.
pub const RECENT_ROWS: usize = 20;
/// How far back in the change window the page looks for them: a bounded
/// scan, whatever the prefix matches.
const RECENT_SCAN: u64 = 2_000;

/// `1234` ms as `1.2 s`, longer spans in minutes and hours.
fn duration(ms: u64) -> String {
    let s = ms / 1_000;
    match s {
        0..60 => format!("{:.1} s", ms as f64 / 1_000.0),
        60..3_600 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3_600, (s % 3_600) / 60),
    }
}

/// A wall time as people read it, `2026-12-06 17:01:02 UTC`; a dash when
/// unknown.
fn utc(unix_ms: Option<u64>) -> String {
    unix_ms.map_or_else(
        || "–".to_string(),
        |ms| {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            humantime::format_rfc3339_seconds(t)
                .to_string()
                .replacen('T', " ", 1)
                .replace('Z', " UTC")
        },
    )
}

fn or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| v.to_string())
}

/// A resource's name as a link to its history on this page.
fn resource_link(name: &str) -> String {
    let query: String =
        percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string();
    format!(
        "<a href=\"/?resource={}\"><code>{}</code></a>",
        escape(&query),
        escape(name)
    )
}

fn event_name(kind: fenced_core::ChangeKind) -> &'static str {
    match kind {
        fenced_core::ChangeKind::Granted => "granted",
        fenced_core::ChangeKind::Released => "released",
        fenced_core::ChangeKind::Expired => "expired",
        fenced_core::ChangeKind::Superseded => "superseded",
    }
}

/// The view as a whole HTML document; the shell takes its `<main>`.
pub fn render(v: &StatusView) -> String {
    let mut out = String::with_capacity(4 * 1024 + 200 * v.leases.rows.len());
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>fenced node {id} status</title><style>{STYLE}</style></head><body>\n\
         <main id=\"status\">\n<h2>Node {id}: {state}, term {term}</h2>\n",
        id = v.node_id,
        state = v.state,
        term = v.term,
    );
    match &v.leader {
        Some((id, addr)) => {
            let page = v
                .members
                .iter()
                .find(|m| m.id == *id && *id != v.node_id)
                .and_then(|m| m.status_page.as_deref())
                .map(|url| {
                    format!(
                        "; <a id=\"leader-page\" href=\"{url}\">its status page</a>",
                        url = escape(url)
                    )
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "<p>Leader: <strong id=\"leader\" data-leader=\"{id}\">node {id}</strong> \
                 (client address <code>{}</code>{page})</p>",
                escape(addr)
            );
        }
        None => out.push_str(
            "<p class=\"warn\">Leader: <strong id=\"leader\" data-leader=\"none\">none known</strong></p>\n",
        ),
    }
    let _ = writeln!(
        out,
        "<p>Applied index {}, last log index {}, cluster time {} (<span id=\"now\">{}</span> \
         on the leader's clock).</p>",
        v.applied_index,
        v.last_log_index,
        duration(v.cluster_time_ms),
        utc(v.wall_time_unix_ms)
    );
    out.push_str(
        "<h3>Members</h3>\n<table id=\"members\"><thead><tr><th>node</th><th>role</th>\
         <th>client address</th><th>peer address</th><th>log index</th><th>lag</th>\
         <th>status page</th></tr></thead><tbody>\n",
    );
    let leader_id = v.leader.as_ref().map(|(id, _)| *id);
    for m in &v.members {
        let mut role = String::from(if m.voter { "voter" } else { "learner" });
        if leader_id == Some(m.id) {
            role.push_str(", leader");
        }
        if m.id == v.node_id {
            role.push_str(", this node");
        }
        let _ = writeln!(
            out,
            "<tr data-node=\"{id}\"><td class=\"n\">{id}</td><td>{role}</td><td><code>{}</code></td>\
             <td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            escape(&m.client_addr),
            escape(&m.peer_addr),
            or_dash(m.index),
            or_dash(m.lag),
            match (m.id == v.node_id, m.status_page.as_deref()) {
                (true, _) => "this page".to_string(),
                (false, Some(url)) => format!("<a href=\"{u}\">{u}</a>", u = escape(url)),
                (false, None) => "–".to_string(),
            },
            id = m.id,
        );
    }
    out.push_str("</tbody></table>\n");
    if v.state != "leader" {
        out.push_str(
            "<p class=\"note\">The other members' log index and lag are known to the leader; \
             its page shows them.</p>\n",
        );
    }
    let shown = v.leases.rows.len();
    let which = if v.query.prefix.is_empty() {
        "All resources".to_string()
    } else {
        format!(
            "Resources starting with <code>{}</code>",
            escape(&v.query.prefix)
        )
    };
    let _ = writeln!(
        out,
        "<h3>Live leases</h3>\n<p>{which}: {} live, {shown} shown, as applied on this node.</p>",
        shown + v.leases.more,
    );
    out.push_str(
        "<table id=\"leases\"><thead><tr><th>resource</th><th>token</th><th>holder</th>\
         <th>job</th><th>granted</th><th>held for</th><th>remaining</th><th>ttl</th>\
         <th>waiters</th></tr></thead><tbody>\n",
    );
    for l in &v.leases.rows {
        // The identity, never the owner id (a capability); empty with auth off.
        let holder = if l.identity.is_empty() {
            "–".to_string()
        } else {
            format!("<code>{}</code>", escape(&l.identity))
        };
        let held = l
            .granted_at
            .map(|t| duration(v.cluster_time_ms.saturating_sub(t.as_millis())));
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td>{holder}</td><td>{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr>",
            resource_link(l.resource.as_str()),
            l.token,
            l.label
                .as_ref()
                .map_or_else(|| "–".to_string(), |j| escape(j.as_str())),
            utc(l.granted_at_unix_ms),
            held.unwrap_or_else(|| "–".to_string()),
            duration(l.remaining_ms),
            duration(l.ttl_ms),
            l.waiters,
        );
    }
    if v.leases.more > 0 {
        let _ = writeln!(
            out,
            "<tr class=\"more\"><td colspan=\"9\">and {} more (narrow the prefix)</td></tr>",
            v.leases.more
        );
    }
    out.push_str("</tbody></table>\n");
    let _ = writeln!(
        out,
        "<h3>Recent grants and ends</h3>\n<p>The newest {} ownership changes under \
         this prefix among the cluster's last {RECENT_SCAN} (as `fencectl watch` \
         sees them), newest first.</p>",
        v.recent.len()
    );
    out.push_str(
        "<table id=\"recent\"><thead><tr><th>revision</th><th>resource</th><th>event</th>\
         <th>token</th><th>age</th><th>time</th></tr></thead><tbody>\n",
    );
    for Recent { change: c, unix_ms } in &v.recent {
        let _ = writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{} ago</td><td>{}</td></tr>",
            c.revision,
            resource_link(c.resource.as_str()),
            event_name(c.kind),
            c.token.get(),
            duration(v.cluster_time_ms.saturating_sub(c.at.as_millis())),
            utc(*unix_ms),
        );
    }
    out.push_str("</tbody></table>\n");
    if let Some(h) = &v.history {
        render_history(&mut out, h, v.cluster_time_ms);
    }
    out.push_str("</main>\n</body></html>\n");
    out
}

/// One resource's grants: when each began and ended, how, and how long it
/// was held. Never the owner id (a capability).
fn render_history(out: &mut String, h: &History, now_ms: u64) {
    let _ = writeln!(
        out,
        "<h3 id=\"history-of\">History of <code>{}</code></h3>\n<p>Its last {} grants \
         (the table keeps {} per resource), newest first, as `fencectl history` shows them.</p>",
        escape(&h.resource),
        h.entries.len(),
        h.kept
    );
    out.push_str(
        "<table id=\"history\"><thead><tr><th>token</th><th>granted</th><th>ended</th>\
         <th>how</th><th>held for</th></tr></thead><tbody>\n",
    );
    for row in &h.entries {
        let e = &row.entry;
        let (ended, how, until) = match e.end {
            Some(end) => (
                utc(row.ended_at_unix_ms),
                event_name(end.how),
                end.at.as_millis(),
            ),
            None => ("–".to_string(), "live", now_ms),
        };
        let _ = writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td>{}</td><td>{ended}</td><td>{how}</td>\
             <td class=\"n\">{}</td></tr>",
            e.token,
            utc(row.granted_at_unix_ms),
            duration(until.saturating_sub(e.granted_at.as_millis())),
        );
    }
    if h.entries.is_empty() {
        out.push_str("<tr><td colspan=\"5\">no grant remembered</td></tr>\n");
    }
    out.push_str("</tbody></table>\n");
}

/// Reads the view from the node. The cluster time it shows (and counts
/// remaining time from) is made durable first, as for a Describe: no later
/// leader's clock starts below a time a page revealed.
pub async fn gather(ctx: &NodeContext, query: Query) -> Result<StatusView, String> {
    let (now, as_leader_time) = ctx.read_time();
    ctx.replica
        .time
        .floor()
        .make_durable(as_leader_time)
        .await
        .map_err(|e| format!("cannot store the cluster time: {e}"))?;
    let shared = std::sync::Arc::clone(&ctx.replica.shared);
    let (prefix, rows) = (query.prefix.clone(), query.rows);
    // A pass over the records under the prefix: off the runtime thread.
    let leases = tokio::task::spawn_blocking(move || shared.leases(&prefix, now, rows))
        .await
        .map_err(|e| format!("listing leases: {e}"))?;
    let history = query.resource.as_ref().map(|resource| History {
        resource: resource.clone(),
        entries: ctx.replica.shared.dated_history(resource, usize::MAX),
        kept: ctx.replica.shared.history_len(),
    });
    let changes = recent_changes(ctx, &query.prefix);
    let walls = ctx.replica.shared.wall_ms_of(&changes);
    let recent = changes
        .into_iter()
        .zip(walls)
        .map(|(change, unix_ms)| Recent { change, unix_ms })
        .collect();
    let m = ctx.replica.raft.metrics().borrow().clone();
    let leader = m.current_leader.map(|id| {
        let addr = m
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.client_addr.clone())
            .unwrap_or_default();
        (id, addr)
    });
    let last_log_index = m.last_log_index.unwrap_or(0);
    let applied_index = ctx.replica.shared.last_applied().map_or(0, |l| l.index);
    let membership = m.membership_config.membership();
    let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
    let others: Vec<(NodeId, crate::types::Node)> = membership
        .nodes()
        .filter(|(id, _)| **id != ctx.replica.id)
        .map(|(id, node)| (*id, node.clone()))
        .collect();
    let pages = status_pages(ctx, others).await;
    let members = membership
        .nodes()
        .map(|(id, node)| {
            let replicated = m
                .replication
                .as_ref()
                .and_then(|r| r.get(id))
                .map(|matched| matched.map_or(0, |l| l.index));
            let index = if *id == ctx.replica.id {
                Some(applied_index)
            } else {
                replicated
            };
            MemberRow {
                id: *id,
                voter: voters.contains(id),
                client_addr: node.client_addr.clone(),
                peer_addr: node.peer_addr.clone(),
                index,
                lag: replicated.map(|i| last_log_index.saturating_sub(i)),
                status_page: pages.get(id).cloned(),
            }
        })
        .collect();
    Ok(StatusView {
        node_id: ctx.replica.id,
        state: role_name(m.state),
        term: m.current_term,
        leader,
        last_log_index,
        applied_index,
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: ctx.replica.shared.wall_ms_at(now),
        members,
        query,
        leases,
        recent,
        history,
    })
}

/// How long the page waits for another member to say where its page is.
const PAGE_ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// Each other member's status page, asked over the peer port (Status
/// without the digest needs no grant), all at once and briefly: a member
/// that does not answer in time gets no link.
async fn status_pages(
    ctx: &NodeContext,
    others: Vec<(NodeId, crate::types::Node)>,
) -> std::collections::BTreeMap<NodeId, String> {
    let mut asks = tokio::task::JoinSet::new();
    for member in others {
        let channel = ctx.channel_to(&member);
        asks.spawn(async move {
            let mut request = tonic::Request::new(fenced_proto::v1::StatusRequest::default());
            request.set_timeout(PAGE_ASK_TIMEOUT);
            let mut client = fenced_proto::v1::cluster_client::ClusterClient::new(channel.ok()?);
            let call = client.status(request);
            let answer = tokio::time::timeout(PAGE_ASK_TIMEOUT, call)
                .await
                .ok()?
                .ok()?;
            let url = linkable(&answer.get_ref().status_page_url)?.to_string();
            Some((member.0, url))
        });
    }
    let mut pages = std::collections::BTreeMap::new();
    while let Some(answer) = asks.join_next().await {
        if let Ok(Some((id, url))) = answer {
            pages.insert(id, url);
        }
    }
    pages
}

/// The newest [`RECENT_ROWS`] changes under `prefix` among the last
/// [`RECENT_SCAN`] the table keeps, newest first.
fn recent_changes(ctx: &NodeContext, prefix: &str) -> Vec<fenced_core::Change> {
    let revision = ctx.replica.shared.revision();
    let from = revision.saturating_sub(RECENT_SCAN);
    let mut changes = match ctx
        .replica
        .shared
        .changes_after(from, prefix, RECENT_SCAN as usize)
    {
        Ok(found) => found.changes,
        // Fewer kept than the scan: start from the oldest one kept.
        Err(compacted) => ctx
            .replica
            .shared
            .changes_after(
                compacted.oldest_revision.saturating_sub(1),
                prefix,
                RECENT_SCAN as usize,
            )
            .map(|found| found.changes)
            .unwrap_or_default(),
    };
    changes.reverse();
    changes.truncate(RECENT_ROWS);
    changes
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use fenced_core::{LeaseView, ResourceName};

    fn view(resource: &str, more: usize) -> StatusView {
        StatusView {
            node_id: 2,
            state: "follower",
            term: 7,
            leader: Some((1, "127.0.0.1:7001".into())),
            last_log_index: 10,
            applied_index: 9,
            cluster_time_ms: 5_000,
            wall_time_unix_ms: Some(1_800_000_003_000),
            members: vec![MemberRow {
                id: 1,
                voter: true,
                client_addr: "a<b".into(),
                peer_addr: "p".into(),
                index: None,
                lag: None,
                status_page: Some("http://10.0.0.1:9100/?a=1&b=\"".into()),
            }],
            query: Query {
                prefix: "\"><img src=x>".into(),
                rows: 1,
                resource: None,
            },
            leases: LeaseList {
                rows: vec![LeaseView {
                    label: Some(fenced_core::JobLabel::new("nightly <run>").unwrap()),
                    resource: ResourceName::new(resource).unwrap(),
                    token: fenced_core::Token::new(42).unwrap(),
                    remaining_ms: 1_500,
                    ttl_ms: 90_000,
                    waiters: 3,
                    identity: "billing-<app>".into(),
                    granted_at: Some(fenced_core::ClusterTime::from_millis(2_000)),
                    granted_at_unix_ms: Some(1_800_000_000_000),
                }],
                more,
            },
            recent: vec![Recent {
                change: fenced_core::Change {
                    revision: 77,
                    resource: ResourceName::new(resource).unwrap(),
                    kind: fenced_core::ChangeKind::Expired,
                    token: fenced_core::Token::new(41).unwrap(),
                    owner_id: fenced_core::OwnerId::from_bytes(&[7; 16]).unwrap(),
                    at: fenced_core::ClusterTime::from_millis(3_500),
                },
                unix_ms: Some(1_800_000_001_500),
            }],
            history: None,
        }
    }

    #[test]
    fn a_follower_links_to_the_leaders_page_and_every_members() {
        let html = render(&view("jobs/a", 0));
        assert!(
            html.contains(
                "(client address <code>127.0.0.1:7001</code>; <a id=\"leader-page\" \
                 href=\"http://10.0.0.1:9100/?a=1&amp;b=&quot;\">its status page</a>)"
            ),
            "{html}"
        );
        assert!(
            html.contains("<td><a href=\"http://10.0.0.1:9100/?a=1&amp;b=&quot;\">"),
            "{html}"
        );
    }

    #[test]
    fn a_page_address_is_the_listener_or_the_client_host_and_only_http_is_linked() {
        let at = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert_eq!(
            url_of(at("127.0.0.1:9101"), false, "127.0.0.1:7101"),
            "http://127.0.0.1:9101/"
        );
        assert_eq!(
            url_of(at("0.0.0.0:9100"), true, "fenced-2.db:7001"),
            "https://fenced-2.db:9100/"
        );
        assert_eq!(
            url_of(at("[::]:9100"), true, "[fd00::2]:7001"),
            "https://[fd00::2]:9100/"
        );
        assert_eq!(url_of(at("[::1]:9100"), false, ""), "http://[::1]:9100/");
        assert_eq!(
            url_of(at("0.0.0.0:9100"), false, ""),
            "http://0.0.0.0:9100/"
        );
        assert_eq!(linkable("https://n1:9100/"), Some("https://n1:9100/"));
        for bad in [
            "javascript:alert(1)",
            "http://a b/",
            "ftp://x/",
            &format!("http://{}", "x".repeat(300)),
        ] {
            assert_eq!(linkable(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_resource_links_to_its_history_which_shows_dates_and_how_it_ended() {
        let name = "jobs/<b> &x";
        let mut v = view(name, 0);
        let html = render(&v);
        // The link's query is percent-encoded, then escaped for HTML.
        assert!(
            html.contains("<a href=\"/?resource=jobs%2F%3Cb%3E%20%26x\"><code>jobs/&lt;b&gt; &amp;x</code></a>"),
            "{html}"
        );
        assert!(!html.contains("id=\"history\""), "{html}");
        let owner = fenced_core::OwnerId::from_bytes(&[9; 16]).unwrap();
        let entry = |token, granted, end: Option<(u64, fenced_core::ChangeKind)>| {
            fenced_core::DatedHistoryEntry {
                entry: fenced_core::HistoryEntry {
                    token: fenced_core::Token::new(token).unwrap(),
                    owner_id: owner,
                    granted_at: fenced_core::ClusterTime::from_millis(granted),
                    end: end.map(|(at, how)| fenced_core::LeaseEnd {
                        at: fenced_core::ClusterTime::from_millis(at),
                        how,
                    }),
                },
                granted_at_unix_ms: Some(1_800_000_000_000 + granted),
                ended_at_unix_ms: end.map(|(at, _)| 1_800_000_000_000 + at),
            }
        };
        v.history = Some(History {
            resource: name.into(),
            entries: vec![
                entry(8, 4_000, None),
                entry(7, 1_000, Some((2_500, fenced_core::ChangeKind::Expired))),
            ],
            kept: 16,
        });
        let html = render(&v);
        let history = html.split("id=\"history\"").nth(1).unwrap();
        assert!(
            html.contains("History of <code>jobs/&lt;b&gt; &amp;x</code>"),
            "{html}"
        );
        assert!(
            history.contains("<td class=\"n\">8</td><td>2027-01-15 08:00:04 UTC</td><td>–</td><td>live</td><td class=\"n\">1.0 s</td>"),
            "{history}"
        );
        assert!(
            history.contains("<td class=\"n\">7</td><td>2027-01-15 08:00:01 UTC</td><td>2027-01-15 08:00:02 UTC</td><td>expired</td><td class=\"n\">1.5 s</td>"),
            "{history}"
        );
        // Never the owner id.
        assert!(!html.contains(&owner.to_string()), "{html}");
    }

    #[test]
    fn user_text_is_escaped_everywhere_it_appears() {
        let html = render(&view("<script>alert(1)</script>&'\"", 0));
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&amp;&#39;&quot;"),
            "{html}"
        );
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("a&lt;b"), "{html}");
        // The recent changes name the resource escaped too, and never an
        // owner id.
        assert_eq!(html.matches("&lt;script&gt;alert(1)").count(), 2, "{html}");
        assert!(!html.contains("07070707"), "{html}");
    }

    #[test]
    fn recent_grants_and_ends_show_revision_event_token_and_age() {
        let html = render(&view("jobs/a", 0));
        assert!(html.contains("<h3>Recent grants and ends</h3>"), "{html}");
        assert!(
            html.contains("<td class=\"n\">77</td><td><a href=\"/?resource=jobs%2Fa\"><code>jobs/a</code></a></td><td>expired</td><td class=\"n\">41</td><td class=\"n\">1.5 s ago</td><td>2027-01-15 08:00:01 UTC</td>"),
            "{html}"
        );
    }

    #[test]
    fn a_lease_shows_its_holders_identity_job_grant_date_and_time_held() {
        let html = render(&view("jobs/a", 0));
        assert!(
            html.contains("<td><code>billing-&lt;app&gt;</code></td><td>nightly &lt;run&gt;</td><td>2027-01-15 08:00:00 UTC</td><td class=\"n\">3.0 s</td>"),
            "{html}"
        );
        // Cluster time as a duration, beside the leader's clock.
        assert!(
            html.contains("cluster time 5.0 s (<span id=\"now\">"),
            "{html}"
        );
    }

    #[test]
    fn the_view_shows_leader_members_leases_and_what_is_left_out() {
        let html = render(&view("orders/1", 12));
        assert!(html.contains("data-leader=\"1\""), "{html}");
        assert!(html.contains("<h2>Node 2: follower, term 7</h2>"), "{html}");
        assert!(html.contains("<td class=\"n\">42</td>"), "{html}");
        assert!(
            html.contains("1.5 s") && html.contains("1 min 30 s"),
            "{html}"
        );
        assert!(html.contains("13 live, 1 shown"), "{html}");
        assert!(html.contains("and 12 more"), "{html}");
        assert!(!render(&view("orders/1", 0)).contains("more"));
    }

    #[test]
    fn queries_are_decoded_and_bounded() {
        assert_eq!(parse_query(None).unwrap(), Query::default());
        let q = parse_query(Some("prefix=a%2Fb+c%2B&rows=5")).unwrap();
        assert_eq!((q.prefix.as_str(), q.rows), ("a/b c+", 5));
        let long = "x".repeat(RESOURCE_NAME_MAX_BYTES + 1);
        let err = parse_query(Some(&format!("prefix={long}"))).unwrap_err();
        assert!(err.contains("prefix") && err.contains("200"), "{err}");
        for bad in ["rows=0", "rows=1001", "rows=x"] {
            let err = parse_query(Some(bad)).unwrap_err();
            assert!(err.contains("rows") && err.contains("1000"), "{bad}: {err}");
        }
        assert!(parse_query(Some("limit=3")).unwrap_err().contains("limit"));
        let q = parse_query(Some("resource=jobs%2Fa")).unwrap();
        assert_eq!(q.resource.as_deref(), Some("jobs/a"));
        for bad in ["resource=", "resource=%07bell", &format!("resource={long}")] {
            let err = parse_query(Some(bad)).unwrap_err();
            assert!(err.starts_with("resource:"), "{bad}: {err}");
        }
        assert!(parse_query(Some("prefix=%FF"))
            .unwrap_err()
            .contains("prefix"));
    }

    #[test]
    fn tokens_never_cross_the_network_in_clear() {
        let at = |a: &str| Some(a.parse().unwrap());
        let err = availability(at("10.0.0.1:9101"), false, true).unwrap_err();
        assert!(
            err.contains("--metrics-tls") && err.contains("10.0.0.1:9101"),
            "{err}"
        );
        assert!(availability(at("0.0.0.0:9101"), false, true).is_err());
        // Over HTTPS, or on loopback: served.
        assert!(availability(at("10.0.0.1:9101"), true, true).is_ok());
        assert!(availability(at("127.0.0.1:9101"), false, true).is_ok());
        assert!(availability(at("[::1]:9101"), false, true).is_ok());
        let page = unavailable(&err);
        assert!(!page.contains("<script") && page.contains("--metrics-tls"));
    }

    #[test]
    fn with_auth_off_the_page_is_served_on_loopback_only() {
        let at = |a: &str| Some(a.parse().unwrap());
        for (addr, tls) in [("10.0.0.1:9101", false), ("0.0.0.0:9101", true)] {
            let err = availability(at(addr), tls, false).unwrap_err();
            assert!(
                err.contains("authentication is off") && err.contains(addr),
                "{err}"
            );
        }
        assert!(availability(at("127.0.0.1:9101"), false, false).is_ok());
        assert!(availability(at("[::1]:9101"), true, false).is_ok());
    }

    #[test]
    fn the_policies_name_the_shell_script_and_style_by_hash() {
        assert!(SHELL_CSP.contains(&sha256_source(SCRIPT)));
        assert!(SHELL_CSP.contains(&sha256_source(STYLE)));
        assert!(!SHELL_CSP.contains("unsafe"));
        assert!(!STATUS_CSP.contains("script-src"));
        // The shell carries exactly the script and style the hashes name.
        assert!(shell().contains(&format!("<script>{SCRIPT}</script>")));
        assert!(shell().contains(&format!("<style>{STYLE}</style>")));
    }
}
