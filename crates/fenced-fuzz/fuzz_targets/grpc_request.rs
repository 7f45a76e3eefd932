//! A gRPC request's body as a node receives it: decoded by prost into the
//! request message the first byte picks, then through the checked
//! conversions of `fenced-proto` (the path a request takes to the table).
//! A message decodes to itself once encoded again; a request converted to
//! a command is a valid command that the replicated log carries unchanged.
#![no_main]

use std::fmt::Debug;

use fenced_core::{Batch, ClusterTime, Command, InvalidArgument, Limits, MAX_HISTORY_PER_RESOURCE};
use fenced_proto::{self as convert, v1};
use fenced_server::codec;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The caller's identity a session command carries.
const IDENTITY: &str = "tenant-a";

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 25 {
        0 => command(body, convert::acquire_command),
        1 => command(body, convert::renew_command),
        2 => command(body, convert::renew_many_command),
        3 => command(body, |r, _| convert::release_command(r)),
        4 => command(body, |r, l| convert::open_session_command(r, IDENTITY, l)),
        5 => command(body, |r, l| {
            convert::acquire_in_session_command(r, IDENTITY, l)
        }),
        6 => command(body, |r, l| convert::keep_alive_command(r, IDENTITY, l)),
        7 => command(body, |r, l| convert::close_session_command(r, IDENTITY, l)),
        8 => checked(body, |r: &v1::DescribeRequest| {
            if let Ok(name) = convert::describe_resource(r) {
                assert_eq!(name.as_str().as_bytes(), r.resource);
            }
        }),
        9 => checked(body, |r: &v1::ValidateTokenRequest| {
            if let Ok((name, token, owner)) = convert::validate_check(r) {
                assert_eq!(name.as_str().as_bytes(), r.resource);
                assert_eq!(token.get(), r.token);
                assert_eq!(owner.is_some(), !r.owner_id.is_empty());
            }
        }),
        10 => checked(body, |r: &v1::ValidateTokensRequest| {
            if let Ok(checks) = convert::validate_checks(r) {
                assert_eq!(checks.len(), r.checks.len());
                assert!((1..=fenced_core::MAX_VALIDATE_BATCH).contains(&checks.len()));
            }
        }),
        11 => checked(body, |r: &v1::WatchRequest| {
            if let Ok(prefix) = fenced_core::watch_prefix(&r.prefix) {
                assert_eq!(prefix.as_bytes(), r.prefix);
            }
        }),
        12 => checked(body, |r: &v1::HistoryRequest| {
            if let Ok((name, limit)) = convert::history_request(r) {
                assert_eq!(name.as_str().as_bytes(), r.resource);
                assert!((1..=MAX_HISTORY_PER_RESOURCE).contains(&limit));
            }
        }),
        13 => command(body, convert::kv_put_command),
        14 => command(body, |r, _| convert::kv_delete_command(r)),
        15 => checked(body, |r: &v1::KvGetRequest| {
            if let Ok(key) = convert::kv_get_key(r) {
                assert_eq!(key.as_str().as_bytes(), r.key);
            }
        }),
        // Requests whose fields the services check themselves (node ids,
        // addresses) or that carry none: decoding is their whole path here.
        16 => checked(body, |_: &v1::StatusRequest| {}),
        17 => checked(body, |_: &v1::AddLearnerRequest| {}),
        18 => checked(body, |_: &v1::ChangeMembershipRequest| {}),
        19 => checked(body, |_: &v1::RemoveNodeRequest| {}),
        20 => checked(body, |_: &v1::PromoteLearnerRequest| {}),
        21 => checked(body, |_: &v1::ListMembersRequest| {}),
        22 => checked(body, |_: &v1::SaveSnapshotRequest| {}),
        23 => checked(body, |_: &v1::PutRequest| {}),
        _ => checked(body, |_: &v1::GetRequest| {}),
    }
});

/// A request that becomes a command: decoded, converted under the default
/// limits, and followed to the log ([`enters`]).
fn command<M: Message + Default + PartialEq + Debug>(
    body: &[u8],
    convert: impl Fn(&M, &Limits) -> Result<Command, InvalidArgument>,
) {
    if let Some(request) = decoded(body) {
        let limits = Limits::default();
        enters(convert(&request, &limits), &limits);
    }
}

/// A request that does not: decoded, then `check`ed.
fn checked<M: Message + Default + PartialEq + Debug>(body: &[u8], check: impl Fn(&M)) {
    if let Some(request) = decoded(body) {
        check(&request);
    }
}

/// The message `bytes` hold, if they hold one; it decodes to itself once
/// encoded again.
fn decoded<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    match M::decode(message.encode_to_vec().as_slice()) {
        Ok(again) => assert_eq!(again, message),
        Err(e) => panic!("{message:?} decoded, then refused encoded again: {e}"),
    }
    Some(message)
}

/// A converted command: valid, and carried unchanged by a log entry
/// (a batch in the node's codec) to the table.
fn enters(command: Result<Command, InvalidArgument>, limits: &Limits) {
    let Ok(command) = command else {
        return;
    };
    assert_eq!(command.validate(limits), Ok(()));
    let batch = Batch {
        stamp: ClusterTime::from_millis(1),
        commands: vec![command],
    };
    let entry = match codec::encode("batch", &batch) {
        Ok(entry) => entry,
        Err(e) => panic!("{batch:?} does not encode: {e}"),
    };
    match codec::decode::<Batch>("batch", &entry) {
        Ok(carried) => assert_eq!(carried, batch),
        Err(e) => panic!("{batch:?} encoded, then refused: {e}"),
    }
}
