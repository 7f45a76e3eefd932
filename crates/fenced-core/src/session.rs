//! When leases end: each lease at its own expiry, or with its session.
//!
//! A lease acquired in a session has no expiry of its own: it is live while
//! its session is, so one keep-alive (one write to the session) extends
//! every lease of the session, and when the session lapses or is closed all
//! its leases end in the same step, at the same cluster time.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{
    table::IdentityId, ClusterTime, ResourceName, SessionBound, SessionBounds, SessionId,
    SessionOutcome, SessionRefusal,
};

/// How a held lease ends, and the identity that holds it: kept here, where
/// it fills the padding beside the variant's tag, so a lease stays 48
/// bytes and a record 96 (docs/DECISIONS.md, "A lease belongs to an
/// identity").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Term {
    /// At `expires_at`, unless renewed.
    Own {
        expires_at: ClusterTime,
        ttl_ms: u64,
        identity: IdentityId,
    },
    /// With its session; `identity` is the session's.
    Session(SessionId, IdentityId),
}

impl Term {
    pub fn identity(&self) -> IdentityId {
        match self {
            Term::Own { identity, .. } | Term::Session(_, identity) => *identity,
        }
    }
}

/// An open session. Also its snapshot layout (the leases as a sequence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Session {
    /// Who opened it: only the same identity keeps it alive, closes it or
    /// acquires in it.
    pub identity: String,
    pub ttl_ms: u64,
    pub expires_at: ClusterTime,
    /// The resources whose lease it holds.
    pub leases: BTreeSet<ResourceName>,
}

/// The expiry indexes of the table: leases with their own expiry by time,
/// and sessions by time with the leases each holds. Kept apart from the
/// records so that a record can be changed while they are.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ends {
    /// Every held lease with its own expiry, by expiry time.
    pub own: BTreeSet<(ClusterTime, ResourceName)>,
    pub sessions: BTreeMap<SessionId, Session>,
    /// Every session by the time it lapses.
    pub session_expiries: BTreeSet<(ClusterTime, SessionId)>,
    /// Open sessions per identity.
    per_identity: BTreeMap<String, u64>,
    /// Leases held by sessions, over all of them.
    session_leases: usize,
}

impl Ends {
    /// When a lease of this term ends, and the TTL it runs on. A session
    /// that is not open (never the case for a held lease, an invariant)
    /// reads as ended at time zero.
    pub fn end_of(&self, term: &Term) -> (ClusterTime, u64) {
        match term {
            Term::Own {
                expires_at, ttl_ms, ..
            } => (*expires_at, *ttl_ms),
            Term::Session(id, _) => self
                .sessions
                .get(id)
                .map_or((ClusterTime::ZERO, 0), |s| (s.expires_at, s.ttl_ms)),
        }
    }

    pub fn live_leases(&self) -> usize {
        self.own.len() + self.session_leases
    }

