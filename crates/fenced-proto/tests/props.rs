//! Property tests: every conversion from the wire takes a message of
//! arbitrary fields (or arbitrary bytes through prost) and answers with a
//! valid command or an error naming the field at fault, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::{Command, Limits, RESOURCE_NAME_MAX_BYTES};
use fenced_proto::{v1, *};
use proptest::prelude::*;
use prost::Message;

const FIELDS: &[&str] = &["resource", "owner_id", "token", "ttl_ms", "wait_ms"];

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..max),
        // Mostly printable names, some of them valid.
        "[a-z0-9:/._-]{0,40}".prop_map(String::into_bytes),
    ]
}

/// A u64 near the bounds as often as anywhere.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..5,
        999u64..1_002,
        3_599_999u64..3_600_002,
        Just(u64::MAX)
    ]
}

fn check<T>(result: Result<T, fenced_core::InvalidArgument>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(FIELDS.contains(&e.field()), "unexpected field {e}");
            assert!(e.to_string().starts_with(e.field()), "{e}");
            None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn an_acquire_of_any_fields_converts_or_names_its_field(
        resource in bytes(300), owner_id in bytes(24), ttl_ms in number(), wait_ms in number(),
    ) {
        let limits = Limits::default();
        let req = v1::AcquireRequest { label: String::new(), resource: resource.clone(), owner_id, ttl_ms, wait_ms };
        if let Some(Command::AcquireBounded { resource: name, ttl_ms: t, capacity, .. }) =
            check(acquire_command(&req, &limits))
        {
            prop_assert_eq!(name.as_str().as_bytes(), &resource[..]);
            prop_assert!(resource.len() <= RESOURCE_NAME_MAX_BYTES);
            prop_assert!(limits.check_ttl_ms(t).is_ok());
            prop_assert_eq!(capacity, limits.capacity());
        }
    }

    #[test]
    fn a_renew_release_or_describe_of_any_fields_converts_or_names_its_field(
        resource in bytes(300), owner_id in bytes(24), token in number(), ttl_ms in number(),
    ) {
        let limits = Limits::default();
        let renew = v1::RenewRequest { resource: resource.clone(), owner_id: owner_id.clone(), token, ttl_ms };
        if let Some(cmd) = check(renew_command(&renew, &limits)) {
            prop_assert!(cmd.validate(&limits).is_ok());
            prop_assert!(token > 0);
        }
        let release = v1::ReleaseRequest { resource: resource.clone(), owner_id, token };
        if let Some(cmd) = check(release_command(&release)) {
            prop_assert_eq!(cmd.resource().unwrap().as_str().as_bytes(), &resource[..]);
        }
        let describe = v1::DescribeRequest { resource: resource.clone(), allow_stale: false };
        if let Some(name) = check(describe_resource(&describe)) {
            prop_assert_eq!(name.as_str().as_bytes(), &resource[..]);
        }
    }

    /// A lease call's resource and owner id are the ones its command
    /// addresses: the handler authorizes and parks by what is proposed.
    #[test]
    fn a_lease_call_names_what_its_command_addresses(
        resource in bytes(300), owner_id in bytes(24), token in number(), ttl_ms in number(), wait_ms in number(),
    ) {
        let limits = Limits::default();
        let acquire = v1::AcquireRequest { label: String::new(), resource: resource.clone(), owner_id: owner_id.clone(), ttl_ms, wait_ms };
        let renew = v1::RenewRequest { resource: resource.clone(), owner_id: owner_id.clone(), token, ttl_ms };
        let release = v1::ReleaseRequest { resource, owner_id, token };
        let calls = [
            acquire_call(&acquire, &limits).ok(),
            renew_call(&renew, &limits).ok(),
            release_call(&release).ok(),
        ];
        let commands = [
            acquire_command(&acquire, &limits).ok(),
            renew_command(&renew, &limits).ok(),
            release_command(&release).ok(),
        ];
        for (call, command) in calls.into_iter().zip(commands) {
            prop_assert_eq!(call.is_some(), command.is_some());
            if let Some(call) = call {
                prop_assert_eq!(call.command.resource(), Some(&call.resource));
                prop_assert_eq!(call.command.owner_id(), Some(call.owner_id));
                prop_assert_eq!(Some(call.command), command);
            }
        }
    }

    #[test]
    fn any_bytes_through_prost_decode_and_convert_or_are_refused(raw in proptest::collection::vec(any::<u8>(), 0..256)) {
        let limits = Limits::default();
        if let Ok(req) = v1::AcquireRequest::decode(raw.as_slice()) {
            check(acquire_command(&req, &limits));
        }
        if let Ok(req) = v1::RenewRequest::decode(raw.as_slice()) {
            check(renew_command(&req, &limits));
        }
        if let Ok(req) = v1::ReleaseRequest::decode(raw.as_slice()) {
            check(release_command(&req));
        }
        if let Ok(req) = v1::DescribeRequest::decode(raw.as_slice()) {
            check(describe_resource(&req));
        }
        // Replies a client decodes: a value or a prost error.
        let _ = v1::AcquireResponse::decode(raw.as_slice());
        let _ = v1::RenewResponse::decode(raw.as_slice());
        let _ = v1::ReleaseResponse::decode(raw.as_slice());
        let _ = v1::DescribeResponse::decode(raw.as_slice());
    }
}
