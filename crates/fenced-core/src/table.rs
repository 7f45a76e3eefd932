use std::{
    collections::{btree_map, BTreeMap, BTreeSet, VecDeque},
    ops::Bound,
};

use serde::{Deserialize, Serialize};

use crate::{
    observe::Window,
    session::{Ends, Session, Term},
    AcquireInSessionOutcome, AcquireOutcome, Applied, Batch, Capacity, CapacityBound, Change,
    ChangeKind, ChangesAfter, CloseSessionOutcome, ClusterTime, Command, Compacted, Description,
    Event, Grant, HistoryEntry, IdentityBounds, JobLabel, KvSnapshot, KvStore, LeaseEnd, LeaseList,
    LeaseView, LostReason, Outcome, OwnerId, ReleaseOutcome, RenewOutcome, ResourceName, SessionId,
    SessionRefusal, Token, TokenState, Validation, WallAnchor, WallClock,
    DEFAULT_HISTORY_PER_RESOURCE, MAX_HISTORY_PER_RESOURCE, MAX_IDLE_RECORDS, MAX_TOKEN,
    MAX_TOKEN_FLOOR, MAX_WAITERS_PER_RESOURCE, WATCH_WINDOW,
};

#[cfg(test)]
mod counter_tests;
mod identity;
mod load;

pub(crate) use identity::IdentityId;
use identity::{Held, Identities};
pub use load::TableSeed;

/// The version of [`TableSnapshot`]'s layout. Bump it when the layout changes.
/// Version 2 added the change window and the grant history; version 3 the
/// sessions; version 4 the identity of each lease and waiter. Older
/// snapshots still load (version 1 with no history and no changes kept,
/// 1 and 2 with no sessions, 1 to 3 with every lease the empty identity's).
pub const SNAPSHOT_FORMAT_VERSION: u32 = 6;

/// The fields of a [`TableSnapshot`] in the order a sequence-based format
/// (the node's codec) stores them; a version stores a prefix of them.
pub const SNAPSHOT_FIELDS: &[&str] = snapshot_format::FIELDS;

/// A held lease. Its token is its record's newest (an invariant), so it is
/// not kept twice.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lease {
    owner: OwnerId,
    term: Term,
    /// When it was granted, if the history remembers the grant
    /// ([`NOT_REMEMBERED`] otherwise): a live grant's history entry is made
    /// from the lease, not kept beside it.
    granted_at: ClusterTime,
}

/// The grant time of a lease whose grant the history does not remember (a
/// table that keeps no history, or a lease loaded from a snapshot that kept
/// none).
const NOT_REMEMBERED: ClusterTime = ClusterTime::MAX;

/// A held lease as snapshots store it: with its expiry and TTL, its
/// session's for a lease held by one (the sessions, stored after the
/// records, say which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "Lease")]
struct StoredLease {
    owner: OwnerId,
    token: Token,
    expires_at: ClusterTime,
    ttl_ms: u64,
}

impl Lease {
    fn stored(&self, token: Token, ends: &Ends) -> StoredLease {
        let (expires_at, ttl_ms) = ends.end_of(&self.term);
        StoredLease {
            owner: self.owner,
            token,
            expires_at,
            ttl_ms,
        }
    }

    /// The history entry of this live lease, if its grant is remembered.
    fn live_entry(&self, token: Token) -> Option<HistoryEntry> {
        (self.granted_at != NOT_REMEMBERED).then_some(HistoryEntry {
            token,
            owner_id: self.owner,
            granted_at: self.granted_at,
            end: None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum EndReason {
    Released,
    Expired,
}

/// The most recent lease of a resource that ended, so that a late renew or a
/// retried release can be told exactly what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Ended {
    owner: OwnerId,
    token: Token,
    reason: EndReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Waiter {
    owner: OwnerId,
    ttl_ms: u64,
    deadline: ClusterTime,
    /// Not in the record's layout: a snapshot stores it after the sessions
    /// ([`StoredIdentities`]).
    #[serde(skip)]
    identity: IdentityId,
    /// Not in the record's layout either: a snapshot stores it last
    /// ([`StoredLabels`]).
    #[serde(skip)]
    label: Option<JobLabel>,
}

/// One resource's state. Its size is the table's memory (a million live
/// leases are a million records): every field that is usually empty is one
/// pointer or less, and the record fits the allocator's 96-byte class.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    /// The newest token issued for this resource.
    last_token: Token,
    holder: Option<Lease>,
    /// Boxed: none until a resource's first lease ends.
    ended: Option<Box<Ended>>,
    /// First come, first served. Never non-empty while `holder` is `None`:
    /// the head waiter is granted in the same step that ends a lease.
    waiters: Waiters,
    /// Position in the forget-oldest order while the resource is idle.
    idle_seq: IdleSeq,
    /// The last grants that ended, oldest first; with the holder's grant
    /// (made from `holder`, see [`Record::history`]) at most the table's
    /// history length. A slice of exactly its length (most resources keep
    /// none or one), and kept here rather than in a map of its own, so a
    /// resource's name is held once by the records and once per index entry
    /// (a shared pointer).
    ended_grants: Box<[HistoryEntry]>,
}

/// A record's place in the forget-oldest order, or none while it is in use:
/// the sequence number plus one, so that "none" costs no extra word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct IdleSeq(Option<std::num::NonZeroU64>);

impl IdleSeq {
    /// `None` for the one sequence number that has no mark (`u64::MAX`,
    /// never reached by a counter that starts at zero).
    fn new(seq: Option<u64>) -> Option<Self> {
        match seq {
            None => Some(IdleSeq(None)),
            Some(s) => s
                .checked_add(1)
                .and_then(std::num::NonZeroU64::new)
                .map(|m| IdleSeq(Some(m))),
        }
    }

    fn get(self) -> Option<u64> {
        self.0.map(|m| m.get() - 1)
    }

    fn is_some(self) -> bool {
        self.0.is_some()
    }
}

/// A record as snapshots store it: the layout of format versions 1 and 2
/// (the grant history is stored apart, after the records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "Record")]
struct StoredRecord {
    last_token: Token,
    holder: Option<StoredLease>,
    ended: Option<Ended>,
    waiters: VecDeque<Waiter>,
    idle_seq: Option<u64>,
}

/// [`StoredRecord`]'s fields borrowed from a live record: the same bytes,
/// written without a copy of the table.
#[derive(Serialize)]
#[serde(rename = "Record")]
struct StoredRecordRef<'a> {
    last_token: Token,
    holder: Option<StoredLease>,
    ended: Option<&'a Ended>,
    waiters: &'a Waiters,
    idle_seq: Option<u64>,
}

/// A resource's waiters: one pointer while there are none (nearly every
/// resource), a queue on the heap when there are.
/// The box is the point: 8 bytes in every record instead of a 32-byte
/// queue header that nearly every record would hold empty.
#[allow(clippy::box_collection)]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Waiters(Option<Box<VecDeque<Waiter>>>);

impl Waiters {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn iter(&self) -> impl Iterator<Item = &Waiter> {
        self.0.iter().flat_map(|q| q.iter())
    }

    fn push_back(&mut self, waiter: Waiter) {
        self.0.get_or_insert_with(Box::default).push_back(waiter);
    }

    fn pop_front(&mut self) -> Option<Waiter> {
        let waiter = self.0.as_mut()?.pop_front();
        self.drop_if_empty();
        waiter
    }

    fn retain(&mut self, keep: impl FnMut(&Waiter) -> bool) {
        if let Some(q) = self.0.as_mut() {
            q.retain(keep);
        }
        self.drop_if_empty();
    }

    fn drop_if_empty(&mut self) {
        if self.0.as_ref().is_some_and(|q| q.is_empty()) {
            self.0 = None;
        }
    }
}

impl From<VecDeque<Waiter>> for Waiters {
    fn from(q: VecDeque<Waiter>) -> Self {
        Waiters((!q.is_empty()).then(|| Box::new(q)))
    }
}

/// Written as the queue it stands for (the snapshot layout).
impl Serialize for Waiters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for w in self.iter() {
            seq.serialize_element(w)?;
        }
        seq.end()
    }
}

impl Record {
    fn new(last_token: Token, holder: Lease) -> Self {
        Record {
            last_token,
            holder: Some(holder),
            ended: None,
            waiters: Waiters::default(),
            idle_seq: IdleSeq::default(),
            ended_grants: Box::default(),
        }
    }

    fn stored(&self, ends: &Ends) -> StoredRecord {
        StoredRecord {
            last_token: self.last_token,
            holder: self
                .holder
                .as_ref()
                .map(|l| l.stored(self.last_token, ends)),
            ended: self.ended.as_deref().cloned(),
            waiters: self.waiters.iter().cloned().collect(),
            idle_seq: self.idle_seq.get(),
        }
    }

