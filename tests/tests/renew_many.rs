//! Batch renewal against real nodes: a client's keeper renews all its leases
//! in one RenewMany call per interval, each call one command in the log; the
//! call is refused whole when a resource is not permitted or a bound is
//! passed; a follower forwards it like a Renew.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use fenced_client::{Acquired, Client, LeaseOptions};
use fenced_core::{OwnerId, Token};
use fenced_proto::v1::{self, renew_response};
use fenced_tests::{
    acquire_all, lock_rpcs_ok as rpc_ok, metric, write_auth_files, Cluster, ORDERS_AND_OPS_POLICY,
};
use tonic::{metadata::MetadataValue, Code};

/// A keeper that renews leases of their own in batches (no session).
fn batch_renewed() -> LeaseOptions {
    LeaseOptions {
        no_sessions: true,
        ..LeaseOptions::default()
    }
}

#[derive(Debug, Clone, Copy)]
struct Counts {
    /// Commands applied to the lease table (one node's count: every node
    /// applies every entry).
    commands: u64,
    renewals: u64,
    renew_many_calls: u64,
    renew_calls: u64,
}

async fn counts(metrics: &[String]) -> Counts {
    Counts {
        commands: metric(&metrics[0], "fenced_applied_commands_total").await,
        renewals: metric(&metrics[0], "fenced_renewals_total").await,
        renew_many_calls: rpc_ok(metrics, "RenewMany").await,
        renew_calls: rpc_ok(metrics, "Renew").await,
    }
}

