//! A `lock` dropped before its answer arrives (a timeout around it, a
//! `select!`, a shutdown) gives back, in the background, the grant the
//! server made for it: nothing stays held by an owner id nobody knows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake;

use std::time::{Duration, Instant};

use fake::{FakeLock, ReleaseSeen, Scene, GRANTED_TOKEN};
use fenced_client::Client;

/// Drops `lock(wait)` after 300 ms and returns the releases the server
/// received within 5 s after.
async fn releases_after_a_dropped_lock(
    client: &Client,
    fake: &FakeLock,
    wait: Duration,
) -> Vec<ReleaseSeen> {
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        client.lock("statement:account-1842", Duration::from_secs(30), wait),
    )
    .await;
    assert!(dropped.is_err(), "the server never answers a first acquire");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let releases = fake.releases.lock().unwrap().clone();
        if !releases.is_empty() || Instant::now() > deadline {
            return releases;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The one release, with the granted token and the owner id first asked.
async fn gives_back_after_dropping(wait: Duration) {
    let (fake, addr) = FakeLock::serve(Scene::FirstAnswerLost).await;
    let client = Client::new([addr.to_string()]).unwrap();
    let releases = releases_after_a_dropped_lock(&client, &fake, wait).await;
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert_eq!(releases[0].1, GRANTED_TOKEN);
    assert_eq!(
        fake.asked.lock().unwrap().len(),
        1,
        "one owner id, asked again"
    );
    assert!(fake.asked.lock().unwrap().contains(&releases[0].0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lock_in_the_session_releases_what_it_was_granted() {
    gives_back_after_dropping(Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiting_lock_releases_what_it_was_granted() {
    gives_back_after_dropping(Duration::from_secs(10)).await;
}
