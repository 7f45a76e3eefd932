use serde::{Deserialize, Serialize};

use crate::{
    Capacity, ClusterTime, IdentityBounds, InvalidArgument, KvBounds, KvKey, KvValue, Limits,
    OwnerId, ResourceName, SessionBounds, SessionId, Token, MAX_RENEW_BATCH, MAX_RENEW_BATCH_BYTES,
    SESSION_IDENTITY_MAX_BYTES,
};

/// One client request, as replicated in the log.
///
/// Names, owner ids and tokens are valid by construction; TTL and wait are
/// checked against the server's [`Limits`] by [`Command::validate`] before
/// the command is proposed, so a bad request never reaches the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Take the lease and, in the same step, a new token. With `wait_ms > 0`
    /// a held resource queues the owner instead of refusing it.
    Acquire {
        resource: ResourceName,
        owner_id: OwnerId,
        ttl_ms: u64,
        wait_ms: u64,
    },
    /// Extend the holder's lease, keeping its token.
    Renew {
        resource: ResourceName,
        owner_id: OwnerId,
        token: Token,
        ttl_ms: u64,
    },
    /// End the holder's lease; the next waiter, if any, is granted at once.
    Release {
        resource: ResourceName,
        owner_id: OwnerId,
        token: Token,
    },
    /// [`Command::Acquire`] under the table-wide [`Capacity`] the leader's
    /// settings gave it: a grant that would add a live lease, or a wait
    /// that would add a waiter, beyond it is refused. Last in the enum so
    /// that logs written before it still decode.
    AcquireBounded {
        resource: ResourceName,
        owner_id: OwnerId,
        ttl_ms: u64,
        wait_ms: u64,
        capacity: Capacity,
    },
    /// Write `value` under `key` if `owner_id` and `token` are the current,
    /// unexpired holder of `resource` when the entry is applied, and the
    /// key was never written with a higher token; within `bounds`.
    KvPut {
        key: KvKey,
        value: KvValue,
        resource: ResourceName,
        owner_id: OwnerId,
        token: Token,
        bounds: KvBounds,
    },
    /// Remove `key`, under the same rule as [`Command::KvPut`].
    KvDelete {
        key: KvKey,
        resource: ResourceName,
        owner_id: OwnerId,
        token: Token,
    },
    /// [`Command::Renew`] for each of a bounded list of leases, in order, in
    /// one log entry at one cluster time: the keep-alive of one client's
    /// leases. Each lease is renewed or reported lost exactly as a
    /// `Renew` of its own would be ([`crate::Outcome::RenewMany`]).
    RenewMany { leases: RenewLeases },
    /// Open a session owned by `identity` (the caller as the server
    /// authenticated it; empty without auth), live for `ttl_ms` unless kept
    /// alive, within `bounds`. Opening a session the same identity already
    /// has open is a keep-alive (a retried open).
    OpenSession {
        session: SessionId,
        identity: String,
        ttl_ms: u64,
        bounds: SessionBounds,
    },
    /// Extend a session by its TTL from now: one write, however many leases
    /// it holds.
    KeepAlive {
        session: SessionId,
        identity: String,
    },
    /// End a session and, at the same cluster time, every lease it holds
    /// (each as if released).
    CloseSession {
        session: SessionId,
        identity: String,
    },
    /// [`Command::AcquireBounded`] without a wait, for a lease that has no
    /// expiry of its own: it is live while `session` is, and ends with it.
    AcquireInSession {
        resource: ResourceName,
        owner_id: OwnerId,
        session: SessionId,
        identity: String,
        capacity: Capacity,
    },
    /// `command`, a lease command, made by `identity` (the caller as the
    /// server authenticated it; empty without auth) within `bounds`: the
    /// lease it grants belongs to that identity, and only the same identity
    /// renews, releases or writes with it, whoever knows its owner id and
    /// token. A command logged before this variant existed is its own
    /// command made by the empty identity, without bounds. Last in the enum
    /// so that older logs still decode.
    AsIdentity {
        identity: String,
        bounds: IdentityBounds,
        command: Box<Command>,
    },
    /// The leader's wall clock at this entry's cluster time, for the times
    /// people read (grants, ends, history, watch); never used to decide
    /// anything (see [`crate::WallClock`]). Proposed by the leader itself,
    /// never by a client. Last in the enum so that older logs still decode.
    WallClock { unix_ms: u64 },
    /// `command`, an acquire, with a job label for people: the lease it
    /// grants (at once or after waiting) carries `label` while it lives
    /// (see [`crate::JobLabel`]). Last in the enum so that older logs still
    /// decode.
    Labelled {
        label: crate::JobLabel,
        command: Box<Command>,
    },
}