    fn stored_ref(&self, ends: &Ends) -> StoredRecordRef<'_> {
        StoredRecordRef {
            last_token: self.last_token,
            holder: self
                .holder
                .as_ref()
                .map(|l| l.stored(self.last_token, ends)),
            ended: self.ended.as_deref(),
            waiters: &self.waiters,
            idle_seq: self.idle_seq.get(),
        }
    }

    /// Remembers how the lease that just ended did, in the box of the
    /// previous one if there was one.
    fn set_ended(&mut self, ended: Ended) {
        match &mut self.ended {
            Some(b) => **b = ended,
            None => self.ended = Some(Box::new(ended)),
        }
    }

    /// The remembered grants, oldest first: those that ended, then the
    /// holder's if its grant is remembered.
    fn history(&self) -> impl DoubleEndedIterator<Item = HistoryEntry> + '_ {
        let live = self
            .holder
            .as_ref()
            .and_then(|l| l.live_entry(self.last_token));
        self.ended_grants.iter().copied().chain(live)
    }

    /// Appends a grant that ended, dropping the oldest beyond `len` (at
    /// least one is kept).
    fn push_ended_grant(&mut self, entry: HistoryEntry, len: usize) {
        let grants = &mut self.ended_grants;
        if !grants.is_empty() && grants.len() >= len {
            let last = grants.len() - 1;
            grants.rotate_left(1);
            grants[last] = entry;
            self.cut_history(len);
            return;
        }
        let mut v = std::mem::take(grants).into_vec();
        v.reserve_exact(1);
        v.push(entry);
        self.ended_grants = v.into_boxed_slice();
    }

    /// Ends `lease`, the holder just taken off this record, `how` at `now`:
    /// it becomes the last ended lease and, if its grant was remembered, an
    /// ended grant of the history. Returns its token and the change to tell
    /// watchers.
    fn end(
        &mut self,
        lease: &Lease,
        how: EndReason,
        now: ClusterTime,
        history_len: usize,
    ) -> (Token, ChangeKind) {
        let token = self.last_token;
        self.set_ended(Ended {
            owner: lease.owner,
            token,
            reason: how,
        });
        let kind = match how {
            EndReason::Released => ChangeKind::Released,
            EndReason::Expired => ChangeKind::Expired,
        };
        if history_len > 0 && lease.granted_at != NOT_REMEMBERED {
            let entry = HistoryEntry {
                token,
                owner_id: lease.owner,
                granted_at: lease.granted_at,
                end: Some(LeaseEnd { at: now, how: kind }),
            };
            self.push_ended_grant(entry, history_len);
        }
        (token, kind)
    }

    /// Keeps the newest `len` grants of the history, the holder's counted.
    fn cut_history(&mut self, len: usize) {
        if len == 0 {
            if let Some(l) = self.holder.as_mut() {
                l.granted_at = NOT_REMEMBERED;
            }
        }
        let live = self
            .holder
            .as_ref()
            .is_some_and(|l| l.granted_at != NOT_REMEMBERED);
        let keep = len.saturating_sub(usize::from(live));
        let extra = self.ended_grants.len().saturating_sub(keep);
        if extra > 0 {
            self.ended_grants = self.ended_grants[extra..].into();
        }
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty()
    }

    /// Why `owner`'s acquisition attempt on this resource is over, if its
    /// lease is the one that ended last and `owner` does not hold a newer
    /// one. Owner ids are single-use per attempt, so an acquire that arrives
    /// after its own lease ended (a retry that outlived its caller's release,
    /// or a stale copy of the request) must not grant a second lease.
    fn ended_attempt(&self, owner: OwnerId) -> Option<LostReason> {
        let ended = self.ended.as_deref().filter(|e| e.owner == owner)?;
        if self.holder.as_ref().is_some_and(|l| l.owner == owner) {
            return None;
        }
        Some(if self.last_token > ended.token {
            LostReason::Superseded {
                current_token: self.last_token,
            }
        } else {
            match ended.reason {
                EndReason::Released => LostReason::Released,
                EndReason::Expired => LostReason::Expired,
            }
        })
    }

    fn lost_reason(&self, owner: OwnerId, token: Token) -> LostReason {
        match self.ended.as_deref() {
            Some(e) if e.owner == owner && e.token == token => match e.reason {
                EndReason::Released => LostReason::Released,
                EndReason::Expired => LostReason::Expired,
            },
            _ if token < self.last_token => LostReason::Superseded {
                current_token: self.last_token,
            },
            _ => LostReason::Unknown,
        }
    }
}

/// What an acquire asks for: a lease with its own TTL (waiting up to
/// `wait_ms` if held), or one that lives with a session.
#[derive(Debug, Clone, Copy)]
enum Ask {
    Own {
        ttl_ms: u64,
        wait_ms: u64,
    },
    /// The caller checked that the session is live and the acquirer's.
    InSession {
        session: SessionId,
    },
}

/// The lease table: every resource's holder, token and waiters.
///
/// A pure state machine: [`LeaseTable::apply`] takes a [`Batch`] stamped with
/// cluster time and returns one [`Outcome`] per command plus the [`Event`]s
/// the batch caused. The same batches in the same order give the same table on
/// every replica.
///
/// Tokens come from one counter for the whole table, so every grant's token is
/// greater than every token issued before it, for that resource and all
/// others: a resource that was forgotten and used again still gets a higher
/// token.
///
/// ```
/// use fenced_core::*;
/// let mut table = LeaseTable::new();
/// let (a, b) = (OwnerId::random(), OwnerId::random());
/// let res = ResourceName::new("statement:account-1842:2026-07")?;
/// let acquire = |owner_id| Command::Acquire { resource: res.clone(), owner_id, ttl_ms: 30_000, wait_ms: 0 };
///
/// let at = |ms| ClusterTime::from_millis(ms);
/// let out = table.apply(&Batch { stamp: at(0), commands: vec![acquire(a)] });
/// let Outcome::Acquire(AcquireOutcome::Granted(first)) = out.outcomes[0] else { panic!() };
///
/// // B is refused while A's lease runs, and granted a higher token after it expires.
/// let out = table.apply(&Batch { stamp: at(1_000), commands: vec![acquire(b)] });
/// assert!(matches!(out.outcomes[0], Outcome::Acquire(AcquireOutcome::Held { .. })));
/// let out = table.apply(&Batch { stamp: at(30_000), commands: vec![acquire(b)] });
/// let Outcome::Acquire(AcquireOutcome::Granted(second)) = out.outcomes[0] else { panic!() };
/// assert!(second.token > first.token);
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Debug, Clone)]
pub struct LeaseTable {
    now: ClusterTime,
    last_token: u64,
    /// Boxed: a map node then holds 11 small entries, not 11 records, so a
    /// node half full (as ordered inserts leave them) wastes little.
    records: BTreeMap<ResourceName, Box<Record>>,
    /// When every held lease ends: by its own expiry, or with its session.
    ends: Ends,
    /// Every waiter by the end of its wait.
    deadlines: BTreeSet<(ClusterTime, ResourceName, OwnerId)>,
    /// Idle resources, oldest first.
    idle: BTreeSet<(u64, ResourceName)>,
    next_idle_seq: u64,
    max_idle: usize,
    /// Fenced writes, decided against the leases above (see [`KvStore`]).
    kv: KvStore,
    /// Recent ownership changes, numbered, for watchers.
    window: Window,
    /// The grants remembered per resource (see [`Record::history`]).
    history_len: usize,
    /// The two large indexes' sizes when they were last built whole (see
    /// [`LeaseTable::rebuild_grown_indexes`]).
    built_at: IndexSizes,
    /// Who holds each lease and waits, and what each identity has.
    identities: Identities,
    /// The leader's wall clock by cluster time, for the times people read.
    wall: WallClock,
    /// The job label of each labelled live lease, with its token: kept
    /// apart from the records, which stay in the allocator's 96-byte class
    /// (an entry whose token is not the holder's is stale and never read;
    /// it goes when the resource falls idle).
    labels: BTreeMap<ResourceName, (Token, JobLabel)>,
}

/// How many entries the records map and the expiry index held when they
/// were last built from sorted input (every node full).
#[derive(Debug, Clone, Copy, Default)]
struct IndexSizes {
    records: usize,
    own: usize,
}

/// An index is rebuilt once it has grown by a quarter past this many
/// entries: below it the space a rebuild saves is small.
const REBUILD_MIN_ENTRIES: usize = 65_536;

impl IndexSizes {
    fn grown(built: usize, now: usize) -> bool {
        now >= REBUILD_MIN_ENTRIES && now >= built + built / 4
    }
}

impl Default for LeaseTable {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseTable {
    pub fn new() -> Self {
        Self {
            now: ClusterTime::ZERO,
            last_token: 0,
            records: BTreeMap::new(),
            ends: Ends::default(),
            deadlines: BTreeSet::new(),
            idle: BTreeSet::new(),
            next_idle_seq: 0,
            max_idle: MAX_IDLE_RECORDS,
            kv: KvStore::new(),
            window: Window::new(WATCH_WINDOW),
            history_len: DEFAULT_HISTORY_PER_RESOURCE,
            built_at: IndexSizes::default(),
            identities: Identities::default(),
            wall: WallClock::default(),
            labels: BTreeMap::new(),
        }
    }

    /// The same table remembering at most `len` grants per resource (at
    /// most [`MAX_HISTORY_PER_RESOURCE`]); older entries are dropped now.
    /// Every node of a cluster must use the same value: it shapes the
    /// replicated state.
    pub fn with_history_len(mut self, len: usize) -> Self {
        self.history_len = len.min(MAX_HISTORY_PER_RESOURCE);
        for rec in self.records.values_mut() {
            rec.cut_history(self.history_len);
        }
        self
    }

    /// The same table keeping at most `len` recent changes (tests of the
    /// window use a small one; servers always use [`WATCH_WINDOW`]).
    pub fn with_watch_window(mut self, len: usize) -> Self {
        self.window.capacity = len;
        while self.window.changes.len() > len {
            self.window.changes.pop_front();
        }
        self
    }

    /// The revision of the latest change (0 before the first).
    pub fn revision(&self) -> u64 {
        self.window.revision
    }

    /// The oldest revision still kept (one past [`LeaseTable::revision`]
    /// when none is).
    pub fn oldest_revision(&self) -> u64 {
        self.window.oldest()
    }

    /// Up to `max` changes after revision `after` on resources starting with
    /// `prefix`, or [`Compacted`] when some after it are no longer kept.
    pub fn changes_after(
        &self,
        after: u64,
        prefix: &str,
        max: usize,
    ) -> Result<ChangesAfter, Compacted> {
        self.window.after(after, prefix, max)
    }

    /// The remembered grants of `resource`, newest first, at most `limit`.
    pub fn history(&self, resource: &str, limit: usize) -> Vec<HistoryEntry> {
        self.records
            .get(resource)
            .map(|r| r.history().rev().take(limit).collect())
            .unwrap_or_default()
    }

    /// [`LeaseTable::history`] with the wall clock at each grant and end.
    pub fn dated_history(&self, resource: &str, limit: usize) -> Vec<crate::DatedHistoryEntry> {
        self.history(resource, limit)
            .into_iter()
            .map(|entry| crate::DatedHistoryEntry {
                granted_at_unix_ms: self.wall.unix_ms_at(entry.granted_at),
                ended_at_unix_ms: entry.end.and_then(|end| self.wall.unix_ms_at(end.at)),
                entry,
            })
            .collect()
    }

