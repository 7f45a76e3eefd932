//! Settings from flags, `FENCED_*` environment variables and an optional TOML
//! file, in that order of precedence.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, ToSocketAddrs},
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Args;
use serde::{Deserialize, Serialize};

pub use crate::node::within::{OutOfBounds, Within};

use crate::{
    node::NodeConfig,
    peer::membership::Join,
    security::tls::TlsSettings,
    types::{Node, NodeId},
};

/// `fenced run` settings. Every one may also come from the TOML file given
/// by `--config` (same names, with `_` instead of `-`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RunSettings {
    /// This node's id, unique in the cluster. 1 to 18446744073709551615.
    #[arg(long, env = "FENCED_ID")]
    pub id: Option<Within<1, { u64::MAX }>>,
    /// Where the Raft log and snapshots live.
    #[arg(long, env = "FENCED_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Client listener, host:port.
    #[arg(long, env = "FENCED_LISTEN")]
    pub listen: Option<String>,
    /// Peer (Raft) listener, host:port.
    #[arg(long, env = "FENCED_PEER_LISTEN")]
    pub peer_listen: Option<String>,
    /// The first membership, the same on every node:
    /// `1=HOST:PEERPORT[/HOST:CLIENTPORT],2=...,3=...`.
    #[arg(long, env = "FENCED_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Join a running cluster instead (a new node with an empty data dir):
    /// comma-separated client addresses of its members. The node starts as
    /// a learner and asks to be added (with its node certificate); an
    /// operator promotes it. With existing data it is ignored.
    #[arg(long, env = "FENCED_JOIN", conflicts_with = "initial_cluster")]
    pub join: Option<String>,
    /// The peer address other nodes reach this one at, for --join (default
    /// --peer-listen).
    #[arg(long, env = "FENCED_ADVERTISE_PEER")]
    pub advertise_peer: Option<String>,
    /// The client address clients reach this one at, for --join (default
    /// --listen).
    #[arg(long, env = "FENCED_ADVERTISE_CLIENT")]
    pub advertise_client: Option<String>,
    /// Shortest lease a client may ask for, ms. 1 to 86400000, and at most
    /// ttl_max_ms.
    #[arg(long, env = "FENCED_TTL_MIN_MS")]
    pub ttl_min_ms: Option<Within<1, 86_400_000>>,
    /// Longest lease a client may ask for, ms. 1 to 86400000.
    #[arg(long, env = "FENCED_TTL_MAX_MS")]
    pub ttl_max_ms: Option<Within<1, 86_400_000>>,
    /// Longest a blocking acquire may wait on the server, ms. 0 to 86400000.
    #[arg(long, env = "FENCED_WAIT_MAX_MS")]
    pub wait_max_ms: Option<Within<0, 86_400_000>>,
    /// Raft election timeout, ms (default 200): a follower stands for
    /// election once it has not heard from a leader for twice this and a
    /// pre-vote majority agrees, checking every tenth to fifth of it. 50 to
    /// 60000.
    #[arg(long, env = "FENCED_ELECTION_TIMEOUT_MS")]
    pub election_timeout_ms: Option<Within<50, 60_000>>,
    /// How often a follower that has heard from no leader for its lease
    /// (twice the election timeout) checks whether to stand, ms: each wait
    /// is drawn between half this and this. Unset: a fifth of the election
    /// timeout.
    /// Shorter makes failover sooner without shortening the lease that
    /// keeps a briefly stalled leader in place. 10 to 60000, and at most
    /// election_timeout_ms.
    #[arg(long, env = "FENCED_ELECTION_CHECK_MS")]
    pub election_check_ms: Option<Within<10, 60_000>>,
    /// How often a leader sends a heartbeat, ms (default 50). An
    /// AppendEntries may take at least 100 ms, however short this is. 10 to
    /// 59999, and below election_timeout_ms.
    #[arg(long, env = "FENCED_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<Within<10, 59_999>>,
    /// Snapshot (and purge the log) every this many entries. 10 to 10000000.
    #[arg(long, env = "FENCED_SNAPSHOT_LOGS")]
    pub snapshot_logs: Option<Within<10, 10_000_000>>,
    /// Most commands waiting to be proposed. 1 to 10000000.
    #[arg(long, env = "FENCED_MAX_PENDING")]
    pub max_pending: Option<Within<1, 10_000_000>>,
    /// Most commands in one log entry. 1 to 4096.
    #[arg(long, env = "FENCED_MAX_BATCH")]
    pub max_batch: Option<Within<1, { fenced_core::MAX_BATCH_COMMANDS as u64 }>>,
    /// Most blocking acquires parked on this node. 1 to 10000000.
    #[arg(long, env = "FENCED_MAX_PARKED")]
    pub max_parked: Option<Within<1, 10_000_000>>,
    /// How long a write may take to commit before the caller hears "unknown", ms. 100 to 600000.
    #[arg(long, env = "FENCED_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<Within<100, 600_000>>,
    /// Prometheus `/metrics` over HTTP on host:port; off when unset.
    #[arg(long, env = "FENCED_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Bearer tokens (hashed) and their roles, TOML; turns auth on. Reread on SIGHUP.
    #[arg(long, env = "FENCED_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,
    /// Roles and the identities that have them, TOML; turns auth on. Reread on SIGHUP.
    #[arg(long, env = "FENCED_AUTH_POLICY")]
    pub auth_policy: Option<PathBuf>,
    /// Most live leases one identity may hold (with auth on). 1 to 10000000.
    #[arg(long, env = "FENCED_MAX_LEASES_PER_IDENTITY")]
    pub max_leases_per_identity: Option<Within<1, 10_000_000>>,
    /// Most blocking acquires one identity may have waiting (with auth on). 1 to 10000000.
    #[arg(long, env = "FENCED_MAX_WAITERS_PER_IDENTITY")]
    pub max_waiters_per_identity: Option<Within<1, 10_000_000>>,
    /// Grants remembered per resource for History (0 to 64). Shapes the
    /// replicated state: give every node the same value. 0 to 64.
    #[arg(long, env = "FENCED_HISTORY_PER_RESOURCE")]
    pub history_per_resource: Option<Within<0, { fenced_core::MAX_HISTORY_PER_RESOURCE as u64 }>>,
    /// Most open Watch streams on this node. 1 to 100000.
    #[arg(long, env = "FENCED_MAX_WATCHERS")]
    pub max_watchers: Option<Within<1, 100_000>>,
    /// Most open Watch streams of one identity on this node (with auth on). 1 to 100000.
    #[arg(long, env = "FENCED_MAX_WATCHERS_PER_IDENTITY")]
    pub max_watchers_per_identity: Option<Within<1, 100_000>>,
    /// Messages a Watch stream may have waiting for its client; a client
    /// that leaves it full for 5 s is sent FellBehind. 1 to 65536.
    #[arg(long, env = "FENCED_WATCH_BUFFER")]
    pub watch_buffer: Option<Within<1, 65_536>>,
    /// Most open connections per listener (client port and peer port);
    /// beyond it a new connection is closed at once. 16 to 1000000.
    #[arg(long, env = "FENCED_MAX_CONNECTIONS")]
    pub max_connections: Option<Within<16, 1_000_000>>,
    /// Most connections per listener still in their TLS handshake (or,
    /// on the peer port, not yet routed); beyond it the oldest is closed. 16 to 100000.
    #[arg(long, env = "FENCED_MAX_PENDING_HANDSHAKES")]
    pub max_pending_handshakes: Option<Within<16, 100_000>>,
    /// Of those, most from one address; beyond it that address's oldest
    /// is closed. 1 to 100000, and at most max_pending_handshakes.
    #[arg(long, env = "FENCED_MAX_PENDING_HANDSHAKES_PER_SOURCE")]
    pub max_pending_handshakes_per_source: Option<Within<1, 100_000>>,
    /// Most concurrent HTTP/2 streams (calls) per connection. 1 to 100000.
    #[arg(long, env = "FENCED_MAX_CONCURRENT_STREAMS")]
    pub max_concurrent_streams: Option<Within<1, 100_000>>,
    /// HTTP/2 keep-alive ping interval, ms. 1000 to 3600000.
    #[arg(long, env = "FENCED_HTTP2_KEEPALIVE_INTERVAL_MS")]
    pub http2_keepalive_interval_ms: Option<Within<1_000, 3_600_000>>,
    /// How long an HTTP/2 keep-alive ping may go unanswered, ms. 1000 to 600000.
    #[arg(long, env = "FENCED_HTTP2_KEEPALIVE_TIMEOUT_MS")]
    pub http2_keepalive_timeout_ms: Option<Within<1_000, 600_000>>,
    /// A connection that sends nothing for this long is closed, ms. 1000 to
    /// 86400000, and at least a keep-alive ping's interval plus its timeout.
    #[arg(long, env = "FENCED_IDLE_TIMEOUT_MS")]
    pub idle_timeout_ms: Option<Within<1_000, 86_400_000>>,
    /// Most live leases in the whole cluster; acquires beyond are refused. 1 to 10000000.
    #[arg(long, env = "FENCED_MAX_LIVE_LEASES")]
    pub max_live_leases: Option<Within<1, 10_000_000>>,
    /// Most waiting acquires in the whole cluster; waits beyond are refused. 1 to 10000000.
    #[arg(long, env = "FENCED_MAX_WAITERS")]
    pub max_waiters: Option<Within<1, 10_000_000>>,
    /// Most open sessions in the whole cluster; opens beyond are refused. 1 to 1000000.
    #[arg(long, env = "FENCED_MAX_SESSIONS")]
    pub max_sessions: Option<Within<1, 1_000_000>>,
    /// Most open sessions of one identity; opens beyond are refused. 1 to 1000000.
    #[arg(long, env = "FENCED_MAX_SESSIONS_PER_IDENTITY")]
    pub max_sessions_per_identity: Option<Within<1, 1_000_000>>,
    /// Largest snapshot received from a leader, bytes. 1048576 to 1073741824.
    #[arg(long, env = "FENCED_MAX_SNAPSHOT_BYTES")]
    pub max_snapshot_bytes: Option<Within<{ 1 << 20 }, { 1 << 30 }>>,
    /// Most keys in the fenced store (the Kv service); puts beyond are refused. 1 to 10000000.
    #[arg(long, env = "FENCED_KV_MAX_KEYS")]
    pub kv_max_keys: Option<Within<1, 10_000_000>>,
    /// Most bytes of keys plus values in the fenced store; at most half of
    /// max_snapshot_bytes, since every snapshot carries the whole store.
    /// 65536 to 536870912.
    #[arg(long, env = "FENCED_KV_MAX_TOTAL_BYTES")]
    pub kv_max_total_bytes: Option<Within<{ fenced_core::KV_VALUE_MAX_BYTES as u64 }, { 1 << 29 }>>,
    /// Test-only: run the leader clock this many parts per million fast (or slow).
    #[arg(long, env = "FENCED_TEST_CLOCK_SKEW_PPM", hide = true)]
    pub test_clock_skew_ppm: Option<i64>,
    /// This node's certificate (PEM); with --tls-key and --tls-ca turns TLS
    /// on for both ports, mutual between nodes (see `fenced certs`).
    #[arg(long, env = "FENCED_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, env = "FENCED_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs node and client certificates.
    #[arg(long, env = "FENCED_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Certificates refused before they expire: a TOML file of `serials`,
    /// `nodes` and `clients`, checked on every port and reread on SIGHUP
    /// (docs/DEPLOYING.md, "Revoking a certificate"); needs TLS.
    #[arg(long, env = "FENCED_TLS_DENY")]
    pub tls_deny: Option<PathBuf>,
    /// Require a client certificate signed by --tls-ca on the client port
    /// (it is optional there otherwise; the peer port always requires one).
    #[arg(long, env = "FENCED_CLIENT_CERT_AUTH")]
    #[serde(default, skip_serializing_if = "is_off")]
    pub client_cert_auth: bool,
    /// Serve `/metrics` over HTTPS with the node's certificate (client
    /// certificates optional); needs --tls-cert, --tls-key and --tls-ca.
    #[arg(long, env = "FENCED_METRICS_TLS")]
    #[serde(default, skip_serializing_if = "is_off")]
    pub metrics_tls: bool,
    /// Serve plaintext on a non-loopback address (refused otherwise);
    /// anyone who reaches the ports can then rewrite the lease table.
    #[arg(long, env = "FENCED_INSECURE")]
    #[serde(default, skip_serializing_if = "is_off")]
    pub insecure: bool,
    /// Serve TLS on a non-loopback address with authentication off (refused
    /// otherwise): every client that trusts the CA, with or without a
    /// certificate, is then an admin. Warned at every start.
    #[arg(long, env = "FENCED_INSECURE_NO_AUTH")]
    #[serde(default, skip_serializing_if = "is_off")]
    pub insecure_no_auth: bool,
}

