//! The three lock services behind one interface: fenced, etcd's v3 lock and
//! the article's lease table on PostgreSQL (its stored procedure: one
//! statement, one round trip per acquire).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use fenced_client::{AcquireOutcome, Client, OwnerId, ReleaseOutcome, RenewOutcome, Token};
use tonic::transport::Channel;

/// Generated from proto/: the etcd v3 subset.
pub mod pb {
    #![allow(clippy::all, clippy::unwrap_used, clippy::expect_used)]
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    pub mod v3lockpb {
        tonic::include_proto!("v3lockpb");
    }
}
use pb::{etcdserverpb as etcdpb, v3lockpb as lockpb};

use etcdpb::{
    kv_client::KvClient, lease_client::LeaseClient, maintenance_client::MaintenanceClient,
};
use lockpb::lock_client::LockClient;

/// Which system a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Fenced,
    Etcd,
    Postgres,
    /// The same procedure on a primary with one synchronous standby.
    PostgresSync,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Fenced => "fenced",
            Kind::Etcd => "etcd",
            Kind::Postgres => "postgres",
            Kind::PostgresSync => "postgres-sync",
        }
    }
}

/// The TLS options every fenced client of this run uses (`--fenced-tls`);
/// unset: plaintext.
static FENCED_TLS: std::sync::OnceLock<fenced_client::TlsOptions> = std::sync::OnceLock::new();

/// Makes every fenced client of this run speak TLS with `options`.
pub fn use_fenced_tls(options: fenced_client::TlsOptions) {
    let _ = FENCED_TLS.set(options);
}

/// A fenced client for `endpoints`, over TLS when the run uses it.
pub fn fenced_client<I, S>(endpoints: I) -> Result<Client>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let endpoints: Vec<String> = endpoints
        .into_iter()
        .map(|e| e.as_ref().to_string())
        .collect();
    Client::with_tls(&endpoints, FENCED_TLS.get()).map_err(|e| anyhow!("fenced client: {e}"))
}

/// How to reach a system; cheap to clone.
#[derive(Clone)]
pub enum Target {
    /// Every endpoint, in the order the run chose (as configured unless
    /// `--find-leader` or `--follower-first`).
    Fenced { endpoints: Vec<String> },
    /// Every member, the one clients talk to first (the first configured
    /// unless `--find-leader` or `--follower-first`), then the others.
    Etcd { endpoints: Vec<String> },
    /// `sync_standby`: the server is a primary whose commits wait for one
    /// synchronous standby.
    Postgres { url: String, sync_standby: bool },
}

/// A granted lock: the token and what the system needs to release or renew.
#[derive(Debug, Clone)]
pub struct Grant {
    pub token: u64,
    handle: Handle,
}

/// A fenced grant's token, typed again for the client (the ledger and the
/// other systems keep the number).
fn fenced_token(grant: &Grant) -> Result<Token> {
    Token::new(grant.token).map_err(|e| anyhow!("fenced grant: {e}"))
}

#[derive(Debug, Clone)]
enum Handle {
    Fenced(OwnerId),
    /// The lock key and the lease it is attached to.
    Etcd {
        key: Vec<u8>,
        lease: i64,
    },
    Postgres(uuid::Uuid),
}

/// How long a failed etcd Unlock is retried on the other members.
const ETCD_UNLOCK_RETRY_FOR: Duration = Duration::from_secs(10);

const PG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS resource_leases (
    resource_name  varchar(200) NOT NULL,
    owner_id       uuid NULL,
    expires_at_utc timestamptz NULL,
    fence          bigint NOT NULL DEFAULT 0,
    CONSTRAINT pk_resource_leases PRIMARY KEY (resource_name)
)";

/// The article's TryAcquireResourceLease as a stored procedure: create the
/// row or take it over when it is free or expired, incrementing the fence,
/// in one conditional upsert; returns the new fence, NULL while another
/// owner's lease runs. Called with one statement, so an acquire is one
/// round trip and one statement.
const PG_ACQUIRE_FUNCTION: &str = "CREATE OR REPLACE FUNCTION try_acquire_resource_lease(
    p_resource varchar, p_owner uuid, p_ttl_s double precision) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_fence bigint;
