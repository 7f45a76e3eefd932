//! What the examples share with the build: docs/GUIDE.md's Rust examples,
//! compiled (the programs themselves are in src/bin).

#![allow(
    dead_code,
    unused_variables,
    unused_imports,
    clippy::unwrap_used,
    clippy::diverging_sub_expression
)]

#[rustfmt::skip]
pub mod guide;
