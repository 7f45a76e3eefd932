//! `fenced check --data-dir DIR`: verifies every file of a stopped node's
//! data directory as the node reads it, and says, file by file, whether it
//! is whole. The Raft log's lock (the one a running node holds) is taken
//! first and kept to the end, so a node's live directory is refused.

use std::{
    io,
    path::{Path, PathBuf},
};

use crate::{
    clock::floor,
    state_machine,
    storage::checksum::Damaged,
    storage::data_format::{self, LOG_DIR, STATE_DIR},
    storage::log_store::LockedLog,
};

/// One file's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReport {
    pub path: PathBuf,
    /// What it holds when whole; what is wrong with it (the offset, the
    /// next step) when not.
    pub verdict: Result<String, String>,
}

impl std::fmt::Display for FileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match &self.verdict {
            Ok(what) => write!(f, "ok       {}: {what}", self.path.display()),
            Err(why) => write!(f, "DAMAGED  {why}"),
        }
    }
}

/// Checks `dir`'s format file, Raft log, snapshot and cluster time. An
/// error only when the directory cannot be checked at all (missing, or
/// held by a running node).
pub fn check_data_dir(dir: &Path) -> io::Result<Vec<FileReport>> {
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: not a directory", dir.display()),
        ));
    }
    let log_dir = dir.join(LOG_DIR);
    let log = if log_dir.is_dir() {
        Some(LockedLog::lock(&log_dir).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => io::Error::new(
                e.kind(),
                format!("{e}; stop the node first: fenced check reads a stopped node's files"),
            ),
            _ => e,
        })?)
    } else {
        None
    };
    let mut reports = Vec::new();
    let marker_path = dir.join(crate::repair::marker::FILE_NAME);
    if marker_path.exists() {
        reports.push(FileReport {
            path: marker_path,
            verdict: match crate::repair::marker::read(dir) {
                Ok(Some(m)) => Ok(format!("node {} is being repaired ({:?})", m.node, m.step)),
                Ok(None) => Ok("removed meanwhile".into()),
                Err(e) => Err(format!(
                    "{e}; run fenced repair again: the directory holds nothing that is not in the peers"
                )),
            },
        });
    }
    let format_path = dir.join(data_format::FILE_NAME);
    let layout = data_format::check(dir);
    reports.push(FileReport {
        path: format_path,
        verdict: match &layout {
            Ok(Some(v)) => Ok(format!("data format {v}")),
            Ok(None) => Ok("absent: data format 1, written before the file existed".into()),
            Err(e) => Err(e.to_string()),
        },
    });
    reports.push(FileReport {
        path: log_dir.clone(),
        verdict: match &log {
            Some(log) => log
                .verify()
                .map(|n| format!("{n} records, each matching its CRC"))
                .map_err(|e| e.to_string()),
            None => Err(format!(
                "{}: missing; a node that ever started has it",
                log_dir.display()
            )),
        },
    });
    let unframed = matches!(layout, Ok(v) if v.is_none_or(|v| v < data_format::FRAMED));
    reports.push(check_snapshot(&dir.join(STATE_DIR), unframed));
    reports.push(check_cluster_time(dir));
    drop(log);
    Ok(reports)
}

fn check_snapshot(state: &Path, unframed: bool) -> FileReport {
    let path = state.join(state_machine::SNAPSHOT_FILE);
    let verdict = match std::fs::read(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok("absent: no snapshot yet".into()),
        Err(e) => Err(format!("{}: {e}", path.display())),
        Ok(bytes) => state_machine::check_snapshot_file(&path, &bytes, unframed),
    };
    FileReport { path, verdict }
}

fn check_cluster_time(dir: &Path) -> FileReport {
    let path = dir.join(floor::FILE_NAME);
    let verdict = match std::fs::read(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok("absent: no time made durable".into()),
        Err(e) => Err(format!("{}: {e}", path.display())),
        Ok(bytes) => cluster_time_verdict(&path, &bytes).map_err(|d| d.to_string()),
    };
    FileReport { path, verdict }
}

/// The cluster-time file's bytes: each slot whole, of a version this build
/// reads, or never written (zeros), and nothing outside the slots. A slot
/// that fails its CRC is reported although a node starts from the other
/// (it cannot tell a write a crash cut from damage).
pub(crate) fn cluster_time_verdict(path: &Path, bytes: &[u8]) -> Result<String, Damaged> {
    let mut best = None;
    let slot_at = |o: u64| usize::try_from(o).unwrap_or(usize::MAX);
    for offset in floor::SLOT_OFFSETS.map(slot_at) {
        let end = offset.saturating_add(floor::SLOT_LEN).min(bytes.len());
        let slot = bytes.get(offset..end).unwrap_or_default();
        if slot.iter().all(|b| *b == 0) {
            continue;
        }
        if let Some(v) = floor::slot_version(slot).filter(|v| *v > floor::FORMAT_VERSION) {
            return Err(Damaged::new(
                path,
                offset,
                format!("a slot of version {v}, newer than this build reads"),
            ));
        }
        match floor::decode_slot(slot) {
            Some(t) => best = best.max(Some(t)),
            None => {
                return Err(Damaged::new(
                    path,
                    offset,
                    "the slot fails its CRC (a node starts from the other slot, as after a \
                     write a crash cut)",
                ))
            }
        }
    }
    let in_slot = |i: usize| {
        floor::SLOT_OFFSETS
            .map(slot_at)
            .iter()
            .any(|&o| i >= o && i < o.saturating_add(floor::SLOT_LEN))
    };
    if let Some(i) = (0..bytes.len()).find(|&i| !in_slot(i) && bytes.get(i) != Some(&0)) {
        return Err(Damaged::new(
            path,
            i,
            "a byte outside the slots is not zero",
        ));
    }
    Ok(match best {
        Some(t) => format!("time {} ms of term {}", t.at.as_millis(), t.term),
        None => "no time yet".into(),
    })
}