BEGIN
    INSERT INTO resource_leases AS l (resource_name, owner_id, expires_at_utc, fence)
    VALUES (p_resource, p_owner, now() + make_interval(secs => p_ttl_s), 1)
    ON CONFLICT (resource_name) DO UPDATE
        SET owner_id = EXCLUDED.owner_id,
            expires_at_utc = EXCLUDED.expires_at_utc,
            fence = l.fence + 1
        WHERE l.owner_id IS NULL OR l.expires_at_utc <= now()
    RETURNING l.fence INTO v_fence;
    RETURN v_fence;
END
$$";
/// An acquire: one call of the procedure.
const PG_ACQUIRE: &str = "SELECT try_acquire_resource_lease($1, $2, $3)";
/// TryRenewResourceLease.
const PG_RENEW: &str = "UPDATE resource_leases
    SET expires_at_utc = now() + make_interval(secs => $4)
    WHERE resource_name = $1 AND owner_id = $2 AND fence = $3 AND expires_at_utc > now()";
/// The owner-checked release.
const PG_RELEASE: &str = "UPDATE resource_leases
    SET owner_id = NULL, expires_at_utc = NULL
    WHERE resource_name = $1 AND owner_id = $2 AND fence = $3";

/// How long an etcd session lease lives. Longer than any scenario, so no
/// keep-alive traffic is needed for the per-client session leases; a real
/// client would send one keep-alive per TTL/3, which is negligible here.
const ETCD_SESSION_TTL_S: i64 = 600;

/// One client's connection to a system.
pub enum Session {
    Fenced(Client),
    Etcd(EtcdSession),
    Postgres(PgSession),
}

pub struct EtcdSession {
    channel: Channel,
    /// Every member, the one in use first; a failed call moves to the next,
    /// like etcd's own client does.
    endpoints: Vec<String>,
    current: usize,
    /// The session lease every lock of this client is attached to; `None`
    /// when every lock gets a lease of its own (holders that renew).
    session_lease: Option<i64>,
    keepalive: Option<(
        tokio::sync::mpsc::Sender<etcdpb::LeaseKeepAliveRequest>,
        tonic::Streaming<etcdpb::LeaseKeepAliveResponse>,
    )>,
    /// Grants whose token is still checked against the lock key's create
    /// revision (the warm-up); afterwards a grant costs the Lock call only.
    checks_left: u32,
}

/// The first grants of each etcd client whose token (the Lock answer's
/// header revision) is checked against a Range of the lock key.
const ETCD_TOKEN_CHECKS: u32 = 3;

pub struct PgSession {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    renew: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
}

fn channel(addr: &str) -> Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))
        .with_context(|| format!("endpoint {addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy())
}

/// No etcd call may hang the benchmark: each has this deadline.
const ETCD_CALL_TIMEOUT: Duration = Duration::from_secs(15);

fn etcd_req<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(ETCD_CALL_TIMEOUT);
    req
}

fn secs_f64(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl Target {
    pub fn kind(&self) -> Kind {
        match self {
            Target::Fenced { .. } => Kind::Fenced,
            Target::Etcd { .. } => Kind::Etcd,
            Target::Postgres {
                sync_standby: false,
                ..
            } => Kind::Postgres,
            Target::Postgres {
                sync_standby: true, ..
            } => Kind::PostgresSync,
        }
    }

    /// Prepares the system (the PostgreSQL table and procedure).
    pub async fn prepare(&self) -> Result<()> {
        if let Target::Postgres { url, sync_standby } = self {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .context("connecting to PostgreSQL")?;
            tokio::spawn(conn);
            if *sync_standby {
                // Measured only once a standby confirms every commit
                // (before that, a commit would wait for one to connect).
                let row = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
                        &[],
                    )
                    .await
                    .context("reading pg_stat_replication")?;
                let synced: i64 = row.get(0);
                if synced < 1 {
                    bail!("no synchronous standby streaming yet");
                }
            }
            client
                .batch_execute(PG_SCHEMA)
                .await
                .context("creating resource_leases")?;
            client
                .batch_execute(PG_ACQUIRE_FUNCTION)
                .await
                .context("creating try_acquire_resource_lease")?;
        }
        Ok(())
    }

    /// A new client with its own connection. `lease_per_lock`: for etcd,
    /// attach every lock to a lease of its own (so it can be renewed on its
    /// own) instead of the client's session lease.
    pub async fn session(&self, lease_per_lock: bool) -> Result<Session> {
        match self {
            Target::Fenced { endpoints } => Ok(Session::Fenced(
                fenced_client(endpoints)?.with_call_timeout(Duration::from_secs(15)),
            )),
            Target::Etcd { endpoints } => {
                let first = endpoints.first().context("no etcd endpoint")?;
                let channel = channel(first)?;
                let session_lease = if lease_per_lock {
                    None
                } else {
                    Some(etcd_grant_lease(&channel, ETCD_SESSION_TTL_S).await?)
                };
                Ok(Session::Etcd(EtcdSession {
                    channel,
                    endpoints: endpoints.clone(),
                    current: 0,
                    session_lease,
                    keepalive: None,
                    checks_left: ETCD_TOKEN_CHECKS,
                }))
            }
            Target::Postgres { url, .. } => {
                let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .context("connecting to PostgreSQL")?;
                tokio::spawn(conn);
                let acquire = client.prepare(PG_ACQUIRE).await?;
                let renew = client.prepare(PG_RENEW).await?;
                let release = client.prepare(PG_RELEASE).await?;
                Ok(Session::Postgres(PgSession {
                    client,
                    acquire,
                    renew,
                    release,
                }))
            }
        }
    }
}

