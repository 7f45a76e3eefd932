//! A table built from its snapshot. Records are decoded one at a time
//! straight into the table's boxed records (no vector of decoded records
//! beside the table), grant histories and sessions find their record by a
//! forward search (all are written in name order), and each invariant is
//! checked once, in the pass that builds the indexes from the records
//! (docs/DECISIONS.md, "A million live leases").

use std::fmt;

use serde::de::{
    value::MapAccessDeserializer, DeserializeSeed, Deserializer, Error as _, SeqAccess, Visitor,
};

use super::{
    snapshot_format::{missing, Header},
    IdentityId, IdleSeq, LeaseTable, Record, SnapshotError, StoredIdentities, StoredLabels,
    StoredRecord, TableSnapshot, Term, Waiters, NOT_REMEMBERED, SNAPSHOT_FORMAT_VERSION,
};
use crate::{
    Change, ClusterTime, HistoryEntry, ResourceName, SessionId, WallAnchor, WallClock,
    MAX_HISTORY_PER_RESOURCE, MAX_LOADED_REVISION, MAX_TOKEN, SESSION_IDENTITY_MAX_BYTES,
};

/// The most records room is made for ahead of decoding them: a corrupt
/// length must not reserve more than this.
const MAX_RESERVED: usize = 1 << 21;

fn invariant(what: String) -> SnapshotError {
    SnapshotError::Invariant(what)
}

/// A table being built from a snapshot, in the order its parts are stored.
pub(super) struct Builder {
    table: LeaseTable,
    /// In name order once [`Builder::records_done`] ran.
    records: Vec<(ResourceName, Box<Record>)>,
    /// Whether the records came in strictly increasing name order (every
    /// snapshot a table writes): then they need no sort and hold no
    /// duplicate.
    sorted: bool,
    /// Where the last history or session lease was found: the next one is
    /// usually just after it.
    cursor: usize,
}

impl Builder {
    /// Refuses an unknown format version before anything else is read.
    pub(super) fn new(h: Header, history_len: usize) -> Result<Self, SnapshotError> {
        if !(1..=SNAPSHOT_FORMAT_VERSION).contains(&h.format_version) {
            return Err(SnapshotError::Version {
                found: h.format_version,
                supported: SNAPSHOT_FORMAT_VERSION,
            });
        }
        // A counter of idle transitions: a file that puts it within reach of
        // its end (2^64) is not one this code wrote.
        if h.next_idle_seq >= 1 << 63 {
            return Err(invariant(format!(
                "next idle mark {} out of range",
                h.next_idle_seq
            )));
        }
        // A counter above the highest token ever issued is not one this code
        // wrote, and one at the end of a u64 would wrap on the next grant.
        if h.last_token > MAX_TOKEN {
            return Err(invariant(format!(
                "token counter {} above the bound {MAX_TOKEN} (2^63)",
                h.last_token
            )));
        }
        let table = LeaseTable {
            now: h.now,
            last_token: h.last_token,
            next_idle_seq: h.next_idle_seq,
            ..LeaseTable::new().with_history_len(history_len)
        };
        Ok(Self {
            table,
            records: Vec::new(),
            sorted: true,
            cursor: 0,
        })
    }

    fn reserve(&mut self, records: usize) {
        self.records.reserve_exact(records.min(MAX_RESERVED));
    }

    /// A record as stored; its lease is taken as one of its own until a
    /// session claims it.
    pub(super) fn record(
        &mut self,
        name: ResourceName,
        rec: StoredRecord,
    ) -> Result<(), SnapshotError> {
        if self.records.last().is_some_and(|(last, _)| *last >= name) {
            self.sorted = false;
        }
        if rec.holder.is_some_and(|l| l.token != rec.last_token) {
            return Err(invariant(format!(
                "resource {name}: holder's token is not the newest token"
            )));
        }
        // Its grant time comes with the history, if the snapshot kept it.
        let holder = rec.holder.map(|l| super::Lease {
            owner: l.owner,
            term: Term::Own {
                expires_at: l.expires_at,
                ttl_ms: l.ttl_ms,
                // Its identity comes after the sessions, if not the empty one.
                identity: IdentityId::EMPTY,
            },
            granted_at: NOT_REMEMBERED,
        });
        let idle_seq = IdleSeq::new(rec.idle_seq)
            .ok_or_else(|| invariant(format!("resource {name}: idle mark out of range")))?;
        let record = Record {
            last_token: rec.last_token,
            holder,
            ended: rec.ended.map(Box::new),
            waiters: Waiters::from(rec.waiters),
            idle_seq,
            ended_grants: Box::default(),
        };
        self.records.push((name, Box::new(record)));
        Ok(())
    }

