//! openraft's warnings and errors that describe nothing wrong, kept out of
//! the node's log.
//!
//! openraft 0.9 logs at ERROR every vote request and every replication
//! attempt that fails, whatever the cause, at WARN the leader's progress
//! update after each failed heartbeat, and at WARN every answer that
//! arrives after the election it belonged to ended, and at ERROR every call
//! into a core that has stopped. Four of these say nothing an operator must
//! act on:
//!
//! - a call that failed as [`openraft::error::Unreachable`], and the
//!   leader's "update progress error" and "heartbeat error" that follow it
//!   (seen when followers stop before the leader): fenced's
//!   transport returns that only for a peer it could not connect to or whose
//!   connection broke, and logs it itself, once per outage and then at most
//!   every [`crate::peer::network::REACHABILITY_REPEAT`] (see
//!   [`crate::peer::network::Reachability`]), where openraft would log it on every
//!   retry;
//! - "... backoff mode: drain events without processing them": the pause
//!   openraft's replication to a peer takes after such a call (it backs off
//!   on [`openraft::error::Unreachable`] only), logged at WARN on every
//!   pause; the outage itself is what the transport reports;
//! - "A message will be ignored because vote changed": a late vote
//!   answer or higher-vote notice for an election or term already over; the
//!   candidate that won with two of three votes always gets the third after;
//! - a call into a core that stopped because the node asked it to
//!   (`Fatal::Stopped`: a write or read of the node's own still in flight
//!   at shutdown): the caller is answered "unknown" and the node logs its
//!   stop itself. A core that stopped on a storage error or a panic
//!   (`Fatal::StorageError`, `Fatal::Panicked`) is still an error.
//!
//! Only those exact events are dropped, by their message and the error they
//! carry; every other openraft warning and error (timeouts, a peer's error
//! answer, storage) is logged as before.

use std::fmt;

use tracing::{
    field::{Field, Visit},
    Event, Level, Subscriber,
};
use tracing_subscriber::layer::{Context, Layer};

/// Drops the openraft events described in the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuietRaftNoise;

impl<S: Subscriber> Layer<S> for QuietRaftNoise {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || !meta.target().starts_with("openraft") {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        !is_noise(&fields.message, &fields.error) && !is_shutdown(&fields.message, &fields)
    }
}

/// Whether an openraft warning or error with this message and error text is
/// one of the three kinds of noise.
pub fn is_noise(message: &str, error: &str) -> bool {
    const STALE_VOTE: &str = "A message will be ignored because vote changed";
    // openraft's ReplicationCore::backoff_drain_events, behind its function name.
    const BACKOFF: &str = "backoff mode: drain events without processing them";
    // openraft's Display of RPCError::Unreachable.
    const UNREACHABLE: &str = "Unreachable node:";
    // openraft's ReplicationHandler::update_progress, with the failure as
    // `result` and again inside the heartbeat message.
    const PROGRESS: &str = "update progress error";
    const HEARTBEAT: &str = "heartbeat error: Unreachable node:";
    message.starts_with(STALE_VOTE)
        || message.ends_with(BACKOFF)
        || message.starts_with(HEARTBEAT)
        || (message == PROGRESS && error.starts_with(UNREACHABLE))
        || (error.starts_with(UNREACHABLE)
            && (message == "while requesting vote"
                || message == "RPCError"
                || message.starts_with("error replication to target=")))
}

/// Whether an openraft error reports a call into a core that stopped
/// because it was shut down: the core's result (`core_result`) or the
/// caller's error is exactly `Fatal::Stopped`.
fn is_shutdown(message: &str, fields: &Fields) -> bool {
    fields.core_result == "Err(Stopped)"
        || (fields.error == "Stopped"
            && (message.starts_with("error when ") || message == "core_call fatal error"))
}

