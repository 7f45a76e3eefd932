//! The simulated clients: workers that acquire, renew, describe and release
//! through the real Lock service of the node they pick, recorded in
//! fenced-jepsen's history format on the simulated clock.
//!
//! Short-TTL workers sometimes stop renewing for longer than their lease
//! and come back with the old token (the article's worker); long-TTL
//! workers hold leases that outlive the run, checked against the mutex
//! model; a reader describes the short-TTL resources all the time.

use std::{
    str::FromStr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use fenced_core::OwnerId;
use fenced_jepsen::history::{event, Answer, Event, Phase, F};
use fenced_proto::v1::{
    lock_server::Lock, AcquireRequest, DescribeRequest, ReleaseRequest, RenewRequest,
};
use fenced_server::{rpc::FORWARDED, types::NodeId};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::world::Cluster;

/// How long a call may take before its outcome is unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Short-TTL resources: `short-0`, `short-1`.
const SHORT_RESOURCES: u64 = 2;

/// The history as it is made: invocations and completions, stamped with
/// the simulated time since the run began.
pub struct History {
    started: Instant,
    next_op: AtomicU64,
    events: Mutex<Vec<Event>>,
}

impl History {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            next_op: AtomicU64::new(0),
            events: Mutex::default(),
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn invoke(&self, mut e: Event) -> Event {
        e.op = self.next_op.fetch_add(1, Ordering::SeqCst);
        e.phase = Phase::Invoke;
        e.t_ns = self.now_ns();
        self.push(e.clone());
        e
    }

    fn complete(&self, invoked: &Event, result: &Result<Answer, String>) {
        let mut e = invoked.clone();
        e.t_ns = self.now_ns();
        match result {
            Ok(a) => {
                e.phase = Phase::Ok;
                e.answer = Some(a.clone());
            }
            Err(why) => {
                e.phase = Phase::Info;
                e.error = Some(why.clone());
            }
        }
        self.push(e);
    }

    fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
    }

    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

pub struct Workload {
    pub cluster: Arc<Cluster>,
    pub history: Arc<History>,
    pub stop: Arc<AtomicBool>,
    pub short_ttl_ms: u64,
    pub long_ttl_ms: u64,
}

struct Worker {
    id: u32,
    w: Arc<Workload>,
    rng: fastrand::Rng,
    /// The node this worker sends to: the last leader it was told of.
    target: NodeId,
}

fn request<T>(msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    // Marked as forwarded: a node that does not lead says so (and names
    // the leader) instead of forwarding over a network the simulation
    // does not have.
    r.metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    r
}

impl Worker {
    fn stopped(&self) -> bool {
        self.w.stop.load(Ordering::SeqCst)
    }

    async fn sleep_ms(&mut self, lo: u64, hi: u64) {
        tokio::time::sleep(Duration::from_millis(self.rng.u64(lo..hi))).await;
    }

    fn owner(&mut self) -> OwnerId {
        let bytes: [u8; 16] = std::array::from_fn(|_| self.rng.u8(..));
        let id = uuid::Builder::from_random_bytes(bytes).into_uuid();
        OwnerId::new(id).unwrap_or_else(|_| OwnerId::random())
    }

    /// Sends one call to the worker's node and records it. A refusal that
    /// names the leader moves the worker there.
    async fn call<Req, Resp, Fut>(
        &mut self,
        e: Event,
        send: impl FnOnce(fenced_server::rpc::LockService, Request<Req>) -> Fut,
        req: Req,
        answer: impl FnOnce(Resp) -> Result<Answer, String>,
    ) -> Option<Answer>
    where
        Fut: std::future::Future<Output = Result<Response<Resp>, Status>>,
    {
        let Some(service) = self.w.cluster.service(self.target) else {
            // The node is down: try another, recording nothing.
            self.target = self.w.cluster.ids()[self.rng.usize(..3)];
            self.sleep_ms(20, 100).await;
            return None;
        };
        let mut e = e;
        e.node = Some(self.target);
        let invoked = self.w.history.invoke(e);
        let result = match tokio::time::timeout(CALL_TIMEOUT, send(service, request(req))).await {
            Ok(Ok(resp)) => answer(resp.into_inner()),
            Ok(Err(status)) => {
                self.follow_hint(&status);
                Err(format!("{:?}: {}", status.code(), status.message()))
            }
            Err(_) => {
                self.target = self.w.cluster.ids()[self.rng.usize(..3)];
                Err("timed out".into())
            }
        };
        self.w.history.complete(&invoked, &result);
        result.ok()
    }

    fn follow_hint(&mut self, status: &Status) {
        let hinted = status
            .metadata()
            .get(fenced_server::headers::LEADER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .and_then(|id| NodeId::from_str(id).ok());
        self.target = match hinted {
            Some(id) if id != self.target => id,
            _ => self.w.cluster.ids()[self.rng.usize(..3)],
        };
    }

    async fn acquire(&mut self, resource: &str, owner: OwnerId, ttl_ms: u64) -> Option<Answer> {
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
        self.call(
            e,
            |s, r| async move { s.acquire(r).await },
            req,
            Answer::of_acquire,
        )
        .await
    }

    async fn renew(&mut self, resource: &str, owner: OwnerId, token: u64, ttl_ms: u64) {
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
        self.call(
            e,
            |s, r| async move { s.renew(r).await },
            req,
            Answer::of_renew,
        )
        .await;
    }

    async fn release(&mut self, resource: &str, owner: OwnerId, token: u64) -> Option<Answer> {
        let mut e = event(self.id, F::Release, resource);
        e.owner = Some(owner.to_string());
        e.token = Some(token);
        let req = ReleaseRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            token,
        };
        self.call(
            e,
            |s, r| async move { s.release(r).await },
            req,
            Answer::of_release,
        )
        .await
    }

    async fn describe(&mut self, resource: &str) {
        let e = event(self.id, F::Describe, resource);
        let req = DescribeRequest {
            resource: resource.as_bytes().to_vec(),
            allow_stale: false,
        };
        self.call(
            e,
            |s, r| async move { s.describe(r).await },
            req,
            |d| Ok(Answer::of_describe(d)),
        )
        .await;
    }

    async fn acquire_definite(
        &mut self,
        resource: &str,
        owner: OwnerId,
        ttl: u64,
    ) -> Option<Answer> {
        for _ in 0..3 {
            if let Some(a) = self.acquire(resource, owner, ttl).await {
                return Some(a);
            }
            if self.stopped() {
                break;
            }
            self.sleep_ms(50, 200).await;
        }
        None
    }

    async fn short_cycle(&mut self) {
        let resource = format!("short-{}", self.rng.u64(..SHORT_RESOURCES));
        let ttl = self.w.short_ttl_ms;
        let owner = self.owner();
        let Some(Answer::Granted { token, .. }) =
            self.acquire_definite(&resource, owner, ttl).await
        else {
            self.sleep_ms(50, 150).await;
            return;
        };
        if self.rng.u32(..10) < 3 {
            // Stops renewing for longer than its lease, then comes back.
            self.sleep_ms(ttl + 300, ttl + 1_500).await;
            self.renew(&resource, owner, token, ttl).await;
            self.describe(&resource).await;
            self.release(&resource, owner, token).await;
            return;
        }
        self.sleep_ms(0, ttl / 3).await;
        self.renew(&resource, owner, token, ttl).await;
        self.describe(&resource).await;
        self.release(&resource, owner, token).await;
    }

    /// A long lease on a resource of its own generation: a lease whose
    /// outcome stays unknown may hold its resource for the rest of the run,
    /// so the worker moves on to a new name.
    async fn long_cycle(&mut self, generation: &mut u64) {
        let resource = format!("long-{}-g{generation}", self.id);
        let ttl = self.w.long_ttl_ms;
        let owner = self.owner();
        let token = match self.acquire_definite(&resource, owner, ttl).await {
            Some(Answer::Granted { token, .. }) => token,
            Some(_) => {
                self.sleep_ms(10, 60).await;
                return;
            }
            None => {
                *generation += 1;
                return;
            }
        };
        self.renew(&resource, owner, token, ttl).await;
        self.describe(&resource).await;
        for _ in 0..3 {
            if self.release(&resource, owner, token).await.is_some() {
                return;
            }
            if self.stopped() {
                break;
            }
        }
        *generation += 1;
    }
}

/// Starts the workers; they stop at `w.stop`.
pub fn spawn(
    w: &Arc<Workload>,
    rng: &crate::Rng,
    short: u32,
    long: u32,
) -> Vec<tokio::task::JoinHandle<()>> {
    let ids = w.cluster.ids();
    let mut handles = Vec::new();
    for id in 0..=short + long {
        let (seed, first) = {
            let mut r = rng.lock();
            (r.u64(..), ids[r.usize(..ids.len())])
        };
        let mut worker = Worker {
            id,
            w: Arc::clone(w),
            rng: fastrand::Rng::with_seed(seed),
            target: first,
        };
        let reader = id == short + long;
        let is_long = id >= short && !reader;
        handles.push(tokio::spawn(async move {
            let mut generation = 0;
            while !worker.stopped() {
                if reader {
                    let r = format!("short-{}", worker.rng.u64(..SHORT_RESOURCES));
                    worker.describe(&r).await;
                    worker.sleep_ms(50, 150).await;
                } else if is_long {
                    worker.long_cycle(&mut generation).await;
                } else {
                    worker.short_cycle().await;
                }
            }
        }));
    }
    handles
}