    /// All records are in: puts them in name order if they were not.
    pub(super) fn records_done(&mut self) -> Result<(), SnapshotError> {
        if !self.sorted {
            self.records.sort_by(|a, b| a.0.cmp(&b.0));
            if self.records.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(invariant("a resource is recorded twice".into()));
            }
        }
        Ok(())
    }

    pub(super) fn window(
        &mut self,
        revision: u64,
        changes: Vec<Change>,
    ) -> Result<(), SnapshotError> {
        if revision > MAX_LOADED_REVISION {
            return Err(invariant(format!(
                "watch revision {revision} above the bound {MAX_LOADED_REVISION} (2^62)"
            )));
        }
        // Every change names a token the counter issued.
        if let Some(c) = changes
            .iter()
            .find(|c| c.token.get() > self.table.last_token)
        {
            return Err(invariant(format!(
                "change {} of {}: token {} above the table's counter {}",
                c.revision, c.resource, c.token, self.table.last_token
            )));
        }
        self.table.window.revision = revision;
        self.table.window.changes = changes.into();
        Ok(())
    }

    /// The grants kept for `name`, checked in full, then cut to the
    /// table's history length (oldest dropped). A grant that has not ended
    /// must be the holder's: its time goes to the lease, the rest are kept
    /// as ended grants.
    pub(super) fn history(
        &mut self,
        name: &str,
        mut entries: Vec<HistoryEntry>,
    ) -> Result<(), SnapshotError> {
        let i = self.find(name).ok_or_else(|| {
            invariant(format!("history kept for {name}, which is not remembered"))
        })?;
        let rec = &mut self.records[i].1;
        let remembered = |l: &super::Lease| l.granted_at != NOT_REMEMBERED;
        if !rec.ended_grants.is_empty() || rec.holder.as_ref().is_some_and(remembered) {
            return Err(invariant(format!("history of {name} is kept twice")));
        }
        super::check_history(name, &entries, rec.last_token, MAX_HISTORY_PER_RESOURCE)
            .map_err(invariant)?;
        let extra = entries.len().saturating_sub(self.table.history_len);
        entries.drain(..extra);
        if let Some(live) = entries.pop_if(|e| e.end.is_none()) {
            let lease = rec
                .holder
                .as_mut()
                .filter(|l| l.owner == live.owner_id && live.token == rec.last_token)
                .ok_or_else(|| {
                    invariant(format!("{name}: a grant never ended, not the holder's"))
                })?;
            if live.granted_at == NOT_REMEMBERED {
                return Err(invariant(format!("{name}: grant time out of range")));
            }
            lease.granted_at = live.granted_at;
        }
        // The holder's grant has not ended: an ended grant with its token (or
        // a later one) is not a history this code wrote.
        if rec.holder.is_some() && entries.last().is_some_and(|e| e.token >= rec.last_token) {
            return Err(invariant(format!(
                "{name}: the holder's grant is recorded as ended"
            )));
        }
        rec.ended_grants = entries.into_boxed_slice();
        Ok(())
    }

    /// An open session and the resources whose lease it holds: each must be
    /// held, by no other session. The session keeps the records' names.
    pub(super) fn session<'n>(
        &mut self,
        id: SessionId,
        identity: String,
        ttl_ms: u64,
        expires_at: ClusterTime,
        leases: impl IntoIterator<Item = &'n str>,
    ) -> Result<(), SnapshotError> {
        let owner = self.table.identities.intern(&identity).ok_or_else(|| {
            invariant(format!("session {id}: more identities than a table holds"))
        })?;
        let mut names = Vec::new();
        for name in leases {
            let i = self.find(name).ok_or_else(|| {
                invariant(format!(
                    "session {id} holds the lease of {name}, which is not remembered"
                ))
            })?;
            let (record_name, rec) = &mut self.records[i];
            match rec.holder.as_mut().map(|l| &mut l.term) {
                Some(term @ Term::Own { .. }) => *term = Term::Session(id, owner),
                // Named twice by this session: a set, as before.
                Some(Term::Session(s, _)) if *s == id => continue,
                Some(Term::Session(..)) => {
                    return Err(invariant(format!(
                        "the lease of {name} is held by two sessions"
                    )))
                }
                None => {
                    return Err(invariant(format!(
                        "session {id} holds the lease of {name}, which is free"
                    )))
                }
            }
            names.push(record_name.clone());
        }
        let session = crate::session::Session {
            identity,
            ttl_ms,
            expires_at,
            leases: names.into_iter().collect(),
        };
        self.table
            .ends
            .restore(id, session)
            .map_err(SnapshotError::Invariant)
    }

    /// Who holds the leases with their own expiry, and who waits, where
    /// that is not the empty identity: each entry names a held lease (not
    /// a session's) or a queued waiter, once, and a name of the table.
    pub(super) fn identities(&mut self, stored: StoredIdentities) -> Result<(), SnapshotError> {
        let mut ids = Vec::with_capacity(stored.names.len());
        for name in &stored.names {
            if name.len() > SESSION_IDENTITY_MAX_BYTES {
                return Err(invariant(format!(
                    "an identity of {} bytes, more than {SESSION_IDENTITY_MAX_BYTES}",
                    name.len()
                )));
            }
            let id = self
                .table
                .identities
                .intern(name)
                .ok_or_else(|| invariant("more identities than a table holds".to_string()))?;
            ids.push(id);
        }
        let id_at = |i: u32| {
            usize::try_from(i)
                .ok()
                .and_then(|i| ids.get(i).copied())
                .ok_or_else(|| invariant(format!("identity {i} is not in the names")))
        };
        self.cursor = 0;
        for (name, i) in stored.holders {
            let id = id_at(i)?;
            let at = self.find(name.as_str()).ok_or_else(|| {
                invariant(format!("identity kept for {name}, which is not remembered"))
            })?;
            match self.records[at].1.holder.as_mut().map(|l| &mut l.term) {
                Some(Term::Own { identity, .. }) if *identity == IdentityId::EMPTY => {
                    *identity = id;
                }
                _ => {
                    return Err(invariant(format!(
                        "{name}: an identity kept for no lease of its own, or twice"
                    )))
                }
            }
        }
        self.cursor = 0;
        for (name, owner, i) in stored.waiters {
            let id = id_at(i)?;
            let at = self.find(name.as_str()).ok_or_else(|| {
                invariant(format!("identity kept for {name}, which is not remembered"))
            })?;
            let waiters = &mut self.records[at].1.waiters;
            let waiter = waiters
                .0
                .as_mut()
                .and_then(|q| q.iter_mut().find(|w| w.owner == owner))
                .filter(|w| w.identity == IdentityId::EMPTY)
                .ok_or_else(|| {
                    invariant(format!("{name}: an identity kept for no waiter, or twice"))
                })?;
            waiter.identity = id;
        }
        Ok(())
    }

    /// Where `name` is among the records: the one after the last found
    /// first, then searched forward from there by doubling steps, else in
    /// the records before it.
    fn find(&mut self, name: &str) -> Option<usize> {
        let records = &self.records;
        let at = |i: usize| records[i].0.as_str();
        let search = |lo: usize, hi: usize| {
            records[lo..hi]
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
                .ok()
                .map(|i| lo + i)
        };
        let from = self.cursor;
        let found = if from < records.len() && at(from) == name {
            Some(from)
        } else if from < records.len() && at(from) < name {
            let (mut lo, mut step) = (from, 1);
            while lo + step < records.len() && at(lo + step) <= name {
                lo += step;
                step *= 2;
            }
            search(lo, (lo + step).min(records.len()))
        } else {
            search(0, from.min(records.len()))
        };
        if let Some(i) = found {
            self.cursor = i + 1;
        }
        found
    }

    /// Checks every record against the table's counter, clock and sessions
    /// and builds the indexes from them in the same pass: an index built
    /// from the records matches them by construction.
    /// The job labels (version 6; none before): each of a live lease the
    /// snapshot holds, or of one of its waiters, once.
    pub(super) fn labels(&mut self, stored: StoredLabels) -> Result<(), SnapshotError> {
        self.cursor = 0;
        for (name, label) in stored.holders {
            let at = self.find(name.as_str()).ok_or_else(|| {
                invariant(format!("label kept for {name}, which is not remembered"))
            })?;
            let rec = &self.records[at].1;
            if rec.holder.is_none() {
                return Err(invariant(format!("{name}: a label kept for no lease")));
            }
            let token = rec.last_token;
            if self
                .table
                .labels
                .insert(name.clone(), (token, label))
                .is_some()
            {
                return Err(invariant(format!("{name}: a lease's label kept twice")));
            }
        }
        self.cursor = 0;
        for (name, owner, label) in stored.waiters {
            let at = self.find(name.as_str()).ok_or_else(|| {
                invariant(format!("label kept for {name}, which is not remembered"))
            })?;
            let waiter = self.records[at]
                .1
                .waiters
                .0
                .as_mut()
                .and_then(|q| q.iter_mut().find(|w| w.owner == owner))
                .filter(|w| w.label.is_none())
                .ok_or_else(|| {
                    invariant(format!("{name}: a label kept for no waiter, or twice"))
                })?;
            waiter.label = Some(label);
        }
        Ok(())
    }

    /// The wall-clock anchors (version 5; none before), checked.
    pub(super) fn wall_clock(&mut self, anchors: Vec<WallAnchor>) -> Result<(), SnapshotError> {
        self.table.wall = WallClock::from_stored(anchors).map_err(invariant)?;
        Ok(())
    }

    pub(super) fn finish(self) -> Result<LeaseTable, SnapshotError> {
        let Builder {
            mut table, records, ..
        } = self;
        // CANARY (planted in a `canaries` build, `canary::on`): a table loaded
        // from a snapshot (a restart, or a snapshot installed from the leader)
        // forgets its token counter, as if the snapshot did not carry it, and
        // counts again from 0: every resource it remembers is then granted
        // tokens at or below ones already issued for it.
        if crate::canary::on(crate::canary::Canary::ReuseToken) {
            table.last_token = 0;
        }
        let mut expiries = Vec::with_capacity(records.len());
        let mut deadlines = Vec::new();
        let mut idle = Vec::new();
        // Counted from the records: what each identity holds and waits for.
        table.identities.clear_counts();
        for (name, rec) in &records {
            table.check_one(name, rec).map_err(invariant)?;
            if let Some(l) = &rec.holder {
                table.identities.add_lease(l.term.identity());
            }
            for w in rec.waiters.iter() {
                table.identities.add_waiter(w.identity);
            }
            if let Some(Term::Own { expires_at, .. }) = rec.holder.as_ref().map(|l| l.term) {
                expiries.push((expires_at, name.clone()));
            }
            for w in rec.waiters.iter() {
                deadlines.push((w.deadline, name.clone(), w.owner));
            }
            if let Some(seq) = rec.idle_seq.get() {
                idle.push((seq, name.clone()));
            }
        }
        table.identities.forget_unused();
        table.ends.check(table.now).map_err(invariant)?;
        if idle.len() > table.max_idle {
            return Err(invariant(format!(
                "{} idle records, more than the bound {}",
                idle.len(),
                table.max_idle
            )));
        }
        table.window.check().map_err(invariant)?;
        // Stable, by time only: the records' name order is kept among
        // leases that end at once, so the set is built from sorted input.
        expiries.sort_by_key(|(t, _)| *t);
        table.ends.own = expiries.into_iter().collect();
        let waiters = deadlines.len();
        table.deadlines = deadlines.into_iter().collect();
        if table.deadlines.len() != waiters {
            return Err(invariant("a waiter is queued twice".into()));
        }
        table.idle = idle.into_iter().collect();
        table.records = records.into_iter().collect();
        table.built_at = super::IndexSizes {
            records: table.records.len(),
            own: table.ends.own.len(),
        };
        // The full check agrees with the one folded into the build above
        // (debug builds and tests only: it takes as long as the build).
        debug_assert_eq!(table.check_invariants(), Ok(()));
        Ok(table)
    }
}

