//! Prometheus metrics: a hand-written text exposition of the node's counters,
//! served at `/metrics` on a listener of its own (`metrics_listen`), beside
//! the status page ([`crate::observe::status_page`]).
//!
//! Every value is read at scrape time from where it already lives (the
//! node's [`Counters`](crate::counters::Counters), openraft's metrics, the
//! log's flush statistics); nothing here keeps state. Nothing below the
//! services imports this module: what it reads is updated through
//! [`crate::counters`] and [`crate::histogram`].

use std::{
    convert::Infallible,
    fmt::Write,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header, Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use openraft::ServerState;
use rustls::pki_types::CertificateDer;
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::{
    histogram::{header, label_value},
    observe::status_page,
    rpc::NodeContext,
    security::admission::Admission,
    security::auth::{Permission, Principal},
    security::limits::Port,
};

/// Most connections served at once; a new one beyond closes the oldest
/// (see [`crate::security::admission`]: a flood of silent sockets evicts itself,
/// not a scrape that takes milliseconds).
const MAX_CONNECTIONS: usize = 64;
/// Of those, most from one address (a browser opens several).
const MAX_CONNECTIONS_PER_SOURCE: usize = 16;
/// A scrape connection that has not sent its headers within this is closed.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head read (request line and headers: a bearer
/// token, a prefix of at most 200 bytes percent-encoded).
const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;
/// A scrape connection is closed after this, whatever it is doing.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

fn sample(out: &mut String, name: &str, help: &str, kind: &str, value: impl std::fmt::Display) {
    header(out, name, help, kind);
    let _ = writeln!(out, "{name} {value}");
}

/// The whole exposition, in the Prometheus text format 0.0.4.
pub fn render(ctx: &NodeContext) -> String {
    let mut out = String::with_capacity(8 * 1024);
    let c = &ctx.counters;
    for (name, help, counter) in [
        (
            "fenced_grants_total",
            "Leases granted (to callers and to waiters).",
            &c.grants,
        ),
        (
            "fenced_refusals_total",
            "Acquires refused because the resource was held, and releases by a non-holder.",
            &c.refusals,
        ),
        ("fenced_renewals_total", "Leases renewed.", &c.renewals),
        (
            "fenced_lost_renewals_total",
            "Renewals refused because the lease was expired, released or superseded, and acquires by an owner id whose lease had already ended.",
            &c.lost,
        ),
        (
            "fenced_releases_total",
            "Leases released by their holder.",
            &c.releases,
        ),
        (
            "fenced_expiries_total",
            "Leases that reached their expiry.",
            &c.expiries,
        ),
        (
            "fenced_session_keep_alives_total",
            "Sessions opened or kept alive (one write each, however many leases the session holds).",
            &c.keep_alives,
        ),
        (
            "fenced_session_expiries_total",
            "Sessions that lapsed without a keep-alive, ending every lease they held.",
            &c.session_expiries,
        ),
        (
            "fenced_kv_applied_total",
            "Fenced puts and deletes applied.",
            &c.kv_applied,
        ),
        (
            "fenced_kv_refused_total",
            "Fenced puts and deletes refused because their token was not the resource's current holder's (or older than the key's).",
            &c.kv_refused,
        ),
        (
            "fenced_applied_entries_total",
            "Log entries with commands applied to the lease table.",
            &c.entries,
        ),
        (
            "fenced_applied_commands_total",
            "Commands applied to the lease table.",
            &c.commands,
        ),
        (
            "fenced_leader_changes_total",
            "Times this node saw a new leader (a new leader id or term), the first one included.",
            &c.leader_changes,
        ),
    ] {
        sample(&mut out, name, help, "counter", counter.load(Relaxed));
    }
    sample(
        &mut out,
        "fenced_deadline_dropped_total",
        "Commands dropped unwritten because their caller's deadline passed before they were proposed (by this node as leader) or forwarded (by this node as follower).",
        "counter",
        ctx.replica.proposer.deadline_drops(),
    );
    sample(
        &mut out,
        "fenced_forwarded_requests_total",
        "Client calls this node sent on to the leader because it was not the leader.",
        "counter",
        ctx.forwarded_calls(),
    );
    header(
        &mut out,
        "fenced_identity_limit_refusals_total",
        "Acquires refused because their identity reached a per-identity limit (the setting).",
        "counter",
    );
    for (setting, counter) in [
        ("max_leases_per_identity", &c.limits.leases_per_identity),
        ("max_waiters_per_identity", &c.limits.waiters_per_identity),
    ] {
        let _ = writeln!(
            out,
            "fenced_identity_limit_refusals_total{{setting=\"{}\"}} {}",
            label_value(setting),
            counter.load(Relaxed)
        );
    }
    c.limits.render(&mut out);
    c.batch_commands.render(
        &mut out,
        "fenced_proposal_batch_commands",
        "Commands per log entry proposed by this node while leader.",
        1.0,
    );
    c.apply_us.render(
        &mut out,
        "fenced_apply_seconds",
        "Time to apply one log entry of commands to the lease table.",
        1e-6,
    );

    let flush = ctx.replica.log.flush_metrics();
    header(
        &mut out,
        "fenced_log_fsync_seconds",
        "Time spent in fdatasync of the Raft log, per synced write batch.",
        "summary",
    );
    let _ = writeln!(
        out,
        "fenced_log_fsync_seconds_sum {}\nfenced_log_fsync_seconds_count {}",
        flush.sync_us as f64 * 1e-6,
        flush.sync_batch_count
    );
    sample(
        &mut out,
        "fenced_log_fsync_max_seconds",
        "The longest single fdatasync of the Raft log since the node started.",
        "gauge",
        flush.sync_max_us as f64 * 1e-6,
    );
    sample(
        &mut out,
        "fenced_raft_early_appends_total",
        "Copies of this node's appends as leader sent to followers while its own fdatasync ran.",
        "counter",
        ctx.early.sent(),
    );
    sample(
        &mut out,
        "fenced_raft_appends_answered_early_total",
        "AppendEntries to followers answered by their stored answer to an early copy, without a round trip of their own.",
        "counter",
        ctx.early.reused(),
    );
    sample(
        &mut out,
        "fenced_raft_heartbeats_answered_early_total",
        "Heartbeats to followers answered from their stored answer to an early copy; the commit index they carried goes with the next message.",
        "counter",
        ctx.early.heartbeats_answered(),
    );

    c.rpc.render(&mut out);
    for (name, help, value) in [
        (
            "fenced_waiters",
            "Acquires waiting in the lease table for a held resource.",
            ctx.replica.shared.waiters() as u64,
        ),
        (
            "fenced_parked_requests",
            "Calls on this node waiting for a waiter's grant to be applied (or its wait to end).",
            ctx.parking.parked() as u64,
        ),
        (
            "fenced_proposal_queue_depth",
            "Commands queued for the proposer (this node as leader), not yet in a log entry.",
            ctx.replica.proposer.queued() as u64,
        ),
        (
            "fenced_snapshot_bytes",
            "Size of the snapshot on disk, bytes (0 before the first).",
            c.snapshot_bytes.load(Relaxed),
        ),
    ] {
        sample(&mut out, name, help, "gauge", value);
    }
    for (name, help, counter) in [
        (
            "fenced_snapshots_built_total",
            "Snapshots this node built and made durable.",
            &c.snapshots_built,
        ),
        (
            "fenced_snapshots_installed_total",
            "Snapshots this node installed from a leader.",
            &c.snapshots_installed,
        ),
    ] {
        sample(&mut out, name, help, "counter", counter.load(Relaxed));
    }
    c.snapshot_build_us.render(
        &mut out,
        "fenced_snapshot_build_seconds",
        "Time to build one snapshot: encode, write, fsync and rename.",
        1e-6,
    );

    let m = ctx.replica.raft.metrics().borrow().clone();
    header(
        &mut out,
        "fenced_follower_lag_entries",
        "On the leader: entries each follower (and learner) still lacks, from the leader's last log index to the follower's matched index.",
        "gauge",
    );
    if let Some(replication) = &m.replication {
        let last = m.last_log_index.unwrap_or(0);
        for (follower, matched) in replication {
            if *follower == ctx.replica.id {
                continue;
            }
            let lag = last.saturating_sub(matched.map_or(0, |l| l.index));
            let _ = writeln!(
                out,
                "fenced_follower_lag_entries{{follower=\"{}\"}} {lag}",
                label_value(&follower.to_string())
            );
        }
    }
    sample(
        &mut out,
        "fenced_start_time_seconds",
        "When this node's process started, Unix seconds.",
        "gauge",
        process_start_unix_seconds(),
    );
    sample(
        &mut out,
        "fenced_current_term",
        "The Raft term this node is in.",
        "gauge",
        m.current_term,
    );
    sample(
        &mut out,
        "fenced_is_leader",
        "1 when this node is the Raft leader, else 0.",
        "gauge",
        u8::from(m.state == ServerState::Leader),
    );
    sample(
        &mut out,
        "fenced_leader_id",
        "The leader this node knows of; 0 when none.",
        "gauge",
        m.current_leader.unwrap_or(0),
    );
    sample(
        &mut out,
        "fenced_last_log_index",
        "Index of the last entry in this node's log.",
        "gauge",
        m.last_log_index.unwrap_or(0),
    );
    sample(
        &mut out,
        "fenced_last_applied_index",
        "Index of the last entry applied to the lease table.",
        "gauge",
        ctx.replica.shared.last_applied().map_or(0, |l| l.index),
    );
    sample(
        &mut out,
        "fenced_live_leases",
        "Leases held and not yet expired.",
        "gauge",
        ctx.replica.shared.live_leases(),
    );
    sample(
        &mut out,
        "fenced_open_sessions",
        "Sessions open (opened and neither lapsed nor closed).",
        "gauge",
        ctx.replica.shared.sessions(),
    );
    sample(
        &mut out,
        "fenced_last_token",
        "The highest fencing token issued by the cluster.",
        "gauge",
        ctx.replica
            .shared
            .last_token()
            .map_or(0, fenced_core::Token::get),
    );
    out
}

/// The start of this process in Unix seconds: [`crate::node::Node::start`]
/// takes it; a restart changes it, which alerts count.
pub fn process_start_unix_seconds() -> u64 {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

const TEXT: &str = "text/plain; charset=utf-8";

/// A page of the status UI (or its refusal): never cached, never framed,
/// never sniffed, no referrer, under `csp`.
fn page(status: StatusCode, content_type: &str, body: String, csp: &str) -> Response<Full<Bytes>> {
    let mut resp = response(status, content_type, body);
    let headers = resp.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, csp),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        if let Ok(v) = header::HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    }
    resp
}

