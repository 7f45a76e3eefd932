//! Per-identity limits: live leases and waiters, checked by the leader
//! before it proposes an acquire (docs/DECISIONS.md, "Per-identity limits
//! are checked by the leader").

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex, PoisonError,
    },
};

use fenced_core::{OwnerId, ResourceName};
use tonic::Status;

use crate::state_machine::Shared;

/// Defaults: far above what one application needs, far below what exhausts
/// a node's memory.
pub const DEFAULT_MAX_LEASES_PER_IDENTITY: u64 = 10_000;
pub const DEFAULT_MAX_WAITERS_PER_IDENTITY: u64 = 1_000;

type Lease = (ResourceName, OwnerId);

/// The leases and waits each identity has, as far as this node (when it
/// leads) has seen them granted.
#[derive(Debug)]
pub struct IdentityQuota {
    pub max_leases: usize,
    pub max_waiters: usize,
    /// Leases granted (or being proposed) per identity; entries that no
    /// longer hold are dropped when the count reaches the limit.
    leases: Mutex<HashMap<String, HashSet<Lease>>>,
    waiters: Arc<Mutex<HashMap<String, usize>>>,
    pub lease_refusals: AtomicU64,
    pub waiter_refusals: AtomicU64,
}

/// Counts one blocking acquire of an identity while it waits.
#[derive(Debug)]
pub struct WaitSlot {
    identity: String,
    waiters: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        let mut map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.identity) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.identity);
            }
        }
    }
}

impl IdentityQuota {
    pub fn new(max_leases: u64, max_waiters: u64) -> Self {
        Self {
            max_leases: usize::try_from(max_leases).unwrap_or(usize::MAX),
            max_waiters: usize::try_from(max_waiters).unwrap_or(usize::MAX),
            leases: Mutex::default(),
            waiters: Arc::default(),
            lease_refusals: AtomicU64::new(0),
            waiter_refusals: AtomicU64::new(0),
        }
    }

    /// Admits an acquire of `resource` by `owner` for `identity`, counting it
    /// as a lease from now on. A retry of a lease already counted is
    /// admitted at the limit; it takes nothing new.
    pub fn admit_lease(
        &self,
        identity: &str,
        resource: &ResourceName,
        owner: OwnerId,
        shared: &Shared,
    ) -> Result<(), Status> {
        let mut map = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let held = map.entry(identity.to_string()).or_default();
        let lease = (resource.clone(), owner);
        if held.contains(&lease) {
            return Ok(());
        }
        if held.len() >= self.max_leases {
            // Released, expired and refused acquires count no more.
            held.retain(|(r, o)| shared.holds(r.as_str(), *o));
        }
        if held.len() >= self.max_leases {
            self.lease_refusals.fetch_add(1, Relaxed);
            tracing::info!(
                identity,
                %resource,
                max_leases_per_identity = self.max_leases,
                "acquire refused: the identity holds its limit of live leases"
            );
            return Err(Status::resource_exhausted(format!(
                "max_leases_per_identity ({}) reached: identity {identity:?} holds that many \
                 live leases; release one first",
                self.max_leases
            )));
        }
        held.insert(lease);
        Ok(())
    }

    /// Counts a lease granted later (to a waiter).
    pub fn granted(&self, identity: &str, resource: &ResourceName, owner: OwnerId) {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(identity.to_string())
            .or_default()
            .insert((resource.clone(), owner));
    }

    /// Admits one more blocking acquire of `identity`; it counts until the
    /// slot is dropped.
    pub fn admit_waiter(&self, identity: &str) -> Result<WaitSlot, Status> {
        let mut map = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let n = map.entry(identity.to_string()).or_default();
        if *n >= self.max_waiters {
            self.waiter_refusals.fetch_add(1, Relaxed);
            tracing::info!(
                identity,
                max_waiters_per_identity = self.max_waiters,
                "blocking acquire refused: the identity has its limit of waiters"
            );
            return Err(Status::resource_exhausted(format!(
                "max_waiters_per_identity ({}) reached: identity {identity:?} has that many \
                 blocking acquires waiting; retry later or with wait 0",
                self.max_waiters
            )));
        }
        *n += 1;
        Ok(WaitSlot {
            identity: identity.to_string(),
            waiters: Arc::clone(&self.waiters),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn waiters_count_until_their_slot_is_dropped() {
        let q = IdentityQuota::new(1, 2);
        let a = q.admit_waiter("a").unwrap();
        let _b = q.admit_waiter("a").unwrap();
        let err = q.admit_waiter("a").unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("max_waiters_per_identity (2)"));
        assert_eq!(q.waiter_refusals.load(Relaxed), 1);
        // Another identity is not affected.
        let _c = q.admit_waiter("b").unwrap();
        drop(a);
        let _d = q.admit_waiter("a").unwrap();
    }
}