impl LeaseTable {
    /// Rebuilds a table from a snapshot, refusing an unknown format or a
    /// snapshot whose contents break an invariant; remembers the default
    /// number of grants per resource.
    pub fn from_snapshot(snapshot: TableSnapshot) -> Result<Self, SnapshotError> {
        Self::from_snapshot_with_history(snapshot, crate::DEFAULT_HISTORY_PER_RESOURCE)
    }

    /// [`LeaseTable::from_snapshot`] remembering at most `history_len`
    /// grants per resource (the oldest beyond it are dropped).
    pub fn from_snapshot_with_history(
        snapshot: TableSnapshot,
        history_len: usize,
    ) -> Result<Self, SnapshotError> {
        let header = Header {
            format_version: snapshot.format_version,
            now: snapshot.now,
            last_token: snapshot.last_token,
            next_idle_seq: snapshot.next_idle_seq,
        };
        let mut b = Builder::new(header, history_len)?;
        b.reserve(snapshot.records.len());
        for (name, rec) in snapshot.records {
            b.record(name, rec)?;
        }
        b.records_done()?;
        b.window(snapshot.revision, snapshot.changes)?;
        for (name, entries) in snapshot.history {
            b.history(name.as_str(), entries)?;
        }
        for (id, s) in snapshot.sessions {
            b.session(
                id,
                s.identity,
                s.ttl_ms,
                s.expires_at,
                s.leases.iter().map(ResourceName::as_str),
            )?;
        }
        b.identities(snapshot.identities)?;
        b.wall_clock(snapshot.wall_clock)?;
        b.labels(snapshot.labels)?;
        b.finish()
    }
}

