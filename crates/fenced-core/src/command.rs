use serde::{Deserialize, Serialize};

use crate::{
    Capacity, ClusterTime, InvalidArgument, KvBounds, KvKey, KvValue, Limits, OwnerId,
    ResourceName, Token,
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
        owner: OwnerId,
        ttl_ms: u64,
        wait_ms: u64,
    },
    /// Extend the holder's lease, keeping its token.
    Renew {
        resource: ResourceName,
        owner: OwnerId,
        token: Token,
        ttl_ms: u64,
    },
    /// End the holder's lease; the next waiter, if any, is granted at once.
    Release {
        resource: ResourceName,
        owner: OwnerId,
        token: Token,
    },
    /// [`Command::Acquire`] under the table-wide [`Capacity`] the leader's
    /// settings gave it: a grant that would add a live lease, or a wait
    /// that would add a waiter, beyond it is refused. Last in the enum so
    /// that logs written before it still decode.
    AcquireBounded {
        resource: ResourceName,
        owner: OwnerId,
        ttl_ms: u64,
        wait_ms: u64,
        capacity: Capacity,
    },
    /// Write `value` under `key` if `owner` and `token` are the current,
    /// unexpired holder of `resource` when the entry is applied, and the
    /// key was never written with a higher token; within `bounds`.
    KvPut {
        key: KvKey,
        value: KvValue,
        resource: ResourceName,
        owner: OwnerId,
        token: Token,
        bounds: KvBounds,
    },
    /// Remove `key`, under the same rule as [`Command::KvPut`].
    KvDelete {
        key: KvKey,
        resource: ResourceName,
        owner: OwnerId,
        token: Token,
    },
}

impl Command {
    /// Checks the command's durations against the server's bounds.
    ///
    /// ```
    /// use fenced_core::{Command, Limits, OwnerId, ResourceName};
    /// let cmd = Command::Acquire {
    ///     resource: ResourceName::new("billing:run")?,
    ///     owner: OwnerId::random(),
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
            // Keys and values are bounded by their types.
            Command::Release { .. } | Command::KvPut { .. } | Command::KvDelete { .. } => {}
        }
        Ok(())
    }

    pub fn resource(&self) -> &ResourceName {
        match self {
            Command::Acquire { resource, .. }
            | Command::AcquireBounded { resource, .. }
            | Command::Renew { resource, .. }
            | Command::Release { resource, .. }
            | Command::KvPut { resource, .. }
            | Command::KvDelete { resource, .. } => resource,
        }
    }

    pub fn owner(&self) -> OwnerId {
        match self {
            Command::Acquire { owner, .. }
            | Command::AcquireBounded { owner, .. }
            | Command::Renew { owner, .. }
            | Command::Release { owner, .. }
            | Command::KvPut { owner, .. }
            | Command::KvDelete { owner, .. } => *owner,
        }
    }

    /// Bytes of key and value a command carries: what bounds how many puts
    /// share one log entry.
    pub fn kv_bytes(&self) -> usize {
        match self {
            Command::KvPut { key, value, .. } => key.as_str().len() + value.len(),
            Command::KvDelete { key, .. } => key.as_str().len(),
            _ => 0,
        }
    }
}

/// The payload of one log entry: commands applied in order at one cluster
/// time. An empty batch is a tick: it only advances time, so expired leases
/// and elapsed waits are processed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub stamp: ClusterTime,
    pub commands: Vec<Command>,
}
