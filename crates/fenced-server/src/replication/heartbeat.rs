//! The leader's heartbeats, sent by fenced at `--heartbeat-ms` instead of by
//! openraft's tick.
//!
//! openraft 0.9 takes one setting, `heartbeat_interval`, for two things:
//! how often a leader sends a heartbeat (at its tick, every one and a half
//! of it) and how long any AppendEntries may take, the follower's
//! fdatasync included, before it counts as failed. A short heartbeat keeps
//! followers hearing a briefly stalled leader within their lease; a short
//! deadline turns every slow sync into a failed append and a retry. So the
//! two are set apart: openraft's deadline is [`append_deadline_ms`], its
//! own heartbeat is off, and [`run`] triggers one every `--heartbeat-ms`
//! while this node leads.

use std::time::Duration;

use openraft::ServerState;
use tokio_util::sync::CancellationToken;

use crate::types::Raft;

/// The deadline of an AppendEntries: at least 100 ms (a disk's sync under
/// load reaches tens of milliseconds), never under the heartbeat, and below
/// half the election timeout so that a follower that cannot answer in time
/// is given up on well within a lease.
pub fn append_deadline_ms(heartbeat_ms: u64, election_timeout_ms: u64) -> u64 {
    heartbeat_ms.max(100.min(election_timeout_ms / 2))
}

/// Triggers a heartbeat every `every` while this node leads, until `stop`.
pub async fn run(raft: Raft, every: Duration, stop: CancellationToken) {
    let metrics = raft.metrics();
    let mut tick = tokio::time::interval(every);
    // A stalled runtime sends one heartbeat when it resumes, not a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if metrics.borrow().state != ServerState::Leader {
            continue;
        }
        if let Err(error) = raft.trigger().heartbeat().await {
            // The core stopped (shutdown or a fatal storage error), which
            // is logged where it happens.
            tracing::debug!(%error, "heartbeat not sent; stopping");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_append_deadline_is_set_apart_from_a_short_heartbeat() {
        assert_eq!(append_deadline_ms(50, 200), 100, "the default");
        assert_eq!(append_deadline_ms(100, 500), 100, "the old default");
        assert_eq!(
            append_deadline_ms(300, 1_000),
            300,
            "never under the heartbeat"
        );
        assert_eq!(
            append_deadline_ms(10, 50),
            25,
            "within half a short timeout"
        );
        for (hb, timeout) in [
            (10, 50),
            (49, 50),
            (50, 200),
            (1_000, 60_000),
            (59_999, 60_000),
        ] {
            let d = append_deadline_ms(hb, timeout);
            assert!(d >= hb && d < timeout, "{hb}/{timeout}: {d}");
        }
    }
}