/// Decodes a [`TableSnapshot`] straight into a [`LeaseTable`] that
/// remembers `history_len` grants per resource: what
/// [`LeaseTable::from_snapshot_with_history`] builds, without the
/// snapshot's vectors in memory beside it. Names of histories and
/// sessions are compared in place where the format lends them.
#[derive(Debug, Clone, Copy)]
pub struct TableSeed {
    pub history_len: usize,
}

impl<'de> DeserializeSeed<'de> for TableSeed {
    type Value = LeaseTable;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<LeaseTable, D::Error> {
        d.deserialize_struct("TableSnapshot", super::snapshot_format::FIELDS, self)
    }
}

impl<'de> Visitor<'de> for TableSeed {
    type Value = LeaseTable;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a lease table snapshot")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LeaseTable, A::Error> {
        let missing = missing::<A::Error>;
        let header = Header::read(&mut seq)?;
        let format_version = header.format_version;
        let mut b = Builder::new(header, self.history_len).map_err(A::Error::custom)?;
        seq.next_element_seed(Records(&mut b))?
            .ok_or_else(|| missing(4))?;
        b.records_done().map_err(A::Error::custom)?;
        if format_version >= 2 {
            let revision = seq.next_element()?.ok_or_else(|| missing(5))?;
            let changes = seq.next_element()?.ok_or_else(|| missing(6))?;
            b.window(revision, changes).map_err(A::Error::custom)?;
            seq.next_element_seed(Histories(&mut b))?
                .ok_or_else(|| missing(7))?;
        }
        if format_version >= 3 {
            seq.next_element_seed(Sessions(&mut b))?
                .ok_or_else(|| missing(8))?;
        }
        if format_version >= 4 {
            let identities = seq.next_element()?.ok_or_else(|| missing(9))?;
            b.identities(identities).map_err(A::Error::custom)?;
        }
        if format_version >= 5 {
            let anchors = seq.next_element()?.ok_or_else(|| missing(10))?;
            b.wall_clock(anchors).map_err(A::Error::custom)?;
        }
        if format_version >= 6 {
            let labels = seq.next_element()?.ok_or_else(|| missing(11))?;
            b.labels(labels).map_err(A::Error::custom)?;
        }
        b.finish().map_err(A::Error::custom)
    }

    /// Self-describing formats: decoded whole, then built.
    fn visit_map<M: serde::de::MapAccess<'de>>(self, map: M) -> Result<LeaseTable, M::Error> {
        let snapshot =
            <TableSnapshot as serde::Deserialize>::deserialize(MapAccessDeserializer::new(map))?;
        LeaseTable::from_snapshot_with_history(snapshot, self.history_len).map_err(M::Error::custom)
    }
}

