//! The checksum frame around every file a node writes in its data dir
//! (besides the Raft log, which has its own, and `cluster-time`, whose
//! slots carry theirs): a magic, the file's content, the content's length
//! and a CRC32 of everything before the CRC.
//!
//! ```text
//! offset 0       8 bytes   magic "fncdsum1"
//! offset 8       n bytes   content (what the file held before it had a frame)
//! offset 8+n     8 bytes   n, big-endian
//! offset 16+n    4 bytes   CRC32 (IEEE) of bytes 0..16+n, big-endian
//! ```
//!
//! Pure: the frame is computed and checked over bytes the caller read or
//! writes. A file that fails its check is [`Damaged`], an error that names
//! the file, the offset where the check failed and what to do next.

use std::{
    io::{self, Write},
    path::{Path, PathBuf},
};

/// The frame's first bytes. Its first byte, `f`, is at least two bit flips
/// away from the first byte of every file written before the frame (the
/// codec's version byte 1; the format file's text starts with this `f`,
/// and is told apart by the rest of the magic).
pub const MAGIC: [u8; 8] = *b"fncdsum1";
pub const HEADER_LEN: usize = MAGIC.len();
/// The content's length (u64) and the CRC (u32).
pub const TRAILER_LEN: usize = 12;
/// What an operator does about a damaged file.
pub const NEXT_STEP: &str = "the node loads nothing from it; stop it and rebuild it from its peers \
     with `fenced repair --data-dir DIR --node-id ID`, then start it (docs/OPERATIONS.md, \"A damaged node\")";

/// A file that failed its check: nothing in it is used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: damaged at offset {offset}: {what}; {NEXT_STEP}", path.display())]
pub struct Damaged {
    pub path: PathBuf,
    /// Where the check failed: the byte that is wrong, or the field whose
    /// value the bytes do not match.
    pub offset: u64,
    pub what: String,
}

impl Damaged {
    pub fn new(path: &Path, offset: usize, what: impl Into<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            offset: u64::try_from(offset).unwrap_or(u64::MAX),
            what: what.into(),
        }
    }
}

impl From<Damaged> for io::Error {
    fn from(d: Damaged) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, d)
    }
}