#[derive(Default)]
struct Fields {
    message: String,
    error: String,
    core_result: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" | "err" | "result" => self.error = format!("{value:?}"),
            "core_result" => self.core_result = format!("{value:?}"),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex, PoisonError},
    };

    use tracing_subscriber::{fmt::MakeWriter, layer::SubscriberExt};

    use super::*;

    #[test]
    fn only_unreachable_peers_their_backoff_and_stale_votes_are_noise() {
        let unreachable = "Unreachable node: vote to node 2 at 127.0.0.1:7202: Connection refused";
        assert!(is_noise("while requesting vote", unreachable));
        assert!(is_noise("RPCError", unreachable));
        assert!(is_noise("error replication to target=3", unreachable));
        assert!(is_noise(
            "A message will be ignored because vote changed: msg sent by vote: T1-N2:uncommitted",
            ""
        ));
        // Other failures of the same calls are still errors.
        assert!(!is_noise(
            "while requesting vote",
            "NetworkError: no reply within 1s"
        ));
        assert!(!is_noise("RPCError", "timeout after 1s"));
        assert!(!is_noise(
            "error replication to target=3",
            "seen a higher vote: T2-N3 GT mine: T1-N2"
        ));
        assert!(!is_noise("quit RaftCore::main on error", unreachable));
        // The pause after an unreachable peer, as openraft 0.9 words it.
        assert!(is_noise(
            "openraft::replication::ReplicationCore<_, _, _>::backoff_drain_events backoff mode: drain events without processing them",
            ""
        ));
        assert!(!is_noise("backoff mode: something else", ""));
        // The leader's progress after a heartbeat to a stopped follower.
        let reset = "Unreachable node: append_entries to node 3 at 127.0.0.1:10147: Connection reset by peer (os error 104)";
        assert!(is_noise("update progress error", reset));
        assert!(is_noise(
            &format!("heartbeat error: {reset}, no update to inflight data"),
            ""
        ));
        assert!(!is_noise("update progress error", "timeout after 1s"));
        assert!(!is_noise(
            "heartbeat error: NetworkError: no reply, no update to inflight data",
            ""
        ));
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn the_layer_drops_the_noise_and_keeps_the_rest() {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_ansi(false)
            .finish()
            .with(QuietRaftNoise);
        tracing::subscriber::with_default(subscriber, || {
            let refused = "Unreachable node: vote to node 2: Connection refused";
            tracing::error!(target: "openraft::core::raft_core", error = %refused, "while requesting vote");
            tracing::warn!(target: "openraft::core::raft_core", "A message will be ignored because vote changed: x");
            tracing::error!(target: "openraft::core::raft_core", error = %"timeout", "while requesting vote");
            tracing::error!(target: "fenced_server::node", error = %refused, "while requesting vote");
            tracing::warn!(target: "openraft::engine::handler::replication_handler", request_id = %"HeartBeat", result = %refused, "update progress error");
            tracing::warn!(target: "openraft::engine::handler::replication_handler", "heartbeat error: {}, no update to inflight data", refused);
            // A write in flight when the node stopped its core, as openraft
            // 0.9 logs it twice; a core stopped by a storage error is kept.
            let stopped = "Stopped";
            tracing::error!(target: "openraft::raft::raft_inner", core_result = ?Err::<(), _>(stopped_fatal()), "failure {}; message: {}", "receiving rx from RaftCore", "");
            tracing::error!(target: "openraft::raft::raft_inner", error = ?stopped_fatal(), "error when {}", "openraft::raft::raft_inner::RaftInner<_>::recv_msg");
            tracing::error!(target: "openraft::raft::raft_inner", error = ?stopped_fatal(), "core_call fatal error");
            tracing::error!(target: "openraft::raft::raft_inner", core_result = ?Err::<(), _>(storage_fatal()), "failure {}; message: {}", "receiving rx from RaftCore", "");
            tracing::error!(target: "openraft::raft::raft_inner", error = %stopped, "error when {}", "something::else");
        });
        let text = String::from_utf8_lossy(&out.0.lock().unwrap_or_else(PoisonError::into_inner))
            .to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("timeout"), "{text}");
        assert!(lines[1].contains("fenced_server::node"), "{text}");
        assert!(lines[2].contains("StorageError"), "{text}");
    }

    fn stopped_fatal() -> openraft::error::Fatal<u64> {
        openraft::error::Fatal::Stopped
    }

    fn storage_fatal() -> openraft::error::Fatal<u64> {
        openraft::error::Fatal::StorageError(openraft::StorageError::from_io_error(
            openraft::ErrorSubject::Store,
            openraft::ErrorVerb::Write,
            std::io::Error::other("disk full"),
        ))
    }
}