    /// Whether `token` is still the current lease of `resource` at cluster
    /// time `now` (a read; `now` never earlier than the table's).
    pub fn validate(&self, resource: &str, token: Token, now: ClusterTime) -> Validation {
        let now = now.max(self.now);
        let Some(rec) = self.records.get(resource) else {
            return Validation {
                state: TokenState::Unknown,
                current_token: None,
            };
        };
        let current_token = Some(rec.last_token);
        let state = if token < rec.last_token {
            TokenState::Superseded
        } else if token > rec.last_token {
            TokenState::Unknown
        } else {
            let end = rec.holder.as_ref().map(|l| self.ends.end_of(&l.term).0);
            match (&rec.holder, rec.ended.as_deref(), end) {
                // `token` is the newest, so the holder's if there is one.
                (Some(_), _, Some(end)) if end > now => TokenState::Current {
                    remaining_ms: end.millis_since(now),
                },
                // Ran out, not yet swept: the next entry ends it as expired.
                (Some(_), _, _) => TokenState::Expired,
                (None, Some(e), _) if e.token == token => match e.reason {
                    EndReason::Released => TokenState::Released,
                    EndReason::Expired => TokenState::Expired,
                },
                _ => TokenState::Unknown,
            }
        };
        Validation {
            state,
            current_token,
        }
    }

    /// A table that remembers at most `max_idle` idle resources (tests of the
    /// bound use a small one; servers always use [`MAX_IDLE_RECORDS`]).
    pub fn with_max_idle(max_idle: usize) -> Self {
        Self {
            max_idle,
            ..Self::new()
        }
    }

    /// The cluster time of the latest applied batch.
    pub fn now(&self) -> ClusterTime {
        self.now
    }

    /// The highest token issued by this table, or the floor raised above
    /// it ([`LeaseTable::raise_token_floor`]): every token granted from now
    /// on is above it. `None` before the first grant or floor.
    pub fn last_token(&self) -> Option<Token> {
        Token::new(self.last_token).ok()
    }

    /// How many leases are held (not yet expired at [`LeaseTable::now`]).
    pub fn live_leases(&self) -> usize {
        self.ends.live_leases()
    }

    /// How many sessions are open.
    pub fn sessions(&self) -> usize {
        self.ends.sessions.len()
    }

    /// When session `session` lapses unless kept alive, and how many leases
    /// it holds; `None` when it is not open.
    pub fn session(&self, session: SessionId) -> Option<(ClusterTime, usize)> {
        let s = self.ends.sessions.get(&session)?;
        Some((s.expires_at, s.leases.len()))
    }

    /// How many waiters are queued, over every resource.
    pub fn waiters(&self) -> usize {
        self.deadlines.len()
    }

    /// How many resources the table remembers, held or idle.
    pub fn resources(&self) -> usize {
        self.records.len()
    }

    /// The current holder of `resource` and its grant, if any.
    pub fn holder(&self, resource: &str) -> Option<(OwnerId, Grant)> {
        let rec = self.records.get(resource)?;
        let lease = rec.holder.as_ref()?;
        let (expires_at, ttl_ms) = self.ends.end_of(&lease.term);
        Some((
            lease.owner,
            Grant {
                token: rec.last_token,
                expires_at,
                ttl_ms,
            },
        ))
    }

    /// Whether `owner` with `token` is the current, unexpired holder of
    /// `resource` at `now`, and if not, why: superseded (with the newest
    /// token) whenever a later grant exists, else how the lease ended.
    pub fn check_holder(
        &self,
        resource: &str,
        owner: OwnerId,
        token: Token,
        now: ClusterTime,
    ) -> Result<(), LostReason> {
        self.check_holder_by(resource, owner, token, Who::UNCHECKED, now)
    }

    /// [`LeaseTable::check_holder`] for a lease held by `identity`: a lease
    /// of another identity answers as a wrong owner id would.
    pub fn check_holder_as(
        &self,
        resource: &str,
        owner: OwnerId,
        token: Token,
        identity: &str,
        now: ClusterTime,
    ) -> Result<(), LostReason> {
        let who = Who {
            name: identity,
            checked: true,
            label: None,
        };
        self.check_holder_by(resource, owner, token, who, now)
    }

    fn check_holder_by(
        &self,
        resource: &str,
        owner: OwnerId,
        token: Token,
        who: Who<'_>,
        now: ClusterTime,
    ) -> Result<(), LostReason> {
        let Some(rec) = self.records.get(resource) else {
            return Err(LostReason::Unknown);
        };
        let owns = who.owns(&self.identities);
        let is_holder =
            |l: &Lease| l.owner == owner && rec.last_token == token && owns(l.term.identity());
        match &rec.holder {
            Some(l) if is_holder(l) && self.ends.end_of(&l.term).0 > now => Ok(()),
            Some(l) if is_holder(l) => Err(LostReason::Expired),
            _ if token < rec.last_token => Err(LostReason::Superseded {
                current_token: rec.last_token,
            }),
            _ => Err(rec.lost_reason(owner, token)),
        }
    }

    /// The fenced store (read it at [`LeaseTable::now`] or later).
    pub fn kv(&self) -> &KvStore {
        &self.kv
    }

    /// The fenced store in its persisted form (kept apart from
    /// [`TableSnapshot`], whose layout predates it).
    pub fn kv_snapshot(&self) -> KvSnapshot {
        self.kv.snapshot()
    }

    /// Replaces the fenced store with the one `snapshot` holds.
    pub fn restore_kv(&mut self, snapshot: KvSnapshot) -> Result<(), SnapshotError> {
        self.kv = KvStore::from_snapshot(snapshot)?;
        Ok(())
    }

    /// The state of `resource` as seen at cluster time `now` (a read needs no
    /// log entry; `now` is the leader's clock, never earlier than the table's).
    pub fn describe(&self, resource: &str, now: ClusterTime) -> Description {
        let now = now.max(self.now);
        let Some(rec) = self.records.get(resource) else {
            return Description {
                last_token: None,
                held: false,
                remaining_ms: 0,
                waiters: 0,
            };
        };
        let live = rec
            .holder
            .as_ref()
            .map(|l| self.ends.end_of(&l.term).0)
            .filter(|end| *end > now);
        Description {
            last_token: Some(rec.last_token),
            held: live.is_some(),
            remaining_ms: live.map_or(0, |end| end.millis_since(now)),
            waiters: u32::try_from(rec.waiters.len()).unwrap_or(u32::MAX),
        }
    }

    /// The job label of `resource`'s live lease, if its acquire gave one.
    pub fn label_of(&self, resource: &str) -> Option<&JobLabel> {
        let rec = self.records.get(resource)?;
        rec.holder.as_ref()?;
        self.labels
            .get(resource)
            .filter(|(token, _)| *token == rec.last_token)
            .map(|(_, label)| label)
    }

    /// The leases live at `now` on resources whose names start with
    /// `prefix`, in name order: at most `limit` rows, and a count of the
    /// rest. Reads every record under the prefix (the table bounds how many
    /// there are); owner ids are not shown.
    pub fn leases(&self, prefix: &str, now: ClusterTime, limit: usize) -> LeaseList {
        let now = now.max(self.now);
        let mut list = LeaseList::default();
        let under_prefix = self
            .records
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(name, _)| name.as_str().starts_with(prefix));
        for (name, rec) in under_prefix {
            let Some(lease) = rec.holder.as_ref() else {
                continue;
            };
            let (expires_at, ttl_ms) = self.ends.end_of(&lease.term);
            if expires_at <= now {
                continue;
            }
            if list.rows.len() < limit {
                let granted_at = (lease.granted_at != NOT_REMEMBERED).then_some(lease.granted_at);
                list.rows.push(LeaseView {
                    resource: name.clone(),
                    token: rec.last_token,
                    remaining_ms: expires_at.millis_since(now),
                    ttl_ms,
                    waiters: u32::try_from(rec.waiters.len()).unwrap_or(u32::MAX),
                    identity: self.identities.name(lease.term.identity()).to_string(),
                    granted_at,
                    granted_at_unix_ms: granted_at.and_then(|t| self.wall.unix_ms_at(t)),
                    label: self.label_of(name.as_str()).cloned(),
                });
            } else {
                list.more += 1;
            }
        }
        list
    }