/// Whether `bytes` start as a framed file does (its check is still to be
/// made by [`unframe`]).
pub fn is_framed(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// `content` in its frame.
pub fn frame(content: &[u8]) -> Vec<u8> {
    let mut framer = Framer::new();
    let mut out = Vec::with_capacity(
        HEADER_LEN
            .saturating_add(content.len())
            .saturating_add(TRAILER_LEN),
    );
    out.extend_from_slice(&MAGIC);
    framer.update(content);
    out.extend_from_slice(content);
    out.extend_from_slice(&framer.trailer());
    out
}

/// The content of the framed file `path` whose bytes are `bytes`, once
/// its magic, length and CRC hold; `path` only names the file in the error.
pub fn unframe<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a [u8], Damaged> {
    let damaged = |offset, what: String| Damaged::new(path, offset, what);
    let magic_len = bytes.len().min(HEADER_LEN);
    if let Some(at) = (0..magic_len).find(|&i| bytes.get(i) != MAGIC.get(i)) {
        return Err(damaged(
            at,
            "the checksum frame's magic is not there".into(),
        ));
    }
    let framed_min = HEADER_LEN + TRAILER_LEN;
    if bytes.len() < framed_min {
        return Err(damaged(
            bytes.len(),
            format!(
                "the file ends after {} bytes, shorter than an empty frame ({framed_min})",
                bytes.len()
            ),
        ));
    }
    let crc_at = bytes.len() - 4;
    let len_at = crc_at - 8;
    let declared = be_u64(&bytes[len_at..crc_at]);
    let held = len_at - HEADER_LEN;
    if usize::try_from(declared).ok() != Some(held) {
        return Err(damaged(
            len_at,
            format!(
                "the length field says {declared} content bytes, the file holds {held} \
                 (cut short, or the field is damaged)"
            ),
        ));
    }
    let stored = be_u32(&bytes[crc_at..]);
    let computed = crc32fast::hash(&bytes[..crc_at]);
    // CANARY (planted in a `canaries` build, `canary::on`): a file whose
    // CRC fails is loaded anyway.
    if stored != computed && !fenced_core::canary::on(fenced_core::canary::Canary::SkipChecksum) {
        return Err(damaged(
            crc_at,
            format!(
                "the CRC32 there ({stored:08x}) is not that of bytes 0..{crc_at} \
                 ({computed:08x})"
            ),
        ));
    }
    Ok(&bytes[HEADER_LEN..len_at])
}

fn be_u64(b: &[u8]) -> u64 {
    b.iter().fold(0, |v, &x| (v << 8) | u64::from(x))
}

fn be_u32(b: &[u8]) -> u32 {
    b.iter().fold(0, |v, &x| (v << 8) | u32::from(x))
}

/// The CRC and length of a frame's content as it is written piece by
/// piece.
#[derive(Clone)]
pub struct Framer {
    crc: crc32fast::Hasher,
    len: u64,
}

impl Default for Framer {
    fn default() -> Self {
        Self::new()
    }
}

impl Framer {
    pub fn new() -> Self {
        let mut crc = crc32fast::Hasher::new();
        crc.update(&MAGIC);
        Self { crc, len: 0 }
    }

    /// Counts the next bytes of the content.
    pub fn update(&mut self, content: &[u8]) {
        self.crc.update(content);
        self.len = self
            .len
            .saturating_add(u64::try_from(content.len()).unwrap_or(u64::MAX));
    }

    /// The trailer that closes the content counted so far.
    pub fn trailer(mut self) -> [u8; TRAILER_LEN] {
        let len = self.len.to_be_bytes();
        self.crc.update(&len);
        let mut out = [0u8; TRAILER_LEN];
        out[..8].copy_from_slice(&len);
        out[8..].copy_from_slice(&self.crc.finalize().to_be_bytes());
        out
    }
}

/// Writes a framed file into `inner` as its content is written through
/// it: the magic first, the trailer at [`FramedWriter::finish`].
pub struct FramedWriter<W: Write> {
    inner: W,
    framer: Framer,
}

impl<W: Write> FramedWriter<W> {
    pub fn new(mut inner: W) -> io::Result<Self> {
        inner.write_all(&MAGIC)?;
        Ok(Self {
            inner,
            framer: Framer::new(),
        })
    }

    /// Writes the trailer and hands back the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.inner.write_all(&self.framer.trailer())?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for FramedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.framer.update(buf.get(..n).unwrap_or(buf));
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn path() -> PathBuf {
        PathBuf::from("/d/state/snapshot.bin")
    }

    #[test]
    fn a_frame_holds_its_content_and_a_written_one_is_the_same_bytes() {
        for content in [&b""[..], b"x", b"fenced-data-format 2\n", &[0u8; 1000][..]] {
            let framed = frame(content);
            assert_eq!(framed.len(), content.len() + HEADER_LEN + TRAILER_LEN);
            assert_eq!(unframe(&path(), &framed).unwrap(), content);
            let mut w = FramedWriter::new(Vec::new()).unwrap();
            for piece in content.chunks(7) {
                w.write_all(piece).unwrap();
            }
            assert_eq!(w.finish().unwrap(), framed);
        }
    }

    /// Every single-bit flip and every cut is refused, with the file's
    /// name, an offset inside the file and the next step.
    #[test]
    fn every_flipped_bit_and_every_cut_is_refused_by_name() {
        let framed = frame(b"some content of a file");
        for i in 0..framed.len() {
            for bit in 0..8 {
                let mut bad = framed.clone();
                bad[i] ^= 1 << bit;
                let e = unframe(&path(), &bad).unwrap_err();
                assert!(e.offset <= bad.len() as u64, "{e}");
                let text = e.to_string();
                assert!(
                    text.starts_with("/d/state/snapshot.bin: damaged at offset")
                        && text.contains("A damaged node"),
                    "{text}"
                );
            }
        }
        for cut in 0..framed.len() {
            let e = unframe(&path(), &framed[..cut]).unwrap_err();
            assert!(e.offset <= cut as u64, "{e}");
        }
    }

    #[test]
    fn the_offset_points_at_what_failed() {
        let framed = frame(b"abcdef");
        let mut bad = framed.clone();
        bad[3] ^= 1;
        assert_eq!(unframe(&path(), &bad).unwrap_err().offset, 3);
        let mut bad = framed.clone();
        bad[HEADER_LEN + 2] ^= 1;
        let crc_at = framed.len() - 4;
        assert_eq!(unframe(&path(), &bad).unwrap_err().offset, crc_at as u64);
        let cut = &framed[..framed.len() - 1];
        assert_eq!(
            unframe(&path(), cut).unwrap_err().offset,
            (cut.len() - 12) as u64
        );
    }

    #[test]
    fn files_written_before_the_frame_are_not_framed() {
        assert!(!is_framed(&[1, 0, 0]));
        assert!(!is_framed(b"fenced-data-format 1\n"));
        assert!(is_framed(&frame(b"")));
        // A flip of the magic's first byte never makes the codec's
        // version byte.
        for bit in 0..8 {
            assert_ne!(MAGIC[0] ^ (1 << bit), 1);
        }
    }
}