/// `/status`: admin only, then the rendered view.
async fn status(
    ctx: &NodeContext,
    req: &Request<Incoming>,
    certificate: Option<&Principal>,
    renders: &Semaphore,
) -> Response<Full<Bytes>> {
    let refuse = |code, text: String| page(code, TEXT, text + "\n", &status_page::STATUS_CSP);
    if let Err(e) =
        ctx.policy
            .auth
            .authorize_http(req.headers(), certificate, Permission::Admin, "status page")
    {
        let code = match e.code() {
            tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            _ => StatusCode::FORBIDDEN,
        };
        tracing::info!(
            status = code.as_u16(),
            reason = e.message(),
            "status page refused"
        );
        let mut resp = refuse(code, e.message().to_string());
        if code == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"fenced\""),
            );
        }
        return resp;
    }
    let query = match status_page::parse_query(req.uri().query()) {
        Ok(q) => q,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("status page: {e}")),
    };
    let Ok(_turn) = renders.acquire().await else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "shutting down".into());
    };
    match status_page::gather(ctx, query).await {
        Ok(view) => page(
            StatusCode::OK,
            HTML,
            status_page::render(&view),
            &status_page::STATUS_CSP,
        ),
        Err(e) => {
            tracing::warn!(error = %e, "status page not served");
            refuse(StatusCode::SERVICE_UNAVAILABLE, format!("status page: {e}"))
        }
    }
}

