//! Blocking file work off the async threads, or inline under the
//! deterministic simulation (crate `fenced-sim`), where a blocking thread
//! finishing at a moment of its own would make a run unrepeatable.

use std::{
    io,
    sync::atomic::{AtomicBool, Ordering},
};

static INLINE: AtomicBool = AtomicBool::new(false);

/// From now on, this process runs blocking work inline on the calling
/// task. For the simulation only: it runs every node on one thread, on
/// tokio's paused clock, and owns its process.
pub fn run_inline_from_now_on() {
    INLINE.store(true, Ordering::SeqCst);
}

/// Runs `f` on a blocking thread (inline under the simulation).
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    if INLINE.load(Ordering::Relaxed) {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(io::Error::other)
}

/// Whether blocking work runs inline (the simulation).
pub fn is_inline() -> bool {
    INLINE.load(Ordering::Relaxed)
}
