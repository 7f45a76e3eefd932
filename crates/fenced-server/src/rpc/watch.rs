//! Watch streams: each watcher reads the table's window of numbered changes
//! from its own cursor, so a node serves any watcher the same events with
//! the same revisions whichever node it is. A watcher holds at most
//! `buffer` messages in memory; one that lets its buffer stay full for
//! [`STALL`], or whose cursor falls out of the window, is sent `FellBehind`
//! and its stream ends. How many watchers a node serves is bounded in total
//! and per identity (docs/DECISIONS.md, "Watch").

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use fenced_core::{Change, Compacted};
use fenced_proto::{
    event_kind,
    v1::{self, watch_response::Body},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::state_machine::Shared;

pub const DEFAULT_MAX_WATCHERS: usize = 1_024;
pub const DEFAULT_MAX_WATCHERS_PER_IDENTITY: usize = 64;
pub const DEFAULT_WATCH_BUFFER: usize = 256;
/// How long a watcher's buffer may stay full before it is cut off.
pub const STALL: Duration = Duration::from_secs(5);
/// Changes read from the window at a time.
const PAGE: usize = 128;
/// How often an open stream's caller is authorized again: a revoked
/// certificate or token, or a grant a policy reload took away, ends the
/// stream within this.
pub const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// Authorizes the stream's caller again, as at its start; `Err` ends the
/// stream with that status.
pub type Recheck = Box<dyn Fn() -> Result<(), Status> + Send + Sync>;

/// Who watches on this node, and the bounds.
#[derive(Debug)]
pub struct Watchers {
    pub max_total: usize,
    pub max_per_identity: usize,
    pub buffer: usize,
    count: Mutex<Counts>,
    /// Cancelled when the node stops: every stream ends.
    closed: CancellationToken,
    pub refusals: AtomicU64,
    pub fell_behind: AtomicU64,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_identity: HashMap<String, usize>,
}

/// One admitted watcher; dropping it frees its place.
#[derive(Debug)]
pub struct WatchSlot {
    watchers: Arc<Watchers>,
    identity: Option<String>,
    /// Whether this stream's events carry owner ids.
    show_owners: bool,
}

impl WatchSlot {
    /// The same slot, its events carrying owner ids only if `show`.
    pub fn showing_owners(mut self, show: bool) -> Self {
        self.show_owners = show;
        self
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut c = self.watchers.counts();
        c.total = c.total.saturating_sub(1);
        if let Some(id) = &self.identity {
            if let Some(n) = c.per_identity.get_mut(id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.per_identity.remove(id);
                }
            }
        }
    }
}