    /// The earliest cluster time at which a tick would answer a waiter: the end
    /// of a wait, or the expiry of a lease someone is waiting for.
    pub fn next_wakeup(&self) -> Option<ClusterTime> {
        let first_deadline = self.deadlines.first().map(|(t, _, _)| *t);
        let contended_expiry = self
            .deadlines
            .iter()
            .filter_map(|(_, name, _)| self.records.get(name)?.holder.as_ref())
            .map(|l| self.ends.end_of(&l.term).0)
            .min();
        match (first_deadline, contended_expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest cluster time at which an entry would change something
    /// without a command: a wait ending, or any lease or session running
    /// out (so that expiries are recorded, with a revision, soon after they
    /// happen).
    pub fn next_sweep(&self) -> Option<ClusterTime> {
        let first_deadline = self.deadlines.first().map(|(t, _, _)| *t);
        let first_expiry = self.ends.first_expiry();
        match (first_deadline, first_expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The leader's wall clock (ms since the Unix epoch) at cluster time
    /// `t`, for people; `None` before the first anchor (see [`WallClock`]).
    pub fn wall_ms_at(&self, t: ClusterTime) -> Option<u64> {
        self.wall.unix_ms_at(t)
    }

    /// The wall-clock anchors (see [`WallClock`]).
    pub fn wall_clock(&self) -> &WallClock {
        &self.wall
    }

    /// Applies one log entry. Cluster time only moves forward: a stamp older
    /// than the table's time is treated as the table's time.
    pub fn apply(&mut self, batch: &Batch) -> Applied {
        if batch.stamp > self.now {
            self.now = batch.stamp;
        }
        let now = self.now;
        let mut applied = Applied {
            outcomes: Vec::with_capacity(batch.commands.len()),
            events: Vec::new(),
        };
        self.sweep(now, &mut applied.events);
        for command in &batch.commands {
            let outcome = self.apply_command(
                command,
                Who::UNCHECKED,
                IdentityBounds::UNBOUNDED,
                now,
                &mut applied.events,
            );
            for resource in command.resources() {
                self.update_idle(resource);
                debug_assert!(self.check_record(resource).is_ok());
            }
            applied.outcomes.push(outcome);
        }
        self.forget_oldest_idle();
        self.rebuild_grown_indexes();
        applied
    }

    /// One command made by `who` within `bounds`.
    fn apply_command(
        &mut self,
        command: &Command,
        who: Who<'_>,
        bounds: IdentityBounds,
        now: ClusterTime,
        events: &mut Vec<Event>,
    ) -> Outcome {
        match command {
            Command::AsIdentity {
                identity,
                bounds,
                command,
            } => self.apply_command(
                command,
                Who {
                    name: identity,
                    checked: true,
                    label: who.label,
                },
                *bounds,
                now,
                events,
            ),
            Command::Labelled { label, command } => self.apply_command(
                command,
                Who {
                    label: Some(label),
                    ..who
                },
                bounds,
                now,
                events,
            ),
            Command::Acquire {
                resource,
                owner_id: owner,
                ttl_ms,
                wait_ms,
            } => Outcome::Acquire(self.acquire(
                resource,
                *owner,
                Ask::Own {
                    ttl_ms: *ttl_ms,
                    wait_ms: *wait_ms,
                },
                Capacity::UNBOUNDED,
                (who, bounds),
                now,
            )),
            Command::AcquireBounded {
                resource,
                owner_id: owner,
                ttl_ms,
                wait_ms,
                capacity,
            } => Outcome::Acquire(self.acquire(
                resource,
                *owner,
                Ask::Own {
                    ttl_ms: *ttl_ms,
                    wait_ms: *wait_ms,
                },
                *capacity,
                (who, bounds),
                now,
            )),
            Command::AcquireInSession {
                resource,
                owner_id: owner,
                session,
                identity,
                capacity,
            } => Outcome::AcquireInSession(match self.ends.check_owner(*session, identity, now) {
                Err(refusal) => AcquireInSessionOutcome::SessionRefused(refusal),
                Ok(_) => AcquireInSessionOutcome::Acquire(self.acquire(
                    resource,
                    *owner,
                    Ask::InSession { session: *session },
                    *capacity,
                    // The lease is the session's identity's (the one
                    // just checked).
                    (
                        Who {
                            name: identity,
                            checked: who.checked,
                            label: who.label,
                        },
                        bounds,
                    ),
                    now,
                )),
            }),
            Command::OpenSession {
                session,
                identity,
                ttl_ms,
                bounds,
            } => Outcome::Session(self.ends.open(*session, identity, *ttl_ms, *bounds, now)),
            Command::KeepAlive { session, identity } => {
                Outcome::Session(self.ends.keep_alive(*session, identity, now))
            }
            Command::CloseSession { session, identity } => {
                Outcome::CloseSession(match self.ends.check_owner(*session, identity, now) {
                    Ok(_) => {
                        let leases = self.end_session(*session, EndReason::Released, now, events);
                        CloseSessionOutcome::Closed { leases }
                    }
                    // Closing a session that is not open: a retried close.
                    Err(SessionRefusal::Gone) => CloseSessionOutcome::Closed { leases: 0 },
                    // `check_owner` refuses only a session that is gone
                    // or another identity's.
                    Err(_) => CloseSessionOutcome::NotOwner,
                })
            }
            Command::Renew {
                resource,
                owner_id: owner,
                token,
                ttl_ms,
            } => Outcome::Renew(self.renew(resource, *owner, *token, *ttl_ms, who, now, events)),
            Command::Release {
                resource,
                owner_id: owner,
                token,
            } => Outcome::Release(self.release(resource, *owner, *token, who, now, events)),
            Command::KvPut {
                key,
                value,
                resource,
                owner_id: owner,
                token,
                bounds,
            } => {
                let holder = self.check_kv_writer(resource, *owner, *token, who, now, events);
                // CANARY (planted in a `canaries` build, `canary::on`):
                // a put is applied whoever holds the resource.
                let holder = if crate::canary::on(crate::canary::Canary::KvSkipHolderCheck) {
                    holder.or(Ok(()))
                } else {
                    holder
                };
                Outcome::KvPut(self.kv.put(holder, key, value, resource, *token, *bounds))
            }
            Command::KvDelete {
                key,
                resource,
                owner_id: owner,
                token,
            } => {
                let holder = self.check_kv_writer(resource, *owner, *token, who, now, events);
                Outcome::KvDelete(self.kv.delete(holder, key, resource, *token))
            }
            Command::WallClock { unix_ms } => {
                self.wall.record(now, *unix_ms);
                Outcome::WallClockNoted
            }
            Command::RenewMany { leases } => Outcome::RenewMany(
                leases
                    .iter()
                    .map(|l| {
                        self.renew(&l.resource, l.owner_id, l.token, l.ttl_ms, who, now, events)
                    })
                    .collect(),
            ),
        }
    }

    /// Rebuilds the records map and the expiry index from their own sorted
    /// entries once either has grown by a quarter since its last build.
    /// Names and expiries mostly arrive in order (a fill of numbered
    /// resources, leases granted at the cluster's advancing time), and a
    /// B-tree that grows at its right edge leaves each node a little over
    /// half full: a fill of a million leases held about 30 bytes a lease
    /// more in each of the two than the same entries built whole. A
    /// rebuild moves each entry once; growing by a quarter between them
    /// bounds that at five moves per entry inserted. Deterministic (sizes
    /// only), so every node rebuilds at the same entry.
    fn rebuild_grown_indexes(&mut self) {
        if IndexSizes::grown(self.built_at.records, self.records.len()) {
            self.records = std::mem::take(&mut self.records).into_iter().collect();
            self.built_at.records = self.records.len();
        }
        if IndexSizes::grown(self.built_at.own, self.ends.own.len()) {
            self.ends.own = std::mem::take(&mut self.ends.own).into_iter().collect();
            self.built_at.own = self.ends.own.len();
        }
    }

    fn sweep(&mut self, now: ClusterTime, events: &mut Vec<Event>) {
        // Waits that ran out come first: a waiter whose wait ended is not granted.
        while let Some((deadline, name, owner)) = self.deadlines.first().cloned() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(rec) = self.records.get_mut(&name) else {
                continue;
            };
            let mut identity = None;
            rec.waiters.retain(|w| {
                let elapsed = w.owner == owner;
                if elapsed {
                    identity = Some(w.identity);
                }
                !elapsed
            });
            if let Some(id) = identity {
                self.identities.end_waiter(id);
            }
            if let Some(lease) = &rec.holder {
                events.push(Event::WaitElapsed {
                    resource: name.clone(),
                    owner_id: owner,
                    current_token: rec.last_token,
                    remaining_ms: self.ends.end_of(&lease.term).0.millis_since(now),
                });
            }
        }
        // Sessions first: a lapsed session's leases end together, in the
        // session's order of names, before leases with their own expiry.
        while let Some(id) = self.ends.first_lapsed(now) {
            let leases = self.end_session(id, EndReason::Expired, now, events);
            events.push(Event::SessionExpired {
                session: id,
                leases,
            });
        }
        while let Some((expires_at, name)) = self.ends.own.first().cloned() {
            if expires_at > now {
                break;
            }
            self.ends.own.pop_first();
            let Some(rec) = self.records.get_mut(&name) else {
                continue;
            };
            if let Some(lease) = rec.holder.take() {
                let (token, kind) = rec.end(&lease, EndReason::Expired, now, self.history_len);
                self.identities.end_lease(lease.term.identity());
                events.push(Event::Expired {
                    resource: name.clone(),
                    owner_id: lease.owner,
                    token,
                });
                self.window.record(&name, kind, token, lease.owner, now);
            }
            self.hand_off(&name, now, events);
            self.update_idle(&name);
        }
    }

    fn acquire(
        &mut self,
        name: &ResourceName,
        owner: OwnerId,
        ask: Ask,
        capacity: Capacity,
        (who, bounds): (Who<'_>, IdentityBounds),
        now: ClusterTime,
    ) -> AcquireOutcome {
        let owns = who.owns(&self.identities);
        // Checked only where a lease or a waiter would be added: a holder
        // asking again, a renew, a release and a hand-off never are.
        let has = self.identities.held_by(who.name);
        let lease_refusal = first_reached([
            (
                as_u64(self.ends.live_leases()),
                CapacityBound::LiveLeases,
                capacity.max_live_leases,
            ),
            (
                has.leases,
                CapacityBound::LeasesPerIdentity,
                bounds.max_leases_per_identity,
            ),
        ]);
        let waiter_refusal = first_reached([
            (
                as_u64(self.deadlines.len()),
                CapacityBound::Waiters,
                capacity.max_waiters,
            ),
            (
                has.waiters,
                CapacityBound::WaitersPerIdentity,
                bounds.max_waiters_per_identity,
            ),
        ]);
        let term_of = |identity| match ask {
            Ask::Own { ttl_ms, .. } => {
                let ttl_ms = ttl_ms.max(1);
                Term::Own {
                    expires_at: now.plus_millis(ttl_ms),
                    ttl_ms,
                    identity,
                }
            }
            // The session was checked by the caller.
            Ask::InSession { session } => Term::Session(session, identity),
        };
        let wait_ms = match ask {
            Ask::Own { wait_ms, .. } => wait_ms,
            Ask::InSession { .. } => 0,
        };
        let Some(rec) = self.records.get_mut(name) else {
            if let Some(refusal) = lease_refusal {
                return refusal;
            }
            return self.grant_new(name, owner, who, term_of, now);
        };
        if let Some(reason) = rec.ended_attempt(owner) {
            return AcquireOutcome::Ended(reason);
        }
        // CANARY (planted in a `canaries` build, `canary::on`): grants over
        // another owner's live lease.
        if crate::canary::on(crate::canary::Canary::SkipLeaseCheck) {
            if let Some(lease) = rec.holder.take_if(|l| l.owner != owner) {
                self.ends.detach(name, &lease.term);
                self.identities.end_lease(lease.term.identity());
                return self.grant_new(name, owner, who, term_of, now);
            }
        }
        match &mut rec.holder {
            // The holder asking again (its reply was lost): the same grant, with
            // the lease running at least `ttl_ms` from now, so a client that
            // times its lease from the retry is still on the safe side. A
            // lease of a session runs as its session does. Another identity
            // with the holder's owner id is refused as any other owner is.
            Some(lease) if lease.owner == owner && owns(lease.term.identity()) => {
                if let (
                    Term::Own {
                        expires_at: old,
                        identity,
                        ..
                    },
                    Term::Own {
                        expires_at, ttl_ms, ..
                    },
                ) = (lease.term, term_of(lease.term.identity()))
                {
                    if expires_at > old {
                        self.ends.reschedule(name, old, expires_at);
                        lease.term = Term::Own {
                            expires_at,
                            ttl_ms,
                            identity,
                        };
                    }
                }
                let (expires_at, ttl_ms) = self.ends.end_of(&lease.term);
                AcquireOutcome::Granted(Grant {
                    token: rec.last_token,
                    expires_at,
                    ttl_ms,
                })
            }
            Some(lease) => {
                let held = AcquireOutcome::Held {
                    current_token: rec.last_token,
                    remaining_ms: self.ends.end_of(&lease.term).0.millis_since(now),
                };
                let Ask::Own { ttl_ms, .. } = ask else {
                    return held;
                };
                // The holder's owner id from another identity never waits:
                // granted after the holder, it would be granted twice.
                if wait_ms == 0 || lease.owner == owner {
                    return held;
                }
                let queued = rec
                    .waiters
                    .iter()
                    .enumerate()
                    .find(|(_, w)| w.owner == owner);
                if let Some((pos, w)) = queued {
                    // Another identity's wait, with its owner id: refused
                    // as a holder's owner id is, above.
                    if !owns(w.identity) {
                        return held;
                    }
                    return AcquireOutcome::Waiting {
                        position: position_u32(pos + 1),
                    };
                }
                // No grant can end the wait: answer now, queue nothing.
                if self.last_token >= MAX_TOKEN {
                    return AcquireOutcome::TokensExhausted { limit: MAX_TOKEN };
                }
                if rec.waiters.len() >= MAX_WAITERS_PER_RESOURCE {
                    return AcquireOutcome::WaitQueueFull {
                        max_waiters: position_u32(MAX_WAITERS_PER_RESOURCE),
                    };
                }
                if let Some(refusal) = waiter_refusal {
                    return refusal;
                }
                // More identities than a `u32` counts: out of reach.
                let Some(identity) = self.identities.intern(who.name) else {
                    return AcquireOutcome::CapacityReached {
                        bound: CapacityBound::WaitersPerIdentity,
                        limit: 0,
                    };
                };
                self.identities.add_waiter(identity);
                let deadline = now.plus_millis(wait_ms);
                rec.waiters.push_back(Waiter {
                    owner,
                    ttl_ms: ttl_ms.max(1),
                    deadline,
                    identity,
                    label: who.label.cloned(),
                });
                self.deadlines.insert((deadline, name.clone(), owner));
                AcquireOutcome::Waiting {
                    position: position_u32(rec.waiters.len()),
                }
            }
            // Free: waiters are granted in the step that ends a lease, so a
            // free resource has none queued.
            None => match lease_refusal {
                Some(refusal) => refusal,
                None => self.grant_new(name, owner, who, term_of, now),
            },
        }
    }

    /// Grants `name` to `owner` of identity `who`, on the term `term_of`
    /// makes for its number.
    fn grant_new(
        &mut self,
        name: &ResourceName,
        owner: OwnerId,
        who: Who<'_>,
        term_of: impl FnOnce(IdentityId) -> Term,
        now: ClusterTime,
    ) -> AcquireOutcome {
        // Checked before the identity is interned: a refused grant leaves
        // no name behind.
        if self.next_token().is_none() {
            return AcquireOutcome::TokensExhausted { limit: MAX_TOKEN };
        }
        let Some(identity) = self.identities.intern(who.name) else {
            return AcquireOutcome::CapacityReached {
                bound: CapacityBound::LeasesPerIdentity,
                limit: 0,
            };
        };
        match self.grant(name, owner, term_of(identity), who.label.cloned(), now) {
            Some(grant) => AcquireOutcome::Granted(grant),
            None => AcquireOutcome::TokensExhausted { limit: MAX_TOKEN },
        }
    }

    /// Ends session `id` and, in this step, every lease it holds (`how`:
    /// released for a close, expired for a lapse), handing each resource
    /// to its first waiter. Returns how many leases ended.
    fn end_session(
        &mut self,
        id: SessionId,
        how: EndReason,
        now: ClusterTime,
        events: &mut Vec<Event>,
    ) -> u64 {
        let Some(session) = self.ends.remove(id) else {
            return 0;
        };
        let mut ended = 0;
        for name in &session.leases {
            let Some(rec) = self.records.get_mut(name) else {
                continue;
            };
            let Some(lease) = rec
                .holder
                .take_if(|l| matches!(l.term, Term::Session(s, _) if s == id))
            else {
                continue;
            };
            ended += 1;
            let (token, kind) = rec.end(&lease, how, now, self.history_len);
            self.identities.end_lease(lease.term.identity());
            if how == EndReason::Expired {
                events.push(Event::Expired {
                    resource: name.clone(),
                    owner_id: lease.owner,
                    token,
                });
            }
            self.window.record(name, kind, token, lease.owner, now);
            self.hand_off(name, now, events);
            self.update_idle(name);
        }
        ended
    }

    #[allow(clippy::too_many_arguments)]
    fn renew(
        &mut self,
        name: &ResourceName,
        owner: OwnerId,
        token: Token,
        ttl_ms: u64,
        who: Who<'_>,
        now: ClusterTime,
        events: &mut Vec<Event>,
    ) -> RenewOutcome {
        let ttl_ms = ttl_ms.max(1);
        let owns = who.owns(&self.identities);
        let Some(rec) = self.records.get_mut(name) else {
            return RenewOutcome::Lost(LostReason::Unknown);
        };
        let current = rec.last_token;
        match &mut rec.holder {
            Some(lease) if lease.owner == owner && current == token => {
                if !owns(lease.term.identity()) {
                    events.push(other_identity(name, token, who.name));
                    return RenewOutcome::Lost(rec.lost_reason(owner, token));
                }
                let Term::Own {
                    expires_at: old,
                    identity,
                    ..
                } = lease.term
                else {
                    return RenewOutcome::KeptBySession;
                };
                let expires_at = now.plus_millis(ttl_ms);
                self.ends.reschedule(name, old, expires_at);
                lease.term = Term::Own {
                    expires_at,
                    ttl_ms,
                    identity,
                };
                RenewOutcome::Renewed { expires_at, ttl_ms }
            }
            _ => RenewOutcome::Lost(rec.lost_reason(owner, token)),
        }
    }

    /// Whether `who` with `owner` and `token` holds `name` now, for a
    /// fenced write: another identity's lease is refused as a wrong owner
    /// id is.
    fn check_kv_writer(
        &self,
        name: &ResourceName,
        owner: OwnerId,
        token: Token,
        who: Who<'_>,
        now: ClusterTime,
        events: &mut Vec<Event>,
    ) -> Result<(), LostReason> {
        if !who.checked {
            return self.check_holder(name.as_str(), owner, token, now);
        }
        let checked = self.check_holder_as(name.as_str(), owner, token, who.name, now);
        if checked.is_err() && self.check_holder_any(name.as_str(), owner, token) {
            events.push(other_identity(name, token, who.name));
        }
        checked
    }

    /// Whether `owner` and `token` are `name`'s holder's, whoever holds it.
    fn check_holder_any(&self, name: &str, owner: OwnerId, token: Token) -> bool {
        self.records.get(name).is_some_and(|rec| {
            rec.last_token == token && rec.holder.as_ref().is_some_and(|l| l.owner == owner)
        })
    }

    fn release(
        &mut self,
        name: &ResourceName,
        owner: OwnerId,
        token: Token,
        who: Who<'_>,
        now: ClusterTime,
        events: &mut Vec<Event>,
    ) -> ReleaseOutcome {
        let Some(rec) = self.records.get_mut(name) else {
            return ReleaseOutcome::NotHolder(LostReason::Unknown);
        };
        // CANARY (planted in a `canaries` build, `canary::on`): any owner id
        // and token release the current lease.
        let (owner, token, who) = match &rec.holder {
            Some(l) if crate::canary::on(crate::canary::Canary::AnyoneRelease) => {
                (l.owner, rec.last_token, Who::UNCHECKED)
            }
            _ => (owner, token, who),
        };
        let owns = who.owns(&self.identities);
        match &rec.holder {
            Some(lease)
                if lease.owner == owner
                    && rec.last_token == token
                    && !owns(lease.term.identity()) =>
            {
                events.push(other_identity(name, token, who.name));
                ReleaseOutcome::NotHolder(rec.lost_reason(owner, token))
            }
            Some(lease) if lease.owner == owner && rec.last_token == token => {
                self.ends.detach(name, &lease.term);
                let lease = lease.clone();
                rec.holder = None;
                let (token, kind) = rec.end(&lease, EndReason::Released, now, self.history_len);
                self.identities.end_lease(lease.term.identity());
                self.window.record(name, kind, token, owner, now);
                self.hand_off(name, now, events);
                ReleaseOutcome::Released
            }
            _ => match rec.lost_reason(owner, token) {
                // A retried release whose first reply was lost.
                LostReason::Released => ReleaseOutcome::Released,
                reason => ReleaseOutcome::NotHolder(reason),
            },
        }
    }

    /// The token the next grant gets, or none once the counter reached
    /// [`MAX_TOKEN`]: checked, so no build (release ones have no overflow
    /// checks) ever wraps to 0 or below a token already issued.
    fn next_token(&self) -> Option<Token> {
        self.last_token
            .checked_add(1)
            .filter(|t| *t <= MAX_TOKEN)
            .map(Token::issued)
    }

    /// Issues the next token to `owner` and makes it the holder of `name`;
    /// none, and nothing changed, once the counter is exhausted.
    fn grant(
        &mut self,
        name: &ResourceName,
        owner: OwnerId,
        term: Term,
        label: Option<JobLabel>,
        now: ClusterTime,
    ) -> Option<Grant> {
        let token = self.next_token()?;
        self.last_token = token.get();
        match label {
            Some(label) => {
                self.labels.insert(name.clone(), (token, label));
            }
            None => {
                self.labels.remove(name);
            }
        }
        let granted_at = if self.history_len > 0 {
            now
        } else {
            NOT_REMEMBERED
        };
        let lease = Lease {
            owner,
            term,
            granted_at,
        };
        // One search of the records, whether the resource is known or new.
        match self.records.entry(name.clone()) {
            btree_map::Entry::Occupied(mut known) => {
                let rec = known.get_mut();
                debug_assert!(rec.holder.is_none());
                rec.last_token = token;
                rec.holder = Some(lease);
                // Room for the new grant, whose entry is made from the lease.
                if self.history_len > 0 {
                    rec.cut_history(self.history_len);
                }
            }
            btree_map::Entry::Vacant(new) => {
                new.insert(Box::new(Record::new(token, lease)));
            }
        }
        self.ends.attach(name, &term);
        self.identities.add_lease(term.identity());
        self.window
            .record(name, ChangeKind::Granted, token, owner, now);
        let (expires_at, ttl_ms) = self.ends.end_of(&term);
        Some(Grant {
            token,
            expires_at,
            ttl_ms,
        })
    }

    /// Grants a free resource to its first waiter, in the same step.
    fn hand_off(&mut self, name: &ResourceName, now: ClusterTime, events: &mut Vec<Event>) {
        let Some(rec) = self.records.get_mut(name) else {
            return;
        };
        if rec.holder.is_some() {
            return;
        }
        let Some(waiter) = rec.waiters.pop_front() else {
            return;
        };
        self.deadlines
            .remove(&(waiter.deadline, name.clone(), waiter.owner));
        let term = Term::Own {
            expires_at: now.plus_millis(waiter.ttl_ms),
            ttl_ms: waiter.ttl_ms,
            identity: waiter.identity,
        };
        // Counted as a lease before it stops counting as a waiter, so its
        // identity keeps its number.
        let grant = self.grant(name, waiter.owner, term, waiter.label.clone(), now);
        self.identities.end_waiter(waiter.identity);
        let Some(grant) = grant else {
            // No waiter can ever be granted: every wait ends now, so no
            // waiter stays queued on a free resource.
            self.end_waits_exhausted(name, waiter.owner, events);
            return;
        };
        events.push(Event::WaiterGranted {
            resource: name.clone(),
            owner_id: waiter.owner,
            grant,
        });
    }

    /// Ends the wait of `first` (already taken off the queue) and of every
    /// waiter still queued on `name`: the counter is exhausted.
    fn end_waits_exhausted(
        &mut self,
        name: &ResourceName,
        first: OwnerId,
        events: &mut Vec<Event>,
    ) {
        let mut owners = vec![first];
        if let Some(rec) = self.records.get_mut(name) {
            while let Some(w) = rec.waiters.pop_front() {
                self.deadlines.remove(&(w.deadline, name.clone(), w.owner));
                self.identities.end_waiter(w.identity);
                owners.push(w.owner);
            }
        }
        events.extend(owners.into_iter().map(|owner_id| Event::TokensExhausted {
            resource: name.clone(),
            owner_id,
            limit: MAX_TOKEN,
        }));
    }

    fn update_idle(&mut self, name: &ResourceName) {
        let Some(rec) = self.records.get_mut(name) else {
            self.labels.remove(name);
            return;
        };
        if rec.holder.is_none() {
            self.labels.remove(name);
        }
        match (rec.is_idle(), rec.idle_seq.get()) {
            (true, None) => {
                let seq = self.next_idle_seq;
                let (Some(mark), Some(next)) = (IdleSeq::new(Some(seq)), seq.checked_add(1)) else {
                    // Out of reach: the counter counts idle transitions from
                    // zero, and a load refuses one at or above 2^63.
                    return;
                };
                self.next_idle_seq = next;
                rec.idle_seq = mark;
                self.idle.insert((seq, name.clone()));
            }
            (false, Some(seq)) => {
                rec.idle_seq = IdleSeq::default();
                self.idle.remove(&(seq, name.clone()));
            }
            _ => {}
        }
    }

    fn forget_oldest_idle(&mut self) {
        while self.idle.len() > self.max_idle {
            if let Some((_, name)) = self.idle.pop_first() {
                self.records.remove(&name);
                self.labels.remove(&name);
            }
        }
    }

    /// Checks every invariant of the table; used by tests, by debug builds and
    /// when a snapshot is loaded.
    pub fn check_invariants(&self) -> Result<(), String> {
        // Sorted vectors, not sets: a table loaded from a snapshot of a
        // million leases is checked in a fraction of the time and memory.
        let mut expiries = Vec::with_capacity(self.ends.own.len());
        let mut session_leases: BTreeMap<SessionId, Vec<&ResourceName>> = BTreeMap::new();
        let mut deadlines = Vec::with_capacity(self.deadlines.len());
        let mut idle = Vec::with_capacity(self.idle.len());
        let mut held: BTreeMap<IdentityId, Held> = BTreeMap::new();
        for (name, rec) in &self.records {
            self.check_one(name, rec)?;
            match rec.holder.as_ref().map(|l| l.term) {
                Some(Term::Own { expires_at, .. }) => expiries.push((expires_at, name)),
                Some(Term::Session(id, identity)) => {
                    session_leases.entry(id).or_default().push(name);
                    let of_session = self.ends.sessions.get(&id).map(|s| s.identity.as_str());
                    if of_session != Some(self.identities.name(identity)) {
                        return Err(format!(
                            "resource {name}: its lease is not its session's identity's"
                        ));
                    }
                }
                None => {}
            }
            if let Some(l) = &rec.holder {
                held.entry(l.term.identity()).or_default().leases += 1;
            }
            for w in rec.waiters.iter() {
                deadlines.push((w.deadline, name, w.owner));
                held.entry(w.identity).or_default().waiters += 1;
            }
            if let Some(seq) = rec.idle_seq.get() {
                idle.push((seq, name));
            }
            check_history(
                name.as_str(),
                &rec.history().collect::<Vec<_>>(),
                rec.last_token,
                self.history_len,
            )?;
        }
        expiries.sort_unstable();
        deadlines.sort_unstable();
        idle.sort_unstable();
        if !self.ends.own.iter().map(|(t, n)| (*t, n)).eq(expiries) {
            return Err("expiry index does not match the holders".into());
        }
        self.ends.check(self.now)?;
        for (id, session) in &self.ends.sessions {
            let held = session_leases.remove(id).unwrap_or_default();
            if !session.leases.iter().eq(held) {
                return Err(format!("session {id}: its leases do not match the holders"));
            }
        }
        if let Some(id) = session_leases.keys().next() {
            return Err(format!(
                "a lease is held by session {id}, which is not open"
            ));
        }
        if !self
            .deadlines
            .iter()
            .map(|(t, n, o)| (*t, n, *o))
            .eq(deadlines)
        {
            return Err("deadline index does not match the waiters".into());
        }
        if !self.idle.iter().map(|(q, n)| (*q, n)).eq(idle) {
            return Err("idle index does not match the idle records".into());
        }
        self.identities.check(&held)?;
        self.kv.check_invariants()?;
        if self.idle.len() > self.max_idle {
            return Err(format!(
                "{} idle records, more than the bound {}",
                self.idle.len(),
                self.max_idle
            ));
        }
        self.window.check()?;
        // A label belongs to a live lease, by its token.
        for (name, (token, _)) in &self.labels {
            match self.records.get(name) {
                Some(rec) if rec.holder.is_some() && rec.last_token == *token => {}
                _ => return Err(format!("{name}: a job label kept for no live lease")),
            }
        }
        Ok(())
    }

    fn check_record(&self, name: &ResourceName) -> Result<(), String> {
        match self.records.get(name) {
            Some(rec) => self.check_one(name, rec),
            None => Ok(()),
        }
    }

    fn check_one(&self, name: &ResourceName, rec: &Record) -> Result<(), String> {
        let fail = |what: &str| Err(format!("resource {name}: {what}"));
        // CANARY (planted in a `canaries` build, `canary::on`): the check that
        // would stop the reuse-token canary below is skipped, so it misbehaves.
        if rec.last_token.get() > self.last_token
            && !crate::canary::on(crate::canary::Canary::ReuseToken)
        {
            return fail("token above the table's counter");
        }
        // Tokens start at 1: a record with token 0 is not one a grant made.
        if rec.last_token.get() == 0 {
            return fail("token 0");
        }
        if let Some(l) = &rec.holder {
            if l.granted_at != NOT_REMEMBERED && l.granted_at > self.now {
                return fail("a lease granted after the table's time");
            }
            if self.ends.end_of(&l.term).0 <= self.now {
                return fail("an expired lease is still held");
            }
        } else if !rec.waiters.is_empty() {
            return fail("waiters queued on a free resource");
        }
        if rec.waiters.len() > MAX_WAITERS_PER_RESOURCE {
            return fail("more waiters than the bound");
        }
        if rec.idle_seq.is_some() != rec.is_idle() {
            return fail("idle mark is wrong");
        }
        Ok(())
    }

    /// The whole table in its persisted form.
    pub fn snapshot(&self) -> TableSnapshot {
        TableSnapshot {
            format_version: SNAPSHOT_FORMAT_VERSION,
            now: self.now,
            last_token: self.last_token,
            next_idle_seq: self.next_idle_seq,
            records: self
                .records
                .iter()
                .map(|(n, r)| (n.clone(), r.stored(&self.ends)))
                .collect(),
            revision: self.window.revision,
            changes: self.window.changes.iter().cloned().collect(),
            history: self
                .records
                .iter()
                .filter(|(_, r)| r.history().next().is_some())
                .map(|(n, r)| (n.clone(), r.history().collect()))
                .collect(),
            sessions: self
                .ends
                .sessions
                .iter()
                .map(|(id, s)| (*id, s.clone()))
                .collect(),
            identities: self.stored_identities(),
            wall_clock: self.wall.anchors().copied().collect(),
            labels: self.stored_labels(),
        }
    }
}

/// The grant history of one record against its bound and its record's
/// newest token.
fn check_history(
    name: &str,
    entries: &[HistoryEntry],
    last_token: Token,
    bound: usize,
) -> Result<(), String> {
    if entries.len() > bound {
        return Err(format!(
            "resource {name}: {} history entries, bound {bound}",
            entries.len(),
        ));
    }
    if entries
        .iter()
        .zip(entries.iter().skip(1))
        .any(|(a, b)| a.token >= b.token)
    {
        return Err(format!("resource {name}: history tokens out of order"));
    }
    if entries.iter().rev().skip(1).any(|e| e.end.is_none()) {
        return Err(format!("resource {name}: an older grant never ended"));
    }
    if entries.last().is_some_and(|e| e.token > last_token) {
        return Err(format!("resource {name}: history ahead of its token"));
    }
    Ok(())
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The refusal of the first bound that `(count, bound, limit)` has reached.
fn first_reached(checks: [(u64, CapacityBound, u64); 2]) -> Option<AcquireOutcome> {
    checks
        .into_iter()
        .find(|(count, _, limit)| count >= limit)
        .map(|(_, bound, limit)| AcquireOutcome::CapacityReached { bound, limit })
}

/// Who a command is made by: an identity, checked against the lease it
/// names, or (a command logged before leases had one) nobody checked, as
/// such a command was applied when it was written.
#[derive(Debug, Clone, Copy)]
struct Who<'a> {
    /// The identity a lease it grants or a wait it queues is recorded as.
    name: &'a str,
    checked: bool,
    /// The job label a lease it grants or a wait it queues carries.
    label: Option<&'a JobLabel>,
}

impl Who<'_> {
    const UNCHECKED: Who<'static> = Who {
        name: "",
        checked: false,
        label: None,
    };

    /// Whether a lease or wait of identity `id` is this caller's.
    fn owns(self, identities: &Identities) -> impl Fn(IdentityId) -> bool {
        let id = identities.lookup(self.name);
        move |of: IdentityId| !self.checked || id == Some(of)
    }
}

/// The event that says `who` presented the holder's owner id and token of
/// another identity's lease (logged by the server without the owner id).
fn other_identity(name: &ResourceName, token: Token, who: &str) -> Event {
    Event::OtherIdentity {
        resource: name.clone(),
        token,
        identity: who.to_string(),
    }
}

fn position_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The whole lease table in a form that serializes, tagged with its format
/// version ([`SNAPSHOT_FORMAT_VERSION`]).
///
/// Fields are only ever appended, and a version 1 snapshot ends after
/// `records`: it is read by a deserializer that stops there (see
/// `snapshot_format`). It must stay the last value of whatever contains it,
/// as in a sequential format the reader cannot skip what it did not read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableSnapshot {
    format_version: u32,
    now: ClusterTime,
    last_token: u64,
    next_idle_seq: u64,
    records: Vec<(ResourceName, StoredRecord)>,
    // Version 2:
    revision: u64,
    changes: Vec<Change>,
    history: Vec<(ResourceName, Vec<HistoryEntry>)>,
    // Version 3:
    sessions: Vec<(SessionId, Session)>,
    // Version 4:
    identities: StoredIdentities,
    // Version 5:
    wall_clock: Vec<WallAnchor>,
    // Version 6:
    labels: StoredLabels,
}

/// The job labels of live leases and of waiters, each by its resource
/// (and a waiter by its owner id). Stored last, so older versions still
/// load (with no labels).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct StoredLabels {
    holders: Vec<(ResourceName, JobLabel)>,
    waiters: Vec<(ResourceName, OwnerId, JobLabel)>,
}

