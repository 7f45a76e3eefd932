//! Blocking acquires parked on this node until the state machine grants them
//! or their wait ends. The queue itself is replicated (fenced-core); this is
//! only the list of callers to answer when an applied entry says so.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, PoisonError,
    },
};

use fenced_core::{Event, Grant, OwnerId, ResourceName, Token};
use tokio::sync::oneshot;

/// How a parked acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    Granted(Grant),
    Elapsed {
        current_token: Token,
        remaining_ms: u64,
    },
    /// The resource came free but the token counter is at its bound.
    TokensExhausted {
        limit: u64,
    },
}

type Key = (ResourceName, OwnerId);

/// The callers parked on this node, at most `max` at once.
pub struct Parking {
    slots: Mutex<HashMap<Key, (u64, oneshot::Sender<WaitEnd>)>>,
    next_id: AtomicU64,
    max: usize,
}

/// The parking list is full.
#[derive(Debug, thiserror::Error)]
#[error("max_parked: this node already has the maximum of {0} blocking acquires waiting")]
pub struct ParkingFull(pub usize);

/// One parked caller; leaving (drop) frees its slot.
pub struct Parked {
    parking: Arc<Parking>,
    key: Key,
    id: u64,
    pub rx: oneshot::Receiver<WaitEnd>,
}

impl Drop for Parked {
    fn drop(&mut self) {
        let mut slots = self.parking.slots();
        if slots.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            slots.remove(&self.key);
        }
    }
}

impl Parking {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            max,
        })
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<Key, (u64, oneshot::Sender<WaitEnd>)>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a caller BEFORE its acquire is proposed, so an event applied
    /// right after the acquire cannot be missed. A second park for the same
    /// owner replaces the first (a retry); the first caller sees its channel close.
    pub fn park(
        self: &Arc<Self>,
        resource: ResourceName,
        owner: OwnerId,
    ) -> Result<Parked, ParkingFull> {
        let mut slots = self.slots();
        let key = (resource, owner);
        if slots.len() >= self.max && !slots.contains_key(&key) {
            return Err(ParkingFull(self.max));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        slots.insert(key.clone(), (id, tx));
        Ok(Parked {
            parking: Arc::clone(self),
            key,
            id,
            rx,
        })
    }

    /// Answers the callers that applied events concern.
    pub fn notify(&self, events: &[Event]) {
        let mut slots = self.slots();
        for event in events {
            let (key, end) = match event {
                Event::WaiterGranted {
                    resource,
                    owner_id: owner,
                    grant,
                } => ((resource.clone(), *owner), WaitEnd::Granted(*grant)),
                Event::WaitElapsed {
                    resource,
                    owner_id: owner,
                    current_token,
                    remaining_ms,
                } => (
                    (resource.clone(), *owner),
                    WaitEnd::Elapsed {
                        current_token: *current_token,
                        remaining_ms: *remaining_ms,
                    },
                ),
                Event::TokensExhausted {
                    resource,
                    owner_id: owner,
                    limit,
                } => (
                    (resource.clone(), *owner),
                    WaitEnd::TokensExhausted { limit: *limit },
                ),
                Event::Expired { .. }
                | Event::SessionExpired { .. }
                | Event::OtherIdentity { .. } => continue,
            };
            if let Some((_, tx)) = slots.remove(&key) {
                let _ = tx.send(end);
            }
        }
    }

    /// How many callers are parked.
    pub fn parked(&self) -> usize {
        self.slots().len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use fenced_core::ClusterTime;

    fn name() -> ResourceName {
        ResourceName::new("r").unwrap()
    }

    #[test]
    fn parking_is_bounded_and_a_slot_is_freed_on_drop() {
        let parking = Parking::new(2);
        let a = parking.park(name(), OwnerId::random()).unwrap();
        let _b = parking.park(name(), OwnerId::random()).unwrap();
        let err = parking.park(name(), OwnerId::random()).err().unwrap();
        assert!(err.to_string().contains("max_parked"));
        assert!(err.to_string().contains('2'));
        drop(a);
        assert_eq!(parking.parked(), 1);
        assert!(parking.park(name(), OwnerId::random()).is_ok());
    }

    #[test]
    fn a_grant_event_answers_the_parked_caller() {
        let parking = Parking::new(10);
        let owner = OwnerId::random();
        let mut parked = parking.park(name(), owner).unwrap();
        let grant = Grant {
            token: Token::new(3).unwrap(),
            expires_at: ClusterTime::from_millis(9),
            ttl_ms: 5,
        };
        parking.notify(&[Event::WaiterGranted {
            resource: name(),
            owner_id: owner,
            grant,
        }]);
        assert_eq!(parked.rx.try_recv().unwrap(), WaitEnd::Granted(grant));
        assert_eq!(parking.parked(), 0);
    }

    #[test]
    fn a_retry_replaces_the_first_caller() {
        let parking = Parking::new(10);
        let owner = OwnerId::random();
        let mut first = parking.park(name(), owner).unwrap();
        let _second = parking.park(name(), owner).unwrap();
        assert!(first.rx.try_recv().is_err());
        drop(first);
        assert_eq!(
            parking.parked(),
            1,
            "dropping the replaced caller keeps the retry"
        );
    }
}
