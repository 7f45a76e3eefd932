//! Bad input arriving as protobuf bytes is refused by field, with the bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::{AcquireOutcome, Limits, LostReason, Token};
use fenced_proto::{v1, *};
use prost::Message;

fn decode_acquire(req: &v1::AcquireRequest) -> v1::AcquireRequest {
    v1::AcquireRequest::decode(req.encode_to_vec().as_slice()).unwrap()
}

fn good() -> v1::AcquireRequest {
    v1::AcquireRequest {
        label: String::new(),
        resource: b"statement:account-1842:2026-07".to_vec(),
        owner_id: vec![0x42; 16],
        ttl_ms: 30_000,
        wait_ms: 0,
    }
}

fn refused(req: v1::AcquireRequest, field: &str, bound: &str) {
    let err = acquire_command(&decode_acquire(&req), &Limits::default()).unwrap_err();
    let status = invalid_argument(&err);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with(&format!("{field}: ")),
        "{}",
        status.message()
    );
    assert!(status.message().contains(bound), "{}", status.message());
}

#[test]
fn a_valid_request_converts() {
    assert!(acquire_command(&decode_acquire(&good()), &Limits::default()).is_ok());
}

#[test]
fn invalid_utf8_in_the_resource_is_refused_by_field() {
    refused(
        v1::AcquireRequest {
            resource: vec![b'a', 0xc3, 0x28],
            ..good()
        },
        "resource",
        "UTF-8",
    );
}

#[test]
fn an_empty_or_long_resource_is_refused_by_field() {
    let empty = v1::AcquireRequest {
        resource: vec![],
        ..good()
    };
    refused(empty, "resource", "1 to 200 bytes");
    let long = v1::AcquireRequest {
        resource: vec![b'x'; 201],
        ..good()
    };
    refused(long, "resource", "1 to 200 bytes");
}

#[test]
fn a_missing_or_nil_owner_is_refused_by_field() {
    let missing = v1::AcquireRequest {
        owner_id: vec![],
        ..good()
    };
    refused(missing, "owner_id", "16 bytes");
    let nil = v1::AcquireRequest {
        owner_id: vec![0; 16],
        ..good()
    };
    refused(nil, "owner_id", "non-nil");
}

#[test]
fn ttl_and_wait_outside_the_bounds_are_refused_by_field() {
    let short = v1::AcquireRequest {
        ttl_ms: 0,
        ..good()
    };
    refused(short, "ttl_ms", "1000 and 3600000");
    let long = v1::AcquireRequest {
        ttl_ms: 3_600_001,
        ..good()
    };
    refused(long, "ttl_ms", "1000 and 3600000");
    let wait = v1::AcquireRequest {
        wait_ms: u64::MAX,
        ..good()
    };
    refused(wait, "wait_ms", "3600000");
}

#[test]
fn token_zero_is_refused_on_renew_and_release() {
    let renew = v1::RenewRequest {
        resource: b"r".to_vec(),
        owner_id: vec![1; 16],
        token: 0,
        ttl_ms: 5_000,
    };
    assert_eq!(
        renew_command(&renew, &Limits::default())
            .unwrap_err()
            .field(),
        "token"
    );
    let release = v1::ReleaseRequest {
        resource: b"r".to_vec(),
        owner_id: vec![1; 16],
        token: 0,
    };
    assert_eq!(release_command(&release).unwrap_err().field(), "token");
}

#[test]
fn a_full_waiter_queue_is_resource_exhausted_naming_the_bound() {
    let status = acquire_reply(
        &AcquireOutcome::WaitQueueFull { max_waiters: 1024 },
        "r",
        fenced_core::ClusterTime::ZERO,
    )
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("1024"));
}

#[test]
fn an_acquire_by_a_spent_owner_id_is_answered_ended_with_the_reason() {
    let reply = |reason| {
        acquire_reply(
            &AcquireOutcome::Ended(reason),
            "r",
            fenced_core::ClusterTime::ZERO,
        )
        .expect("an ended attempt is a typed outcome, not an error")
        .outcome
    };
    assert_eq!(
        reply(LostReason::Released),
        Some(v1::acquire_response::Outcome::Ended(v1::Ended {
            reason: v1::LostReason::Released as i32,
            current_token: 0,
        }))
    );
    let current_token = Token::new(9).expect("a valid token");
    assert_eq!(
        reply(LostReason::Superseded { current_token }),
        Some(v1::acquire_response::Outcome::Ended(v1::Ended {
            reason: v1::LostReason::Superseded as i32,
            current_token: 9,
        }))
    );
}

