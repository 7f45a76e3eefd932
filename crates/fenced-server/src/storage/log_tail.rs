//! The end of the Raft log's last chunk, where a write a crash cut short
//! and damage can look alike: what raft-log would drop as a torn write is
//! checked first (docs/DECISIONS.md, "A damaged node").

use std::{io, path::Path};

use raft_log::codeq::Decode;

/// Whether `path` names one of raft-log's chunk files (`r-OFFSET.wal`).
pub fn is_chunk(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("r-") && n.ends_with(".wal"))
}

/// The log's last chunk file in `dir` and its length (chunk names are
/// zero-padded, so the last in name order is the newest).
pub fn last_chunk(dir: &Path) -> io::Result<(std::path::PathBuf, u64)> {
    let mut last: Option<std::path::PathBuf> = None;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if is_chunk(&path) && last.as_ref().is_none_or(|l| path > *l) {
            last = Some(path);
        }
    }
    let path = last.ok_or_else(|| io::Error::other("the log has no chunk file"))?;
    let len = std::fs::metadata(&path)?.len();
    Ok((path, len))
}

/// How far past a record that fails its check the last chunk is searched
/// for a whole one (a chunk closes at `LOG_CHUNK_BYTES`, 16 MiB; one of an
/// older release may be larger): what is read into memory at most.
const TAIL_SEARCH_BYTES: u64 = 64 << 20;

/// A sector: a crash loses whole ones.
const SECTOR: u64 = 512;

/// Checks the log's last chunk before raft-log opens it, where a write a
/// crash cut short and damage can look alike.
///
/// raft-log drops the tail of the last chunk from a record that ends
/// early, or from one followed by zeros only: a torn write. But a flipped
/// length that runs past the end, or a zeroed sector before the end, reads
/// the same way and would drop every record after it, records the node
/// acknowledged. A cut has nothing whole after it; such damage has: a
/// record whose CRC is right, past the one that failed. That is refused.
///
/// A crash can also leave a record's first sectors written and zeros from
/// a sector boundary on (a file system that wrote the length first);
/// raft-log refuses that as damage. With nothing whole after it, it is the
/// same torn write: the chunk is cut at that record, as raft-log cuts one
/// that ends early.
pub fn refuse_damage_before_the_tail<T: raft_log::Types>(dir: &Path) -> io::Result<()> {
    let Ok((chunk, len)) = last_chunk(dir) else {
        return Ok(());
    };
    let Some(failed) = first_failed_record::<T>(&chunk, len)? else {
        return Ok(());
    };
    let tail = read_from(&chunk, failed, TAIL_SEARCH_BYTES)?;
    if let Some(whole) = (1..tail.len()).find(|&at| whole_record_at::<T>(&tail[at..])) {
        let whole = failed.saturating_add(u64::try_from(whole).unwrap_or(u64::MAX));
        return Err(crate::storage::checksum::Damaged::new(
            &chunk,
            usize::try_from(failed).unwrap_or(usize::MAX),
            format!(
                "a Raft log record fails its check and a whole record follows at offset {whole} \
                 (not a write a crash cut short)"
            ),
        )
        .into());
    }
    let whole_tail_read =
        u64::try_from(tail.len()).unwrap_or(u64::MAX) >= len.saturating_sub(failed);
    if let Some(zeros_from) = torn_into_zeros(&tail, failed).filter(|_| whole_tail_read) {
        tracing::warn!(
            chunk = %chunk.display(),
            offset = failed,
            zeros_from,
            "the Raft log's last record was cut short by a crash (zeros from a sector on): \
             dropped, as a write never acknowledged"
        );
        let file = std::fs::OpenOptions::new().write(true).open(&chunk)?;
        file.set_len(failed)?;
        file.sync_all()?;
    }
    Ok(())
}

/// Up to `max` bytes of `path` from `offset` on.
fn read_from(path: &Path, offset: u64, max: u64) -> io::Result<Vec<u8>> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(path)?;
    file.seek(io::SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The file offset of the sector boundary past `start` from which `tail`
/// (the file's bytes from `start` to its end) holds only zeros, if there is
/// one before the end: the mark of a write a crash cut short on a file
/// system that wrote the file's length before its data.
fn torn_into_zeros(tail: &[u8], start: u64) -> Option<u64> {
    let data = tail.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let last_data = start.checked_add(u64::try_from(data).ok()?)?;
    let end = start.checked_add(u64::try_from(tail.len()).ok()?)?;
    let zeros_from = last_data.div_ceil(SECTOR).checked_mul(SECTOR)?;
    (zeros_from > start && zeros_from < end).then_some(zeros_from)
}

/// Counts the bytes read through it: where a record begins.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: io::Read> io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read = self
            .read
            .saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
        Ok(n)
    }
}

/// The offset of the first record of the chunk file at `path` (`len` bytes
/// long) that does not decode whole, read in one pass without holding it.
fn first_failed_record<T: raft_log::Types>(path: &Path, len: u64) -> io::Result<Option<u64>> {
    let mut reader = Counted {
        inner: io::BufReader::new(std::fs::File::open(path)?),
        read: 0,
    };
    while reader.read < len {
        let at = reader.read;
        if raft_log::RaftLogRecord::<T>::decode(&mut reader).is_err() {
            return Ok(Some(at));
        }
    }
    Ok(None)
}

