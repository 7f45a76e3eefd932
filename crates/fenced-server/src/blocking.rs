//! Blocking file work off the async threads, or inline under the
//! deterministic simulation (crate `fenced-sim`), where a blocking thread
//! finishing at a moment of its own would make a run unrepeatable.

use std::{cell::RefCell, io, sync::Arc, time::Duration};

/// The simulation's disk: how long the next piece of blocking file work
/// takes, in simulated time.
pub type SimDisk = Arc<dyn Fn() -> Duration + Send + Sync>;

thread_local! {
    static SIM_DISK: RefCell<Option<SimDisk>> = const { RefCell::new(None) };
}

/// From now on, blocking work started on this thread runs inline, after
/// the simulated latency `disk` draws. For the simulation only: it runs
/// every node of a run on one thread, on tokio's paused clock. `None`
/// ends it.
pub fn simulate_on_this_thread(disk: Option<SimDisk>) {
    SIM_DISK.with(|d| *d.borrow_mut() = disk);
}

/// Runs `f` on a blocking thread (inline under the simulation).
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    if let Some(disk) = SIM_DISK.with(|d| d.borrow().clone()) {
        // The latency before the work: a node stopped meanwhile never wrote.
        tokio::time::sleep(disk()).await;
        return Ok(f());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(io::Error::other)
}