/// The check's exit status: 0 when every file is whole.
pub fn all_whole(reports: &[FileReport]) -> bool {
    reports.iter().all(|r| r.verdict.is_ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::storage::log_store::LogStore;

    /// A copy of `tests/fixtures/v1/data`: a one-node data dir of the
    /// release before the checksum frame (data format 1).
    fn fixture() -> tempfile::TempDir {
        fn copy(from: &Path, to: &Path) {
            std::fs::create_dir_all(to).unwrap();
            for entry in std::fs::read_dir(from).unwrap() {
                let entry = entry.unwrap();
                let target = to.join(entry.file_name());
                if entry.file_type().unwrap().is_dir() {
                    copy(&entry.path(), &target);
                } else {
                    std::fs::copy(entry.path(), target).unwrap();
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/v1/data");
        copy(&from, dir.path());
        dir
    }

    /// [`fixture`] as a node of this release leaves it after its start:
    /// the snapshot in its frame, data format 2.
    fn upgraded_fixture() -> tempfile::TempDir {
        let dir = fixture();
        let log = LogStore::open(&dir.path().join(LOG_DIR)).unwrap();
        crate::state_machine::StateMachine::open(
            &dir.path().join(STATE_DIR),
            crate::state_machine::parking::Parking::new(4),
            log.purge_horizon(),
            16,
        )
        .unwrap();
        drop(log);
        data_format::write(dir.path()).unwrap();
        dir
    }

    fn verdicts(dir: &Path) -> Vec<(String, bool)> {
        check_data_dir(dir)
            .unwrap()
            .iter()
            .map(|r| (r.to_string(), r.verdict.is_ok()))
            .collect()
    }

    fn flip(path: &Path, at: usize) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[at] ^= 0x10;
        std::fs::write(path, bytes).unwrap();
    }

    fn wal(dir: &Path) -> PathBuf {
        std::fs::read_dir(dir.join(LOG_DIR))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "wal"))
            .unwrap()
    }

    #[test]
    fn a_whole_data_dir_of_the_release_before_checks_ok() {
        let dir = fixture();
        let got = verdicts(dir.path());
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got.iter().all(|(_, ok)| *ok), "{got:?}");
        assert!(got[0].0.contains("data format 1"), "{got:?}");
        assert!(
            got[1].0.contains("records, each matching its CRC"),
            "{got:?}"
        );
        assert!(
            got[2].0.contains("written before the checksum frame"),
            "{got:?}"
        );
        assert!(got[3].0.starts_with("ok "), "{got:?}");
    }

    #[test]
    fn each_damaged_file_is_reported_by_name_with_its_offset() {
        let dir = upgraded_fixture();
        let got = verdicts(dir.path());
        assert!(got.iter().all(|(_, ok)| *ok), "{got:?}");
        assert!(got[0].0.contains("data format 2"), "{got:?}");
        assert!(got[2].0.contains("matches its CRC"), "{got:?}");
        flip(&dir.path().join("state/snapshot.bin"), 40);
        flip(&wal(dir.path()), 100);
        flip(&dir.path().join(floor::FILE_NAME), 6);
        let got = verdicts(dir.path());
        assert!(got[0].1, "{got:?}");
        for (line, ok) in &got[1..] {
            assert!(!ok && line.starts_with("DAMAGED  "), "{line}");
            assert!(line.contains(&dir.path().display().to_string()), "{line}");
            assert!(line.contains("offset"), "{line}");
            assert!(line.contains("A damaged node"), "{line}");
        }
        assert!(got[3].0.contains("damaged at offset 0"), "{got:?}");
    }

    #[test]
    fn a_damaged_log_is_refused_at_open_naming_the_directory_and_the_next_step() {
        let dir = fixture();
        flip(&wal(dir.path()), 100);
        let log_dir = dir.path().join(LOG_DIR);
        let e = LogStore::open(&log_dir)
            .map_err(|e| crate::storage::log_store::unreadable_log(&log_dir, e))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.starts_with(&format!("{}: the Raft log is damaged", log_dir.display()))
                && e.contains("A damaged node"),
            "{e}"
        );
    }

    #[test]
    fn a_directory_a_node_holds_is_not_checked() {
        let dir = fixture();
        let _held = LogStore::open(&dir.path().join(LOG_DIR)).unwrap();
        let e = check_data_dir(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(e.to_string().contains("stop the node first"), "{e}");
    }

    #[test]
    fn every_flipped_bit_and_cut_of_the_cluster_time_file_is_reported() {
        let dir = fixture();
        let path = dir.path().join(floor::FILE_NAME);
        let good = std::fs::read(&path).unwrap();
        assert!(cluster_time_verdict(&path, &good).is_ok());
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[i] ^= 1 << bit;
                let e = cluster_time_verdict(&path, &bad).unwrap_err();
                assert!(e.to_string().contains("A damaged node"), "{e}");
            }
        }
        for cut in 1..good.len() {
            assert!(cluster_time_verdict(&path, &good[..cut]).is_err(), "{cut}");
        }
    }
}