impl RunSettings {
    /// Fills what flags and environment left unset from `file`. Every
    /// setting merges alike: a value given wins, one left unset (a switch
    /// left off) takes the file's.
    pub fn or_file(self, file: RunSettings) -> Result<RunSettings, String> {
        let mut merged = file.to_table()?;
        merged.extend(self.to_table()?);
        merged.try_into().map_err(|e| format!("settings: {e}"))
    }

    /// The settings given (a switch only when on), by config-file key.
    fn to_table(&self) -> Result<toml::Table, String> {
        toml::Table::try_from(self).map_err(|e| format!("settings: {e}"))
    }

    /// The `fenced run` flags that give these settings: what a launcher
    /// passes to start a node with them. Flag names come from the same
    /// declarations as `fenced run`'s own (the config-file key with `-`).
    pub fn to_args(&self) -> Result<Vec<String>, String> {
        let command = <Self as clap::Args>::augment_args(clap::Command::new("fenced run"));
        let mut args = Vec::new();
        for (key, value) in self.to_table()? {
            let flag = command
                .get_arguments()
                .find(|a| a.get_id().as_str() == key)
                .and_then(clap::Arg::get_long)
                .ok_or_else(|| format!("{key}: no flag of `fenced run` gives it"))?;
            match value {
                toml::Value::Boolean(true) => args.push(format!("--{flag}")),
                toml::Value::Boolean(false) => {}
                // One argument with `=`: a negative number is not taken
                // for a flag.
                toml::Value::String(s) => args.push(format!("--{flag}={s}")),
                toml::Value::Integer(i) => args.push(format!("--{flag}={i}")),
                other => return Err(format!("{key}: {other:?} is not a flag value")),
            }
        }
        Ok(args)
    }

