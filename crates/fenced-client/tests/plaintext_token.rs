//! A bearer token is never sent in plaintext to an address that is not
//! loopback: the client refuses to be built so, naming the endpoint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_client::{Client, ClientError};

#[tokio::test]
async fn a_token_over_plaintext_to_a_remote_address_is_refused_naming_the_endpoint() {
    for remote in [
        "10.0.0.5:7101",
        "http://10.0.0.5:7101",
        "lock.example.com:7101",
        "[2001:db8::1]:7101",
        "128.0.0.1:7101",
        // A name that only looks local is not looked up: refused.
        "localhost.example.com:7101",
    ] {
        let client = Client::new(["127.0.0.1:7101", remote]).unwrap();
        let err = client
            .with_token("secret")
            .err()
            .unwrap_or_else(|| panic!("{remote}: a token was accepted over plaintext"));
        let text = err.to_string();
        assert!(matches!(err, ClientError::Endpoint { .. }), "{text}");
        assert!(text.contains(remote), "{text}");
        assert!(text.contains("https://") && text.contains("TLS"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}

#[tokio::test]
async fn a_token_over_plaintext_to_loopback_is_allowed() {
    let loopback = [
        "127.0.0.1:7101",
        "127.8.9.10:7101",
        "http://127.0.0.1:7101",
        "localhost:7101",
        "LOCALHOST:7101",
        "[::1]:7101",
        "http://[::1]:7101",
    ];
    for e in loopback {
        let client = Client::new([e]).unwrap();
        assert!(client.with_token("secret").is_ok(), "{e}");
    }
    // And with no token, any address is fine (nothing secret travels).
    assert!(Client::new(["10.0.0.5:7101"]).is_ok());
}