impl LeaseTable {
    fn stored_labels(&self) -> StoredLabels {
        let mut stored = StoredLabels::default();
        for (name, rec) in &self.records {
            if let Some(label) = self.label_of(name.as_str()) {
                stored.holders.push((name.clone(), label.clone()));
            }
            for w in rec.waiters.iter() {
                if let Some(label) = &w.label {
                    stored.waiters.push((name.clone(), w.owner, label.clone()));
                }
            }
        }
        stored
    }
}

/// Who holds each lease with its own expiry, and who waits, where that is
/// not the empty identity (a session's leases are its identity's): names
/// once, sorted, and each lease and waiter by its name's position. Stored
/// after everything older versions had, so those still load (every lease
/// and waiter then the empty identity's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct StoredIdentities {
    names: Vec<String>,
    holders: Vec<(ResourceName, u32)>,
    waiters: Vec<(ResourceName, OwnerId, u32)>,
}

impl LeaseTable {
    fn stored_identities(&self) -> StoredIdentities {
        let mut names = BTreeSet::new();
        let holder_of = |rec: &Record| match rec.holder.as_ref().map(|l| l.term) {
            Some(Term::Own { identity, .. }) if identity != IdentityId::EMPTY => Some(identity),
            _ => None,
        };
        for rec in self.records.values() {
            names.extend(holder_of(rec).map(|id| self.identities.name(id)));
            names.extend(
                rec.waiters
                    .iter()
                    .filter(|w| w.identity != IdentityId::EMPTY)
                    .map(|w| self.identities.name(w.identity)),
            );
        }
        let names: Vec<String> = names.into_iter().map(str::to_string).collect();
        let position = |id: IdentityId| {
            let name = self.identities.name(id);
            let i = names
                .binary_search_by(|n| n.as_str().cmp(name))
                .unwrap_or(0);
            u32::try_from(i).unwrap_or(u32::MAX)
        };
        let mut stored = StoredIdentities::default();
        for (name, rec) in &self.records {
            if let Some(id) = holder_of(rec) {
                stored.holders.push((name.clone(), position(id)));
            }
            for w in rec.waiters.iter() {
                if w.identity != IdentityId::EMPTY {
                    stored
                        .waiters
                        .push((name.clone(), w.owner, position(w.identity)));
                }
            }
        }
        stored.names = names;
        stored
    }
}

