//! Client workers. Every request is recorded before it is sent and when it
//! answers (or times out: unknown outcome).
//!
//! - long-TTL workers: acquire, write through the protected resource with the
//!   token, renew, write, describe, release; sometimes skip the release (the
//!   resource stays held, so the workload moves on to a fresh resource name),
//!   sometimes send a stale write and a stale release on purpose. Their
//!   leases outlive the run, so the history is checked against a mutex model.
//! - short-TTL workers (2 s leases): like the article's worker, some stop
//!   renewing for longer than the TTL, describe the resource and then write
//!   with their old token.
//! - a reader: describes the short-TTL resources all the time, also through
//!   the nemesis's idle periods (describes write no log entry), so a lease
//!   seen running out before a fault can be seen again after it.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use fenced_core::{OwnerId, ResourceName, Token};
use fenced_proto::v1::{
    kv_client::KvClient, kv_put_response, lock_client::LockClient, KvGetRequest, KvPutRequest,
    KvRefusalReason,
};
use fenced_resource::{FenceStore, Write, WriteOutcome};
use tokio::sync::RwLock;
use tonic::transport::Channel;

use crate::{
    calls::{LockCall, LockWorker, Record, Transport},
    history::{event, Answer, Event, Recorder, F},
};

/// How long one request may take before its outcome is unknown.
const RPC_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Ctx {
    pub rec: Recorder,
    pub store: Arc<FenceStore>,
    /// A client per member; the membership profile adds and removes them.
    pub clients: std::sync::RwLock<Vec<(u64, LockClient<Channel>)>>,
    /// Kv service clients over the same channels (kept with `clients`).
    pub kv_clients: std::sync::RwLock<Vec<(u64, KvClient<Channel>)>>,
    pub stop: AtomicBool,
    /// Held for writing while client workers are "paused".
    pub freeze: RwLock<()>,
    /// Held for writing during an idle period: every worker that writes to
    /// the cluster's log waits; the reader goes on.
    pub idle: RwLock<()>,
    /// Nodes known to be down (killed), skipped when choosing a node.
    pub down: Mutex<Vec<u64>>,
    pub long_ttl_ms: u64,
    pub short_ttl_ms: u64,
    /// Generation of each long-TTL resource slot.
    pub slots: Vec<AtomicU64>,
    /// Grants seen per resource: (owner, token), for stale operations.
    pub past: Mutex<HashMap<String, Vec<(OwnerId, u64)>>>,
}