    /// Reads a TOML settings file.
    pub fn from_file(path: &Path) -> Result<RunSettings, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    /// Checks every setting and builds the node's configuration.
    pub fn into_node_config(self) -> Result<NodeConfig, String> {
        let id = self.id.ok_or("id: required (--id or FENCED_ID)")?.get();
        let data_dir = self
            .data_dir
            .ok_or("data_dir: required (--data-dir or FENCED_DATA_DIR)")?;
        let listen = resolve(
            "listen",
            &self
                .listen
                .ok_or("listen: required (--listen or FENCED_LISTEN)")?,
        )?;
        let peer_listen = resolve(
            "peer_listen",
            &self
                .peer_listen
                .ok_or("peer_listen: required (--peer-listen or FENCED_PEER_LISTEN)")?,
        )?;
        let (initial_cluster, join) = match (self.initial_cluster, self.join) {
            (Some(_), Some(_)) => {
                return Err(
                    "join: conflicts with initial_cluster: a node either starts a new \
                            cluster or joins a running one"
                        .into(),
                )
            }
            (Some(spec), None) => (parse_initial_cluster(&spec)?, None),
            (None, Some(endpoints)) => (
                BTreeMap::new(),
                Some(join_settings(
                    id,
                    &endpoints,
                    self.advertise_peer.as_deref(),
                    self.advertise_client.as_deref(),
                    listen,
                    peer_listen,
                )?),
            ),
            (None, None) => {
                return Err("initial_cluster: required (--initial-cluster or \
                            FENCED_INITIAL_CLUSTER), or --join to join a running cluster"
                    .into())
            }
        };
        let mut cfg = NodeConfig::new(id, data_dir, listen, peer_listen, initial_cluster);
        cfg.join = join;
        // Each value is within its own bounds already (its type); what is
        // left here is the default for a value not given and the checks
        // between settings.
        let l = &mut cfg.limits;
        l.ttl_min_ms = given(self.ttl_min_ms, l.ttl_min_ms);
        l.ttl_max_ms = given(self.ttl_max_ms, l.ttl_max_ms);
        l.wait_max_ms = given(self.wait_max_ms, l.wait_max_ms);
        l.max_live_leases = given(self.max_live_leases, l.max_live_leases);
        l.max_waiters = given(self.max_waiters, l.max_waiters);
        l.max_sessions = given(self.max_sessions, l.max_sessions);
        l.max_sessions_per_identity =
            given(self.max_sessions_per_identity, l.max_sessions_per_identity);
        l.kv_max_keys = given(self.kv_max_keys, l.kv_max_keys);
        l.validate().map_err(|e| e.to_string())?;
        cfg.election_timeout_ms = given(self.election_timeout_ms, cfg.election_timeout_ms);
        cfg.heartbeat_ms = given(self.heartbeat_ms, cfg.heartbeat_ms);
        if cfg.heartbeat_ms >= cfg.election_timeout_ms {
            return Err(format!(
                "heartbeat_ms: must be below election_timeout_ms ({}), got {}",
                cfg.election_timeout_ms, cfg.heartbeat_ms
            ));
        }
        if let Some(check) = self.election_check_ms {
            if check.get() > cfg.election_timeout_ms {
                return Err(format!(
                    "election_check_ms: must be at most election_timeout_ms ({}), got {check}",
                    cfg.election_timeout_ms
                ));
            }
            cfg.election_check_ms = Some(check.get());
        }
        cfg.snapshot_logs = given(self.snapshot_logs, cfg.snapshot_logs);
        cfg.proposer.max_pending = given_usize(self.max_pending, cfg.proposer.max_pending);
        cfg.proposer.max_batch = given_usize(self.max_batch, cfg.proposer.max_batch);
        cfg.max_parked = given_usize(self.max_parked, cfg.max_parked);
        cfg.request_timeout = given_ms(self.request_timeout_ms, cfg.request_timeout);
        let s = &mut cfg.server_limits;
        s.max_connections = given_usize(self.max_connections, s.max_connections);
        s.max_pending_handshakes =
            given_usize(self.max_pending_handshakes, s.max_pending_handshakes);
        // One address's share is at most the whole budget; a budget below
        // the default share lowers the default with it.
        s.max_pending_handshakes_per_source = match self.max_pending_handshakes_per_source {
            Some(v) if v.get_usize() > s.max_pending_handshakes => {
                return Err(format!(
                    "max_pending_handshakes_per_source: must be at most \
                     max_pending_handshakes ({}), got {v}",
                    s.max_pending_handshakes
                ))
            }
            Some(v) => v.get_usize(),
            None => s
                .max_pending_handshakes_per_source
                .min(s.max_pending_handshakes),
        };
        s.max_concurrent_streams = self
            .max_concurrent_streams
            .map_or(s.max_concurrent_streams, |v| {
                u32::try_from(v.get()).unwrap_or(u32::MAX)
            });
        s.http2_keepalive_interval =
            given_ms(self.http2_keepalive_interval_ms, s.http2_keepalive_interval);
        s.http2_keepalive_timeout =
            given_ms(self.http2_keepalive_timeout_ms, s.http2_keepalive_timeout);
        s.idle_timeout = given_ms(self.idle_timeout_ms, s.idle_timeout);
        // A live client answers keep-alive pings, so the idle timeout must
        // leave room for at least one ping and its answer.
        let ping_round = s.http2_keepalive_interval + s.http2_keepalive_timeout;
        if s.idle_timeout < ping_round {
            return Err(format!(
                "idle_timeout_ms: must be at least http2_keepalive_interval_ms plus \
                 http2_keepalive_timeout_ms ({}), got {}",
                ping_round.as_millis(),
                s.idle_timeout.as_millis()
            ));
        }
        s.max_snapshot_bytes = given(self.max_snapshot_bytes, s.max_snapshot_bytes);
        // Every snapshot carries the whole store.
        let kv_ceiling = s.max_snapshot_bytes / 2;
        cfg.limits.kv_max_total_bytes = match self.kv_max_total_bytes {
            Some(v) if v.get() > kv_ceiling => {
                return Err(format!(
                    "kv_max_total_bytes: must be at most half of max_snapshot_bytes \
                     ({kv_ceiling}), got {v}"
                ))
            }
            Some(v) => v.get(),
            None => cfg.limits.kv_max_total_bytes.min(kv_ceiling),
        };
        cfg.metrics_listen = self
            .metrics_listen
            .filter(|a| !a.is_empty())
            .map(|a| resolve("metrics_listen", &a))
            .transpose()?;
        cfg.auth = crate::security::auth::AuthConfig {
            tokens: self.auth_tokens,
            policy: self.auth_policy,
        };
        cfg.max_leases_per_identity =
            given(self.max_leases_per_identity, cfg.max_leases_per_identity);
        cfg.max_waiters_per_identity =
            given(self.max_waiters_per_identity, cfg.max_waiters_per_identity);
        cfg.history_per_resource = given_usize(self.history_per_resource, cfg.history_per_resource);
        cfg.max_watchers = given_usize(self.max_watchers, cfg.max_watchers);
        cfg.max_watchers_per_identity = given_usize(
            self.max_watchers_per_identity,
            cfg.max_watchers_per_identity,
        );
        cfg.watch_buffer = given_usize(self.watch_buffer, cfg.watch_buffer);
        cfg.tls = tls_settings(
            self.tls_cert,
            self.tls_key,
            self.tls_ca,
            self.client_cert_auth,
        )?;
        match (&mut cfg.tls, self.tls_deny) {
            (Some(tls), deny) => tls.deny = deny,
            (None, Some(_)) => {
                return Err("tls_deny: needs --tls-cert, --tls-key and --tls-ca".into())
            }
            (None, None) => {}
        }
        secure_default(&cfg, self.insecure)?;
        authenticated_default(&cfg, self.insecure, self.insecure_no_auth)?;
        if self.metrics_tls && cfg.tls.is_none() {
            return Err("metrics_tls: needs --tls-cert, --tls-key and --tls-ca".into());
        }
        cfg.metrics_tls = self.metrics_tls;
        cfg.proposer.clock_skew_ppm = self
            .test_clock_skew_ppm
            .unwrap_or(0)
            .clamp(-100_000, 100_000);
        Ok(cfg)
    }
}