mod snapshot_format {
    use std::fmt;

    use serde::{
        de::{value::MapAccessDeserializer, Error, MapAccess, SeqAccess, Visitor},
        Deserialize, Deserializer,
    };

    use super::{Session, StoredIdentities, StoredLabels, StoredRecord, TableSnapshot};
    use crate::{Change, ClusterTime, HistoryEntry, ResourceName, SessionId, WallAnchor};

    pub(super) const FIELDS: &[&str] = &[
        "format_version",
        "now",
        "last_token",
        "next_idle_seq",
        "records",
        "revision",
        "changes",
        "history",
        "sessions",
        "identities",
        "wall_clock",
        "labels",
    ];

    /// A sequence that ends before the fields its format version has.
    pub(super) fn missing<E: Error>(i: usize) -> E {
        E::invalid_length(i, &"the fields of its format version")
    }

    /// The fields in front of the records, in every format version.
    pub(super) struct Header {
        pub format_version: u32,
        pub now: ClusterTime,
        pub last_token: u64,
        pub next_idle_seq: u64,
    }

    impl Header {
        pub(super) fn read<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<Self, A::Error> {
            Ok(Header {
                format_version: seq.next_element()?.ok_or_else(|| missing(0))?,
                now: seq.next_element()?.ok_or_else(|| missing(1))?,
                last_token: seq.next_element()?.ok_or_else(|| missing(2))?,
                next_idle_seq: seq.next_element()?.ok_or_else(|| missing(3))?,
            })
        }
    }

