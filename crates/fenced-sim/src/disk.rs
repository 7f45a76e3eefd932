//! Disk faults a seed draws for one node at a time: damage at rest while it
//! is stopped (a flipped bit, a zeroed sector), the tail of its log torn
//! by a crash, and errors while it runs (EIO on reads and writes, ENOSPC on
//! writes), which [`DiskFaults`] hands to the node's simulated disk.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use fenced_server::{
    blocking::DiskWork, clock::floor, storage::log_store::UnansweredTail,
    storage::log_tail::is_chunk, types::NodeId,
};

use crate::Rng;

/// A sector, the unit a disk loses.
const SECTOR: u64 = 512;

/// Damage done to one file of a stopped node.
#[derive(Debug, Clone)]
pub struct Damage {
    pub file: PathBuf,
    pub offset: u64,
    pub what: &'static str,
    /// Whether the node must refuse to start on it: every byte it reads
    /// is checked, except the cluster-time file's slots (a slot that fails
    /// its check is taken for one a crash cut short, and the other used)
    /// and the last record of the log (the same).
    pub must_refuse: bool,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at offset {} of {}",
            self.what,
            self.offset,
            self.file.display()
        )
    }
}

/// The files a node wrote in `dir` (what an earlier repair moved aside
/// and raft-log's empty lock file left out).
fn node_files(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            if !name.starts_with("damaged-") {
                node_files(&path, out)?;
            }
        } else if name != "LOCK" && entry.metadata()?.len() > 0 {
            out.push(path);
        }
    }
    Ok(())
}

/// Where damage may fall in `file`: everything, except in the log's last
/// chunk, where only what comes before its last record counts (damage
/// after reads as a write a crash cut short; docs/DECISIONS.md).
fn damageable(file: &Path, bytes: &[u8]) -> (u64, bool) {
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if is_chunk(file) {
        let last_chunk = file
            .parent()
            .and_then(|d| fenced_server::storage::log_tail::last_chunk(d).ok())
            .map(|(path, _)| path);
        if last_chunk.as_deref() == Some(file) {
            let (starts, _) = fenced_server::storage::log_tail::whole_records::<
                fenced_server::storage::log_store::WalTypes,
            >(bytes);
            let last = starts.last().copied().unwrap_or(0);
            return (u64::try_from(last).unwrap_or(0), true);
        }
        return (len, true);
    }
    let must_refuse = file.file_name().and_then(|n| n.to_str()) != Some(floor::FILE_NAME);
    (len, must_refuse)
}

/// Flips one bit, or zeroes one sector, of a file the stopped node in
/// `dir` wrote; `None` when there is nothing to damage.
pub fn damage(dir: &Path, rng: &Rng) -> io::Result<Option<Damage>> {
    let mut files = Vec::new();
    node_files(dir, &mut files)?;
    files.sort();
    // The log's chunks and the snapshot hold nearly every byte: drawn four
    // times as often as the small files.
    let big: Vec<PathBuf> = files
        .iter()
        .filter(|f| is_chunk(f) || f.file_name().is_some_and(|n| n == "snapshot.bin"))
        .cloned()
        .collect();
    for _ in 0..3 {
        files.extend(big.iter().cloned());
    }
    if files.is_empty() {
        return Ok(None);
    }
    let (file, flip) = {
        let mut r = rng.lock();
        let i = r.usize(..files.len());
        (files.swap_remove(i), r.u32(..10) < 6)
    };
    let mut bytes = std::fs::read(&file)?;
    let (reach, must_refuse) = damageable(&file, &bytes);
    let damage = if flip || reach < SECTOR {
        if reach == 0 {
            return Ok(None);
        }
        let (offset, bit) = {
            let mut r = rng.lock();
            (r.u64(..reach), r.u8(..8))
        };
        let at = usize::try_from(offset).map_err(io::Error::other)?;
        if let Some(b) = bytes.get_mut(at) {
            *b ^= 1 << bit;
        }
        Damage {
            file: file.clone(),
            offset,
            what: "a flipped bit",
            must_refuse,
        }
    } else {
        let sector = rng.lock().u64(..reach / SECTOR);
        let offset = sector * SECTOR;
        let from = usize::try_from(offset).map_err(io::Error::other)?;
        let to = bytes.len().min(from.saturating_add(512));
        let changed = bytes[from..to].iter().any(|b| *b != 0);
        bytes[from..to].fill(0);
        Damage {
            file: file.clone(),
            offset,
            what: "a zeroed sector",
            must_refuse: must_refuse && changed,
        }
    };
    std::fs::write(&file, &bytes)?;
    Ok(Some(damage))
}