/// One lease of a [`Command::RenewMany`]: what a [`Command::Renew`] carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewLease {
    pub resource: ResourceName,
    pub owner_id: OwnerId,
    pub token: Token,
    pub ttl_ms: u64,
}

impl RenewLease {
    /// What the lease weighs against [`MAX_RENEW_BATCH_BYTES`]: its name
    /// plus owner id, token and TTL.
    pub fn weight(&self) -> usize {
        self.resource.as_str().len() + 32
    }
}

/// The leases of a [`Command::RenewMany`]: 1 to [`MAX_RENEW_BATCH`] of them,
/// weighing at most [`MAX_RENEW_BATCH_BYTES`], by construction (also when
/// read from the log).
///
/// ```
/// use fenced_core::{OwnerId, RenewLease, RenewLeases, ResourceName, Token, MAX_RENEW_BATCH};
/// let lease = RenewLease {
///     resource: ResourceName::new("billing:run")?,
///     owner_id: OwnerId::random(),
///     token: Token::new(7)?,
///     ttl_ms: 10_000,
/// };
/// assert_eq!(RenewLeases::new(vec![lease.clone(); 3])?.len(), 3);
/// let err = RenewLeases::new(vec![]).unwrap_err();
/// assert_eq!(err.field(), "leases");
/// assert!(RenewLeases::new(vec![lease; MAX_RENEW_BATCH + 1]).is_err());
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<RenewLease>", into = "Vec<RenewLease>")]
pub struct RenewLeases {
    first: RenewLease,
    rest: Vec<RenewLease>,
}

impl RenewLeases {
    /// Checks the count and the weight; the error names the field `leases`
    /// and the bound.
    pub fn new(leases: Vec<RenewLease>) -> Result<Self, InvalidArgument> {
        let n = leases.len();
        if n > MAX_RENEW_BATCH {
            return Err(InvalidArgument::new(
                "leases",
                format!("must hold 1 to {MAX_RENEW_BATCH} leases, got {n}"),
            ));
        }
        let weight: usize = leases.iter().map(RenewLease::weight).sum();
        if weight > MAX_RENEW_BATCH_BYTES {
            return Err(InvalidArgument::new(
                "leases",
                format!(
                    "must weigh at most {MAX_RENEW_BATCH_BYTES} bytes (each lease: its \
                     resource name plus 32), got {weight}"
                ),
            ));
        }
        let mut leases = leases.into_iter();
        let Some(first) = leases.next() else {
            return Err(InvalidArgument::new(
                "leases",
                format!("must hold 1 to {MAX_RENEW_BATCH} leases, got 0"),
            ));
        };
        Ok(Self {
            first,
            rest: leases.collect(),
        })
    }

    pub fn first(&self) -> &RenewLease {
        &self.first
    }

    pub fn iter(&self) -> impl Iterator<Item = &RenewLease> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    pub fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// Never true: a batch holds at least one lease.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The sum of the leases' [`RenewLease::weight`].
    pub fn weight(&self) -> usize {
        self.iter().map(RenewLease::weight).sum()
    }
}

impl TryFrom<Vec<RenewLease>> for RenewLeases {
    type Error = InvalidArgument;

    fn try_from(leases: Vec<RenewLease>) -> Result<Self, Self::Error> {
        Self::new(leases)
    }
}

impl From<RenewLeases> for Vec<RenewLease> {
    fn from(leases: RenewLeases) -> Self {
        let mut all = Vec::with_capacity(leases.len());
        all.push(leases.first);
        all.extend(leases.rest);
        all
    }
}