    struct SnapshotVisitor;

    impl<'de> Visitor<'de> for SnapshotVisitor {
        type Value = TableSnapshot;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a lease table snapshot")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TableSnapshot, A::Error> {
            let missing = missing::<A::Error>;
            let h = Header::read(&mut seq)?;
            let format_version = h.format_version;
            let records = seq.next_element()?.ok_or_else(|| missing(4))?;
            let mut snapshot = TableSnapshot {
                format_version,
                now: h.now,
                last_token: h.last_token,
                next_idle_seq: h.next_idle_seq,
                records,
                revision: 0,
                changes: Vec::new(),
                history: Vec::new(),
                sessions: Vec::new(),
                identities: StoredIdentities::default(),
                wall_clock: Vec::new(),
                labels: StoredLabels::default(),
            };
            if format_version >= 2 {
                snapshot.revision = seq.next_element()?.ok_or_else(|| missing(5))?;
                snapshot.changes = seq.next_element()?.ok_or_else(|| missing(6))?;
                snapshot.history = seq.next_element()?.ok_or_else(|| missing(7))?;
            }
            if format_version >= 3 {
                snapshot.sessions = seq.next_element()?.ok_or_else(|| missing(8))?;
            }
            if format_version >= 4 {
                snapshot.identities = seq.next_element()?.ok_or_else(|| missing(9))?;
            }
            if format_version >= 5 {
                snapshot.wall_clock = seq.next_element()?.ok_or_else(|| missing(10))?;
            }
            if format_version >= 6 {
                snapshot.labels = seq.next_element()?.ok_or_else(|| missing(11))?;
            }
            Ok(snapshot)
        }