/// Tears the log's unanswered tail as a crash in the middle of its flush
/// may leave it: cut short, or (a file system that wrote the length before
/// the data) zeros from a sector boundary on. Says what it did.
pub fn tear(tail: &UnansweredTail, rng: &Rng) -> io::Result<Option<String>> {
    let (cut, zeros) = {
        let mut r = rng.lock();
        (r.u64(tail.bytes.clone()), r.bool())
    };
    let cut = if zeros {
        cut.div_ceil(SECTOR).saturating_mul(SECTOR)
    } else {
        cut
    };
    if cut >= tail.bytes.end {
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new().write(true).open(&tail.chunk)?;
    if zeros {
        file.set_len(cut)?;
        file.set_len(tail.bytes.end)?;
    } else {
        file.set_len(cut)?;
    }
    Ok(Some(format!(
        "{} torn at {cut} of {}..{}{}",
        tail.chunk.display(),
        tail.bytes.start,
        tail.bytes.end,
        if zeros { ", zeros after" } else { "" }
    )))
}

/// An error a running node's disk answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoFault {
    /// EIO on every read and write.
    Eio,
    /// ENOSPC on every write; reads succeed.
    Full,
}

impl IoFault {
    fn error(self) -> io::Error {
        match self {
            IoFault::Eio => io::Error::from_raw_os_error(5),
            IoFault::Full => io::Error::from_raw_os_error(28),
        }
    }

    /// The error `work` fails with under this fault, if it does.
    fn fails(self, work: Option<DiskWork>) -> Option<io::Error> {
        let read = matches!(work, Some(DiskWork::SnapshotRead));
        (self == IoFault::Eio || !read).then(|| self.error())
    }
}

/// Which node's disk errs now; consulted by every simulated disk access.
pub struct DiskFaults {
    root: PathBuf,
    faults: Mutex<BTreeMap<NodeId, IoFault>>,
}

impl DiskFaults {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            faults: Mutex::default(),
        }
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, IoFault>> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set(&self, node: NodeId, fault: Option<IoFault>) {
        match fault {
            Some(f) => self.faults().insert(node, f),
            None => self.faults().remove(&node),
        };
    }

    /// The node whose data dir holds `path`.
    fn node_of(&self, path: &Path) -> Option<NodeId> {
        let rest = path.strip_prefix(&self.root).ok()?;
        let first = rest.components().next()?.as_os_str().to_str()?;
        first.strip_prefix('n')?.parse().ok()
    }

    /// Blocking file work in `dir`: the error it fails with, if its node's
    /// disk errs.
    pub fn work(&self, work: DiskWork, dir: &Path) -> io::Result<()> {
        let Some(node) = self.node_of(dir) else {
            return Ok(());
        };
        match self.faults().get(&node).and_then(|f| f.fails(Some(work))) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A log flush of `node`: the error it fails with, if its disk errs.
    pub fn flush(&self, node: NodeId) -> io::Result<()> {
        match self.faults().get(&node).and_then(|f| f.fails(None)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A node's data dir after damage, made ready for `fenced repair`'s start:
/// what it held moved aside, the marker written (the command's own code).
pub fn prepare_repair(dir: &Path, node: NodeId, seq: u64) -> io::Result<PathBuf> {
    let prepared = fenced_server::repair::prepare::prepare(dir, node, seq)?;
    Ok(prepared.moved_to.unwrap_or_else(|| dir.to_path_buf()))
}

/// How long a run waits for a repaired node to vote again.
pub const REPAIR_WITHIN: Duration = Duration::from_secs(20);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_node_is_found_by_its_data_dir() {
        let f = DiskFaults::new(PathBuf::from("/tmp/run"));
        f.set(2, Some(IoFault::Full));
        assert!(f
            .work(DiskWork::SnapshotStore, Path::new("/tmp/run/n2/state"))
            .is_err());
        assert!(f
            .work(DiskWork::SnapshotRead, Path::new("/tmp/run/n2/state"))
            .is_ok());
        assert!(f
            .work(DiskWork::SnapshotStore, Path::new("/tmp/run/n1/state"))
            .is_ok());
        assert!(f.flush(2).is_err());
        f.set(2, Some(IoFault::Eio));
        assert!(f
            .work(DiskWork::SnapshotRead, Path::new("/tmp/run/n2/state"))
            .is_err());
        f.set(2, None);
        assert!(f.flush(2).is_ok());
    }

    #[test]
    fn damage_changes_the_file_it_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("snapshot.bin"), vec![7u8; 2_000]).unwrap();
        std::fs::write(dir.path().join("LOCK"), b"").unwrap();
        let d = damage(dir.path(), &Rng::new(3)).unwrap().unwrap();
        assert!(d.must_refuse);
        let after = std::fs::read(&d.file).unwrap();
        assert_ne!(after, vec![7u8; 2_000], "{d}");
    }
}