    /// The earliest time a lease or a session runs out.
    pub fn first_expiry(&self) -> Option<ClusterTime> {
        let own = self.own.first().map(|(t, _)| *t);
        let session = self.session_expiries.first().map(|(t, _)| *t);
        match (own, session) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Indexes a lease of `name` just granted.
    pub fn attach(&mut self, name: &ResourceName, term: &Term) {
        match term {
            Term::Own { expires_at, .. } => {
                self.own.insert((*expires_at, name.clone()));
            }
            Term::Session(id, _) => {
                if let Some(s) = self.sessions.get_mut(id) {
                    if s.leases.insert(name.clone()) {
                        self.session_leases += 1;
                    }
                }
            }
        }
    }

    /// Forgets a lease of `name` that ended.
    pub fn detach(&mut self, name: &ResourceName, term: &Term) {
        match term {
            Term::Own { expires_at, .. } => {
                self.own.remove(&(*expires_at, name.clone()));
            }
            Term::Session(id, _) => {
                if let Some(s) = self.sessions.get_mut(id) {
                    if s.leases.remove(name) {
                        self.session_leases -= 1;
                    }
                }
            }
        }
    }

    /// Moves a lease with its own expiry to a new expiry.
    pub fn reschedule(&mut self, name: &ResourceName, from: ClusterTime, to: ClusterTime) {
        self.own.remove(&(from, name.clone()));
        self.own.insert((to, name.clone()));
    }

    /// Whether `identity` may use session `id` at `now`.
    pub fn check_owner(
        &self,
        id: SessionId,
        identity: &str,
        now: ClusterTime,
    ) -> Result<&Session, SessionRefusal> {
        let session = self
            .sessions
            .get(&id)
            .filter(|s| s.expires_at > now)
            .ok_or(SessionRefusal::Gone)?;
        if session.identity != identity {
            return Err(SessionRefusal::NotOwner);
        }
        Ok(session)
    }

    /// Opens session `id`, or keeps it alive when `identity` has it open
    /// already (a retried open).
    pub fn open(
        &mut self,
        id: SessionId,
        identity: &str,
        ttl_ms: u64,
        bounds: SessionBounds,
        now: ClusterTime,
    ) -> SessionOutcome {
        if self.sessions.contains_key(&id) {
            return self.keep_alive(id, identity, now);
        }
        let refuse = |bound, limit| SessionOutcome::Refused(SessionRefusal::Bound { bound, limit });
        if as_u64(self.sessions.len()) >= bounds.max_sessions {
            return refuse(SessionBound::Sessions, bounds.max_sessions);
        }
        let of_identity = self.per_identity.get(identity).copied().unwrap_or(0);
        if of_identity >= bounds.max_sessions_per_identity {
            return refuse(
                SessionBound::SessionsPerIdentity,
                bounds.max_sessions_per_identity,
            );
        }
        let ttl_ms = ttl_ms.max(1);
        let expires_at = now.plus_millis(ttl_ms);
        self.insert(
            id,
            Session {
                identity: identity.to_string(),
                ttl_ms,
                expires_at,
                leases: BTreeSet::new(),
            },
        );
        SessionOutcome::Alive {
            expires_at,
            ttl_ms,
            leases: 0,
        }
    }

    /// Extends session `id` by its TTL from `now` (never shortens it).
    pub fn keep_alive(
        &mut self,
        id: SessionId,
        identity: &str,
        now: ClusterTime,
    ) -> SessionOutcome {
        let (from, ttl_ms, leases) = match self.check_owner(id, identity, now) {
            Ok(s) => (s.expires_at, s.ttl_ms, as_u64(s.leases.len())),
            Err(refusal) => return SessionOutcome::Refused(refusal),
        };
        let expires_at = from.max(now.plus_millis(ttl_ms));
        if let Some(s) = self.sessions.get_mut(&id) {
            s.expires_at = expires_at;
        }
        self.session_expiries.remove(&(from, id));
        self.session_expiries.insert((expires_at, id));
        SessionOutcome::Alive {
            expires_at,
            ttl_ms,
            leases,
        }
    }

    /// The first session that has run out at `now`.
    pub fn first_lapsed(&self, now: ClusterTime) -> Option<SessionId> {
        self.session_expiries
            .first()
            .filter(|(t, _)| *t <= now)
            .map(|(_, id)| *id)
    }

    fn insert(&mut self, id: SessionId, session: Session) {
        self.session_expiries.insert((session.expires_at, id));
        *self
            .per_identity
            .entry(session.identity.clone())
            .or_default() += 1;
        self.session_leases += session.leases.len();
        self.sessions.insert(id, session);
    }

    /// Takes session `id` out of every index; its leases are the caller's
    /// to end.
    pub fn remove(&mut self, id: SessionId) -> Option<Session> {
        let session = self.sessions.remove(&id)?;
        self.session_expiries.remove(&(session.expires_at, id));
        if let Some(n) = self.per_identity.get_mut(&session.identity) {
            *n -= 1;
            if *n == 0 {
                self.per_identity.remove(&session.identity);
            }
        }
        self.session_leases -= session.leases.len();
        Some(session)
    }

    /// Adds a session restored from a snapshot, refusing a second one
    /// with the same id.
    pub fn restore(&mut self, id: SessionId, session: Session) -> Result<(), String> {
        if self.sessions.contains_key(&id) {
            return Err(format!("session {id} is recorded twice"));
        }
        self.insert(id, session);
        Ok(())
    }

    /// Checks the session indexes against the sessions, and that every
    /// session is still open at `now` with each of its leases named once.
    pub fn check(&self, now: ClusterTime) -> Result<(), String> {
        let mut per_identity: BTreeMap<&str, u64> = BTreeMap::new();
        let mut leases = 0;
        for (id, s) in &self.sessions {
            if s.expires_at <= now {
                return Err(format!("session {id} lapsed but is still open"));
            }
            if !self.session_expiries.contains(&(s.expires_at, *id)) {
                return Err(format!("session {id} is missing from the expiry index"));
            }
            *per_identity.entry(&s.identity).or_default() += 1;
            leases += s.leases.len();
        }
        if self.session_expiries.len() != self.sessions.len() {
            return Err("session expiry index does not match the sessions".into());
        }
        if !self
            .per_identity
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .eq(per_identity)
        {
            return Err("sessions per identity do not match the sessions".into());
        }
        if leases != self.session_leases {
            return Err("session lease count does not match the sessions".into());
        }
        Ok(())
    }
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