/// A switch left off is not written (so a file's `true` is not undone).
fn is_off(on: &bool) -> bool {
    !*on
}

/// All three files or none; `client_cert_auth` needs them.
fn tls_settings(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
    client_cert_auth: bool,
) -> Result<Option<TlsSettings>, String> {
    match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsSettings {
            cert,
            key,
            ca,
            client_cert_auth,
            deny: None,
        })),
        (None, None, None) if client_cert_auth => {
            Err("client_cert_auth: needs --tls-cert, --tls-key and --tls-ca".into())
        }
        (None, None, None) => Ok(None),
        (cert, key, ca) => {
            let missing: Vec<&str> = [
                ("--tls-cert", cert.is_none()),
                ("--tls-key", key.is_none()),
                ("--tls-ca", ca.is_none()),
            ]
            .into_iter()
            .filter_map(|(f, m)| m.then_some(f))
            .collect();
            Err(format!(
                "tls: {} missing (TLS needs all three)",
                missing.join(" and ")
            ))
        }
    }
}

/// With TLS, authentication off only on a loopback client address, unless
/// `--insecure-no-auth` says otherwise (then a warning at every start). A
/// plaintext node (`--insecure`) is already warned as open to anyone.
fn authenticated_default(
    cfg: &NodeConfig,
    insecure: bool,
    insecure_no_auth: bool,
) -> Result<(), String> {
    if cfg.auth.enabled() || cfg.listen.ip().is_loopback() || (cfg.tls.is_none() && insecure) {
        return Ok(());
    }
    if insecure_no_auth {
        tracing::warn!(
            client = %cfg.listen,
            "--insecure-no-auth: authentication is off; every client that trusts the CA can \
             take and release any lock, change the membership and save a snapshot with every \
             owner id"
        );
        return Ok(());
    }
    Err(format!(
        "--listen {} is not a loopback address and authentication is off: give --auth-policy \
         (client certificates, roles) and/or --auth-tokens (docs/DEPLOYING.md, \
         \"Authentication\"), or --insecure-no-auth to serve every caller as an admin anyway",
        cfg.listen
    ))
}

