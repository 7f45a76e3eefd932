//! fenced's gRPC contract, generated from `proto/fenced/v1`, and the checked
//! conversions between wire messages and [`fenced_core`] types.
//!
//! Every conversion from the wire validates: a bad field becomes a
//! [`fenced_core::InvalidArgument`] naming the field and the bound, which
//! [`invalid_argument`] turns into a gRPC `INVALID_ARGUMENT` status.

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("fenced.v1");
    #[cfg(feature = "json")]
    include!(concat!(env!("OUT_DIR"), "/fenced.v1.serde.rs"));
}

/// Every method of the services in `proto/fenced/v1`, as
/// `package.Service/Method` (a call's path without its `/`), sorted.
pub mod methods {
    include!(concat!(env!("OUT_DIR"), "/methods.rs"));
}
pub use methods::METHODS;

/// The encoded `FileDescriptorSet` of `proto/fenced/v1`, for gRPC server
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/fenced_descriptor.bin"));

mod convert;
mod kv;
mod wall;

pub use convert::*;
pub use kv::*;
pub use wall::WallTimed;
