//! One request at a time per resource: a turn is held from the compare to
//! the end of the effect, so no request of an older token can run its
//! effect while, or after, a newer one runs. The table of resources in use
//! is bounded and forgets a resource once nobody holds or awaits it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};

/// The resources in use and their turn locks.
#[derive(Debug)]
pub struct Serializer {
    in_use: Arc<Mutex<HashMap<String, Arc<TurnLock<()>>>>>,
    max_resources: usize,
}

/// Why no turn was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoTurn {
    /// As many resources as the bound are in use.
    Full(usize),
    /// The turn did not come within the wait.
    Waited(Duration),
}

/// The right to act on one resource; dropping it passes the turn on.
#[derive(Debug)]
pub struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    lock: Arc<TurnLock<()>>,
    resource: String,
    in_use: Arc<Mutex<HashMap<String, Arc<TurnLock<()>>>>>,
}

impl Serializer {
    /// At most `max_resources` resources held or awaited at once.
    pub fn new(max_resources: usize) -> Self {
        Serializer {
            in_use: Arc::new(Mutex::new(HashMap::new())),
            max_resources,
        }
    }

    /// Waits at most `wait` for the turn of `resource`.
    pub async fn turn(&self, resource: &str, wait: Duration) -> Result<Turn, NoTurn> {
        let lock = {
            let mut in_use = self.in_use.lock().unwrap_or_else(PoisonError::into_inner);
            match in_use.get(resource) {
                Some(lock) => Arc::clone(lock),
                None if in_use.len() >= self.max_resources => {
                    return Err(NoTurn::Full(self.max_resources))
                }
                None => {
                    let lock = Arc::new(TurnLock::new(()));
                    in_use.insert(resource.to_string(), Arc::clone(&lock));
                    lock
                }
            }
        };
        // From here the turn (or its failure) must give the entry back.
        let mut turn = Turn {
            guard: None,
            lock: Arc::clone(&lock),
            resource: resource.to_string(),
            in_use: Arc::clone(&self.in_use),
        };
        // A statement of its own: the wait (and its reference to the lock)
        // ends here, before `turn` can be dropped on the error path.
        let got = tokio::time::timeout(wait, lock.lock_owned()).await;
        match got {
            Ok(guard) => {
                turn.guard = Some(guard);
                Ok(turn)
            }
            Err(_) => Err(NoTurn::Waited(wait)),
        }
    }

    /// How many resources are held or awaited now.
    pub fn in_use(&self) -> usize {
        self.in_use
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut in_use = self.in_use.lock().unwrap_or_else(PoisonError::into_inner);
        self.guard = None;
        // Two references left, the table's and this turn's: nobody else
        // holds or awaits the resource (waiters clone under this lock).
        if Arc::strong_count(&self.lock) == 2 {
            in_use.remove(&self.resource);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_turn_per_resource_and_the_table_empties() {
        let s = Serializer::new(2);
        let a = s.turn("a", Duration::from_secs(1)).await;
        assert!(a.is_ok());
        // The same resource waits; another does not.
        assert_eq!(
            s.turn("a", Duration::from_millis(20)).await.err(),
            Some(NoTurn::Waited(Duration::from_millis(20)))
        );
        let b = s.turn("b", Duration::from_secs(1)).await;
        assert!(b.is_ok());
        assert_eq!(
            s.turn("c", Duration::from_secs(1)).await.err(),
            Some(NoTurn::Full(2))
        );
        drop(a);
        drop(b);
        assert_eq!(s.in_use(), 0);
        assert!(s.turn("c", Duration::from_secs(1)).await.is_ok());
        assert_eq!(s.in_use(), 0);
    }

    #[tokio::test]
    async fn a_waiter_gets_the_turn_when_it_is_passed_on() {
        let s = Arc::new(Serializer::new(8));
        let first = s.turn("a", Duration::from_secs(1)).await;
        let s2 = Arc::clone(&s);
        let waiter =
            tokio::spawn(async move { s2.turn("a", Duration::from_secs(5)).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The waiter keeps the entry while the holder lets go.
        drop(first);
        assert_eq!(waiter.await.ok(), Some(true));
        assert_eq!(s.in_use(), 0);
    }

    #[tokio::test]
    async fn a_waiter_dropped_after_the_holder_leaves_no_entry() {
        let s = Serializer::new(8);
        let holder = s.turn("a", Duration::from_secs(1)).await;
        let mut waiter = Box::pin(s.turn("a", Duration::from_secs(5)));
        // Polled once: it waits in the queue.
        tokio::select! {
            biased;
            _ = &mut waiter => panic!("the turn is held"),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        drop(holder);
        drop(waiter);
        assert_eq!(s.in_use(), 0);
    }
}