impl Command {
    /// Checks the command's durations against the server's bounds.
    ///
    /// ```
    /// use fenced_core::{Command, Limits, OwnerId, ResourceName};
    /// let cmd = Command::Acquire {
    ///     resource: ResourceName::new("billing:run")?,
    ///     owner_id: OwnerId::random(),
    ///     ttl_ms: 30_000,
    ///     wait_ms: 0,
    /// };
    /// assert!(cmd.validate(&Limits::default()).is_ok());
    /// # Ok::<(), fenced_core::InvalidArgument>(())
    /// ```
    pub fn validate(&self, limits: &Limits) -> Result<(), InvalidArgument> {
        match self {
            Command::Acquire {
                ttl_ms, wait_ms, ..
            }
            | Command::AcquireBounded {
                ttl_ms, wait_ms, ..
            } => {
                limits.check_ttl_ms(*ttl_ms)?;
                limits.check_wait_ms(*wait_ms)?;
            }
            Command::Renew { ttl_ms, .. } => {
                limits.check_ttl_ms(*ttl_ms)?;
            }
            Command::RenewMany { leases } => {
                for (i, lease) in leases.iter().enumerate() {
                    limits
                        .check_ttl_ms(lease.ttl_ms)
                        .map_err(|e| InvalidArgument::new("leases", format!("leases[{i}].{e}")))?;
                }
            }
            Command::OpenSession {
                ttl_ms, identity, ..
            } => {
                limits.check_ttl_ms(*ttl_ms)?;
                check_identity(identity)?;
            }
            Command::KeepAlive { identity, .. }
            | Command::CloseSession { identity, .. }
            | Command::AcquireInSession { identity, .. } => check_identity(identity)?,
            Command::AsIdentity {
                identity, command, ..
            } => {
                check_identity(identity)?;
                // A labelled acquire is checked as the acquire it labels.
                let target = match &**command {
                    Command::Labelled { command, .. } => &**command,
                    other => other,
                };
                match target {
                    Command::AcquireInSession { identity: of, .. } if of != identity => {
                        return Err(InvalidArgument::new(
                            "command",
                            "an acquire in a session must be made by the identity it names",
                        ))
                    }
                    t if t.carries_identity()
                        || matches!(
                            t,
                            Command::AsIdentity { .. }
                                | Command::Labelled { .. }
                                | Command::WallClock { .. }
                        ) =>
                    {
                        return Err(InvalidArgument::new(
                            "command",
                            "must be a lease or fenced-store command (sessions carry their \
                             own identity)",
                        ))
                    }
                    _ => command.validate(limits)?,
                }
            }
            Command::WallClock { unix_ms } => {
                crate::wall::check_unix_ms(*unix_ms)?;
            }
            Command::Labelled { command, .. } => match &**command {
                Command::Acquire { .. }
                | Command::AcquireBounded { .. }
                | Command::AcquireInSession { .. } => command.validate(limits)?,
                _ => {
                    return Err(InvalidArgument::new(
                        "label",
                        "only an acquire carries a job label",
                    ))
                }
            },
            // Keys and values are bounded by their types.
            Command::Release { .. } | Command::KvPut { .. } | Command::KvDelete { .. } => {}
        }
        Ok(())
    }

    /// The resource the command is about; for [`Command::RenewMany`], the
    /// first lease's (see [`Command::resources`]); none for a session's
    /// open, keep-alive or close.
    pub fn resource(&self) -> Option<&ResourceName> {
        match self {
            Command::AsIdentity { command, .. } | Command::Labelled { command, .. } => {
                command.resource()
            }
            Command::RenewMany { leases } => Some(&leases.first().resource),
            Command::Acquire { resource, .. }
            | Command::AcquireBounded { resource, .. }
            | Command::AcquireInSession { resource, .. }
            | Command::Renew { resource, .. }
            | Command::Release { resource, .. }
            | Command::KvPut { resource, .. }
            | Command::KvDelete { resource, .. } => Some(resource),
            Command::OpenSession { .. }
            | Command::KeepAlive { .. }
            | Command::CloseSession { .. }
            | Command::WallClock { .. } => None,
        }
    }

