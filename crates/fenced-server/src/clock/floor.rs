//! The highest cluster time this node knows a leader issued: the floor a
//! new leader's clock starts from (`fenced_core::LeaderClock::take_over`).
//!
//! It rises with every leader time this node accepts (the time rides on
//! every Raft message, [`crate::network`]), issues as leader, or hears from
//! a voter that elected it. Votes are granted under [`TimeFloor::gate`] held
//! for writing and accepted messages are recorded under it held for reading,
//! so a voter's answer carries every time it accepted before the vote.
//!
//! Times a client can see without a log entry (a linearizable describe) are
//! made durable first, on the leader and on the followers that confirm the
//! read, in a small file of two slots written in turn: after a restart of
//! the whole cluster, time still never runs backwards.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
};

use fenced_core::ClusterTime;

/// The file, under the data dir.
pub const FILE_NAME: &str = "cluster-time";

/// One slot: magic and format version, the time, a CRC of both.
pub(crate) const SLOT_LEN: usize = 16;
const MAGIC: [u8; 3] = *b"fct";
const FORMAT_VERSION: u8 = 1;
/// The second slot sits in another sector, so a torn write of one slot
/// leaves the other whole.
const SLOT_OFFSETS: [u64; 2] = [0, 512];

pub struct TimeFloor {
    highest: AtomicU64,
    durable: AtomicU64,
    /// Grants a vote exclusively against recording accepted times.
    pub gate: tokio::sync::RwLock<()>,
    /// One writer at a time; the file and the slot written last.
    file: Option<Arc<Mutex<(File, usize)>>>,
    writer: tokio::sync::Mutex<()>,
    /// Set once a write failed: after a failed fdatasync the file's state is
    /// unknown, so the node stops (see [`TimeFloor::failed`]).
    failure: tokio::sync::watch::Sender<Option<Arc<io::Error>>>,
}

impl TimeFloor {
    /// A floor kept only in memory (tests, tools).
    pub fn in_memory() -> Self {
        Self {
            highest: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            gate: tokio::sync::RwLock::new(()),
            file: None,
            writer: tokio::sync::Mutex::new(()),
            failure: tokio::sync::watch::Sender::new(None),
        }
    }

