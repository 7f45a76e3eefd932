//! The leader's wall clock on the replies that carry a cluster time: for
//! people, never for timing (see `fenced_core::WallClock`). The conversions
//! leave it 0; the server, which holds the anchors, sets it.

use crate::v1;

/// A reply with a `wall_time_unix_ms` field.
pub trait WallTimed {
    /// The reply with the leader's wall clock at its cluster time (0:
    /// unknown).
    fn with_wall_time(self, unix_ms: u64) -> Self;
}

macro_rules! wall_timed {
    ($($reply:ty),* $(,)?) => {$(
        impl WallTimed for $reply {
            fn with_wall_time(mut self, unix_ms: u64) -> Self {
                self.wall_time_unix_ms = unix_ms;
                self
            }
        }
    )*};
}

wall_timed!(
    v1::AcquireResponse,
    v1::RenewResponse,
    v1::RenewManyResponse,
    v1::ReleaseResponse,
    v1::DescribeResponse,
    v1::HistoryResponse,
    v1::SessionResponse,
    v1::CloseSessionResponse,
    v1::KvPutResponse,
    v1::KvDeleteResponse,
    v1::KvGetResponse,
);