/// Runs `each` on every element of a sequence, holding none of them.
fn each_element<'de, A, T, F>(mut seq: A, mut each: F) -> Result<(), A::Error>
where
    A: SeqAccess<'de>,
    T: serde::Deserialize<'de>,
    F: FnMut(T) -> Result<(), SnapshotError>,
{
    while let Some(element) = seq.next_element()? {
        each(element).map_err(A::Error::custom)?;
    }
    Ok(())
}

/// A sequence visited element by element (the visitors below).
macro_rules! seq_seed {
    ($name:ident, $what:literal, |$b:ident, $seq:ident| $body:expr) => {
        impl<'de> DeserializeSeed<'de> for $name<'_> {
            type Value = ();

            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_seq(self)
            }
        }

        impl<'de> Visitor<'de> for $name<'_> {
            type Value = ();

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str($what)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, $seq: A) -> Result<(), A::Error> {
                let $b = self.0;
                $body
            }
        }
    };
}

struct Records<'b>(&'b mut Builder);
seq_seed!(Records, "the records", |b, seq| {
    b.reserve(seq.size_hint().unwrap_or(0));
    each_element(seq, |(name, rec): (ResourceName, StoredRecord)| {
        b.record(name, rec)
    })
});

struct Histories<'b>(&'b mut Builder);
seq_seed!(Histories, "the grant histories", |b, seq| {
    each_element(seq, |(name, entries): (Name<'_>, Vec<HistoryEntry>)| {
        b.history(name.as_str(), entries)
    })
});

