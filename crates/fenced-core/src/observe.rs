//! What the table records for observers: ownership changes with revisions
//! (for Watch), the last grants of each resource (for History) and the state
//! of a token (for ValidateToken). Computed while applying, so every replica
//! records the same things with the same revisions.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{ClusterTime, InvalidArgument, OwnerId, ResourceName, Token};

/// How many recent changes the table keeps for watchers that resume. Part of
/// the replicated state (snapshots carry the window), so the same on every
/// node; a watcher resuming from an older revision is told it was compacted.
pub const WATCH_WINDOW: usize = 8192;

/// The default number of grants remembered per resource.
pub const DEFAULT_HISTORY_PER_RESOURCE: usize = 16;

/// The most grants a node may be configured to remember per resource.
pub const MAX_HISTORY_PER_RESOURCE: usize = 64;

/// The most (resource, token) pairs one ValidateTokens call may check.
pub const MAX_VALIDATE_BATCH: usize = 256;

/// What happened to a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    Granted,
    Released,
    Expired,
    /// Ended because a later owner was granted the resource. The table never
    /// grants over a lease that has not ended (an expired lease is ended by
    /// the sweep at the start of the entry that grants the next one), so this
    /// version never records it; it is kept for the wire contract.
    Superseded,
}

/// One ownership change, numbered by the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// One more than the change before it, across all resources.
    pub revision: u64,
    pub resource: ResourceName,
    pub kind: ChangeKind,
    pub token: Token,
    pub owner_id: OwnerId,
    /// The cluster time of the entry that made the change.
    pub at: ClusterTime,
}

/// How a remembered lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseEnd {
    pub at: ClusterTime,
    pub how: ChangeKind,
}

/// A remembered grant with the leader's wall clock (ms since the Unix
/// epoch) at its grant and at its end, where the table knows them: what
/// people read (the History call, the status page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatedHistoryEntry {
    pub entry: HistoryEntry,
    pub granted_at_unix_ms: Option<u64>,
    pub ended_at_unix_ms: Option<u64>,
}

/// One remembered grant of a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub token: Token,
    pub owner_id: OwnerId,
    pub granted_at: ClusterTime,
    /// `None` while the lease is live.
    pub end: Option<LeaseEnd>,
}

/// The state of a (resource, token) pair at a point in cluster time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// The token is the holder's and its lease runs for `remaining_ms` more.
    Current { remaining_ms: u64 },
    /// A higher token was issued for the resource.
    Superseded,
    /// The token is the newest and its lease ran out.
    Expired,
    /// The token is the newest and its lease was released.
    Released,
    /// Never issued for this resource, or the resource is not remembered.
    Unknown,
}

/// What [`crate::LeaseTable::validate`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validation {
    pub state: TokenState,
    /// The newest token issued for the resource; `None` if none is
    /// remembered.
    pub current_token: Option<Token>,
}

/// A resume point older than the changes the table still keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// The oldest revision kept.
    pub oldest_revision: u64,
}

/// Changes after a revision, as [`crate::LeaseTable::changes_after`] finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangesAfter {
    /// The changes whose resource starts with the prefix, in revision order.
    pub changes: Vec<Change>,
    /// The last revision looked at: resume after it (it may be past the
    /// last change returned, when the ones after did not match).
    pub scanned_to: u64,
}

/// The prefix a watcher follows: 0 to [`crate::RESOURCE_NAME_MAX_BYTES`]
/// bytes of UTF-8 without control characters (empty: every resource).
pub fn watch_prefix(prefix: &[u8]) -> Result<String, InvalidArgument> {
    let max = crate::RESOURCE_NAME_MAX_BYTES;
    if prefix.len() > max {
        return Err(InvalidArgument::new(
            "prefix",
            format!("must be 0 to {max} bytes of UTF-8, got {}", prefix.len()),
        ));
    }
    let s =
        std::str::from_utf8(prefix).map_err(|_| InvalidArgument::new("prefix", "must be UTF-8"))?;
    if s.chars().any(char::is_control) {
        return Err(InvalidArgument::new(
            "prefix",
            "must not contain control characters",
        ));
    }
    Ok(s.to_string())
}

/// The recent changes, oldest first, at most `capacity`.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub(crate) revision: u64,
    pub(crate) changes: VecDeque<Change>,
    pub(crate) capacity: usize,
}

impl Window {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            revision: 0,
            changes: VecDeque::new(),
            capacity,
        }
    }

    pub(crate) fn record(
        &mut self,
        resource: &ResourceName,
        kind: ChangeKind,
        token: Token,
        owner: OwnerId,
        at: ClusterTime,
    ) {
        // Checked: a loaded revision is at most 2^62, 2^63 changes from the
        // end; past it a change goes unnumbered rather than wrap to 0.
        let Some(revision) = self.revision.checked_add(1) else {
            return;
        };
        self.revision = revision;
        self.changes.push_back(Change {
            revision: self.revision,
            resource: resource.clone(),
            kind,
            token,
            owner_id: owner,
            at,
        });
        while self.changes.len() > self.capacity {
            self.changes.pop_front();
        }
    }

    /// The oldest revision a watcher can still be sent.
    pub(crate) fn oldest(&self) -> u64 {
        self.changes
            .front()
            .map_or(self.revision.saturating_add(1), |c| c.revision)
    }

    pub(crate) fn after(
        &self,
        after: u64,
        prefix: &str,
        max: usize,
    ) -> Result<ChangesAfter, Compacted> {
        let oldest = self.oldest();
        if after.saturating_add(1) < oldest {
            return Err(Compacted {
                oldest_revision: oldest,
            });
        }
        // Revisions in the window are consecutive.
        let skip = usize::try_from(after.saturating_add(1) - oldest).unwrap_or(usize::MAX);
        let mut out = ChangesAfter {
            changes: Vec::new(),
            scanned_to: after,
        };
        for change in self.changes.iter().skip(skip) {
            if out.changes.len() >= max {
                break;
            }
            out.scanned_to = change.revision;
            if change.resource.as_str().starts_with(prefix) {
                out.changes.push(change.clone());
            }
        }
        Ok(out)
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.changes.len() > self.capacity {
            return Err("more changes kept than the window".into());
        }
        let mut expect = self.oldest();
        for c in &self.changes {
            if c.revision != expect {
                return Err(format!(
                    "change revisions not consecutive: {} where {expect} was due",
                    c.revision
                ));
            }
            expect = expect.saturating_add(1);
        }
        if !self.changes.is_empty() && expect != self.revision.saturating_add(1) {
            return Err("the newest change is not the table's revision".into());
        }
        Ok(())
    }
}
