//! A worker's lock calls, one implementation for the fault campaign and the
//! deterministic simulation: each call's history event and request are
//! made here, recorded before the call is sent and when it answers (or its
//! outcome stays unknown). What differs between the two is only how a call
//! reaches a node, a [`Transport`]: a gRPC channel to a real process picked
//! among the nodes that are up, or the simulated node's service, following
//! the leader it names.

use std::{future::Future, time::Duration};

use fenced_core::OwnerId;
use fenced_proto::v1::{AcquireRequest, DescribeRequest, ReleaseRequest, RenewRequest};

use crate::history::{event, Answer, Event, F};

/// One call of the Lock service, as the workers make them.
#[derive(Debug, Clone)]
pub enum LockCall {
    Acquire(AcquireRequest),
    Renew(RenewRequest),
    Release(ReleaseRequest),
    Describe(DescribeRequest),
}

/// Where the history of a run goes.
pub trait Record: Send + Sync {
    /// Records an invocation; returns the event to complete later.
    fn invoke(&self, e: Event) -> Event;
    /// Records the completion of `invoked`: a definite answer or, with
    /// `Err`, an unknown outcome.
    fn complete(&self, invoked: &Event, result: Result<Answer, String>);
}

/// How one worker's calls reach the cluster.
pub trait Transport: Send {
    /// What a call is sent through once a node is picked.
    type Channel: Send;

    /// The run's history.
    fn record(&self) -> &dyn Record;

    /// Whether the run has ended.
    fn stopped(&self) -> bool;

    /// The node the next call goes to and its channel; `None` when no node
    /// can be tried now: the call is then neither sent nor recorded.
    fn route(
        &mut self,
        rng: &mut fastrand::Rng,
    ) -> impl Future<Output = Option<(u64, Self::Channel)>> + Send;

    /// Sends `call`: its answer, or why its outcome is unknown.
    fn send(
        &mut self,
        channel: Self::Channel,
        call: LockCall,
        rng: &mut fastrand::Rng,
    ) -> impl Future<Output = Result<Answer, String>> + Send;
}

/// A worker's identity, its random source and its way to the cluster.
pub struct LockWorker<T> {
    pub id: u32,
    pub rng: fastrand::Rng,
    pub transport: T,
}

impl<T: Transport> LockWorker<T> {
    pub fn new(id: u32, rng: fastrand::Rng, transport: T) -> Self {
        Self { id, rng, transport }
    }

    pub fn stopped(&self) -> bool {
        self.transport.stopped()
    }

    /// Sleeps a random time from `lo` to `hi` ms.
    pub async fn sleep_ms(&mut self, lo: u64, hi: u64) {
        tokio::time::sleep(Duration::from_millis(self.rng.u64(lo..=hi))).await;
    }

    /// A new owner id from the worker's random source (a run replays from
    /// its seed).
    pub fn owner(&mut self) -> OwnerId {
        let bytes: [u8; 16] = std::array::from_fn(|_| self.rng.u8(..));
        let id = uuid::Builder::from_random_bytes(bytes).into_uuid();
        OwnerId::new(id).unwrap_or_else(|_| OwnerId::random())
    }

    async fn call(&mut self, mut e: Event, call: LockCall) -> Option<Answer> {
        let (node, channel) = self.transport.route(&mut self.rng).await?;
        e.node = Some(node);
        let invoked = self.transport.record().invoke(e);
        let result = self.transport.send(channel, call, &mut self.rng).await;
        self.transport.record().complete(&invoked, result.clone());
        result.ok()
    }

    pub async fn acquire(&mut self, resource: &str, owner: OwnerId, ttl_ms: u64) -> Option<Answer> {
        let mut e = event(self.id, F::Acquire, resource);
        e.owner = Some(owner.to_string());
        e.ttl_ms = Some(ttl_ms);
        let req = AcquireRequest {
            label: String::new(),
            resource: resource.as_bytes().to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            ttl_ms,
            wait_ms: 0,
        };
        self.call(e, LockCall::Acquire(req)).await
    }