struct Sessions<'b>(&'b mut Builder);
seq_seed!(Sessions, "the sessions", |b, seq| {
    each_element(seq, |(id, s): (SessionId, StoredSession<'_>)| {
        b.session(
            id,
            s.identity,
            s.ttl_ms,
            s.expires_at,
            s.leases.iter().map(Name::as_str),
        )
    })
});

/// A session as stored (the layout of [`crate::session::Session`]), its
/// lease names not made into names of their own: they are the records'.
#[derive(serde::Deserialize)]
struct StoredSession<'a> {
    identity: String,
    ttl_ms: u64,
    expires_at: ClusterTime,
    #[serde(borrow)]
    leases: Vec<Name<'a>>,
}

/// A resource name only looked up, never kept: borrowed from the input
/// where the format allows.
struct Name<'a>(std::borrow::Cow<'a, str>);

impl Name<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a resource name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Name<'de>, E> {
                Ok(Name(v.to_owned().into()))
            }
            fn visit_string<E>(self, v: String) -> Result<Name<'de>, E> {
                Ok(Name(v.into()))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::{json, Value};

    use super::*;
    use crate::{Batch, Command, OwnerId, DEFAULT_HISTORY_PER_RESOURCE};

    fn acquire(table: &mut LeaseTable, at: u64, resource: &str) {
        table.apply(&Batch {
            stamp: ClusterTime::from_millis(at),
            commands: vec![Command::Acquire {
                resource: ResourceName::new(resource).unwrap(),
                owner_id: OwnerId::random(),
                ttl_ms: 10,
                wait_ms: 0,
            }],
        });
    }

    fn load(value: Value) -> Result<LeaseTable, SnapshotError> {
        LeaseTable::from_snapshot(serde_json::from_value(value).unwrap())
    }

    fn three_leases() -> LeaseTable {
        let mut table = LeaseTable::new();
        for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
            acquire(&mut table, i as u64, name);
        }
        table
    }

    #[test]
    fn a_history_longer_than_the_default_loads_at_the_length_asked() {
        let mut table = LeaseTable::new().with_history_len(32);
        for i in 0..20 {
            acquire(&mut table, i * 20, "r");
        }
        assert_eq!(table.history("r", 64).len(), 20);
        let loaded = LeaseTable::from_snapshot_with_history(table.snapshot(), 32).unwrap();
        assert_eq!(loaded.snapshot(), table.snapshot());
        // A shorter length keeps the newest grants.
        let short = LeaseTable::from_snapshot(table.snapshot()).unwrap();
        let kept = short.history("r", 64);
        assert_eq!(kept.len(), DEFAULT_HISTORY_PER_RESOURCE);
        assert_eq!(kept, table.history("r", DEFAULT_HISTORY_PER_RESOURCE));
    }

    #[test]
    fn records_out_of_order_load_and_a_resource_recorded_twice_is_refused() {
        let table = three_leases();
        let mut value = serde_json::to_value(table.snapshot()).unwrap();
        value["records"].as_array_mut().unwrap().reverse();
        assert_eq!(load(value.clone()).unwrap().snapshot(), table.snapshot());
        let records = value["records"].as_array_mut().unwrap();
        let first = records[0].clone();
        records.push(first);
        assert_eq!(
            load(value).unwrap_err(),
            SnapshotError::Invariant("a resource is recorded twice".into())
        );
    }

    #[test]
    fn a_history_without_its_record_or_kept_twice_is_refused() {
        let table = three_leases();
        let value = serde_json::to_value(table.snapshot()).unwrap();
        let mut unknown = value.clone();
        unknown["history"][0][0] = json!("zz");
        assert!(matches!(load(unknown), Err(SnapshotError::Invariant(e)) if e.contains("zz")));
        let mut twice = value;
        let history = twice["history"].as_array_mut().unwrap();
        let first = history[0].clone();
        history.insert(1, first);
        assert!(matches!(load(twice), Err(SnapshotError::Invariant(e)) if e.contains("twice")));
    }

    #[test]
    fn a_history_that_ends_the_holders_grant_or_an_idle_counter_at_its_end_is_refused() {
        let value = serde_json::to_value(three_leases().snapshot()).unwrap();
        let mut ended = value.clone();
        ended["history"][0][1][0]["end"] = json!({"at": 2, "how": "Released"});
        let refused =
            |r, what: &str| matches!(r, Err(SnapshotError::Invariant(e)) if e.contains(what));
        assert!(refused(load(ended), "holder's grant is recorded as ended"));
        let mut counter = value;
        counter["next_idle_seq"] = json!(u64::MAX - 1);
        assert!(refused(load(counter), "next idle mark"));
    }

    #[test]
    fn a_session_must_hold_a_held_lease_no_other_session_holds() {
        let table = three_leases();
        let value = serde_json::to_value(table.snapshot()).unwrap();
        let session = |id: u8, leases: &[&str]| {
            let id = SessionId::from_bytes(&[id; 16]).unwrap();
            json!([
                id,
                {"identity": "app", "ttl_ms": 1000, "expires_at": 5000, "leases": leases}
            ])
        };
        let with = |sessions: Vec<Value>| {
            let mut v = value.clone();
            v["sessions"] = Value::Array(sessions);
            load(v)
        };
        let held = with(vec![session(1, &["a", "b"])]).unwrap();
        assert_eq!(held.sessions(), 1);
        assert_eq!(held.live_leases(), 3);
        let err = |r: Result<LeaseTable, SnapshotError>| match r {
            Err(SnapshotError::Invariant(e)) => e,
            other => panic!("loaded: {other:?}"),
        };
        assert!(err(with(vec![session(1, &["a"]), session(2, &["a"])])).contains("two sessions"));
        assert!(err(with(vec![session(1, &["zz"])])).contains("not remembered"));
        assert!(err(with(vec![session(1, &["a"]), session(1, &["b"])])).contains("twice"));
        // A free resource: "a" released. Its grant, still live in the
        // history, is refused first; without it, the session's claim.
        let mut freed = value.clone();
        freed["records"][0][1]["holder"] = Value::Null;
        freed["sessions"] = json!([session(1, &["a"])]);
        assert!(err(load(freed.clone())).contains("never ended"));
        let history = freed["history"].as_array_mut().unwrap();
        history.retain(|h| h[0] != json!("a"));
        assert!(err(load(freed)).contains("free"));
    }

    /// Through a sequence-based format, as a node's codec reads it: the
    /// same table as the whole-snapshot path.
    #[test]
    fn the_seed_builds_what_from_snapshot_builds() {
        let mut table = three_leases().with_history_len(4);
        for i in 0..6 {
            acquire(&mut table, 100 + i * 20, "b");
        }
        let seq = serde_json::to_value(table.snapshot()).unwrap();
        let fields = super::super::snapshot_format::FIELDS;
        let as_seq = Value::Array(fields.iter().map(|f| seq[*f].clone()).collect());
        let seed = TableSeed { history_len: 4 };
        let streamed = seed.deserialize(&as_seq).unwrap();
        let whole = LeaseTable::from_snapshot_with_history(table.snapshot(), 4).unwrap();
        assert_eq!(streamed.snapshot(), whole.snapshot());
        assert_eq!(streamed.snapshot(), table.snapshot());
        let from_map = seed.deserialize(&seq).unwrap();
        assert_eq!(from_map.snapshot(), table.snapshot());
    }
}
