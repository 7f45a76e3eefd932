//! Bad input is refused with an error naming the field and the bound, before
//! anything reaches the table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::*;

fn assert_names(err: InvalidArgument, field: &str, bound: &str) {
    assert_eq!(err.field(), field, "{err}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("{field}: ")), "{text}");
    assert!(
        text.contains(bound),
        "{text} does not name the bound {bound}"
    );
}

#[test]
fn an_empty_resource_name_is_refused() {
    assert_names(
        ResourceName::new("").unwrap_err(),
        "resource",
        "1 to 200 bytes",
    );
}

#[test]
fn a_201_byte_resource_name_is_refused_and_200_is_accepted() {
    assert_names(
        ResourceName::new(&"x".repeat(201)).unwrap_err(),
        "resource",
        "1 to 200 bytes",
    );
    assert!(ResourceName::new(&"x".repeat(200)).is_ok());
    // The bound is in bytes, not characters: 67 three-byte characters is 201.
    assert!(ResourceName::new(&"€".repeat(67)).is_err());
    assert!(ResourceName::new(&"€".repeat(66)).is_ok());
}

#[test]
fn control_characters_in_a_resource_name_are_refused() {
    for bad in ["a\nb", "\0", "tab\there", "del\u{7f}", "c1\u{85}"] {
        assert_names(ResourceName::new(bad).unwrap_err(), "resource", "control");
    }
}

#[test]
fn invalid_utf8_in_a_resource_name_is_refused() {
    assert_names(
        ResourceName::from_bytes(b"ok\xff\xfe").unwrap_err(),
        "resource",
        "UTF-8",
    );
    assert!(ResourceName::from_bytes("statement:é".as_bytes()).is_ok());
}

#[test]
fn a_nil_or_short_owner_id_is_refused() {
    assert_names(
        OwnerId::from_bytes(&[0; 16]).unwrap_err(),
        "owner_id",
        "non-nil",
    );
    assert_names(
        OwnerId::from_bytes(&[1; 15]).unwrap_err(),
        "owner_id",
        "16 bytes",
    );
    assert_names(
        OwnerId::from_bytes(&[]).unwrap_err(),
        "owner_id",
        "16 bytes",
    );
    assert_names(
        OwnerId::parse("not-a-uuid").unwrap_err(),
        "owner_id",
        "UUID",
    );
}

#[test]
fn token_zero_is_refused() {
    assert_names(Token::new(0).unwrap_err(), "token", "at least 1");
}

#[test]
fn ttl_below_and_above_the_bounds_is_refused() {
    let limits = Limits::default();
    let cmd = |ttl_ms| Command::Acquire {
        resource: ResourceName::new("r").unwrap(),
        owner_id: OwnerId::random(),
        ttl_ms,
        wait_ms: 0,
    };
    assert_names(
        cmd(999).validate(&limits).unwrap_err(),
        "ttl_ms",
        "1000 and 3600000",
    );
    assert_names(
        cmd(3_600_001).validate(&limits).unwrap_err(),
        "ttl_ms",
        "1000 and 3600000",
    );
    assert!(cmd(1_000).validate(&limits).is_ok());
    assert!(cmd(3_600_000).validate(&limits).is_ok());
    let renew = Command::Renew {
        resource: ResourceName::new("r").unwrap(),
        owner_id: OwnerId::random(),
        token: Token::new(1).unwrap(),
        ttl_ms: 0,
    };
    assert_names(
        renew.validate(&limits).unwrap_err(),
        "ttl_ms",
        "1000 and 3600000",
    );
}

#[test]
fn a_wait_above_the_bound_is_refused() {
    let limits = Limits::default();
    let cmd = Command::Acquire {
        resource: ResourceName::new("r").unwrap(),
        owner_id: OwnerId::random(),
        ttl_ms: 1_000,
        wait_ms: 3_600_001,
    };
    assert_names(cmd.validate(&limits).unwrap_err(), "wait_ms", "3600000");
}

#[test]
fn inconsistent_server_limits_are_refused() {
    let limits = Limits {
        ttl_min_ms: 10_000,
        ttl_max_ms: 5_000,
        wait_max_ms: 0,
        ..Limits::default()
    };
    assert_names(limits.validate().unwrap_err(), "ttl_min_ms", "ttl_max_ms");
}