/// Where each whole record of a chunk file's bytes starts, up to the first
/// that fails its check (and that one's offset, if one does). For
/// `fenced check` and for the simulation, which must know where the last
/// record starts (damage inside it reads as a write a crash cut short).
pub fn whole_records<T: raft_log::Types>(chunk: &[u8]) -> (Vec<usize>, Option<usize>) {
    let mut starts = Vec::new();
    let mut cursor = io::Cursor::new(chunk);
    loop {
        let Ok(at) = usize::try_from(cursor.position()) else {
            return (starts, None);
        };
        if at >= chunk.len() {
            return (starts, None);
        }
        if raft_log::RaftLogRecord::<T>::decode(&mut cursor).is_err() {
            return (starts, Some(at));
        }
        starts.push(at);
    }
}

/// Whether a record whose checksum is right starts `bytes`. Records start
/// with a big-endian type below 8: other offsets are passed over at once.
fn whole_record_at<T: raft_log::Types>(bytes: &[u8]) -> bool {
    matches!(bytes, [0, 0, 0, t, ..] if *t < 8)
        && raft_log::RaftLogRecord::<T>::decode(io::Cursor::new(bytes)).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::storage::log_store::{testing::log_with_blanks, LogStore, WalTypes};

    /// A log of 40 blank entries in `dir`, closed; its last chunk's path,
    /// bytes and whole records' offsets.
    async fn closed_log(dir: &Path) -> (std::path::PathBuf, Vec<u8>, Vec<usize>) {
        drop(log_with_blanks(dir, 40, 40).await);
        let (chunk, _) = last_chunk(dir).unwrap();
        let bytes = std::fs::read(&chunk).unwrap();
        let (starts, failed) = whole_records::<WalTypes>(&bytes);
        assert_eq!(failed, None, "a log just written is whole");
        (chunk, bytes, starts)
    }

    fn refused(dir: &Path) -> String {
        let e = LogStore::open(dir).err().expect("the log must be refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        e.to_string()
    }

    #[tokio::test]
    async fn a_length_flipped_before_the_tail_is_refused_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (chunk, mut bytes, starts) = closed_log(dir.path()).await;
        // An append in the middle: type 1, then the log id (24 bytes), then
        // the payload's length, whose top bit now runs it past the end.
        let at = starts[starts.len() / 2..]
            .iter()
            .copied()
            .find(|s| bytes[*s..*s + 4] == [0, 0, 0, 1])
            .unwrap();
        bytes[at + 28] ^= 0x80;
        std::fs::write(&chunk, &bytes).unwrap();
        let text = refused(dir.path());
        assert!(text.contains("a whole record follows"), "{text}");
        assert!(text.contains("fenced repair"), "{text}");
        assert!(text.contains(&chunk.display().to_string()), "{text}");
        assert_eq!(
            std::fs::read(&chunk).unwrap(),
            bytes,
            "nothing of the damaged chunk is cut"
        );
    }

    #[tokio::test]
    async fn a_zeroed_sector_before_the_tail_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (chunk, mut bytes, starts) = closed_log(dir.path()).await;
        let last = *starts.last().unwrap();
        assert!(last > 1024, "the chunk holds more than two sectors");
        bytes[512..1024].fill(0);
        std::fs::write(&chunk, &bytes).unwrap();
        let text = refused(dir.path());
        assert!(text.contains("fenced repair"), "{text}");
    }

    #[tokio::test]
    async fn a_flip_inside_the_last_record_is_refused_by_its_crc() {
        let dir = tempfile::tempdir().unwrap();
        let (chunk, mut bytes, starts) = closed_log(dir.path()).await;
        let last = *starts.last().unwrap();
        let end = bytes.len() - 1;
        bytes[end] ^= 1;
        std::fs::write(&chunk, &bytes).unwrap();
        refused(dir.path());
        assert!(std::fs::metadata(&chunk).unwrap().len() > u64::try_from(last).unwrap());
    }

    #[tokio::test]
    async fn a_tail_cut_short_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (chunk, bytes, starts) = closed_log(dir.path()).await;
        let last = *starts.last().unwrap();
        let cut = last + (bytes.len() - last) / 2;
        std::fs::write(&chunk, &bytes[..cut]).unwrap();
        let log = LogStore::open(dir.path()).expect("a torn write is not damage");
        drop(log);
        let (_, failed) = whole_records::<WalTypes>(&std::fs::read(&chunk).unwrap());
        assert_eq!(failed, None, "the cut record is gone");
    }

    #[tokio::test]
    async fn a_tail_torn_into_zeros_is_dropped_at_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let (chunk, bytes, starts) = closed_log(dir.path()).await;
        let last = *starts.last().unwrap();
        // The record's first bytes written (its type and log id, not all
        // zeros), zeros from a sector on.
        let mut torn = bytes[..last + 30].to_vec();
        assert!(torn[last..].iter().any(|b| *b != 0));
        torn.resize((last + 30).div_ceil(512) * 512 + 512, 0);
        std::fs::write(&chunk, &torn).unwrap();
        let log = LogStore::open(dir.path()).expect("a torn write is not damage");
        drop(log);
        assert_eq!(
            std::fs::metadata(&chunk).unwrap().len(),
            u64::try_from(last).unwrap(),
            "cut at the torn record"
        );
    }

    #[test]
    fn zeros_count_only_from_a_sector_past_the_failed_record() {
        // The file's bytes from offset 100 on: data to 600, zeros to 2048.
        let mut tail = vec![1u8; 500];
        tail.resize(1948, 0);
        assert_eq!(torn_into_zeros(&tail, 100), Some(1024));
        assert_eq!(
            torn_into_zeros(&[0u8; 1024], 1024),
            None,
            "zeros from the record on"
        );
        assert_eq!(torn_into_zeros(&[1u8; 1024], 100), None, "no zeros at all");
    }
}