impl Watchers {
    pub fn new(max_total: usize, max_per_identity: usize, buffer: usize) -> Self {
        Self {
            max_total,
            max_per_identity,
            buffer: buffer.max(1),
            count: Mutex::default(),
            closed: CancellationToken::new(),
            refusals: AtomicU64::new(0),
            fell_behind: AtomicU64::new(0),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many watchers are open on this node.
    pub fn open(&self) -> usize {
        self.counts().total
    }

    /// Ends every stream (the node is stopping).
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Admits one more watcher for `identity` (`None` with auth off: only
    /// the total bound applies).
    pub fn admit(self: &Arc<Self>, identity: Option<&str>) -> Result<WatchSlot, Status> {
        let mut c = self.counts();
        let refuse = |what: String| {
            self.refusals.fetch_add(1, Relaxed);
            tracing::info!(identity = identity.unwrap_or(""), "watch refused: {what}");
            Err(Status::resource_exhausted(what))
        };
        if c.total >= self.max_total {
            return refuse(format!(
                "max_watchers ({}) reached: this node serves that many watch streams",
                self.max_total
            ));
        }
        if let Some(id) = identity {
            let n = c.per_identity.get(id).copied().unwrap_or(0);
            if n >= self.max_per_identity {
                return refuse(format!(
                    "max_watchers_per_identity ({}) reached: identity {id:?} has that many \
                     watch streams open on this node",
                    self.max_per_identity
                ));
            }
            c.per_identity.insert(id.to_string(), n + 1);
        }
        c.total += 1;
        Ok(WatchSlot {
            watchers: Arc::clone(self),
            identity: identity.map(str::to_string),
            show_owners: true,
        })
    }
}

/// One change as sent, with the leader's wall clock at its time
/// (`wall_unix_ms`, 0 if unknown); its owner id only to a watcher shown
/// owner ids (empty to the others).
fn event(c: &Change, wall_unix_ms: u64, show_owners: bool) -> v1::WatchResponse {
    v1::WatchResponse {
        body: Some(Body::Event(v1::WatchEvent {
            revision: c.revision,
            resource: c.resource.as_str().as_bytes().to_vec(),
            kind: event_kind(c.kind) as i32,
            token: c.token.get(),
            owner_id: if show_owners {
                c.owner_id.as_bytes().to_vec()
            } else {
                Vec::new()
            },
            cluster_time_ms: c.at.as_millis(),
            wall_time_unix_ms: wall_unix_ms,
        })),
    }
}

fn body(b: Body) -> v1::WatchResponse {
    v1::WatchResponse { body: Some(b) }
}

type Tx = mpsc::Sender<Result<v1::WatchResponse, Status>>;

/// Starts serving one watch stream; the receiver is the response body.
pub fn start(
    shared: Arc<Shared>,
    slot: WatchSlot,
    prefix: String,
    from_revision: u64,
    recheck: Recheck,
) -> mpsc::Receiver<Result<v1::WatchResponse, Status>> {
    // One place more than the buffer: an event is sent only while two are
    // free, so the last message always fits.
    let (tx, rx) = mpsc::channel(slot.watchers.buffer + 1);
    tokio::spawn(async move {
        let closed = slot.watchers.closed.clone();
        tokio::select! {
            () = serve(&shared, &slot, &prefix, from_revision, &tx) => {}
            () = closed.cancelled() => {
                let _ = tx.try_send(Err(Status::unavailable(
                    "the node is shutting down; resume the watch on another node",
                )));
            }
            refused = refused(&recheck) => {
                tracing::info!(prefix, code = ?refused.code(), "watch ended: its caller is no longer authorized");
                let _ = tx.try_send(Err(refused));
            }
        }
        drop(slot);
    });
    rx
}

/// Resolves with the refusal once `recheck` refuses.
async fn refused(recheck: &Recheck) -> Status {
    loop {
        tokio::time::sleep(RECHECK_EVERY).await;
        if let Err(refused) = recheck() {
            return refused;
        }
    }
}

async fn serve(shared: &Shared, slot: &WatchSlot, prefix: &str, from: u64, tx: &Tx) {
    let mut revisions = shared.subscribe_revisions();
    let start = if from == 0 { shared.revision() } else { from };
    let mut cursor = start;
    let mut last_sent = start;
    if tx
        .try_send(Ok(body(Body::Started(v1::Started { revision: start }))))
        .is_err()
    {
        return;
    }
    let mut first = true;
    loop {
        revisions.borrow_and_update();
        let page = match shared.changes_after(cursor, prefix, PAGE) {
            Ok(page) => page,
            Err(Compacted { oldest_revision }) if first => {
                let _ = tx.try_send(Ok(body(Body::Compacted(v1::Compacted { oldest_revision }))));
                return;
            }
            Err(_) => return fell_behind(slot, tx, last_sent, "its cursor left the window"),
        };
        first = false;
        // Anchors only come after: the time shown never changes.
        let walls = shared.wall_ms_of(&page.changes);
        for (change, wall) in page.changes.iter().zip(walls) {
            let permits = match tokio::time::timeout(STALL, tx.reserve_many(2)).await {
                Ok(Ok(permits)) => permits,
                Ok(Err(_)) => return, // the client went away
                Err(_) => return fell_behind(slot, tx, last_sent, "its buffer stayed full"),
            };
            if let Some(permit) = permits.into_iter().next() {
                permit.send(Ok(event(change, wall.unwrap_or(0), slot.show_owners)));
            }
            last_sent = change.revision;
        }
        let more = page.scanned_to > cursor && page.changes.len() >= PAGE;
        cursor = page.scanned_to;
        if more {
            continue;
        }
        tokio::select! {
            changed = revisions.changed() => if changed.is_err() { return },
            () = tx.closed() => return,
        }
    }
}

fn fell_behind(slot: &WatchSlot, tx: &Tx, last_sent_revision: u64, why: &str) {
    slot.watchers.fell_behind.fetch_add(1, Relaxed);
    tracing::info!(
        identity = slot.identity.as_deref().unwrap_or(""),
        last_sent_revision,
        "watcher fell behind: {why}"
    );
    let _ = tx.try_send(Ok(body(Body::FellBehind(v1::FellBehind {
        last_sent_revision,
    }))));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn watchers_are_bounded_in_total_and_per_identity() {
        let w = Arc::new(Watchers::new(3, 2, 8));
        let a1 = w.admit(Some("a")).unwrap();
        let _a2 = w.admit(Some("a")).unwrap();
        let e = w.admit(Some("a")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("max_watchers_per_identity (2)"), "{e}");
        let _b = w.admit(Some("b")).unwrap();
        let e = w.admit(None).unwrap_err();
        assert!(e.message().contains("max_watchers (3)"), "{e}");
        assert_eq!(w.refusals.load(Relaxed), 2);
        drop(a1);
        assert_eq!(w.open(), 2);
        let _a3 = w.admit(Some("a")).unwrap();
    }
}