/// Plaintext only on loopback, unless `--insecure` says otherwise (then a
/// warning at every start).
fn secure_default(cfg: &NodeConfig, insecure: bool) -> Result<(), String> {
    if cfg.tls.is_some() {
        return Ok(());
    }
    if insecure {
        tracing::warn!(
            client = %cfg.listen,
            peer = %cfg.peer_listen,
            "--insecure: serving plaintext without authentication; anyone who reaches these ports \
             can take and release any lock and rewrite the cluster's state"
        );
        return Ok(());
    }
    for (flag, addr) in [("--listen", cfg.listen), ("--peer-listen", cfg.peer_listen)] {
        if !addr.ip().is_loopback() {
            return Err(format!(
                "{flag} {addr} is not a loopback address and TLS is off: give --tls-cert, \
                 --tls-key and --tls-ca (make them with `fenced certs`), or --insecure to \
                 serve plaintext anyway"
            ));
        }
    }
    Ok(())
}

/// A value given, or the default.
fn given<const MIN: u64, const MAX: u64>(value: Option<Within<MIN, MAX>>, default: u64) -> u64 {
    value.map_or(default, Within::get)
}

fn given_usize<const MIN: u64, const MAX: u64>(
    value: Option<Within<MIN, MAX>>,
    default: usize,
) -> usize {
    value.map_or(default, Within::get_usize)
}

fn given_ms<const MIN: u64, const MAX: u64>(
    value: Option<Within<MIN, MAX>>,
    default: Duration,
) -> Duration {
    value.map_or(default, |v| Duration::from_millis(v.get()))
}

fn resolve(field: &str, addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("{field}: {addr} is not host:port ({e})"))?
        .next()
        .ok_or_else(|| format!("{field}: {addr} resolves to no address"))
}

/// What `--join` asks for: the endpoints, and this node's advertised
/// addresses (the listen addresses unless given; a wildcard listen address
/// cannot be reached, so it needs the advertised one).
fn join_settings(
    id: NodeId,
    endpoints: &str,
    advertise_peer: Option<&str>,
    advertise_client: Option<&str>,
    listen: SocketAddr,
    peer_listen: SocketAddr,
) -> Result<Join, String> {
    let endpoints: Vec<String> = endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    if endpoints.is_empty() {
        return Err("join: names no endpoint (HOST:CLIENTPORT,...)".into());
    }
    if endpoints.len() > 16 {
        return Err(format!(
            "join: at most 16 endpoints, got {}",
            endpoints.len()
        ));
    }
    for e in &endpoints {
        if e.rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(format!("join: endpoint {e:?} is not HOST:PORT"));
        }
    }
    let advertised = |field: &str, given: Option<&str>, listen: SocketAddr| match given {
        Some(a)
            if a.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
        {
            Ok(a.to_string())
        }
        Some(a) => Err(format!("{field}: {a:?} is not HOST:PORT")),
        None if listen.ip().is_unspecified() => Err(format!(
            "{field}: required with --join when listening on {listen} (the address other \
             nodes and clients reach this node at)"
        )),
        None => Ok(listen.to_string()),
    };
    Ok(Join {
        endpoints,
        id,
        node: Node {
            peer_addr: advertised("advertise_peer", advertise_peer, peer_listen)?,
            client_addr: advertised("advertise_client", advertise_client, listen)?,
        },
    })
}

