//! The version of a data directory's layout, in `DATA_DIR/format`.
//!
//! The Raft log's chunks and its vote and log-id records are raft-log's
//! own encoding, which carries no version of fenced's; this file does, for
//! the whole directory. A directory without it was written before the file
//! existed, in layout 1, and is accepted (the node then writes the file).
//! A newer version is refused by name before anything in the directory is
//! read. From layout 2 on, the file is in a checksum frame
//! ([`crate::storage::checksum`]), as is every file of the directory that has no
//! check of its own.

use std::{
    io,
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::Path,
};

use fenced_os::write_atomically;

use crate::storage::checksum::{self, Damaged};

pub const FILE_NAME: &str = "format";

/// Where in the data directory the Raft log (entries, vote, commit mark)
/// and the state machine's snapshot live.
pub const LOG_DIR: &str = "raft-log";
pub const STATE_DIR: &str = "state";
/// The layout this build writes. 1: `raft-log/` (raft-log 0.4 chunks,
/// entries in codec version 1), `state/snapshot.bin` (codec version 1,
/// table snapshot version 1), `cluster-time` (slot version 1). 2: the same,
/// with `format` and `state/snapshot.bin` in a checksum frame.
pub const VERSION: u32 = 2;
/// The first layout whose files carry a checksum frame.
pub const FRAMED: u32 = 2;
const PREFIX: &str = "fenced-data-format ";

/// The version `dir` was written in: `None` for a directory without the
/// file (layout 1, or nothing yet); an error for a version this build does
/// not read, or a damaged file, naming the file.
pub fn check(dir: &Path) -> io::Result<Option<u32>> {
    let path = dir.join(FILE_NAME);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let version = parse(&path, &bytes)?;
    if version > VERSION {
        return Err(io::Error::other(format!(
            "{}: data format version {version} is newer than this build reads ({VERSION}); \
             run the release that wrote it, or a newer one",
            path.display()
        )));
    }
    Ok(Some(version))
}

/// The version the bytes of the format file `path` hold. A file of layout
/// 1 is plain text; one of a later layout must be in its frame, so a file
/// that is neither is damaged.
fn parse(path: &Path, bytes: &[u8]) -> Result<u32, Damaged> {
    let framed = checksum::is_framed(bytes);
    let text = if framed {
        checksum::unframe(path, bytes)?
    } else {
        bytes
    };
    let version = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.trim().strip_prefix(PREFIX))
        .and_then(|v| v.parse::<u32>().ok());
    let at = if framed { checksum::HEADER_LEN } else { 0 };
    match version {
        // A newer layout is refused as newer by the caller, framed or not.
        Some(v) if framed || v < FRAMED || v > VERSION => Ok(v),
        Some(v) => Err(Damaged::new(
            path,
            0,
            format!(
                "version {v} but no checksum frame, which every file of version {FRAMED} on has"
            ),
        )),
        None => Err(Damaged::new(
            path,
            at,
            format!("not a fenced data format file (expected \"{PREFIX}N\")"),
        )),
    }
}

/// Writes the file for the current version (atomically, synced).
pub fn write(dir: &Path) -> io::Result<()> {
    write_atomically(
        &dir.join(FILE_NAME),
        &checksum::frame(format!("{PREFIX}{VERSION}\n").as_bytes()),
    )
}

/// Makes `dir` and any missing parent readable by this user only (0700),
/// and tightens `dir` to 0700 if it was there already: a data directory,
/// its stores and a certificate directory hold owner ids and keys. The
/// error names the directory.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", dir.display()));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(named)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(named)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_current_version_and_none_are_read_and_a_newer_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(dir.path()).unwrap(), None);
        write(dir.path()).unwrap();
        assert_eq!(check(dir.path()).unwrap(), Some(VERSION));
        std::fs::write(dir.path().join(FILE_NAME), "fenced-data-format 9\n").unwrap();
        let e = check(dir.path()).unwrap_err().to_string();
        assert!(e.contains("format") && e.contains("version 9"), "{e}");
        std::fs::write(dir.path().join(FILE_NAME), "junk").unwrap();
        assert!(check(dir.path()).is_err());
    }

    #[test]
    fn a_private_dir_is_made_0700_and_an_open_one_tightened() {
        let root = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let nested = root.path().join("a").join("b");
        private_dir(&nested).unwrap();
        assert_eq!(mode(&nested), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
        let file = root.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = private_dir(&file.join("under")).unwrap_err().to_string();
        assert!(e.contains("under"), "{e}");
    }

    #[test]
    fn a_format_file_of_layout_1_is_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), "fenced-data-format 1\n").unwrap();
        assert_eq!(check(dir.path()).unwrap(), Some(1));
        // Layout 2 and on are framed: plain text saying 2 is refused.
        std::fs::write(dir.path().join(FILE_NAME), "fenced-data-format 2\n").unwrap();
        let e = check(dir.path()).unwrap_err().to_string();
        assert!(e.contains("damaged at offset 0"), "{e}");
    }

    /// Every bit of the file flipped, one at a time, and every cut: each is
    /// refused, naming the file, the offset and the next step.
    #[test]
    fn a_damaged_format_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path()).unwrap();
        let path = dir.path().join(FILE_NAME);
        let good = std::fs::read(&path).unwrap();
        let refused = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            let e = check(dir.path()).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{}: ", path.display()))
                    && e.contains("damaged at offset")
                    && e.contains("A damaged node"),
                "{e}"
            );
        };
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[i] ^= 1 << bit;
                refused(&bad);
            }
        }
        for cut in 0..good.len() {
            refused(&good[..cut]);
        }
    }
}
