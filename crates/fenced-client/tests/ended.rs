//! A server's `Ended` answer to an acquire reaches the caller typed:
//! `AcquireOutcome::Ended` from `acquire_once`, `ClientError::AttemptEnded`
//! from `acquire` (nothing is held, so no lease is returned).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::{AcquireOutcome, Client, ClientError, LostReason};
use fenced_core::OwnerId;
mod fake;

use fake::{FakeLock, Scene};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_attempt_is_a_typed_answer_and_holds_nothing() {
    let (_, addr) = FakeLock::serve(Scene::Spent).await;
    let client = Client::new([addr.to_string()]).unwrap();
    let ttl = Duration::from_secs(5);

    let outcome = client
        .acquire_once("billing:run", OwnerId::random(), ttl, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        AcquireOutcome::Ended {
            reason: LostReason::Released
        }
    );
    let Err(err) = client.acquire("billing:run", ttl).await else {
        panic!("an ended attempt must not come back as a lease or a refusal");
    };
    assert!(
        matches!(&err, ClientError::AttemptEnded { resource, reason }
            if resource == "billing:run" && reason == "released"),
        "{err}"
    );
}