const HTML: &str = "text/html; charset=utf-8";

/// The status page's state on one listener.
struct StatusPage {
    /// One view is read at a time: each is a pass over the records under
    /// its prefix.
    renders: Semaphore,
    /// Why the page is off on this listener, if it is.
    off: Option<String>,
}

async fn handle(
    ctx: &NodeContext,
    req: &Request<Incoming>,
    certificate: Option<&Principal>,
    page_state: &StatusPage,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if req.method() != Method::GET {
        return match path {
            "/metrics" | status_page::SHELL_PATH | status_page::STATUS_PATH => response(
                StatusCode::METHOD_NOT_ALLOWED,
                TEXT,
                format!("only GET {path}\n"),
            ),
            _ => not_found(),
        };
    }
    match path {
        "/metrics" => response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            render(ctx),
        ),
        status_page::SHELL_PATH | status_page::STATUS_PATH if page_state.off.is_some() => {
            let why = page_state.off.clone().unwrap_or_default();
            if path == status_page::SHELL_PATH {
                page(
                    StatusCode::FORBIDDEN,
                    HTML,
                    status_page::unavailable(&why),
                    &status_page::STATUS_CSP,
                )
            } else {
                page(
                    StatusCode::FORBIDDEN,
                    TEXT,
                    why + "\n",
                    &status_page::STATUS_CSP,
                )
            }
        }
        status_page::SHELL_PATH => page(
            StatusCode::OK,
            HTML,
            status_page::shell().to_string(),
            &status_page::SHELL_CSP,
        ),
        status_page::STATUS_PATH => status(ctx, req, certificate, &page_state.renders).await,
        _ => not_found(),
    }
}

