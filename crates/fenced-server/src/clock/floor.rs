//! The highest cluster time this node knows a leader issued: the floor a
//! new leader's clock starts from (`fenced_core::LeaderClock::take_over`).
//!
//! It rises with every leader time this node accepts (the time rides on
//! every Raft message, [`crate::peer::network`]), issues as leader, or hears from
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
    sync::{Arc, Mutex, PoisonError},
};

use fenced_core::ClusterTime;

/// The file, under the data dir.
pub const FILE_NAME: &str = "cluster-time";

/// One slot: magic and format version, the term, the time, a CRC of them.
pub(crate) const SLOT_LEN: usize = 24;
/// A slot of format 1 (before times carried their term): magic and
/// version, the time, a CRC.
const V1_SLOT_LEN: usize = 16;
const MAGIC: [u8; 3] = *b"fct";
pub(crate) const FORMAT_VERSION: u8 = 2;
/// The second slot sits in another sector, so a torn write of one slot
/// leaves the other whole.
pub(crate) const SLOT_OFFSETS: [u64; 2] = [0, 512];

/// A time a leader issued, with the term it led. Floors compare by term
/// first: a leader keeps its clock running until it learns of a newer
/// term (a leader paused past an election wakes with it run on), so its
/// late times are ahead of its successor's clock, which started from the
/// times it had heard. Any time of a newer term wins over them: it comes
/// from a clock that started at or above every time revealed before its
/// election (see docs/DECISIONS.md, "Floors compare by term first").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaderTime {
    pub term: u64,
    pub at: ClusterTime,
}

impl LeaderTime {
    pub const ZERO: LeaderTime = LeaderTime {
        term: 0,
        at: ClusterTime::ZERO,
    };

    pub fn new(term: u64, at: ClusterTime) -> Self {
        Self { term, at }
    }
}

pub struct TimeFloor {
    /// The highest leader time known, and the highest known on disk.
    times: Mutex<Times>,
    /// Grants a vote exclusively against recording accepted times.
    pub gate: tokio::sync::RwLock<()>,
    /// One writer at a time; the file and the slot written last.
    file: Option<Arc<Mutex<(File, usize)>>>,
    /// The data dir the file is in (empty in memory).
    dir: std::path::PathBuf,
    writer: tokio::sync::Mutex<()>,
    /// Set once a write failed: after a failed fdatasync the file's state is
    /// unknown, so the node stops (see [`TimeFloor::failed`]).
    failure: tokio::sync::watch::Sender<Option<Arc<io::Error>>>,
}

#[derive(Clone, Copy)]
struct Times {
    highest: LeaderTime,
    durable: LeaderTime,
}

impl TimeFloor {
    /// A floor kept only in memory (tests, tools).
    pub fn in_memory() -> Self {
        Self::starting_at(LeaderTime::ZERO, None, std::path::PathBuf::new())
    }

    fn starting_at(
        t: LeaderTime,
        file: Option<Arc<Mutex<(File, usize)>>>,
        dir: std::path::PathBuf,
    ) -> Self {
        Self {
            times: Mutex::new(Times {
                highest: t,
                durable: t,
            }),
            gate: tokio::sync::RwLock::new(()),
            file,
            dir,
            writer: tokio::sync::Mutex::new(()),
            failure: tokio::sync::watch::Sender::new(None),
        }
    }

