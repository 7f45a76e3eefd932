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

use fenced_jepsen::{
    calls::{LockCall, LockWorker, Record, Transport},
    history::{Answer, Event},
};
use fenced_proto::v1::lock_server::Lock;
use fenced_server::{
    rpc::{LockService, FORWARDED},
    types::NodeId,
};
use tokio::time::Instant;
use tonic::{Request, Status};

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

impl Record for History {
    fn invoke(&self, e: Event) -> Event {
        let e = e.invoked(self.next_op.fetch_add(1, Ordering::SeqCst), self.now_ns());
        self.push(e.clone());
        e
    }

    fn complete(&self, invoked: &Event, result: Result<Answer, String>) {
        self.push(invoked.completed(self.now_ns(), result));
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

/// How a simulated worker's calls reach a node: the node's own Lock
/// service, marked as forwarded so that a node that does not lead names the
/// leader instead of forwarding over a network the simulation does not
/// have; the worker then follows the name.
struct Simulated {
    w: Arc<Workload>,
    /// The last leader this worker was told of.
    target: NodeId,
}

impl Simulated {
    fn any_node(&self, rng: &mut fastrand::Rng) -> NodeId {
        self.w.cluster.ids()[rng.usize(..3)]
    }

    fn follow_hint(&mut self, status: &Status, rng: &mut fastrand::Rng) {
        let hinted = status
            .metadata()
            .get(fenced_server::headers::LEADER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .and_then(|id| NodeId::from_str(id).ok());
        self.target = match hinted {
            Some(id) if id != self.target => id,
            _ => self.any_node(rng),
        };
    }
}

fn request<T>(msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    r
}

impl Transport for Simulated {
    type Channel = LockService;

    fn record(&self) -> &dyn Record {
        &*self.w.history
    }

    fn stopped(&self) -> bool {
        self.w.stop.load(Ordering::SeqCst)
    }

    async fn route(&mut self, rng: &mut fastrand::Rng) -> Option<(u64, LockService)> {
        if let Some(service) = self.w.cluster.service(self.target) {
            return Some((self.target, service));
        }
        // The node is down: try another, recording nothing.
        self.target = self.any_node(rng);
        tokio::time::sleep(Duration::from_millis(rng.u64(20..100))).await;
        None
    }

    async fn send(
        &mut self,
        service: LockService,
        call: LockCall,
        rng: &mut fastrand::Rng,
    ) -> Result<Answer, String> {
        let answered = tokio::time::timeout(CALL_TIMEOUT, async {
            match call {
                LockCall::Acquire(r) => service
                    .acquire(request(r))
                    .await
                    .map(|a| Answer::of_acquire(a.into_inner())),
                LockCall::Renew(r) => service
                    .renew(request(r))
                    .await
                    .map(|a| Answer::of_renew(a.into_inner())),
                LockCall::Release(r) => service
                    .release(request(r))
                    .await
                    .map(|a| Answer::of_release(a.into_inner())),
                LockCall::Describe(r) => service
                    .describe(request(r))
                    .await
                    .map(|a| Ok(Answer::of_describe(a.into_inner()))),
            }
        })
        .await;
        match answered {
            Ok(Ok(answer)) => answer,
            Ok(Err(status)) => {
                self.follow_hint(&status, rng);
                Err(format!("{:?}: {}", status.code(), status.message()))
            }
            Err(_) => {
                self.target = self.any_node(rng);
                Err("timed out".into())
            }
        }
    }
}

type Worker = LockWorker<Simulated>;

async fn short_cycle(w: &mut Worker, short_ttl_ms: u64) {
    let resource = format!("short-{}", w.rng.u64(..SHORT_RESOURCES));
    let ttl = short_ttl_ms;
    let owner = w.owner();
    let Some(Answer::Granted { token, .. }) = w.acquire_definite(&resource, owner, ttl).await
    else {
        w.sleep_ms(50, 150).await;
        return;
    };
    if w.rng.u32(..10) < 3 {
        // Stops renewing for longer than its lease, then comes back.
        w.sleep_ms(ttl + 300, ttl + 1_500).await;
        w.renew(&resource, owner, token, ttl).await;
        w.describe(&resource).await;
        w.release(&resource, owner, token, false).await;
        return;
    }
    w.sleep_ms(0, ttl / 3).await;
    w.renew(&resource, owner, token, ttl).await;
    w.describe(&resource).await;
    w.release(&resource, owner, token, false).await;
}

/// A long lease on a resource of its own generation: a lease whose
/// outcome stays unknown may hold its resource for the rest of the run,
/// so the worker moves on to a new name.
async fn long_cycle(w: &mut Worker, long_ttl_ms: u64, generation: &mut u64) {
    let resource = format!("long-{}-g{generation}", w.id);
    let ttl = long_ttl_ms;
    let owner = w.owner();
    let token = match w.acquire_definite(&resource, owner, ttl).await {
        Some(Answer::Granted { token, .. }) => token,
        Some(_) => {
            w.sleep_ms(10, 60).await;
            return;
        }
        None => {
            *generation += 1;
            return;
        }
    };
    w.renew(&resource, owner, token, ttl).await;
    w.describe(&resource).await;
    for _ in 0..3 {
        if w.release(&resource, owner, token, false).await.is_some() {
            return;
        }
        if w.stopped() {
            break;
        }
    }
    *generation += 1;
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
        let transport = Simulated {
            w: Arc::clone(w),
            target: first,
        };
        let mut worker = Worker::new(id, fastrand::Rng::with_seed(seed), transport);
        let reader = id == short + long;
        let is_long = id >= short && !reader;
        let (short_ttl_ms, long_ttl_ms) = (w.short_ttl_ms, w.long_ttl_ms);
        handles.push(tokio::spawn(async move {
            let mut generation = 0;
            while !worker.stopped() {
                if reader {
                    let r = format!("short-{}", worker.rng.u64(..SHORT_RESOURCES));
                    worker.describe(&r).await;
                    worker.sleep_ms(50, 150).await;
                } else if is_long {
                    long_cycle(&mut worker, long_ttl_ms, &mut generation).await;
                } else {
                    short_cycle(&mut worker, short_ttl_ms).await;
                }
            }
        }));
    }
    handles
}