    /// The owner id of the command; for [`Command::RenewMany`], the first
    /// lease's; none for a session's open, keep-alive or close.
    pub fn owner_id(&self) -> Option<OwnerId> {
        match self {
            Command::AsIdentity { command, .. } | Command::Labelled { command, .. } => {
                command.owner_id()
            }
            Command::RenewMany { leases } => Some(leases.first().owner_id),
            Command::Acquire { owner_id, .. }
            | Command::AcquireBounded { owner_id, .. }
            | Command::AcquireInSession { owner_id, .. }
            | Command::Renew { owner_id, .. }
            | Command::Release { owner_id, .. }
            | Command::KvPut { owner_id, .. }
            | Command::KvDelete { owner_id, .. } => Some(*owner_id),
            Command::OpenSession { .. }
            | Command::KeepAlive { .. }
            | Command::CloseSession { .. }
            | Command::WallClock { .. } => None,
        }
    }

    /// Whether the leader proposed the command for itself (a wall-clock
    /// anchor), not on a client's behalf.
    pub fn is_leaders_own(&self) -> bool {
        matches!(self, Command::WallClock { .. })
    }

    /// Every resource the command is about, in order.
    pub fn resources(&self) -> Box<dyn Iterator<Item = &ResourceName> + '_> {
        match self {
            Command::RenewMany { leases } => Box::new(leases.iter().map(|l| &l.resource)),
            Command::AsIdentity { command, .. } | Command::Labelled { command, .. } => {
                command.resources()
            }
            other => Box::new(other.resource().into_iter()),
        }
    }

    /// Bytes of key and value a command carries, or the weight of a batch
    /// renewal's leases: what bounds how many such commands share one log
    /// entry.
    pub fn kv_bytes(&self) -> usize {
        match self {
            Command::KvPut { key, value, .. } => key.as_str().len() + value.len(),
            Command::KvDelete { key, .. } => key.as_str().len(),
            Command::RenewMany { leases } => leases.weight(),
            Command::AsIdentity { command, .. } | Command::Labelled { command, .. } => {
                command.kv_bytes()
            }
            _ => 0,
        }
    }
}

impl Command {
    /// The command itself, made by `identity` within `bounds` (see
    /// [`Command::AsIdentity`]).
    pub fn as_identity(self, identity: &str, bounds: IdentityBounds) -> Command {
        Command::AsIdentity {
            identity: identity.to_string(),
            bounds,
            command: Box::new(self),
        }
    }

    /// Whether the command names the identity it is made by (a session's
    /// open, keep-alive or close), so it is never wrapped in a
    /// [`Command::AsIdentity`].
    pub fn carries_identity(&self) -> bool {
        matches!(
            self,
            Command::OpenSession { .. } | Command::KeepAlive { .. } | Command::CloseSession { .. }
        )
    }

    /// `self`, an acquire, with a job label (see [`Command::Labelled`]);
    /// itself without one.
    pub fn labelled(self, label: Option<crate::JobLabel>) -> Command {
        match label {
            Some(label) => Command::Labelled {
                label,
                command: Box::new(self),
            },
            None => self,
        }
    }

    /// The command an [`Command::AsIdentity`] or a [`Command::Labelled`]
    /// wraps, or the command itself.
    pub fn inner(&self) -> &Command {
        match self {
            Command::AsIdentity { command, .. } | Command::Labelled { command, .. } => {
                command.inner()
            }
            other => other,
        }
    }
}

/// The identity a session records as its owner: at most
/// [`SESSION_IDENTITY_MAX_BYTES`] (empty when the server runs without auth).
fn check_identity(identity: &str) -> Result<(), InvalidArgument> {
    if identity.len() > SESSION_IDENTITY_MAX_BYTES {
        return Err(InvalidArgument::new(
            "identity",
            format!(
                "must be at most {SESSION_IDENTITY_MAX_BYTES} bytes, got {}",
                identity.len()
            ),
        ));
    }
    Ok(())
}

/// The payload of one log entry: commands applied in order at one cluster
/// time. An empty batch is a tick: it only advances time, so expired leases
/// and elapsed waits are processed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub stamp: ClusterTime,
    pub commands: Vec<Command>,
}