impl Ctx {
    fn node(&self, rng: &mut fastrand::Rng) -> Option<(u64, LockClient<Channel>)> {
        let down = self
            .down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let clients = self.clients.read().unwrap_or_else(PoisonError::into_inner);
        let up: Vec<&(u64, LockClient<Channel>)> = clients
            .iter()
            .filter(|(id, _)| !down.contains(id))
            .collect();
        if up.is_empty() {
            return clients.get(rng.usize(..clients.len().max(1))).cloned();
        }
        up.get(rng.usize(..up.len())).copied().cloned()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

fn refusal_reason(code: i32) -> String {
    KvRefusalReason::try_from(code)
        .map(|r| {
            r.as_str_name()
                .trim_start_matches("KV_REFUSAL_REASON_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| format!("code {code}"))
}

/// The value a kv put writes: its op id, so the checker can trace a read
/// value to the put that wrote it (see `check::kv::value_op`).
pub fn kv_value(op: u64) -> String {
    format!("put op {op}")
}

/// The key every owner of `resource` writes (refusals for a newer token on
/// the key happen here).
fn shared_key(resource: &str) -> String {
    format!("kv-{resource}")
}

/// The key only `worker` writes: the key's own token order never refuses
/// its puts, so a stale put there is refused by the holder check or not at
/// all.
fn worker_key(resource: &str, worker: u32) -> String {
    format!("kv-{resource}-w{worker}")
}

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(RPC_TIMEOUT);
    crate::auth::authorize(&mut r);
    r
}

async fn timed<T>(
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(RPC_TIMEOUT + Duration::from_millis(200), fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Err(_) => Err("timed out".into()),
    }
}

/// How a campaign worker's lock calls reach the cluster: a node that is up,
/// at random, over its gRPC channel, once the nemesis lets calls through.
struct Campaign {
    ctx: Arc<Ctx>,
    /// Only describes: not held by idle periods.
    reader: bool,
}

impl Campaign {
    /// Waits while the workers are paused, and (but for the reader) while
    /// the nemesis holds an idle period.
    async fn gate(&self) {
        if !self.reader {
            let _i = self.ctx.idle.read().await;
        }
        let _g = self.ctx.freeze.read().await;
    }
}

impl Transport for Campaign {
    type Channel = LockClient<Channel>;

    fn record(&self) -> &dyn Record {
        &self.ctx.rec
    }

    fn stopped(&self) -> bool {
        self.ctx.stopped()
    }

    async fn route(&mut self, rng: &mut fastrand::Rng) -> Option<(u64, LockClient<Channel>)> {
        self.gate().await;
        self.ctx.node(rng)
    }

    async fn send(
        &mut self,
        mut c: LockClient<Channel>,
        call: LockCall,
        _: &mut fastrand::Rng,
    ) -> Result<Answer, String> {
        match call {
            LockCall::Acquire(r) => timed(c.acquire(req(r))).await.and_then(Answer::of_acquire),
            LockCall::Renew(r) => timed(c.renew(req(r))).await.and_then(Answer::of_renew),
            LockCall::Release(r) => timed(c.release(req(r))).await.and_then(Answer::of_release),
            LockCall::Describe(r) => timed(c.describe(req(r))).await.map(Answer::of_describe),
        }
    }
}

/// One campaign worker: lock calls, and beside them writes through the
/// protected resource and the fenced store.
struct Worker {
    lock: LockWorker<Campaign>,
    ctx: Arc<Ctx>,
}

impl Worker {
    fn id(&self) -> u32 {
        self.lock.id
    }

    /// Records the invocation and picks a kv client on a node that is up.
    fn begin_kv(&mut self, mut e: Event) -> (Event, KvClient<Channel>) {
        let node = self.ctx.node(&mut self.lock.rng).map(|(n, _)| n);
        let client = node.and_then(|n| {
            self.ctx
                .kv_clients
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find(|(id, _)| *id == n)
                .map(|(_, c)| c.clone())
        });
        e.node = node;
        let invoked = self.ctx.rec.invoke(e);
        // Ctx always has clients; a missing one only yields an unknown op.
        let client = client.unwrap_or_else(|| {
            KvClient::new(Channel::from_static("http://127.0.0.1:9").connect_lazy())
        });
        (invoked, client)
    }

    /// A fenced kv put of `key` with `owner`'s lease `token` on `resource`.
    /// The value names the put's op id, so a read can be traced to its put.
    async fn kv_put(
        &mut self,
        key: &str,
        resource: &str,
        owner: OwnerId,
        token: u64,
        stale: bool,
    ) -> Option<Answer> {
        self.lock.transport.gate().await;
        let mut e = event(self.id(), F::KvPut, resource);
        e.owner = Some(owner.to_string());
        e.token = Some(token);
        e.key = Some(key.to_string());
        e.deliberate_stale = stale;
        let (e, mut c) = self.begin_kv(e);
        let r = timed(c.put(req(KvPutRequest {
            key: key.as_bytes().to_vec(),
            value: kv_value(e.op).into_bytes(),
            resource: resource.as_bytes().to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            token,
        })))
        .await
        .and_then(|r| match r.outcome {
            Some(kv_put_response::Outcome::Applied(a)) => Ok(Answer::KvApplied {
                revision: a.revision,
            }),
            Some(kv_put_response::Outcome::Refused(x)) => Ok(Answer::KvRefused {
                reason: refusal_reason(x.reason),
                current_token: x.current_token,
            }),
            None => Err("empty kv put answer".into()),
        });
        self.ctx.rec.complete(&e, r.clone());
        r.ok()
    }

    /// A linearizable kv get of `key` (a key of `resource`).
    async fn kv_get(&mut self, key: &str, resource: &str) -> Option<Answer> {
        self.lock.transport.gate().await;
        let mut e = event(self.id(), F::KvGet, resource);
        e.key = Some(key.to_string());
        let (e, mut c) = self.begin_kv(e);
        let r = timed(c.get(req(KvGetRequest {
            key: key.as_bytes().to_vec(),
            allow_stale: false,
        })))
        .await
        .map(|g| Answer::KvRead {
            found: g.found,
            value: String::from_utf8_lossy(&g.value).into_owned(),
            resource: g.resource,
            token: g.token,
            revision: g.revision,
        });
        self.ctx.rec.complete(&e, r.clone());
        r.ok()
    }

    /// A write through the protected resource, keyed by the resource name.
    async fn write(
        &mut self,
        resource: &str,
        owner: OwnerId,
        token: u64,
        stale: bool,
    ) -> Option<Answer> {
        self.lock.transport.gate().await;
        let mut e = event(self.id(), F::Write, resource);
        e.owner = Some(owner.to_string());
        e.token = Some(token);
        e.deliberate_stale = stale;
        let e = self.ctx.rec.invoke(e);
        let store = self.ctx.store.clone();
        let value = format!("op {} by {owner} with token {token}", e.op);
        let name = resource.to_string();
        let r = tokio::task::spawn_blocking(move || -> Result<Answer, String> {
            let resource = ResourceName::new(&name).map_err(|e| e.to_string())?;
            let token = Token::new(token).map_err(|e| e.to_string())?;
            let w = Write::for_resource(resource, token, owner, value);
            match store.write(&w).map_err(|e| e.to_string())? {
                WriteOutcome::Accepted { token, version } => {
                    Ok(Answer::Accepted { token, version })
                }
                WriteOutcome::AlreadyApplied { token, version } => {
                    Ok(Answer::AlreadyApplied { token, version })
                }
                WriteOutcome::Rejected(r) => Ok(Answer::Rejected {
                    highest_token: r.highest_token,
                    reason: r.reason.as_str().to_string(),
                }),
            }
        })
        .await
        .map_err(|e| format!("write task: {e}"))
        .and_then(|r| r);
        self.ctx.rec.complete(&e, r.clone());
        r.ok()
    }

    fn remember(&self, resource: &str, owner: OwnerId, token: u64) {
        let mut past = self.ctx.past.lock().unwrap_or_else(PoisonError::into_inner);
        let list = past.entry(resource.to_string()).or_default();
        if !list.iter().any(|(o, t)| *o == owner && *t == token) {
            list.push((owner, token));
        }
    }

    /// An older grant of `resource` than the newest one seen, if any.
    fn older_grant(&mut self, resource: &str) -> Option<(OwnerId, u64)> {
        let past = self.ctx.past.lock().unwrap_or_else(PoisonError::into_inner);
        let list = past.get(resource)?;
        let newest = list.iter().map(|(_, t)| *t).max()?;
        let older: Vec<&(OwnerId, u64)> = list.iter().filter(|(_, t)| *t < newest).collect();
        older
            .get(self.lock.rng.usize(..older.len().max(1)))
            .map(|g| **g)
    }

    fn abandon_slot(&self, slot: usize, generation: u64) {
        if let Some(s) = self.ctx.slots.get(slot) {
            let _ = s.compare_exchange(
                generation,
                generation + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    async fn long_cycle(&mut self) {
        let slot = self.lock.rng.usize(..self.ctx.slots.len().max(1));
        let generation = self
            .ctx
            .slots
            .get(slot)
            .map_or(0, |s| s.load(Ordering::SeqCst));
        let resource = format!("long-{slot}-g{generation}");
        if self.lock.rng.f64() < 0.15 {
            if let Some((o, t)) = self.older_grant(&resource) {
                self.write(&resource, o, t, true).await;
                let key = worker_key(&resource, self.id());
                self.kv_put(&key, &resource, o, t, true).await;
                self.lock.release(&resource, o, t, true).await;
            }
        }
        let owner = OwnerId::random();
        let ttl = self.ctx.long_ttl_ms;
        let token = match self.lock.acquire_definite(&resource, owner, ttl).await {
            Some(Answer::Granted { token, .. }) => token,
            Some(_) => {
                self.lock.sleep_ms(10, 60).await;
                return;
            }
            None => {
                // It may hold the resource for the rest of the run.
                self.abandon_slot(slot, generation);
                return;
            }
        };
        self.remember(&resource, owner, token);
        self.write(&resource, owner, token, false).await;
        self.lock.renew(&resource, owner, token, ttl).await;
        self.write(&resource, owner, token, false).await;
        let key = worker_key(&resource, self.id());
        self.kv_put(&key, &resource, owner, token, false).await;
        self.lock.describe(&resource).await;
        if self.lock.rng.f64() < 0.05 {
            self.abandon_slot(slot, generation);
            return;
        }
        let mut released = false;
        for _ in 0..3 {
            if self
                .lock
                .release(&resource, owner, token, false)
                .await
                .is_some()
            {
                released = true;
                break;
            }
            if self.lock.stopped() {
                break;
            }
        }
        if !released {
            self.abandon_slot(slot, generation);
        }
    }

    async fn short_cycle(&mut self, resources: usize) {
        let resource = format!("short-{}", self.lock.rng.usize(..resources.max(1)));
        let ttl = self.ctx.short_ttl_ms;
        let owner = OwnerId::random();
        let token = match self.lock.acquire_definite(&resource, owner, ttl).await {
            Some(Answer::Granted { token, .. }) => token,
            _ => {
                self.lock.sleep_ms(50, 150).await;
                return;
            }
        };
        self.remember(&resource, owner, token);
        self.write(&resource, owner, token, false).await;
        let own = worker_key(&resource, self.id());
        let shared = shared_key(&resource);
        self.kv_put(&own, &resource, owner, token, false).await;
        if self.lock.rng.f64() < 0.3 {
            // The article's worker: stops renewing for longer than its lease
            // (a GC pause, a slow disk), then writes with its old token.
            self.lock.sleep_ms(ttl + 300, ttl + 1500).await;
            self.lock.describe(&resource).await;
            self.write(&resource, owner, token, true).await;
            // Late puts: on its own key only the holder check can refuse it.
            self.kv_put(&own, &resource, owner, token, true).await;
            self.kv_put(&shared, &resource, owner, token, true).await;
            self.lock.release(&resource, owner, token, false).await;
            return;
        }
        self.lock.renew(&resource, owner, token, ttl).await;
        self.kv_put(&shared, &resource, owner, token, false).await;
        self.lock.describe(&resource).await;
        self.write(&resource, owner, token, false).await;
        self.lock.release(&resource, owner, token, false).await;
    }
}

/// Short-TTL resources: `short-0` .. `short-{SHORT_RESOURCES - 1}`.
const SHORT_RESOURCES: usize = 2;

/// Spawns `long` long-TTL workers, `short` short-TTL workers and one reader.
pub fn spawn(ctx: &Arc<Ctx>, seed: u64, long: u32, short: u32) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = Vec::new();
    for i in 0..=long + short {
        let reader = i == long + short;
        let rng = fastrand::Rng::with_seed(seed.wrapping_mul(1_000_003).wrapping_add(u64::from(i)));
        let campaign = Campaign {
            ctx: ctx.clone(),
            reader,
        };
        let mut w = Worker {
            lock: LockWorker::new(i, rng, campaign),
            ctx: ctx.clone(),
        };
        let is_long = i < long;
        handles.push(tokio::spawn(async move {
            while !w.lock.stopped() {
                if reader {
                    let r = format!("short-{}", w.lock.rng.usize(..SHORT_RESOURCES));
                    w.lock.describe(&r).await;
                    // Reads of the keys the short-TTL workers put.
                    let owner = long + w.lock.rng.u32(..short.max(1));
                    let key = if w.lock.rng.bool() {
                        shared_key(&r)
                    } else {
                        worker_key(&r, owner)
                    };
                    w.kv_get(&key, &r).await;
                    w.lock.sleep_ms(50, 150).await;
                } else if is_long {
                    w.long_cycle().await;
                } else {
                    w.short_cycle(SHORT_RESOURCES).await;
                }
            }
        }));
    }
    handles
}