#[test]
fn an_exhausted_token_counter_is_failed_precondition_naming_the_resource_and_bound() {
    let status = acquire_reply(
        &AcquireOutcome::TokensExhausted {
            limit: fenced_core::MAX_TOKEN,
        },
        "statement:account-1842",
        fenced_core::ClusterTime::ZERO,
    )
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    let m = status.message();
    assert!(m.contains("statement:account-1842"), "{m}");
    assert!(m.contains(&fenced_core::MAX_TOKEN.to_string()), "{m}");
}

#[test]
fn a_full_table_is_resource_exhausted_naming_the_setting_and_its_value() {
    for (bound, setting) in [
        (
            fenced_core::CapacityBound::LiveLeases,
            "max_live_leases=10000",
        ),
        (fenced_core::CapacityBound::Waiters, "max_waiters=10000"),
    ] {
        let status = acquire_reply(
            &AcquireOutcome::CapacityReached {
                bound,
                limit: 10_000,
            },
            "r",
            fenced_core::ClusterTime::ZERO,
        )
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().starts_with(setting),
            "{}",
            status.message()
        );
    }
}

#[test]
fn an_acquire_from_the_wire_carries_the_servers_capacity() {
    let limits = fenced_core::Limits {
        max_live_leases: 11,
        max_waiters: 12,
        ..fenced_core::Limits::default()
    };
    let req = v1::AcquireRequest {
        label: String::new(),
        resource: b"r".to_vec(),
        owner_id: vec![7; 16],
        ttl_ms: 5_000,
        wait_ms: 0,
    };
    let fenced_core::Command::AcquireBounded { capacity, .. } =
        acquire_command(&req, &limits).unwrap()
    else {
        panic!("an acquire from the wire must carry its capacity");
    };
    assert_eq!(capacity, limits.capacity());
}

#[test]
fn a_loss_reason_reads_back_as_it_was_sent() {
    let current_token = Token::new(9).expect("a valid token");
    for reason in [
        LostReason::Expired,
        LostReason::Released,
        LostReason::Superseded { current_token },
        LostReason::Unknown,
    ] {
        let (code, current) = lost_reason_parts(reason);
        assert_eq!(lost_reason_from_wire(code as i32, current), reason);
    }
    // Tokens start at 1: a superseded reason without one, like a code this
    // build does not know, says nothing more than unknown.
    let superseded = v1::LostReason::Superseded as i32;
    assert_eq!(lost_reason_from_wire(superseded, 0), LostReason::Unknown);
    assert_eq!(lost_reason_from_wire(99, 3), LostReason::Unknown);
}

#[test]
fn a_kv_refusal_reads_back_as_it_was_sent() {
    use fenced_core::KvRefusal;
    let token = Token::new(4).expect("a valid token");
    let sent = [
        (
            v1::KvRefusalReason::Expired,
            0,
            KvRefusal::Lease(LostReason::Expired),
        ),
        (
            v1::KvRefusalReason::Released,
            0,
            KvRefusal::Lease(LostReason::Released),
        ),
        (
            v1::KvRefusalReason::Superseded,
            4,
            KvRefusal::Lease(LostReason::Superseded {
                current_token: token,
            }),
        ),
        (
            v1::KvRefusalReason::Unknown,
            0,
            KvRefusal::Lease(LostReason::Unknown),
        ),
        (
            v1::KvRefusalReason::KeyHasNewerToken,
            4,
            KvRefusal::KeyHasNewerToken { key_token: token },
        ),
        // No token where one is due: nothing more than unknown.
        (
            v1::KvRefusalReason::KeyHasNewerToken,
            0,
            KvRefusal::Lease(LostReason::Unknown),
        ),
    ];
    for (reason, current_token, refusal) in sent {
        let wire = v1::KvRefused {
            reason: reason as i32,
            current_token,
            key_resource: String::new(),
        };
        assert_eq!(kv_refusal_from_wire(&wire), refusal, "{reason:?}");
    }
    // The key's resource, named; without a valid name, unknown.
    let owned = |key_resource: &str| v1::KvRefused {
        reason: v1::KvRefusalReason::KeyOfAnotherResource as i32,
        current_token: 0,
        key_resource: key_resource.into(),
    };
    assert_eq!(
        kv_refusal_from_wire(&owned("ledger/a")),
        KvRefusal::KeyOfAnotherResource {
            key_resource: fenced_core::ResourceName::new("ledger/a").unwrap()
        }
    );
    assert_eq!(
        kv_refusal_from_wire(&owned("")),
        KvRefusal::Lease(LostReason::Unknown)
    );
}