fn not_found() -> Response<Full<Bytes>> {
    response(
        StatusCode::NOT_FOUND,
        TEXT,
        "not found; metrics are at /metrics, the status page at /\n".into(),
    )
}

/// Serves `/metrics` and the status page on `listener` until `stop` is
/// cancelled; over TLS with `tls`.
pub async fn serve(
    listener: TcpListener,
    ctx: NodeContext,
    tls: Option<TlsAcceptor>,
    status_page: Result<(), String>,
    stop: CancellationToken,
) {
    let admission = Admission::new(
        Port::Metrics,
        MAX_CONNECTIONS,
        MAX_CONNECTIONS_PER_SOURCE,
        Arc::clone(&ctx.counters.limits),
    );
    let page = Arc::new(StatusPage {
        renders: Semaphore::new(1),
        off: status_page.err(),
    });
    loop {
        let (stream, addr) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(slot) = admission.enter(addr.ip()) else {
            continue;
        };
        let ctx = ctx.clone();
        let tls = tls.clone();
        let page = Arc::clone(&page);
        tokio::spawn(async move {
            // The handshake counts against the connection's time too.
            let evicted = slot.evicted();
            let served = tokio::time::timeout(CONNECTION_TIMEOUT, async move {
                match tls {
                    None => serve_one(stream, ctx, None, page).await,
                    Some(tls) => {
                        if let Ok(Ok(s)) =
                            tokio::time::timeout(HEADER_READ_TIMEOUT, tls.accept(stream)).await
                        {
                            // A certificate the CA signed is an identity.
                            let certificate = s
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|certs| certs.first())
                                .and_then(|c| {
                                    let name = crate::security::tls::client_name(c)?;
                                    Some((Principal(name), c.clone().into_owned()))
                                });
                            serve_one(s, ctx, certificate, page).await;
                        }
                    }
                }
            });
            tokio::select! {
                () = evicted => {}
                _ = served => {}
            }
        });
    }
}

/// Serves one connection, plain or TLS.
async fn serve_one<S>(
    stream: S,
    ctx: NodeContext,
    certificate: Option<(Principal, CertificateDer<'static>)>,
    page: Arc<StatusPage>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let certificate = Arc::new(certificate);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (ctx, certificate, page) = (ctx.clone(), Arc::clone(&certificate), Arc::clone(&page));
        async move {
            // A certificate revoked after the connection opened serves no
            // more requests on it (keep-alive would otherwise go on).
            if let Some((_, der)) = certificate.as_ref() {
                if let Err(refused) = ctx.policy.auth.certificate_in_force(der) {
                    let body = format!("{}\n", refused.message());
                    return Ok::<_, Infallible>(response(StatusCode::UNAUTHORIZED, TEXT, body));
                }
            }
            let principal = certificate.as_ref().as_ref().map(|(p, _)| p);
            let resp = handle(&ctx, &req, principal, &page).await;
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "metrics connection");
    }
}
