//! A write gateway for destinations that cannot check a fencing token.
//!
//! The gateway owns access to one upstream (a third-party API, a service
//! that takes unconditional writes): callers reach the upstream only
//! through it, and every request must carry `x-fencing-resource`,
//! `x-fencing-token`, `x-fencing-owner` and `x-fencing-operation-id`. For
//! each request the gateway
//!
//! 1. authenticates the caller (client certificate or bearer token, the
//!    nodes' auth files) and requires `lock` on the resource;
//! 2. reads the whole body (bounded in size and time), so a caller that
//!    paused mid-upload is judged when it has finished;
//! 3. takes the resource's turn: one request per resource is forwarded at a
//!    time, so an older token never reaches the upstream while or after a
//!    newer one does;
//! 4. asks the lock cluster that the token is its owner's current lease;
//! 5. compares the token with the highest it forwarded and records it,
//!    durably (SQLite, fsync'ed), before forwarding; a lower one is a 409;
//! 6. forwards with `Idempotency-Key` derived from resource, token and
//!    operation id, and records the operation once the upstream answered
//!    2xx: a retry of it is answered `already_applied`, not sent again.

pub mod gateway;
mod key;
pub mod metrics;
pub mod serve;
pub mod upstream;

pub use key::{idempotency_key, IDEMPOTENCY_HEADER};