    pub async fn renew(
        &mut self,
        resource: &str,
        owner: OwnerId,
        token: u64,
        ttl_ms: u64,
    ) -> Option<Answer> {
        let mut e = event(self.id, F::Renew, resource);
        e.owner = Some(owner.to_string());
        e.token = Some(token);
        e.ttl_ms = Some(ttl_ms);
        let req = RenewRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            token,
            ttl_ms,
        };
        self.call(e, LockCall::Renew(req)).await
    }

    /// A release; `stale` marks one sent with an old grant on purpose.
    pub async fn release(
        &mut self,
        resource: &str,
        owner: OwnerId,
        token: u64,
        stale: bool,
    ) -> Option<Answer> {
        let mut e = event(self.id, F::Release, resource);
        e.owner = Some(owner.to_string());
        e.token = Some(token);
        e.deliberate_stale = stale;
        let req = ReleaseRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            token,
        };
        self.call(e, LockCall::Release(req)).await
    }

    pub async fn describe(&mut self, resource: &str) -> Option<Answer> {
        let e = event(self.id, F::Describe, resource);
        let req = DescribeRequest {
            resource: resource.as_bytes().to_vec(),
            allow_stale: false,
        };
        self.call(e, LockCall::Describe(req)).await
    }

    /// Acquires, retrying with the same owner id while the outcome is
    /// unknown (at most three times).
    pub async fn acquire_definite(
        &mut self,
        resource: &str,
        owner: OwnerId,
        ttl_ms: u64,
    ) -> Option<Answer> {
        for _ in 0..3 {
            if let Some(a) = self.acquire(resource, owner, ttl_ms).await {
                return Some(a);
            }
            if self.stopped() {
                break;
            }
            self.sleep_ms(50, 200).await;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use super::*;
    use crate::history::Phase;

    #[derive(Default)]
    struct Memory(Mutex<Vec<Event>>);

    impl Record for Memory {
        fn invoke(&self, e: Event) -> Event {
            let mut events = self.0.lock().unwrap();
            let e = e.invoked(events.len() as u64, 0);
            events.push(e.clone());
            e
        }
        fn complete(&self, invoked: &Event, result: Result<Answer, String>) {
            self.0.lock().unwrap().push(invoked.completed(0, result));
        }
    }

    /// Node 2 is down (no route); node 1 answers every call the same way.
    struct Scripted {
        record: Memory,
        down: bool,
        answer: Result<Answer, String>,
        sent: Vec<LockCall>,
    }

    impl Transport for Scripted {
        type Channel = ();
        fn record(&self) -> &dyn Record {
            &self.record
        }
        fn stopped(&self) -> bool {
            false
        }
        async fn route(&mut self, _: &mut fastrand::Rng) -> Option<(u64, ())> {
            (!self.down).then_some((1, ()))
        }
        async fn send(
            &mut self,
            _: (),
            call: LockCall,
            _: &mut fastrand::Rng,
        ) -> Result<Answer, String> {
            self.sent.push(call);
            self.answer.clone()
        }
    }

    fn worker(down: bool, answer: Result<Answer, String>) -> LockWorker<Scripted> {
        let transport = Scripted {
            record: Memory::default(),
            down,
            answer,
            sent: Vec::new(),
        };
        LockWorker::new(4, fastrand::Rng::with_seed(1), transport)
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_is_recorded_before_and_after_with_its_node_and_request() {
        let mut w = worker(false, Ok(Answer::Released));
        let owner = w.owner();
        let a = w.release("r", owner, 9, true).await;
        assert_eq!(a, Some(Answer::Released));
        let events = w.transport.record.0.lock().unwrap().clone();
        assert_eq!(events.len(), 2);
        let (invoke, done) = (&events[0], &events[1]);
        assert_eq!(invoke.phase, Phase::Invoke);
        assert_eq!(done.phase, Phase::Ok);
        for e in [invoke, done] {
            assert_eq!((e.worker, e.f, e.node), (4, F::Release, Some(1)));
            assert_eq!((e.token, e.deliberate_stale), (Some(9), true));
            assert_eq!(e.owner, Some(owner.to_string()));
        }
        let [LockCall::Release(req)] = w.transport.sent.as_slice() else {
            panic!("{:?}", w.transport.sent);
        };
        assert_eq!((req.token, req.resource.as_slice()), (9, &b"r"[..]));
        assert_eq!(req.owner_id, owner.as_bytes().to_vec());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_outcome_is_recorded_as_info_and_retried_with_the_same_owner() {
        let mut w = worker(false, Err("timed out".into()));
        let owner = w.owner();
        assert_eq!(w.acquire_definite("r", owner, 2_000).await, None);
        let events = w.transport.record.0.lock().unwrap().clone();
        assert_eq!(events.len(), 6, "three tries, each invoked and completed");
        assert!(events
            .iter()
            .all(|e| e.owner == Some(owner.to_string()) && e.ttl_ms == Some(2_000)));
        let infos = events.iter().filter(|e| e.phase == Phase::Info).count();
        assert_eq!(infos, 3);
        assert!(events
            .iter()
            .filter(|e| e.phase == Phase::Info)
            .all(|e| e.error.as_deref() == Some("timed out")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_with_no_node_to_go_to_is_neither_sent_nor_recorded() {
        let mut w = worker(true, Ok(Answer::Released));
        assert_eq!(w.describe("r").await, None);
        assert!(w.transport.record.0.lock().unwrap().is_empty());
        assert!(w.transport.sent.is_empty());
    }
}
