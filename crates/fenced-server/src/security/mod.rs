//! Who may reach the node and what they may hold: TLS on both ports and
//! certificate names, revoked certificates, identities and their
//! permissions, what a connection may hold before it is authenticated, and
//! the node-wide limits with their refusal counters.
//!
//! Architecture invariant: imports only the crate's leaf modules (`types`,
//! `prefixed`, `histogram`); every other layer may lean on it.

pub mod admission;
pub mod auth;
pub mod certs;
pub mod limits;
pub mod revocation;
pub mod tls;