    /// Opens (or creates, mode 0600) the floor in `dir`, starting from the
    /// highest whole slot. A slot that fails its check is ignored: it was
    /// being written when the node stopped, and the other slot holds the
    /// value before it. A slot of format 1 holds a time of term 0: any time
    /// a leader issues after the upgrade wins over it.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(FILE_NAME))?;
        let mut best: Option<(LeaderTime, usize)> = None;
        for (slot, offset) in SLOT_OFFSETS.iter().enumerate() {
            let mut buf = [0u8; SLOT_LEN];
            let n = read_up_to(&file, &mut buf, *offset);
            let buf = &buf[..n];
            // A whole slot of another version is not a torn write: refuse
            // it rather than start the clock below what it may hold.
            if let Some(v) = slot_version(buf).filter(|v| *v > FORMAT_VERSION) {
                return Err(io::Error::other(format!(
                    "{}: cluster-time format version {v} is not supported (this build reads \
                     1 and {FORMAT_VERSION})",
                    dir.join(FILE_NAME).display()
                )));
            }
            if let Some(t) = decode_slot(buf) {
                if best.is_none_or(|(b, _)| t > b) {
                    best = Some((t, slot));
                }
            }
        }
        let (t, last_slot) = best.unwrap_or((LeaderTime::ZERO, 1));
        Ok(Self::starting_at(
            t,
            Some(Arc::new(Mutex::new((file, last_slot)))),
            dir.to_path_buf(),
        ))
    }

    fn times(&self) -> Times {
        *self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The time of the highest leader time known: where the next clock
    /// this node starts begins.
    pub fn get(&self) -> ClusterTime {
        self.times().highest.at
    }

    /// The highest leader time known, with its term: what this node's
    /// messages and votes carry when its own clock does not run.
    pub fn leader_time(&self) -> LeaderTime {
        self.times().highest
    }

    /// The highest time known durable in this node's file.
    pub fn durable(&self) -> LeaderTime {
        self.times().durable
    }

    /// Notes a time a leader issued.
    pub fn raise(&self, t: LeaderTime) {
        let mut times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        // CANARY (planted in a `canaries` build, `canary::on`): floors
        // compare by time alone, so a woken leader's late time carries a
        // later leader's clock ahead.
        if fenced_core::canary::on(fenced_core::canary::Canary::FloorByTime) {
            if t.at > times.highest.at {
                times.highest = t;
            }
            return;
        }
        times.highest = times.highest.max(t);
    }

    /// Raises the floor to `t` and returns once at least `t` is on disk
    /// (fdatasync). Concurrent callers share one write: each write stores
    /// the highest time known when it starts.
    pub async fn make_durable(&self, t: LeaderTime) -> io::Result<()> {
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
        let value = self.leader_time();
        let file = Arc::clone(file);
        let written = crate::blocking::run(
            crate::blocking::DiskWork::ClusterTime,
            &self.dir,
            move || {
                let mut guard = file.lock().unwrap_or_else(PoisonError::into_inner);
                let slot = 1 - guard.1;
                guard
                    .0
                    .write_all_at(&encode_slot(value), SLOT_OFFSETS[slot])?;
                guard.0.sync_data()?;
                guard.1 = slot;
                Ok::<_, io::Error>(())
            },
        )
        .await
        .and_then(|r| r);
        if let Err(e) = written {
            let kind = e.kind();
            let text = e.to_string();
            self.failure.send_replace(Some(Arc::new(e)));
            return Err(io::Error::new(kind, text));
        }
        let mut times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        times.durable = times.durable.max(value);
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

/// Reads what there is of `buf.len()` bytes at `offset` (a short file, or
/// a slot of format 1, is shorter); an error reads as nothing.
fn read_up_to(file: &File, buf: &mut [u8], offset: u64) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

pub(crate) fn encode_slot(t: LeaderTime) -> [u8; SLOT_LEN] {
    let mut buf = [0u8; SLOT_LEN];
    buf[..3].copy_from_slice(&MAGIC);
    buf[3] = FORMAT_VERSION;
    buf[4..12].copy_from_slice(&t.term.to_be_bytes());
    buf[12..20].copy_from_slice(&t.at.as_millis().to_be_bytes());
    let crc = crc32fast::hash(&buf[..20]);
    buf[20..].copy_from_slice(&crc.to_be_bytes());
    buf
}

/// The CRC at `len - 4` of a slot `len` long checks its first bytes.
fn checks(buf: &[u8], len: usize) -> bool {
    buf.len() >= len
        && buf[..3] == MAGIC
        && buf[len - 4..len] == crc32fast::hash(&buf[..len - 4]).to_be_bytes()
}

/// The version of a whole slot (magic and checksum right in either
/// layout), any version.
pub(crate) fn slot_version(buf: &[u8]) -> Option<u8> {
    (checks(buf, V1_SLOT_LEN) || checks(buf, SLOT_LEN)).then(|| buf[3])
}

fn be_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// The time a whole slot of a version this build reads holds.
pub(crate) fn decode_slot(buf: &[u8]) -> Option<LeaderTime> {
    match *buf.get(3)? {
        1 if checks(buf, V1_SLOT_LEN) => Some(LeaderTime::new(
            0,
            ClusterTime::from_millis(be_u64(&buf[4..12])?),
        )),
        2 if checks(buf, SLOT_LEN) => Some(LeaderTime::new(
            be_u64(&buf[4..12])?,
            ClusterTime::from_millis(be_u64(&buf[12..20])?),
        )),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_of_a_newer_version_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut slot = encode_slot(lt(1, 42));
        slot[3] = FORMAT_VERSION + 1;
        let crc = crc32fast::hash(&slot[..20]);
        slot[20..].copy_from_slice(&crc.to_be_bytes());
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

    fn lt(term: u64, ms: u64) -> LeaderTime {
        LeaderTime::new(term, t(ms))
    }

    #[tokio::test]
    async fn a_durable_time_survives_a_reopen_and_a_raised_one_does_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        let floor = TimeFloor::open(dir.path()).expect("open");
        assert_eq!(floor.get(), t(0));
        floor.make_durable(lt(1, 5_000)).await.expect("durable");
        floor.make_durable(lt(1, 7_000)).await.expect("durable");
        floor.raise(lt(1, 9_000));
        drop(floor);
        let floor = TimeFloor::open(dir.path()).expect("reopen");
        assert_eq!(floor.get(), t(7_000));
        assert_eq!(floor.durable(), lt(1, 7_000));
    }

    #[tokio::test]
    async fn a_torn_slot_falls_back_to_the_other() {
        let dir = tempfile::tempdir().expect("temp dir");
        let floor = TimeFloor::open(dir.path()).expect("open");
        floor.make_durable(lt(1, 100)).await.expect("durable");
        floor.make_durable(lt(1, 200)).await.expect("durable");
        drop(floor);
        // The slot holding 200 is the second written; tear it.
        let file = OpenOptions::new()
            .write(true)
            .open(dir.path().join(FILE_NAME))
            .expect("open file");
        file.write_all_at(&[0xff; 4], SLOT_OFFSETS[1] + 14)
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
        floor.make_durable(lt(1, 42)).await.expect("durable");
        drop(floor);
        assert_eq!(TimeFloor::open(dir.path()).expect("reopen").get(), t(42));
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_and_every_later_one_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Every write to /dev/full fails with ENOSPC.
        std::os::unix::fs::symlink("/dev/full", dir.path().join(FILE_NAME)).expect("symlink");
        let floor = TimeFloor::open(dir.path()).expect("open");
        let err = floor
            .make_durable(lt(1, 10))
            .await
            .expect_err("a full disk");
        assert_eq!(err.raw_os_error(), None, "{err}");
        assert!(err.to_string().contains("No space left"), "{err}");
        let failed = tokio::time::timeout(std::time::Duration::from_secs(1), floor.failed())
            .await
            .expect("the failure is reported");
        assert!(failed.to_string().contains("No space left"), "{failed}");
        assert_eq!(floor.durable(), LeaderTime::ZERO);
        let again = floor
            .make_durable(lt(1, 20))
            .await
            .expect_err("still refused");
        assert!(
            again.to_string().contains("an earlier write failed"),
            "{again}"
        );
    }

    #[test]
    fn the_floor_only_rises() {
        let floor = TimeFloor::in_memory();
        floor.raise(lt(1, 10));
        floor.raise(lt(1, 3));
        assert_eq!(floor.get(), t(10));
    }

    /// A leader of term 4 woke from a pause with its clock run on to 9,000
    /// while the leader of term 5 stood at 7,000: the newer term's time is
    /// the floor, whichever arrives first.
    #[test]
    fn a_newer_terms_time_wins_over_an_older_terms_later_one() {
        let floor = TimeFloor::in_memory();
        floor.raise(lt(5, 7_000));
        floor.raise(lt(4, 9_000));
        assert_eq!(floor.leader_time(), lt(5, 7_000));
        let other = TimeFloor::in_memory();
        other.raise(lt(4, 9_000));
        other.raise(lt(5, 7_000));
        assert_eq!(other.get(), t(7_000));
    }

    /// A file of format 1 (a time without its term) opens as term 0; the
    /// next write is of format 2 and wins over it.
    #[tokio::test]
    async fn a_format_1_file_opens_as_term_0_and_is_rewritten_in_format_2() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut v1 = [0u8; V1_SLOT_LEN];
        v1[..3].copy_from_slice(&MAGIC);
        v1[3] = 1;
        v1[4..12].copy_from_slice(&5_000u64.to_be_bytes());
        let crc = crc32fast::hash(&v1[..12]);
        v1[12..].copy_from_slice(&crc.to_be_bytes());
        std::fs::write(dir.path().join(FILE_NAME), v1).expect("write");
        let floor = TimeFloor::open(dir.path()).expect("open");
        assert_eq!(floor.leader_time(), lt(0, 5_000));
        floor.make_durable(lt(2, 4_000)).await.expect("durable");
        drop(floor);
        let floor = TimeFloor::open(dir.path()).expect("reopen");
        assert_eq!(floor.leader_time(), lt(2, 4_000));
    }
}
