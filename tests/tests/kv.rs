//! Fenced writes (the Kv service) against three real nodes: the holder's put
//! applies, a superseded or expired token's put is refused, bounds and
//! permissions refuse with the field or setting named, values survive a
//! restart of the whole cluster, and fencectl drives it all.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write, time::Duration};

use fenced_client::{
    AcquireOutcome, Acquired, Client, ClientError, KvRefusal, KvWrite, LostReason, Token,
};
use fenced_core::{OwnerId, KV_VALUE_MAX_BYTES};
use fenced_tests::{bin, write_auth_files, Cluster, Within};
use serde_json::Value;

async fn grant(client: &Client, resource: &str, owner: OwnerId, ttl: Duration) -> Token {
    match client
        .acquire_once(resource, owner, ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Granted { token, .. } => token,
        other => panic!("expected a grant of {resource}, got {other:?}"),
    }
}

fn applied(w: KvWrite) -> u64 {
    match w {
        KvWrite::Applied { revision, .. } => revision,
        other => panic!("expected the write applied, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_put_applies_and_every_node_reads_it_back() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let Acquired::Granted(lease) = client
        .acquire("job/42", Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("not granted");
    };
    let first = applied(lease.kv_put("job/42/state", b"step-1").await.unwrap());
    let second = applied(lease.kv_put("job/42/state", b"step-2").await.unwrap());
    assert!(second > first);
    for id in 1..=3 {
        let read = cluster
            .client_of(id)
            .kv_get("job/42/state")
            .await
            .unwrap()
            .expect("a value");
        assert_eq!(read.value, b"step-2", "node {id}");
        assert_eq!(
            (read.resource.as_str(), read.token, read.revision),
            ("job/42", lease.token(), second)
        );
    }
    assert_eq!(client.kv_get("job/42/none").await.unwrap(), None);
    // A stale read answers from the node asked; it has the value by now or
    // soon (the write is committed, followers apply it on their next append).
    let mut stale = None;
    for _ in 0..50 {
        stale = cluster
            .client_of(2)
            .kv_get_with("job/42/state", true)
            .await
            .unwrap();
        if stale.as_ref().is_some_and(|r| r.revision == second) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stale.map(|r| r.value), Some(b"step-2".to_vec()));
    // Deleting is fenced the same way.
    assert!(matches!(
        lease.kv_delete("job/42/state").await.unwrap(),
        KvWrite::Applied { existed: true, .. }
    ));
    assert_eq!(client.kv_get("job/42/state").await.unwrap(), None);
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_or_superseded_token_never_writes() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ttl = Duration::from_secs(1);
    let ta = grant(&client, "report", a, ttl).await;
    applied(
        client
            .kv_put("report/out", b"a", "report", a, ta)
            .await
            .unwrap(),
    );

    // A's lease runs out on the cluster's clock: its put is refused.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    assert_eq!(
        client
            .kv_put("report/out", b"a-late", "report", a, ta)
            .await
            .unwrap(),
        KvWrite::Refused(KvRefusal::Lease(LostReason::Expired))
    );

    // B is granted: A's token is superseded, and B's put applies.
    let tb = grant(&client, "report", b, Duration::from_secs(30)).await;
    assert!(tb > ta);
    assert_eq!(
        client
            .kv_put("report/out", b"a-later", "report", a, ta)
            .await
            .unwrap(),
        KvWrite::Refused(KvRefusal::Lease(LostReason::Superseded {
            current_token: tb
        }))
    );
    applied(
        client
            .kv_put("report/out", b"b", "report", b, tb)
            .await
            .unwrap(),
    );
    // The right token with another owner id is not the lease.
    assert_eq!(
        client
            .kv_put("report/out", b"x", "report", OwnerId::random(), tb)
            .await
            .unwrap(),
        KvWrite::Refused(KvRefusal::Lease(LostReason::Unknown))
    );
    // Released: refused too.
    client.release("report", b, tb).await.unwrap();
    assert_eq!(
        client
            .kv_put("report/out", b"b-late", "report", b, tb)
            .await
            .unwrap(),
        KvWrite::Refused(KvRefusal::Lease(LostReason::Released))
    );
    let read = client.kv_get("report/out").await.unwrap().unwrap();
    assert_eq!((read.value.as_slice(), read.token), (&b"b"[..], tb));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_keys_and_the_store_bounds_refuse_naming_field_and_bound() {
    let cluster = Cluster::start_with(3, |s| s.kv_max_keys = Some(Within::new(2).unwrap())).await;
    let client = cluster.client();
    let owner = OwnerId::random();
    let token = grant(&client, "big", owner, Duration::from_secs(30)).await;

    let too_big = vec![b'x'; KV_VALUE_MAX_BYTES + 1];
    match client.kv_put("big/v", &too_big, "big", owner, token).await {
        Err(ClientError::InvalidArgument(msg)) => {
            assert!(msg.starts_with("value:") && msg.contains("65536"), "{msg}")
        }
        other => panic!("expected INVALID_ARGUMENT on value, got {other:?}"),
    }
    // The largest value is fine.
    let largest = vec![b'y'; KV_VALUE_MAX_BYTES];
    applied(
        client
            .kv_put("big/v", &largest, "big", owner, token)
            .await
            .unwrap(),
    );
    assert_eq!(
        client.kv_get("big/v").await.unwrap().unwrap().value.len(),
        KV_VALUE_MAX_BYTES
    );
    let long_key = "k".repeat(513);
    match client.kv_put(&long_key, b"v", "big", owner, token).await {
        Err(ClientError::InvalidArgument(msg)) => {
            assert!(msg.starts_with("key:") && msg.contains("512"), "{msg}")
        }
        other => panic!("expected INVALID_ARGUMENT on key, got {other:?}"),
    }
    match client.kv_get("").await {
        Err(ClientError::InvalidArgument(msg)) => assert!(msg.starts_with("key:"), "{msg}"),
        other => panic!("expected INVALID_ARGUMENT on key, got {other:?}"),
    }
    // kv_max_keys = 2: a third key is refused, naming the setting.
    applied(
        client
            .kv_put("big/w", b"w", "big", owner, token)
            .await
            .unwrap(),
    );
    match client.kv_put("big/z", b"z", "big", owner, token).await {
        Err(ClientError::ResourceExhausted(msg)) => {
            assert!(msg.contains("kv_max_keys=2"), "{msg}")
        }
        other => panic!("expected RESOURCE_EXHAUSTED on kv_max_keys, got {other:?}"),
    }
    assert_eq!(client.kv_get("big/z").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_values_survive_snapshots_and_a_whole_cluster_restart() {
    let mut cluster =
        Cluster::start_with(3, |s| s.snapshot_logs = Some(Within::new(10).unwrap())).await;
    let client = cluster.client();
    let owner = OwnerId::random();
    let token = grant(&client, "persist", owner, Duration::from_secs(3600)).await;
    // Enough entries for several snapshots (and log purges) on every node.
    for i in 0..40u32 {
        let key = format!("persist/{}", i % 5);
        applied(
            client
                .kv_put(&key, &i.to_be_bytes(), "persist", owner, token)
                .await
                .unwrap(),
        );
    }
    for id in 1..=3 {
        cluster.kill(id);
    }
    cluster.start_all().await;
    let client = cluster.client();
    for k in 0..5u32 {
        let read = client
            .kv_get(&format!("persist/{k}"))
            .await
            .unwrap()
            .expect("the value outlived the restart");
        assert_eq!(read.value, (35 + k).to_be_bytes(), "persist/{k}");
        assert_eq!(read.token, token);
    }
    // The lease survived too: the holder keeps writing.
    applied(
        client
            .kv_put("persist/0", b"after", "persist", owner, token)
            .await
            .unwrap(),
    );
}

fn fencectl_json(cluster: &Cluster, args: &[&str], stdin: Option<&[u8]>) -> (i32, Value) {
    let mut cmd = std::process::Command::new(bin("fencectl"));
    cmd.arg("--json")
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout:?} {:?}", out.stderr));
    (out.status.code().unwrap(), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_kv_put_get_and_refusals_with_exit_codes() {
    let cluster = Cluster::start(3).await;
    let owner = OwnerId::random();
    let token = grant(&cluster.client(), "cli", owner, Duration::from_secs(30)).await;
    let (owner_s, token_s) = (owner.to_string(), token.to_string());
    let put = |key: &str, rest: &[&str], stdin: Option<&[u8]>| {
        let mut args = vec!["kv", "put", key];
        args.extend_from_slice(rest);
        args.extend_from_slice(&[
            "--resource",
            "cli",
            "--owner-id",
            &owner_s,
            "--token",
            &token_s,
        ]);
        fencectl_json(&cluster, &args, stdin)
    };
    let (code, v) = put("cli/a", &["hello"], None);
    assert_eq!((code, v["status"].as_str()), (0, Some("applied")), "{v}");
    let (code, v) = put("cli/b", &["--value-file", "-"], Some(b"from stdin"));
    assert_eq!((code, v["status"].as_str()), (0, Some("applied")), "{v}");

    let (code, v) = fencectl_json(&cluster, &["kv", "get", "cli/b"], None);
    assert_eq!(code, 0);
    assert_eq!(v["value"], "from stdin");
    assert_eq!(
        (v["resource"].as_str(), v["token"].as_u64()),
        (Some("cli"), Some(token.get()))
    );
    let (code, v) = fencectl_json(&cluster, &["kv", "get", "cli/none"], None);
    assert_eq!((code, v["status"].as_str()), (3, Some("not_found")));

    // Text mode prints the raw value.
    let out = cluster.fencectl(&["kv", "get", "cli/a"]);
    assert_eq!(
        (out.status.code(), out.stdout.as_slice()),
        (Some(0), &b"hello"[..])
    );

    // A stale token: refused, exit 3, with the current token.
    let newer = OwnerId::random();
    cluster.client().release("cli", owner, token).await.unwrap();
    let token2 = grant(&cluster.client(), "cli", newer, Duration::from_secs(30)).await;
    let (code, v) = put("cli/a", &["late"], None);
    assert_eq!((code, v["status"].as_str()), (3, Some("refused")), "{v}");
    assert_eq!(v["reason"], "superseded");
    assert_eq!(v["current_token"].as_u64(), Some(token2.get()));

    // An oversized value from a file never leaves fencectl: exit 2.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big");
    std::fs::write(&file, vec![0u8; KV_VALUE_MAX_BYTES + 1]).unwrap();
    let (code, v) = put("cli/c", &["--value-file", file.to_str().unwrap()], None);
    assert_eq!(code, 2, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("value: must be at most 65536"),
        "{v}"
    );
}

const POLICY: &str = r#"
[roles.orders]
lock = ["orders/"]
read = ["orders/"]

[roles.reader]
read = ["orders/"]
"#;

fn denied(r: Result<KvWrite, ClientError>, what: &str) {
    assert!(
        matches!(r, Err(ClientError::PermissionDenied(_))),
        "{what}: expected PERMISSION_DENIED, got {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_needs_lock_on_resource_and_key_and_a_get_needs_read() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(
        dir.path(),
        &[
            ("alice", "alice-token", "orders"),
            ("rita", "rita-token", "reader"),
        ],
        POLICY,
    );
    let cluster = Cluster::start_with(3, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
    })
    .await;
    let alice = cluster.client().with_token("alice-token").unwrap();
    let rita = cluster.client().with_token("rita-token").unwrap();
    let owner = OwnerId::random();
    let token = grant(&alice, "orders/1", owner, Duration::from_secs(30)).await;

    applied(
        alice
            .kv_put("orders/1/state", b"paid", "orders/1", owner, token)
            .await
            .unwrap(),
    );
    // A lease on orders/1 does not open keys outside alice's lock prefixes.
    denied(
        alice
            .kv_put("billing/state", b"x", "orders/1", owner, token)
            .await,
        "alice, key outside her prefix",
    );
    denied(
        alice
            .kv_delete("billing/state", "orders/1", owner, token)
            .await,
        "alice, delete outside her prefix",
    );
    // Knowing the lease is not enough without the lock role.
    denied(
        rita.kv_put("orders/1/state", b"x", "orders/1", owner, token)
            .await,
        "rita, read-only",
    );
    // Read needs read on the key.
    let read = rita.kv_get("orders/1/state").await.unwrap().unwrap();
    assert_eq!(read.value, b"paid");
    match rita.kv_get("billing/state").await {
        Err(ClientError::PermissionDenied(_)) => {}
        other => panic!("expected PERMISSION_DENIED, got {other:?}"),
    }
    match cluster.client().kv_get("orders/1/state").await {
        Err(ClientError::Unauthenticated(_)) => {}
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }
    // Through a follower too: each node checks, the leader again.
    for id in 1..=3 {
        let via = cluster.client_of(id).with_token("alice-token").unwrap();
        denied(
            via.kv_put("billing/x", b"x", "orders/1", owner, token)
                .await,
            "alice via a follower",
        );
        applied(
            via.kv_put("orders/1/via", b"ok", "orders/1", owner, token)
                .await
                .unwrap(),
        );
    }
    let read = alice.kv_get("orders/1/state").await.unwrap().unwrap();
    assert_eq!(read.value, b"paid", "refused writes changed nothing");
}

fn refused_write(w: Result<KvWrite, ClientError>, what: &str) {
    match w {
        Ok(KvWrite::Refused(_)) => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// The attack against a real cluster: the holder of another resource, with
/// a newer token, writes and deletes a key that A's lease wrote; by the
/// client and by fencectl. The key stays A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_of_another_resource_cannot_write_a_key_even_with_a_newer_token() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ttl = Duration::from_secs(30);
    let ta = grant(&client, "ledger/a", a, ttl).await;
    applied(
        client
            .kv_put("balance", b"100", "ledger/a", a, ta)
            .await
            .unwrap(),
    );
    let tb = grant(&client, "other/b", b, ttl).await;
    assert!(tb > ta);
    refused_write(
        client.kv_put("balance", b"0", "other/b", b, tb).await,
        "B's put",
    );
    refused_write(
        client.kv_delete("balance", "other/b", b, tb).await,
        "B's delete",
    );
    let (b_s, tb_s) = (b.to_string(), tb.to_string());
    let by_b = [
        "--resource",
        "other/b",
        "--owner-id",
        &b_s,
        "--token",
        &tb_s,
    ];
    let (code, v) = fencectl_json(
        &cluster,
        &[&["kv", "put", "balance", "0"][..], &by_b[..]].concat(),
        None,
    );
    assert_eq!((code, v["status"].as_str()), (3, Some("refused")), "{v}");
    assert_eq!(
        (v["reason"].as_str(), v["key_resource"].as_str()),
        (Some("key_of_another_resource"), Some("ledger/a")),
        "{v}"
    );
    let (code, v) = fencectl_json(
        &cluster,
        &[&["kv", "delete", "balance"][..], &by_b[..]].concat(),
        None,
    );
    assert_eq!((code, v["status"].as_str()), (3, Some("refused")), "{v}");
    for id in 1..=3 {
        let read = cluster.client_of(id).kv_get("balance").await.unwrap();
        let read = read.expect("A's value");
        assert_eq!(
            (read.value.as_slice(), read.resource.as_str(), read.token),
            (&b"100"[..], "ledger/a", ta),
            "node {id}"
        );
    }
}

/// The attack against a real cluster: after the newer holder deletes a
/// key, an older token (a live lease on another resource, the released
/// holder of the key's own) must not land, and the key's token must not go
/// back; after snapshots and a restart of the whole cluster too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_delete_an_older_holders_put_is_refused_across_a_restart() {
    let mut cluster =
        Cluster::start_with(3, |s| s.snapshot_logs = Some(Within::new(10).unwrap())).await;
    let client = cluster.client();
    let (a, b, c) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    let long = Duration::from_secs(3600);
    let told = grant(&client, "r-old", a, long).await;
    let t1 = grant(&client, "job", b, long).await;
    applied(client.kv_put("k", b"one", "job", b, t1).await.unwrap());
    client.release("job", b, t1).await.unwrap();
    let t2 = grant(&client, "job", c, long).await;
    assert!(t2 > told);
    applied(client.kv_put("k", b"two", "job", c, t2).await.unwrap());
    assert!(matches!(
        client.kv_delete("k", "job", c, t2).await.unwrap(),
        KvWrite::Applied { existed: true, .. }
    ));
    assert_eq!(client.kv_get("k").await.unwrap(), None);
    let attacks = |client: Client| async move {
        refused_write(
            client.kv_put("k", b"stale", "r-old", a, told).await,
            "an older live lease of another resource",
        );
        refused_write(
            client.kv_put("k", b"stale", "job", b, t1).await,
            "the released holder",
        );
        // The refusals say why: the key's resource, the key's token.
        assert_eq!(
            client
                .kv_put("k", b"stale", "r-old", a, told)
                .await
                .unwrap(),
            KvWrite::Refused(KvRefusal::KeyOfAnotherResource {
                key_resource: fenced_core::ResourceName::new("job").unwrap()
            })
        );
        assert_eq!(
            client.kv_put("k", b"stale", "job", b, t1).await.unwrap(),
            KvWrite::Refused(KvRefusal::KeyHasNewerToken { key_token: t2 })
        );
        assert_eq!(client.kv_get("k").await.unwrap(), None);
    };
    attacks(client.clone()).await;
    // Enough entries for snapshots (and log purges) on every node.
    for i in 0..30u32 {
        applied(
            client
                .kv_put(&format!("job/{}", i % 3), &i.to_be_bytes(), "job", c, t2)
                .await
                .unwrap(),
        );
    }
    for id in 1..=3 {
        cluster.kill(id);
    }
    cluster.start_all().await;
    let client = cluster.client();
    attacks(client.clone()).await;
    // The key's holder writes it again.
    applied(client.kv_put("k", b"three", "job", c, t2).await.unwrap());
    assert_eq!(client.kv_get("k").await.unwrap().unwrap().token, t2);
}

/// fencectl names the key, the presented token and the key's token when a
/// put is stale against a tombstone, and exits with the refusal code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_says_a_put_below_a_tombstone_is_stale() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = grant(&client, "tomb", a, Duration::from_secs(30)).await;
    client.release("tomb", a, ta).await.unwrap();
    let tb = grant(&client, "tomb", b, Duration::from_secs(30)).await;
    applied(client.kv_put("tomb/k", b"v", "tomb", b, tb).await.unwrap());
    client.kv_delete("tomb/k", "tomb", b, tb).await.unwrap();
    let (a_s, ta_s) = (a.to_string(), ta.to_string());
    let out = cluster.fencectl(&[
        "kv",
        "put",
        "tomb/k",
        "late",
        "--resource",
        "tomb",
        "--owner-id",
        &a_s,
        "--token",
        &ta_s,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("tomb/k")
            && text.contains(&format!("token {ta}"))
            && text.contains(&format!("token {tb}"))
            && text.contains("stale"),
        "{text}"
    );
    let (code, v) = fencectl_json(&cluster, &["kv", "get", "tomb/k"], None);
    assert_eq!((code, v["status"].as_str()), (3, Some("not_found")), "{v}");
}