        /// Self-describing formats name their fields; the ones a version 1
        /// snapshot lacks default to empty.
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TableSnapshot, A::Error> {
            let n = Named::deserialize(MapAccessDeserializer::new(map))?;
            Ok(TableSnapshot {
                format_version: n.format_version,
                now: n.now,
                last_token: n.last_token,
                next_idle_seq: n.next_idle_seq,
                records: n.records,
                revision: n.revision,
                changes: n.changes,
                history: n.history,
                sessions: n.sessions,
                identities: n.identities,
                wall_clock: n.wall_clock,
                labels: n.labels,
            })
        }
    }

    #[derive(Deserialize)]
    struct Named {
        format_version: u32,
        now: ClusterTime,
        last_token: u64,
        next_idle_seq: u64,
        records: Vec<(ResourceName, StoredRecord)>,
        #[serde(default)]
        revision: u64,
        #[serde(default)]
        changes: Vec<Change>,
        #[serde(default)]
        history: Vec<(ResourceName, Vec<HistoryEntry>)>,
        #[serde(default)]
        sessions: Vec<(SessionId, Session)>,
        #[serde(default)]
        identities: StoredIdentities,
        #[serde(default)]
        wall_clock: Vec<WallAnchor>,
        #[serde(default)]
        labels: StoredLabels,
    }

    impl<'de> Deserialize<'de> for TableSnapshot {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_struct("TableSnapshot", FIELDS, SnapshotVisitor)
        }
    }
}

/// The whole table in its persisted form, borrowed: serializes to exactly
/// the bytes of [`LeaseTable::snapshot`]'s [`TableSnapshot`], without a
/// copy of the table, so a snapshot of a million leases streams to its
/// file (test `a_borrowed_snapshot_writes_the_same_bytes`).
pub struct TableSnapshotRef<'a>(&'a LeaseTable);

impl LeaseTable {
    /// See [`TableSnapshotRef`].
    pub fn snapshot_ref(&self) -> TableSnapshotRef<'_> {
        TableSnapshotRef(self)
    }
}

impl Serialize for TableSnapshotRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let t = self.0;
        let mut st = s.serialize_struct("TableSnapshot", 12)?;
        st.serialize_field("format_version", &SNAPSHOT_FORMAT_VERSION)?;
        st.serialize_field("now", &t.now)?;
        st.serialize_field("last_token", &t.last_token)?;
        st.serialize_field("next_idle_seq", &t.next_idle_seq)?;
        st.serialize_field("records", &RecordsRef(t))?;
        st.serialize_field("revision", &t.window.revision)?;
        st.serialize_field("changes", &t.window.changes)?;
        st.serialize_field("history", &HistoriesRef(t))?;
        st.serialize_field("sessions", &SessionsRef(t))?;
        st.serialize_field("identities", &t.stored_identities())?;
        st.serialize_field("wall_clock", &WallAnchorsRef(&t.wall))?;
        st.serialize_field("labels", &t.stored_labels())?;
        st.end()
    }
}

struct WallAnchorsRef<'a>(&'a WallClock);

impl Serialize for WallAnchorsRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.anchors())
    }
}

struct RecordsRef<'a>(&'a LeaseTable);

impl Serialize for RecordsRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.0.records.len()))?;
        for (name, rec) in &self.0.records {
            seq.serialize_element(&(name, rec.stored_ref(&self.0.ends)))?;
        }
        seq.end()
    }
}

struct SessionsRef<'a>(&'a LeaseTable);

impl Serialize for SessionsRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let sessions = &self.0.ends.sessions;
        let mut seq = s.serialize_seq(Some(sessions.len()))?;
        for entry in sessions {
            seq.serialize_element(&entry)?;
        }
        seq.end()
    }
}

struct HistoriesRef<'a>(&'a LeaseTable);

impl Serialize for HistoriesRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let kept = || {
            self.0
                .records
                .iter()
                .filter(|(_, r)| r.history().next().is_some())
        };
        let mut seq = s.serialize_seq(Some(kept().count()))?;
        for (name, rec) in kept() {
            seq.serialize_element(&(name, RecordHistory(rec)))?;
        }
        seq.end()
    }
}

/// A record's remembered grants, written as the sequence they were stored
/// as before the holder's entry was made from its lease.
struct RecordHistory<'a>(&'a Record);

impl Serialize for RecordHistory<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.history())
    }
}

impl TableSnapshot {
    pub fn format_version(&self) -> u32 {
        self.format_version
    }
}

/// A snapshot that cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot format version {found} is not supported (this build reads {supported})")]
    Version { found: u32, supported: u32 },
    #[error("snapshot breaks an invariant: {0}")]
    Invariant(String),
}

impl LeaseTable {
    /// Makes every token granted from now on greater than `floor`, for
    /// every resource, remembered or new (the counter is the table's own).
    /// Never lowers it. A cluster restored from a backup raises its floor
    /// above anything the old cluster may have issued after the backup.
    /// A floor above [`MAX_TOKEN_FLOOR`] is refused, nothing changed: room
    /// for grants must stay above it, and a counter at its end would wrap.
    pub fn raise_token_floor(&mut self, floor: u64) -> Result<(), TokenFloorError> {
        if floor > MAX_TOKEN_FLOOR {
            return Err(TokenFloorError {
                floor,
                max: MAX_TOKEN_FLOOR,
            });
        }
        self.last_token = self.last_token.max(floor);
        Ok(())
    }
}

/// A token floor above [`MAX_TOKEN_FLOOR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("token floor {floor} is above the bound {max} (2^62)")]
pub struct TokenFloorError {
    pub floor: u64,
    pub max: u64,
}

#[cfg(test)]
mod token_floor_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn acquire(table: &mut LeaseTable, resource: &str, at: u64) -> u64 {
        let applied = table.apply(&Batch {
            stamp: ClusterTime::from_millis(at),
            commands: vec![Command::Acquire {
                resource: ResourceName::new(resource).unwrap(),
                owner_id: OwnerId::random(),
                ttl_ms: 1_000,
                wait_ms: 0,
            }],
        });
        match &applied.outcomes[0] {
            Outcome::Acquire(AcquireOutcome::Granted(g)) => g.token.get(),
            other => panic!("not granted: {other:?}"),
        }
    }

    #[test]
    fn a_raised_floor_applies_to_known_and_new_resources_and_never_lowers() {
        let mut table = LeaseTable::new();
        let first = acquire(&mut table, "a", 1);
        table.raise_token_floor(1_000).unwrap();
        assert!(acquire(&mut table, "b", 2) > 1_000);
        assert!(acquire(&mut table, "a", 5_000) > 1_000);
        let before = table.last_token();
        table.raise_token_floor(first).unwrap();
        assert_eq!(table.last_token(), before);
        table.check_invariants().unwrap();
    }
}

#[cfg(test)]
mod snapshot_ref_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_borrowed_snapshot_writes_the_same_bytes() {
        let mut table = LeaseTable::with_max_idle(3);
        let name = |i: u64| ResourceName::new(&format!("r{}", i % 7)).unwrap();
        let owners: Vec<OwnerId> = (0..5).map(|_| OwnerId::random()).collect();
        for step in 0..60_u64 {
            let owner = owners[usize::try_from(step % 5).unwrap()];
            let resource = name(step);
            let command = match step % 3 {
                0 => Command::Acquire {
                    resource,
                    owner_id: owner,
                    ttl_ms: 50,
                    wait_ms: 40,
                },
                1 => Command::Release {
                    resource,
                    owner_id: owner,
                    token: table.last_token().unwrap_or(Token::new(1).unwrap()),
                },
                _ => Command::Acquire {
                    resource,
                    owner_id: owner,
                    ttl_ms: 500,
                    wait_ms: 0,
                },
            };
            table.apply(&Batch {
                stamp: ClusterTime::from_millis(step * 10),
                commands: vec![command],
            });
        }
        assert!(table.resources() > 0 && !table.history("r0", 64).is_empty());
        let owned = serde_json::to_string(&table.snapshot()).unwrap();
        let borrowed = serde_json::to_string(&table.snapshot_ref()).unwrap();
        assert_eq!(owned, borrowed);
        let back: TableSnapshot = serde_json::from_str(&borrowed).unwrap();
        let restored = LeaseTable::from_snapshot(back).unwrap();
        assert_eq!(restored.snapshot(), table.snapshot());
    }
}

#[cfg(test)]
mod layout_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A million live leases are a million records: the record stays in
    /// the allocators' 96-byte class (docs/SCALING.md).
    #[test]
    fn a_record_fits_96_bytes() {
        assert!(
            std::mem::size_of::<Record>() <= 96,
            "{}",
            std::mem::size_of::<Record>()
        );
    }

    fn fill(table: &mut LeaseTable, from: usize, to: usize, at: u64) {
        let commands = (from..to)
            .map(|i| Command::Acquire {
                resource: ResourceName::new(&format!("r{i:08}")).unwrap(),
                // The same owners in every table compared below.
                owner_id: OwnerId::from_bytes(&(i as u128 + 1).to_be_bytes()).unwrap(),
                ttl_ms: 60_000,
                wait_ms: 0,
            })
            .collect();
        table.apply(&Batch {
            stamp: ClusterTime::from_millis(at),
            commands,
        });
    }

    /// The indexes are rebuilt as they grow, and a table is the same
    /// whichever sizes its rebuilds fell at: the same grants in batches of
    /// other sizes give the same snapshot.
    #[test]
    fn grown_indexes_are_rebuilt_without_changing_the_table() {
        let filled_by = |step: usize| {
            let mut table = LeaseTable::new();
            for from in (0..100_000).step_by(step) {
                fill(&mut table, from, from + step, 1);
            }
            table.check_invariants().unwrap();
            table
        };
        let (whole, fifths, small) = (filled_by(100_000), filled_by(20_000), filled_by(2_000));
        assert_eq!(whole.built_at.records, 100_000);
        // Fifths: rebuilt at 80,000 then 100,000 (a quarter more).
        assert_eq!(fifths.built_at.own, 100_000);
        // Batches of 2,000: at 66,000, 84,000 (not 82,000: under a quarter).
        assert_eq!(small.built_at.records, 84_000);
        assert_eq!(small.built_at.own, 84_000);
        let snapshot = whole.snapshot();
        // Not assert_eq: a differing snapshot would print 100,000 records.
        assert!(fifths.snapshot() == snapshot);
        assert!(small.snapshot() == snapshot);
        assert_eq!(small.live_leases(), 100_000);
    }
}
