//! The idempotency key the gateway forwards: derived from the resource and
//! the operation id (`fenced_sql::idempotency_key`), so every retry of one
//! operation carries the same key, whichever owner sends it (an owner that
//! took over and repeats an operation whose first attempt timed out must
//! not apply it twice), and no two operations share one.

/// The header the upstream receives the key in.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

pub use fenced_sql::idempotency_key;
