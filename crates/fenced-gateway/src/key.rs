//! The idempotency key the gateway forwards: derived from resource, token
//! and operation id, so every retry of one operation by one owner carries
//! the same key and no two operations share one.

use sha2::{Digest, Sha256};

/// The header the upstream receives the key in.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// `fenced-` and 64 hex digits of SHA-256 over the three fields, each
/// length-prefixed so that no two triples hash the same input.
///
/// ```
/// let a = fenced_gateway::idempotency_key("statement:7", 4, "op-1");
/// assert_eq!(a.len(), 7 + 64);
/// assert_eq!(a, fenced_gateway::idempotency_key("statement:7", 4, "op-1"));
/// assert_ne!(a, fenced_gateway::idempotency_key("statement:7", 5, "op-1"));
/// ```
pub fn idempotency_key(resource: &str, token: u64, operation_id: &str) -> String {
    let mut h = Sha256::new();
    for field in [
        resource.as_bytes(),
        &token.to_be_bytes(),
        operation_id.as_bytes(),
    ] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field);
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("fenced-");
    for b in digest.iter() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_cannot_run_into_each_other() {
        assert_ne!(idempotency_key("ab", 1, "c"), idempotency_key("a", 1, "bc"));
        assert_ne!(
            idempotency_key("r", 1, "op"),
            idempotency_key("r", 1, "op ")
        );
        assert!(idempotency_key("r", 1, "op")
            .bytes()
            .skip(7)
            .all(|b| b.is_ascii_hexdigit()));
    }
}