    /// Opens (or creates, mode 0600) the floor in `dir`, starting from the
    /// highest whole slot. A slot that fails its check is ignored: it was
    /// being written when the node stopped, and the other slot holds the
    /// value before it.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(FILE_NAME))?;
        let mut best: Option<(u64, usize)> = None;
        for (slot, offset) in SLOT_OFFSETS.iter().enumerate() {
            let mut buf = [0u8; SLOT_LEN];
            if file.read_exact_at(&mut buf, *offset).is_err() {
                continue;
            }
            // A whole slot of another version is not a torn write: refuse
            // it rather than start the clock below what it may hold.
            if let Some(v) = slot_version(&buf).filter(|v| *v != FORMAT_VERSION) {
                return Err(io::Error::other(format!(
                    "{}: cluster-time format version {v} is not supported (this build reads \
                     {FORMAT_VERSION})",
                    dir.join(FILE_NAME).display()
                )));
            }
            if let Some(t) = decode_slot(&buf) {
                if best.is_none_or(|(b, _)| t > b) {
                    best = Some((t, slot));
                }
            }
        }
        let (t, last_slot) = best.unwrap_or((0, 1));
        Ok(Self {
            highest: AtomicU64::new(t),
            durable: AtomicU64::new(t),
            gate: tokio::sync::RwLock::new(()),
            file: Some(Arc::new(Mutex::new((file, last_slot)))),
            writer: tokio::sync::Mutex::new(()),
            failure: tokio::sync::watch::Sender::new(None),
        })
    }

    pub fn get(&self) -> ClusterTime {
        ClusterTime::from_millis(self.highest.load(Ordering::Acquire))
    }

    /// The highest time known durable in this node's file.
    pub fn durable(&self) -> ClusterTime {
        ClusterTime::from_millis(self.durable.load(Ordering::Acquire))
    }

    /// Notes a time a leader issued.
    pub fn raise(&self, t: ClusterTime) {
        self.highest.fetch_max(t.as_millis(), Ordering::AcqRel);
    }

    /// Raises the floor to `t` and returns once at least `t` is on disk
    /// (fdatasync). Concurrent callers share one write: each write stores
    /// the highest time known when it starts.
    pub async fn make_durable(&self, t: ClusterTime) -> io::Result<()> {
        self.raise(t);
        let Some(file) = &self.file else {
            return Ok(());
        };
        if self.durable() >= t {
            return Ok(());
        }
        let _writer = self.writer.lock().await;
        if self.durable() >= t {
            return Ok(());
        }
        if let Some(e) = self.failure.borrow().as_ref() {
            return Err(io::Error::new(
                e.kind(),
                format!("an earlier write failed: {e}"),
            ));
        }
        let value = self.get().as_millis();
        let file = Arc::clone(file);
        let written = tokio::task::spawn_blocking(move || {
            let mut guard = file.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = 1 - guard.1;
            guard
                .0
                .write_all_at(&encode_slot(value), SLOT_OFFSETS[slot])?;
            guard.0.sync_data()?;
            guard.1 = slot;
            Ok::<_, io::Error>(())
        })
        .await
        .map_err(io::Error::other)
        .and_then(|r| r);
        if let Err(e) = written {
            let kind = e.kind();
            let text = e.to_string();
            self.failure.send_replace(Some(Arc::new(e)));
            return Err(io::Error::new(kind, text));
        }
        self.durable.fetch_max(value, Ordering::AcqRel);
        Ok(())
    }

    /// Resolves with the error once a write of the file failed.
    pub async fn failed(&self) -> Arc<io::Error> {
        let mut rx = self.failure.subscribe();
        loop {
            if let Some(e) = rx.borrow_and_update().as_ref() {
                return Arc::clone(e);
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

pub(crate) fn encode_slot(t: u64) -> [u8; SLOT_LEN] {
    let mut buf = [0u8; SLOT_LEN];
    buf[..3].copy_from_slice(&MAGIC);
    buf[3] = FORMAT_VERSION;
    buf[4..12].copy_from_slice(&t.to_be_bytes());
    let crc = crc32fast::hash(&buf[..12]);
    buf[12..].copy_from_slice(&crc.to_be_bytes());
    buf
}

/// The version of a whole slot (magic and checksum right), any version.
fn slot_version(buf: &[u8; SLOT_LEN]) -> Option<u8> {
    let crc = u32::from_be_bytes([buf[12], buf[13], buf[14], buf[15]]);
    (buf[..3] == MAGIC && crc32fast::hash(&buf[..12]) == crc).then_some(buf[3])
}

pub(crate) fn decode_slot(buf: &[u8; SLOT_LEN]) -> Option<u64> {
    if buf[..3] != MAGIC || buf[3] != FORMAT_VERSION {
        return None;
    }
    let crc = u32::from_be_bytes([buf[12], buf[13], buf[14], buf[15]]);
    if crc32fast::hash(&buf[..12]) != crc {
        return None;
    }
    let mut t = [0u8; 8];
    t.copy_from_slice(&buf[4..12]);
    Some(u64::from_be_bytes(t))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_of_a_newer_version_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut slot = encode_slot(42);
        slot[3] = FORMAT_VERSION + 1;
        let crc = crc32fast::hash(&slot[..12]);
        slot[12..].copy_from_slice(&crc.to_be_bytes());
        std::fs::write(dir.path().join(FILE_NAME), slot).expect("write");
        let e = TimeFloor::open(dir.path())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("cluster-time") && e.contains(&format!("version {}", FORMAT_VERSION + 1)),
            "{e}"
        );
    }

    fn t(ms: u64) -> ClusterTime {
        ClusterTime::from_millis(ms)
    }

    #[tokio::test]
    async fn a_durable_time_survives_a_reopen_and_a_raised_one_does_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        let floor = TimeFloor::open(dir.path()).expect("open");
        assert_eq!(floor.get(), t(0));
        floor.make_durable(t(5_000)).await.expect("durable");
        floor.make_durable(t(7_000)).await.expect("durable");
        floor.raise(t(9_000));
        drop(floor);
        let floor = TimeFloor::open(dir.path()).expect("reopen");
        assert_eq!(floor.get(), t(7_000));
        assert_eq!(floor.durable(), t(7_000));
    }

    #[tokio::test]
    async fn a_torn_slot_falls_back_to_the_other() {
        let dir = tempfile::tempdir().expect("temp dir");
        let floor = TimeFloor::open(dir.path()).expect("open");
        floor.make_durable(t(100)).await.expect("durable");
        floor.make_durable(t(200)).await.expect("durable");
        drop(floor);
        // The slot holding 200 is the second written; tear it.
        let file = OpenOptions::new()
            .write(true)
            .open(dir.path().join(FILE_NAME))
            .expect("open file");
        file.write_all_at(&[0xff; 4], SLOT_OFFSETS[1] + 6)
            .expect("tear");
        let floor = TimeFloor::open(dir.path()).expect("reopen");
        assert_eq!(floor.get(), t(100));
    }

    #[tokio::test]
    async fn garbage_in_the_file_is_no_time_and_no_panic() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(FILE_NAME), vec![0x5a; 2_000]).expect("write");
        let floor = TimeFloor::open(dir.path()).expect("open");
        assert_eq!(floor.get(), t(0));
        floor.make_durable(t(42)).await.expect("durable");
        drop(floor);
        assert_eq!(TimeFloor::open(dir.path()).expect("reopen").get(), t(42));
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_and_every_later_one_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Every write to /dev/full fails with ENOSPC.
        std::os::unix::fs::symlink("/dev/full", dir.path().join(FILE_NAME)).expect("symlink");
        let floor = TimeFloor::open(dir.path()).expect("open");
        let err = floor.make_durable(t(10)).await.expect_err("a full disk");
        assert_eq!(err.raw_os_error(), None, "{err}");
        assert!(err.to_string().contains("No space left"), "{err}");
        let failed = tokio::time::timeout(std::time::Duration::from_secs(1), floor.failed())
            .await
            .expect("the failure is reported");
        assert!(failed.to_string().contains("No space left"), "{failed}");
        assert_eq!(floor.durable(), t(0));
        let again = floor.make_durable(t(20)).await.expect_err("still refused");
        assert!(
            again.to_string().contains("an earlier write failed"),
            "{again}"
        );
    }

    #[test]
    fn the_floor_only_rises() {
        let floor = TimeFloor::in_memory();
        floor.raise(t(10));
        floor.raise(t(3));
        assert_eq!(floor.get(), t(10));
    }
}