/// Parses `1=HOST:PEERPORT[/HOST:CLIENTPORT],2=...`.
pub fn parse_initial_cluster(spec: &str) -> Result<BTreeMap<NodeId, Node>, String> {
    let mut members = BTreeMap::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addrs) = part
            .split_once('=')
            .ok_or_else(|| format!("initial_cluster: {part:?} is not ID=HOST:PEERPORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id >= 1)
            .ok_or_else(|| format!("initial_cluster: {id:?} is not a node id (>= 1)"))?;
        let (peer, client) = match addrs.split_once('/') {
            Some((p, c)) => (p.trim(), c.trim()),
            None => (addrs.trim(), ""),
        };
        for (what, a) in [("peer", peer), ("client", client)] {
            if !a.is_empty()
                && a.rsplit_once(':')
                    .and_then(|(_, port)| port.parse::<u16>().ok())
                    .is_none()
            {
                return Err(format!(
                    "initial_cluster: node {id} {what} address {a:?} is not HOST:PORT"
                ));
            }
        }
        if peer.is_empty() {
            return Err(format!("initial_cluster: node {id} has no peer address"));
        }
        let node = Node {
            peer_addr: peer.to_string(),
            client_addr: client.to_string(),
        };
        if members.insert(id, node).is_some() {
            return Err(format!("initial_cluster: node {id} is named twice"));
        }
    }
    if members.is_empty() {
        return Err("initial_cluster: names no node".into());
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn w<const MIN: u64, const MAX: u64>(value: u64) -> Within<MIN, MAX> {
        Within::new(value).unwrap()
    }

    #[test]
    fn an_initial_cluster_parses_with_and_without_client_addresses() {
        let m =
            parse_initial_cluster("1=127.0.0.1:7201/127.0.0.1:7101, 2=h2:7202,3=h3:7203").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[&1].client_addr, "127.0.0.1:7101");
        assert_eq!(m[&2].peer_addr, "h2:7202");
        assert_eq!(m[&2].client_addr, "");
    }

    #[test]
    fn a_bad_initial_cluster_names_the_problem() {
        for (spec, needle) in [
            ("", "names no node"),
            ("x=h:1", "not a node id"),
            ("0=h:1", "not a node id"),
            ("1=h", "not HOST:PORT"),
            ("1=h:1,1=h:2", "named twice"),
            ("1", "not ID=HOST:PEERPORT"),
        ] {
            let err = parse_initial_cluster(spec).unwrap_err();
            assert!(
                err.contains("initial_cluster") && err.contains(needle),
                "{spec}: {err}"
            );
        }
    }

    #[test]
    fn flags_win_over_the_file() {
        let flags = RunSettings {
            id: Some(w(2)),
            ..Default::default()
        };
        let file: RunSettings = toml::from_str("id = 1\ndata_dir = \"/var/lib/fenced\"").unwrap();
        let merged = flags.or_file(file).unwrap();
        assert_eq!(merged.id, Some(w(2)));
        assert_eq!(merged.data_dir, Some(PathBuf::from("/var/lib/fenced")));
    }

    /// `fenced run` parsing `args` (no environment involved: every flag given).
    fn parse_run(args: &[String]) -> RunSettings {
        use clap::FromArgMatches;
        let command = <RunSettings as clap::Args>::augment_args(clap::Command::new("run"));
        let matches = command
            .try_get_matches_from(std::iter::once("run".to_string()).chain(args.iter().cloned()))
            .unwrap();
        RunSettings::from_arg_matches(&matches).unwrap()
    }

    /// Every setting given, each as the first of a few values its parser
    /// takes (a number within its bounds, a path or an address),
    /// `join` and `initial_cluster` in turn.
    fn every_setting(skip: &str) -> Vec<String> {
        let command = <RunSettings as clap::Args>::augment_args(clap::Command::new("run"));
        let mut args = Vec::new();
        for arg in command.get_arguments().filter(|a| a.get_id() != skip) {
            args.push(format!("--{}", arg.get_long().unwrap()));
            if arg.get_action().takes_values() {
                let taken = ["7", "1000", "65536", "1048576"]
                    .into_iter()
                    .find(|v| takes(arg, v).is_ok())
                    .unwrap();
                args.push(taken.into());
            }
        }
        args
    }

    /// Whether `arg` alone takes `value`, or clap's refusal.
    fn takes(arg: &clap::Arg, value: &str) -> Result<(), String> {
        let given = format!("--{}={value}", arg.get_long().unwrap());
        <RunSettings as clap::Args>::augment_args(clap::Command::new("run"))
            .try_get_matches_from(["run", &given])
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// What `fenced run` says of `args`, when it refuses them.
    fn refusal(args: &[&str]) -> String {
        let command = <RunSettings as clap::Args>::augment_args(clap::Command::new("run"));
        command
            .try_get_matches_from(std::iter::once("run").chain(args.iter().copied()))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn each_setting_has_one_name_as_flag_variable_and_file_key() {
        let command = <RunSettings as clap::Args>::augment_args(clap::Command::new("run"));
        let mut n = 0;
        for arg in command.get_arguments() {
            let key = arg.get_id().as_str();
            assert_eq!(arg.get_long(), Some(key.replace('_', "-").as_str()));
            let env = arg.get_env().unwrap().to_str().unwrap();
            assert_eq!(env, format!("FENCED_{}", key.to_ascii_uppercase()));
            n += 1;
        }
        // Every flag is a file key: the settings with all given, as a file.
        for skip in ["join", "initial_cluster"] {
            let all = parse_run(&every_setting(skip));
            let table = all.to_table().unwrap();
            assert_eq!(table.len(), n - 1, "{table:?}");
            let file: RunSettings = table.try_into().unwrap();
            assert_eq!(file, all);
        }
    }

    #[test]
    fn a_launcher_gets_back_every_setting_from_its_flags() {
        for skip in ["join", "initial_cluster"] {
            let all = parse_run(&every_setting(skip));
            assert!(all.id == Some(w(7)) && all.insecure && all.data_dir.is_some());
            assert_eq!(all.election_timeout_ms, Some(w(1000)));
            assert_eq!(parse_run(&all.to_args().unwrap()), all);
        }
        let few = RunSettings {
            id: Some(w(2)),
            listen: Some("127.0.0.1:7102".into()),
            max_batch: Some(w(16)),
            ..Default::default()
        };
        assert_eq!(
            few.to_args().unwrap(),
            ["--id=2", "--listen=127.0.0.1:7102", "--max-batch=16"]
        );
        let skewed = RunSettings {
            test_clock_skew_ppm: Some(-20_000),
            initial_cluster: Some("1=127.0.0.1:7201/127.0.0.1:7101".into()),
            ..Default::default()
        };
        assert_eq!(parse_run(&skewed.to_args().unwrap()), skewed);
        assert!(RunSettings::default().to_args().unwrap().is_empty());
    }

    #[test]
    fn a_switch_left_off_keeps_the_files() {
        let file: RunSettings = toml::from_str(
            "insecure = true
max_batch = 8",
        )
        .unwrap();
        let merged = RunSettings {
            max_batch: Some(w(9)),
            ..Default::default()
        }
        .or_file(file)
        .unwrap();
        assert!(merged.insecure);
        assert_eq!(merged.max_batch, Some(w(9)));
    }

    #[test]
    fn an_unknown_file_key_is_refused() {
        assert!(toml::from_str::<RunSettings>("idd = 1").is_err());
    }

    fn on(listen: &str, peer: &str) -> RunSettings {
        RunSettings {
            id: Some(w(1)),
            data_dir: Some("/tmp/x".into()),
            listen: Some(listen.into()),
            peer_listen: Some(peer.into()),
            initial_cluster: Some(format!("1={peer}")),
            ..Default::default()
        }
    }

    #[test]
    fn join_replaces_the_initial_cluster_and_needs_reachable_addresses() {
        let both = RunSettings {
            join: Some("127.0.0.1:7101".into()),
            ..on("127.0.0.1:7104", "127.0.0.1:7204")
        };
        let err = both.into_node_config().unwrap_err();
        assert!(
            err.contains("join: conflicts with initial_cluster"),
            "{err}"
        );
        let join = |listen: &str, peer: &str, endpoints: &str| RunSettings {
            initial_cluster: None,
            join: Some(endpoints.into()),
            insecure: true,
            ..on(listen, peer)
        };
        let cfg = join("127.0.0.1:7104", "127.0.0.1:7204", "a:7101, b:7102")
            .into_node_config()
            .unwrap();
        assert!(cfg.initial_cluster.is_empty());
        let j = cfg.join.unwrap();
        assert_eq!(j.endpoints, ["a:7101", "b:7102"]);
        assert_eq!(j.node.peer_addr, "127.0.0.1:7204");
        assert_eq!(j.node.client_addr, "127.0.0.1:7104");
        let err = join("0.0.0.0:7104", "0.0.0.0:7204", "a:7101")
            .into_node_config()
            .unwrap_err();
        assert!(
            err.starts_with("advertise_peer: required with --join"),
            "{err}"
        );
        let advertised = RunSettings {
            advertise_peer: Some("fenced-4:7204".into()),
            advertise_client: Some("fenced-4:7104".into()),
            ..join("0.0.0.0:7104", "0.0.0.0:7204", "a:7101")
        };
        let j = advertised.into_node_config().unwrap().join.unwrap();
        assert_eq!(j.node.peer_addr, "fenced-4:7204");
        for bad in ["", " , ", "nohost", "a:b"] {
            let err = join("127.0.0.1:7104", "127.0.0.1:7204", bad)
                .into_node_config()
                .unwrap_err();
            assert!(err.starts_with("join:"), "{bad:?}: {err}");
        }
        let err = RunSettings {
            initial_cluster: None,
            ..on("127.0.0.1:7104", "127.0.0.1:7204")
        }
        .into_node_config()
        .unwrap_err();
        assert!(err.contains("or --join"), "{err}");
    }

    #[test]
    fn plaintext_on_a_non_loopback_address_needs_insecure() {
        let err = on("0.0.0.0:7101", "127.0.0.1:7201")
            .into_node_config()
            .unwrap_err();
        assert!(
            err.contains("--listen 0.0.0.0:7101")
                && err.contains("--tls-cert")
                && err.contains("--insecure"),
            "{err}"
        );
        let err = on("127.0.0.1:7101", "0.0.0.0:7201")
            .into_node_config()
            .unwrap_err();
        assert!(err.contains("--peer-listen 0.0.0.0:7201"), "{err}");
        let insecure = RunSettings {
            insecure: true,
            ..on("0.0.0.0:7101", "0.0.0.0:7201")
        };
        assert!(insecure.into_node_config().unwrap().tls.is_none());
        assert!(on("127.0.0.1:7101", "[::1]:7201")
            .into_node_config()
            .is_ok());
    }

    #[test]
    fn tls_on_a_non_loopback_address_needs_authentication_or_insecure_no_auth() {
        let tls = |listen: &str| RunSettings {
            tls_cert: Some("node.pem".into()),
            tls_key: Some("node-key.pem".into()),
            tls_ca: Some("ca.pem".into()),
            ..on(listen, "0.0.0.0:7201")
        };
        let err = tls("0.0.0.0:7101").into_node_config().unwrap_err();
        assert!(
            err.contains("--listen 0.0.0.0:7101")
                && err.contains("authentication is off")
                && err.contains("--auth-policy")
                && err.contains("--insecure-no-auth"),
            "{err}"
        );
        // A policy, tokens, the loud flag, or a loopback client address.
        for settings in [
            RunSettings {
                auth_policy: Some("policy.toml".into()),
                ..tls("0.0.0.0:7101")
            },
            RunSettings {
                auth_tokens: Some("tokens.toml".into()),
                ..tls("0.0.0.0:7101")
            },
            RunSettings {
                insecure_no_auth: true,
                ..tls("0.0.0.0:7101")
            },
            tls("127.0.0.1:7101"),
        ] {
            assert!(settings.into_node_config().is_ok());
        }
    }

    #[test]
    fn tls_needs_all_three_files() {
        let half = RunSettings {
            tls_cert: Some("c.pem".into()),
            ..on("0.0.0.0:7101", "0.0.0.0:7201")
        };
        let err = half.into_node_config().unwrap_err();
        assert!(err.contains("--tls-key and --tls-ca missing"), "{err}");
        let all = RunSettings {
            tls_cert: Some("c.pem".into()),
            tls_key: Some("k.pem".into()),
            tls_ca: Some("ca.pem".into()),
            client_cert_auth: true,
            auth_policy: Some("policy.toml".into()),
            ..on("0.0.0.0:7101", "0.0.0.0:7201")
        };
        let tls = all.into_node_config().unwrap().tls.unwrap();
        assert!(tls.client_cert_auth);
        let file: RunSettings =
            toml::from_str("tls_ca = \"/etc/fenced/ca.pem\"\nclient_cert_auth = true").unwrap();
        assert!(file.client_cert_auth);
    }

    #[test]
    fn out_of_bounds_tuning_is_refused_where_it_is_read_naming_the_setting() {
        // A flag (or its variable: clap reads both alike).
        let err = refusal(&["--max-batch", "1000000"]);
        assert!(
            err.contains("--max-batch")
                && err.contains("must be a whole number between 1 and 4096, got 1000000"),
            "{err}"
        );
        // An operator's typo that would otherwise wrap or overflow a timer.
        for (flag, bounds) in [
            ("--wait-max-ms", "between 0 and 86400000"),
            ("--ttl-max-ms", "between 1 and 86400000"),
            ("--request-timeout-ms", "between 100 and 600000"),
        ] {
            for bad in ["18446744073709551615", "18446744073709551616", "-1"] {
                let err = refusal(&[&format!("{flag}={bad}")]);
                assert!(
                    err.contains(flag) && err.contains(bounds),
                    "{flag} {bad}: {err}"
                );
            }
        }
        // Node ids start at 1.
        let err = refusal(&["--id=0"]);
        assert!(
            err.contains("--id") && err.contains("between 1 and"),
            "{err}"
        );
        // A file's key.
        let err = toml::from_str::<RunSettings>("max_batch = 1000000").unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("max_batch")
                && err.contains("must be a whole number between 1 and 4096, got 1000000"),
            "{err}"
        );
    }

    /// Every bounded setting's help gives the bounds its type enforces, so
    /// `fenced run --help` cannot drift from what is refused.
    #[test]
    fn every_bounded_settings_help_gives_its_bounds() {
        let command = <RunSettings as clap::Args>::augment_args(clap::Command::new("run"));
        let mut bounded = 0;
        for arg in command.get_arguments() {
            // Past u64: refused by every bounded setting, naming its bounds.
            let Err(e) = takes(arg, "18446744073709551616") else {
                continue;
            };
            let Some(rest) = e.split("between ").nth(1) else {
                continue;
            };
            let (min, rest) = rest.split_once(" and ").unwrap();
            let max = rest.split(',').next().unwrap();
            let help = arg.get_help().unwrap().to_string().replace('\n', " ");
            assert!(
                help.contains(&format!("{min} to {max}")),
                "--{}: help {help:?} does not give {min} to {max}",
                arg.get_long().unwrap()
            );
            bounded += 1;
        }
        assert_eq!(
            bounded, 32,
            "every numeric setting but the test clock's is bounded"
        );
    }

    #[test]
    fn the_limits_come_from_the_file_and_are_bounded_by_name() {
        let base = || RunSettings {
            id: Some(w(1)),
            data_dir: Some("/tmp/x".into()),
            listen: Some("127.0.0.1:1".into()),
            peer_listen: Some("127.0.0.1:2".into()),
            initial_cluster: Some("1=127.0.0.1:2".into()),
            ..Default::default()
        };
        let file: RunSettings = toml::from_str(
            "max_connections = 100\nmax_concurrent_streams = 10\nmax_live_leases = 5000\n\
             max_waiters = 600\nidle_timeout_ms = 60000\nmax_snapshot_bytes = 2097152\n\
             max_pending_handshakes = 32\nmax_pending_handshakes_per_source = 4",
        )
        .unwrap();
        let cfg = base().or_file(file).unwrap().into_node_config().unwrap();
        assert_eq!(cfg.server_limits.max_connections, 100);
        assert_eq!(cfg.server_limits.max_concurrent_streams, 10);
        assert_eq!(cfg.server_limits.max_pending_handshakes, 32);
        assert_eq!(cfg.server_limits.max_pending_handshakes_per_source, 4);
        // A budget below the default share lowers the share with it.
        let small: RunSettings = toml::from_str("max_pending_handshakes = 20").unwrap();
        let small = base().or_file(small).unwrap().into_node_config().unwrap();
        assert_eq!(small.server_limits.max_pending_handshakes_per_source, 20);
        assert_eq!(cfg.server_limits.idle_timeout, Duration::from_secs(60));
        assert_eq!(cfg.server_limits.max_snapshot_bytes, 2 << 20);
        assert_eq!(cfg.limits.max_live_leases, 5000);
        assert_eq!(cfg.limits.max_waiters, 600);
        for (settings, needle) in [
            (
                RunSettings {
                    max_pending_handshakes: Some(w(100)),
                    max_pending_handshakes_per_source: Some(w(101)),
                    ..base()
                },
                "max_pending_handshakes_per_source: must be at most max_pending_handshakes \
                 (100), got 101",
            ),
            (
                RunSettings {
                    idle_timeout_ms: Some(w(5_000)),
                    ..base()
                },
                "idle_timeout_ms: must be at least http2_keepalive_interval_ms plus \
                 http2_keepalive_timeout_ms (40000), got 5000",
            ),
            (
                RunSettings {
                    election_timeout_ms: Some(w(100)),
                    heartbeat_ms: Some(w(100)),
                    ..base()
                },
                "heartbeat_ms: must be below election_timeout_ms (100), got 100",
            ),
            (
                RunSettings {
                    max_snapshot_bytes: Some(w(2 << 20)),
                    kv_max_total_bytes: Some(w((1 << 20) + 1)),
                    ..base()
                },
                "kv_max_total_bytes: must be at most half of max_snapshot_bytes (1048576), \
                 got 1048577",
            ),
            (
                RunSettings {
                    election_check_ms: Some(w(600)),
                    ..base()
                },
                "election_check_ms: must be at most election_timeout_ms (200), got 600",
            ),
            (
                RunSettings {
                    ttl_min_ms: Some(w(5_000)),
                    ttl_max_ms: Some(w(4_000)),
                    ..base()
                },
                "ttl_min_ms",
            ),
        ] {
            let err = settings.into_node_config().unwrap_err();
            assert!(err.starts_with(needle), "{err}");
        }
    }
}
