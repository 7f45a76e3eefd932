//! Blocking file work off the async threads, or inline under the
//! deterministic simulation (crate `fenced-sim`), where a blocking thread
//! finishing at a moment of its own would make a run unrepeatable.

use std::{cell::RefCell, io, path::Path, sync::Arc, time::Duration};

/// Which piece of blocking file work runs: the simulation's disk times
/// each kind its own way (a snapshot is a large write, a cluster-time slot
/// a few bytes), so races between them can be drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskWork {
    /// A snapshot built from the table, encoded into a temporary file.
    SnapshotEncode,
    /// A built snapshot made the one on disk (rename, directory sync).
    SnapshotStore,
    /// A snapshot received from the leader, decoded, written and put in place.
    SnapshotInstall,
    /// The snapshot on disk read to send to a follower.
    SnapshotRead,
    /// The leader's cluster time written to its slot and synced.
    ClusterTime,
}

/// The simulation's disk: how long the next piece of blocking file work
/// of the kind given, in the directory given, takes in simulated time, or
/// the error it fails with (EIO, ENOSPC) without touching the disk.
pub type SimDisk = Arc<dyn Fn(DiskWork, &Path) -> io::Result<Duration> + Send + Sync>;

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

/// Runs `f`, a piece of file work of kind `work` in `dir`, on a blocking
/// thread (inline under the simulation).
pub async fn run<T: Send + 'static>(
    work: DiskWork,
    dir: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    if let Some(disk) = SIM_DISK.with(|d| d.borrow().clone()) {
        // The latency comes before the work: a crash meanwhile finds it not
        // begun (snapshot work then refuses to write, see
        // `Shared::halt_writes`).
        tokio::time::sleep(disk(work, dir)?).await;
        return Ok(f());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(io::Error::other)
}