async fn etcd_grant_lease(channel: &Channel, ttl_s: i64) -> Result<i64> {
    let resp = LeaseClient::new(channel.clone())
        .lease_grant(etcd_req(etcdpb::LeaseGrantRequest { ttl: ttl_s, id: 0 }))
        .await
        .context("etcd LeaseGrant")?
        .into_inner();
    if !resp.error.is_empty() {
        bail!("etcd LeaseGrant: {}", resp.error);
    }
    Ok(resp.id)
}

/// The member id of etcd's leader and of each endpoint; returns the
/// endpoints with the leader first.
pub async fn etcd_leader_first(endpoints: &[String]) -> Result<Vec<String>> {
    let mut leader = None;
    let mut ids = Vec::new();
    for e in endpoints {
        let resp = MaintenanceClient::new(channel(e)?)
            .status(etcd_req(etcdpb::StatusRequest {}))
            .await
            .with_context(|| format!("etcd status of {e}"))?
            .into_inner();
        if resp.leader != 0 {
            leader = Some(resp.leader);
        }
        ids.push((e.clone(), resp.header.map(|h| h.member_id).unwrap_or(0)));
    }
    let leader = leader.context("etcd has no leader")?;
    ids.sort_by_key(|(_, id)| *id != leader);
    Ok(ids.into_iter().map(|(e, _)| e).collect())
}

/// Whether every etcd endpoint answers and one names a leader.
pub async fn etcd_ready(endpoints: &[String]) -> bool {
    etcd_leader_first(endpoints).await.is_ok()
}