/// The server's counts and the keeper's, read at a moment when no batch is
/// on the wire: the keeper counts a call when its answer arrives and the
/// server when it sends it, so a reading taken mid-call differs by one.
/// `client` must be the only caller of RenewMany on the cluster, which makes
/// its total the server's total at such a moment.
async fn quiet_counts(client: &Client, metrics: &[String]) -> (Counts, fenced_client::KeeperStats) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let keeper = client.keeper_stats();
        let server = counts(metrics).await;
        let keeper_again = client.keeper_stats();
        if keeper.calls == keeper_again.calls && keeper.calls == server.renew_many_calls {
            return (server, keeper);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the keeper's {} calls never matched the server's {} RenewMany calls",
            keeper_again.calls,
            server.renew_many_calls
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_keeps_2000_leases_with_one_command_per_interval() {
    const LEASES: usize = 2_000;
    const TTL: Duration = Duration::from_secs(6);
    let (cluster, metrics) = Cluster::start_with_metrics(3, |_| {}).await;
    // Renew every 2 s (a third of the TTL, the default); leases of their
    // own, not in a session.
    let client = cluster.client().with_lease_options(batch_renewed());
    let every = LeaseOptions::default().renew_interval(TTL);

    let leases = acquire_all(&client, "keep/", LEASES, TTL).await;
    // Two intervals for the leases granted over several seconds to settle
    // into one call.
    tokio::time::sleep(2 * every).await;

    let (before, stats_before) = quiet_counts(&client, &metrics).await;
    let span = 3 * every;
    tokio::time::sleep(span).await;
    let (after, stats_after) = quiet_counts(&client, &metrics).await;

    let commands = after.commands - before.commands;
    let renewals = after.renewals - before.renewals;
    let calls = after.renew_many_calls - before.renew_many_calls;
    let keeper_calls = stats_after.calls - stats_before.calls;
    eprintln!(
        "over {span:?}: {commands} commands, {renewals} renewals, {calls} RenewMany calls \
         ({keeper_calls} by the keeper), {LEASES} leases"
    );
    // Every lease was renewed in each of the three intervals (one may start
    // just before the window and one end just after it: at least two)...
    assert!(
        renewals >= 2 * LEASES as u64,
        "{renewals} renewals of {LEASES} leases in {span:?}"
    );
    // ...by about one call, one command, per interval: not one per lease.
    assert!(
        (2..=8).contains(&calls),
        "{calls} RenewMany calls in three intervals"
    );
    assert_eq!(keeper_calls, calls, "the keeper's calls are the server's");
    assert!(
        commands <= calls + 2,
        "{commands} commands applied for {calls} calls: a batch must be one command"
    );
    assert_eq!(after.renew_calls, before.renew_calls, "no single Renew");
    assert_eq!(stats_after.lost, 0);
    for lease in &leases {
        assert!(lease.check().is_ok(), "{} lost", lease.resource());
    }
    let d = client.describe("keep/01999").await.unwrap();
    assert!(d.held && d.remaining_ms > 0, "{d:?}");
    for lease in leases {
        lease.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_in_a_batch_is_reported_to_its_handle_and_the_others_run_on() {
    const TTL: Duration = Duration::from_secs(3);
    let cluster = Cluster::start(3).await;
    let client = cluster.client().with_lease_options(batch_renewed());
    let mut leases = Vec::new();
    for i in 0..20 {
        match client.acquire(&format!("mixed/{i}"), TTL).await.unwrap() {
            Acquired::Granted(lease) => leases.push(lease),
            Acquired::Held { .. } => panic!("mixed/{i} is held"),
        }
    }
    // Someone ends one lease behind the keeper's back (its owner id and
    // token are the capability).
    let victim = &leases[7];
    client
        .release(victim.resource(), victim.owner_id(), victim.token())
        .await
        .unwrap();
    let reason = tokio::time::timeout(3 * TTL, victim.lost()).await.unwrap();
    assert_eq!(reason.to_string(), "renewal refused: released");
    // Its neighbours in the same calls run on past their first TTL.
    tokio::time::sleep(TTL).await;
    for (i, lease) in leases.iter().enumerate() {
        if i != 7 {
            assert!(lease.check().is_ok(), "{} lost", lease.resource());
        }
    }
    assert!(client.keeper_stats().calls >= 2);
    assert_eq!(client.keeper_stats().lost, 1);
}

fn renew_req(resource: &str, owner: OwnerId, token: u64, ttl_ms: u64) -> v1::RenewRequest {
    v1::RenewRequest {
        resource: resource.as_bytes().to_vec(),
        owner_id: owner.as_bytes().to_vec(),
        token,
        ttl_ms,
    }
}

async fn grant(client: &Client, resource: &str, owner: OwnerId, ttl: Duration) -> Token {
    match client
        .acquire_once(resource, owner, ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        fenced_client::AcquireOutcome::Granted { token, .. } => token,
        other => panic!("{resource}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_a_batch_and_each_lease_gets_its_answer() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let client = cluster.client();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ttl = Duration::from_secs(30);
    let held = grant(&client, "fwd/held", a, ttl).await;
    let gone = grant(&client, "fwd/gone", b, ttl).await;
    client.release("fwd/gone", b, gone).await.unwrap();

    let resp = cluster
        .lock_client(follower)
        .renew_many(v1::RenewManyRequest {
            leases: vec![
                renew_req("fwd/held", a, held.get(), 20_000),
                renew_req("fwd/gone", b, gone.get(), 20_000),
                renew_req("fwd/never", a, held.get(), 20_000),
            ],
        })
        .await
        .unwrap();
    assert!(
        resp.metadata().get("x-fenced-leader").is_some(),
        "no leader hint"
    );
    let resp = resp.into_inner();
    let outcomes: Vec<_> = resp.results.iter().map(|r| r.outcome).collect();
    let Some(renew_response::Outcome::Renewed(r)) = &outcomes[0] else {
        panic!("{outcomes:?}");
    };
    assert_eq!(r.ttl_ms, 20_000);
    assert_eq!(r.expires_at_ms, resp.cluster_time_ms + 20_000);
    let lost = |o: &Option<renew_response::Outcome>| match o {
        Some(renew_response::Outcome::Lost(l)) => v1::LostReason::try_from(l.reason).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(lost(&outcomes[1]), v1::LostReason::Released);
    assert_eq!(lost(&outcomes[2]), v1::LostReason::Unknown);
    // Not revived, token unchanged.
    let d = client.describe("fwd/gone").await.unwrap();
    assert!(!d.held);
    assert_eq!(d.last_token, gone.get());
    let d = client.describe("fwd/held").await.unwrap();
    assert!(d.held && d.last_token == held.get());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_a_bound_is_refused_naming_the_field_and_the_bound() {
    let cluster = Cluster::start(3).await;
    let mut lock = cluster.lock_client(1);
    let owner = OwnerId::random();
    let refuse = |leases: Vec<v1::RenewRequest>| {
        let mut lock = lock.clone();
        async move {
            lock.renew_many(v1::RenewManyRequest { leases })
                .await
                .unwrap_err()
        }
    };
    let too_many = vec![renew_req("b/x", owner, 1, 10_000); 4_097];
    let err = refuse(too_many).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "leases: must hold 1 to 4096 leases, got 4097"
    );
    let err = refuse(vec![]).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("leases: "), "{}", err.message());
    let long = "x".repeat(200);
    let err = refuse(vec![renew_req(&long, owner, 1, 10_000); 1_000]).await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("at most 196608 bytes"),
        "{}",
        err.message()
    );
    let err = refuse(vec![
        renew_req("b/x", owner, 1, 10_000),
        renew_req("b/y", owner, 1, 5),
    ])
    .await;
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("leases: leases[1].ttl_ms: "),
        "{}",
        err.message()
    );
    // The largest batch is served.
    let full = lock
        .renew_many(v1::RenewManyRequest {
            leases: vec![renew_req("b/x", owner, 1, 10_000); 4_096],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(full.results.len(), 4_096);
}

fn write_auth(dir: &Path) -> (String, String) {
    write_auth_files(
        dir,
        &[
            ("alice", "alice-token", "orders"),
            ("root", "root-token", "ops"),
        ],
        ORDERS_AND_OPS_POLICY,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_naming_a_resource_not_permitted_renews_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth(dir.path());
    let cluster = Cluster::start_with(3, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
    })
    .await;
    let alice = cluster.client().with_token("alice-token").unwrap();
    let owner = OwnerId::random();
    let ttl = Duration::from_secs(4);
    let token = grant(&alice, "orders/1", owner, ttl).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let call = |leases: Vec<v1::RenewRequest>| {
        let mut req = tonic::Request::new(v1::RenewManyRequest { leases });
        req.metadata_mut().insert(
            "authorization",
            MetadataValue::try_from("Bearer alice-token").unwrap(),
        );
        let mut lock = cluster.lock_client(1);
        async move { lock.renew_many(req).await }
    };
    let err = call(vec![
        renew_req("orders/1", owner, token.get(), 4_000),
        renew_req("payroll/1", owner, token.get(), 4_000),
    ])
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("\"payroll/1\""), "{}", err.message());
    // Nothing was renewed: the permitted lease runs out on its first TTL.
    let d = alice.describe("orders/1").await.unwrap();
    assert!(
        d.remaining_ms <= 2_600,
        "orders/1 was renewed: {} ms left",
        d.remaining_ms
    );
    // The same call without the foreign resource is served.
    let ok = call(vec![renew_req("orders/1", owner, token.get(), 4_000)])
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        ok.results[0].outcome,
        Some(renew_response::Outcome::Renewed(_))
    ));
    let d = alice.describe("orders/1").await.unwrap();
    assert!(d.remaining_ms > 3_000, "{d:?}");
}