impl Session {
    /// Acquires `resource` for `ttl`, waiting up to `wait` if it is held
    /// (zero: do not wait). `None`: still held when the wait ended.
    pub async fn acquire(
        &mut self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>> {
        match self {
            Session::Fenced(client) => {
                let owner = OwnerId::random();
                match client
                    .acquire_once(resource, owner, ttl, wait)
                    .await
                    .map_err(|e| anyhow!("fenced acquire {resource}: {e}"))?
                {
                    AcquireOutcome::Granted { token, .. } => Ok(Some(Grant {
                        token: token.get(),
                        handle: Handle::Fenced(owner),
                    })),
                    // Ended: a retry of this fresh attempt came after its
                    // lease ended; nothing is held either way.
                    AcquireOutcome::Held { .. } | AcquireOutcome::Ended { .. } => Ok(None),
                }
            }
            Session::Etcd(s) => {
                let lease = match s.session_lease {
                    Some(l) => l,
                    None => {
                        let ttl_s = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
                        etcd_grant_lease(&s.channel, ttl_s).await?
                    }
                };
                // etcd's Lock waits for as long as it takes; a wait of zero
                // would need a try-lock, which the lock service lacks, so a
                // bounded wait is the request deadline.
                let mut req = tonic::Request::new(lockpb::LockRequest {
                    name: resource.as_bytes().to_vec(),
                    lease,
                });
                req.set_timeout(wait.max(Duration::from_secs(15)));
                let resp = match LockClient::new(s.channel.clone()).lock(req).await {
                    Ok(r) => r.into_inner(),
                    Err(status) if status.code() == tonic::Code::DeadlineExceeded => {
                        return Ok(None)
                    }
                    Err(status) => {
                        s.next_endpoint()?;
                        bail!("etcd Lock {resource}: {status}")
                    }
                };
                // The token: the answer's header revision, the store's
                // revision once this client held the lock: the lock key's
                // create revision when nothing was ahead of it, else the
                // revision at which the last key ahead was seen deleted.
                // Either is above every earlier holder's, and etcd's own
                // client reads it from the same answer with no second call.
                let token = resp
                    .header
                    .as_ref()
                    .and_then(|h| u64::try_from(h.revision).ok())
                    .filter(|r| *r > 0)
                    .with_context(|| format!("etcd Lock of {resource}: no header revision"))?;
                if s.checks_left > 0 {
                    s.checks_left -= 1;
                    s.check_token(resource, &resp.key, token).await?;
                }
                Ok(Some(Grant {
                    token,
                    handle: Handle::Etcd {
                        key: resp.key,
                        lease,
                    },
                }))
            }
            Session::Postgres(s) => {
                let deadline = Instant::now() + wait;
                loop {
                    let owner = uuid::Uuid::new_v4();
                    if let Some(token) = s.try_acquire(resource, owner, ttl).await? {
                        return Ok(Some(Grant {
                            token,
                            handle: Handle::Postgres(owner),
                        }));
                    }
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                    // The article's table has no server-side wait: poll.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }
    }

    /// Releases a grant; `false`: it was no longer held by this grant.
    pub async fn release(&mut self, resource: &str, grant: &Grant) -> Result<bool> {
        match (self, &grant.handle) {
            (Session::Fenced(client), Handle::Fenced(owner)) => Ok(matches!(
                client
                    .release(resource, *owner, fenced_token(grant)?)
                    .await
                    .map_err(|e| anyhow!("fenced release {resource}: {e}"))?,
                ReleaseOutcome::Released
            )),
            (Session::Etcd(s), Handle::Etcd { key, lease }) => {
                // Retried on the next member like etcd's own client does:
                // an Unlock lost in a leader change would otherwise leave the
                // key in place until the session lease ends, and every later
                // Lock of the resource would wait behind it. Deleting the
                // key twice is harmless (it is unique to this session).
                let started = Instant::now();
                while let Err(status) = LockClient::new(s.channel.clone())
                    .unlock(etcd_req(lockpb::UnlockRequest { key: key.clone() }))
                    .await
                {
                    s.next_endpoint()?;
                    if started.elapsed() > ETCD_UNLOCK_RETRY_FOR {
                        bail!("etcd Unlock {resource}: {status}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if s.session_lease.is_none() {
                    LeaseClient::new(s.channel.clone())
                        .lease_revoke(etcd_req(etcdpb::LeaseRevokeRequest { id: *lease }))
                        .await
                        .with_context(|| format!("etcd LeaseRevoke for {resource}"))?;
                }
                Ok(true)
            }
            (Session::Postgres(s), Handle::Postgres(owner)) => {
                let token = i64::try_from(grant.token)?;
                let n = s
                    .client
                    .execute(&s.release, &[&resource, owner, &token])
                    .await
                    .with_context(|| format!("PostgreSQL release {resource}"))?;
                Ok(n == 1)
            }
            _ => bail!("a grant released through another system's session"),
        }
    }

    /// Renews a grant for `ttl`; `false`: the lease is lost.
    pub async fn renew(&mut self, resource: &str, grant: &Grant, ttl: Duration) -> Result<bool> {
        match (self, &grant.handle) {
            (Session::Fenced(client), Handle::Fenced(owner)) => Ok(matches!(
                client
                    .renew(resource, *owner, fenced_token(grant)?, ttl)
                    .await
                    .map_err(|e| anyhow!("fenced renew {resource}: {e}"))?,
                RenewOutcome::Renewed { .. }
            )),
            (Session::Etcd(s), Handle::Etcd { lease, .. }) => {
                let request = etcdpb::LeaseKeepAliveRequest { id: *lease };
                if s.keepalive.is_none() {
                    // etcd answers the stream's headers only with its first
                    // response: queue the first request before opening it.
                    let (tx, rx) = tokio::sync::mpsc::channel(16);
                    tx.send(request)
                        .await
                        .map_err(|_| anyhow!("etcd keep-alive queue closed"))?;
                    let mut lease_client = LeaseClient::new(s.channel.clone());
                    let open = lease_client
                        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx));
                    let stream = tokio::time::timeout(ETCD_CALL_TIMEOUT, open)
                        .await
                        .map_err(|_| {
                            anyhow!("etcd LeaseKeepAlive: no stream within {ETCD_CALL_TIMEOUT:?}")
                        })?
                        .context("etcd LeaseKeepAlive stream")?
                        .into_inner();
                    s.keepalive = Some((tx, stream));
                } else if let Some((tx, _)) = s.keepalive.as_ref() {
                    tokio::time::timeout(ETCD_CALL_TIMEOUT, tx.send(request))
                        .await
                        .map_err(|_| {
                            anyhow!("etcd keep-alive: queue full for {ETCD_CALL_TIMEOUT:?}")
                        })?
                        .map_err(|_| anyhow!("etcd keep-alive stream closed"))?;
                }
                let Some((_, stream)) = s.keepalive.as_mut() else {
                    bail!("etcd keep-alive stream missing");
                };
                let resp = match tokio::time::timeout(ETCD_CALL_TIMEOUT, stream.message()).await {
                    Ok(r) => r
                        .context("etcd keep-alive")?
                        .context("etcd keep-alive stream ended")?,
                    Err(_) => {
                        s.keepalive = None;
                        bail!("etcd keep-alive: no answer within {ETCD_CALL_TIMEOUT:?}");
                    }
                };
                Ok(resp.ttl > 0)
            }
            (Session::Postgres(s), Handle::Postgres(owner)) => {
                let token = i64::try_from(grant.token)?;
                let n = s
                    .client
                    .execute(&s.renew, &[&resource, owner, &token, &secs_f64(ttl)])
                    .await
                    .with_context(|| format!("PostgreSQL renew {resource}"))?;
                Ok(n == 1)
            }
            _ => bail!("a grant renewed through another system's session"),
        }
    }
}

impl EtcdSession {
    /// Warm-up: the lock key exists and was created at or before `token`
    /// (read on the member that answered the Lock, which applied it).
    async fn check_token(&self, resource: &str, key: &[u8], token: u64) -> Result<()> {
        let range = KvClient::new(self.channel.clone())
            .range(etcd_req(etcdpb::RangeRequest {
                key: key.to_vec(),
                serializable: true,
                ..Default::default()
            }))
            .await
            .with_context(|| format!("etcd Range of the lock key of {resource}"))?
            .into_inner();
        let kv = range
            .kvs
            .first()
            .with_context(|| format!("etcd lock key of {resource} is missing after Lock"))?;
        let created = u64::try_from(kv.create_revision)
            .with_context(|| format!("negative create revision on {resource}"))?;
        if created > token {
            bail!(
                "etcd Lock of {resource}: header revision {token} below the lock key's \
                 create revision {created}: not a fencing token"
            );
        }
        Ok(())
    }

    fn next_endpoint(&mut self) -> Result<()> {
        self.current = (self.current + 1) % self.endpoints.len().max(1);
        let addr = self
            .endpoints
            .get(self.current)
            .context("no etcd endpoint")?;
        self.channel = channel(addr)?;
        self.keepalive = None;
        Ok(())
    }
}

impl PgSession {
    /// The article's acquire: one call of its stored procedure (the
    /// conditional upsert that increments the fence), one round trip.
    async fn try_acquire(
        &self,
        resource: &str,
        owner: uuid::Uuid,
        ttl: Duration,
    ) -> Result<Option<u64>> {
        let row = self
            .client
            .query_one(&self.acquire, &[&resource, &owner, &secs_f64(ttl)])
            .await
            .with_context(|| format!("PostgreSQL acquire {resource}"))?;
        let fence: Option<i64> = row.try_get(0)?;
        fence.map(u64::try_from).transpose().map_err(Into::into)
    }
}
