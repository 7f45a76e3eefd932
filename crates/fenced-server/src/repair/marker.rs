//! The `repair` file of a data directory: present while the node is being
//! repaired, with the step it reached, in a checksum frame like every file
//! of the directory. `fenced repair` writes it; the node removes it once it
//! votes again.

use std::{io, path::Path};

use fenced_os::write_atomically;
use serde::{Deserialize, Serialize};

use crate::{
    codec,
    storage::checksum::{self, Damaged},
    types::NodeId,
};

pub const FILE_NAME: &str = "repair";

/// How far the repair went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// Nothing yet: the node answers no Raft call until it stored a vote
    /// at the fence ([`super::fence::fence`]).
    Fence,
    /// The fence is stored at `term`: the node takes the log, votes for no
    /// one and does not stand until it applied as far as a leader of that
    /// term or a newer one had logged ([`super::fence::catch_up_target`]).
    CatchUp { term: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The node being repaired: a data directory moved to another node's
    /// place is refused.
    pub node: NodeId,
    pub step: Step,
}

/// The file's bytes: the marker in fenced's codec, in a checksum frame.
pub fn encode(marker: &Marker) -> io::Result<Vec<u8>> {
    let body = codec::encode("repair marker", marker).map_err(io::Error::other)?;
    Ok(checksum::frame(&body))
}

/// The marker in `bytes`, read from `path` (named in the error).
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Marker, Damaged> {
    let body = checksum::unframe(path, bytes)?;
    codec::decode("repair marker", body).map_err(|e| {
        Damaged::new(
            path,
            checksum::HEADER_LEN,
            format!("not a repair marker: {e}"),
        )
    })
}

/// The marker in `data_dir`, if the node is being repaired.
pub fn read(data_dir: &Path) -> io::Result<Option<Marker>> {
    let path = data_dir.join(FILE_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(decode(&path, &bytes)?)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

/// Writes the marker atomically (synced).
pub fn write(data_dir: &Path, marker: &Marker) -> io::Result<()> {
    write_atomically(&data_dir.join(FILE_NAME), &encode(marker)?)
}

/// Removes the marker, durably: the repair is over.
pub fn remove(data_dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(data_dir.join(FILE_NAME)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::File::open(data_dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_marker_round_trips_and_a_flipped_bit_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let marker = Marker {
            node: 3,
            step: Step::CatchUp { term: 4 },
        };
        write(dir.path(), &marker).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(marker));
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 9;
        bytes[last] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("repair"), "{err}");
        remove(dir.path()).unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        // Removing twice is not an error: a crash may come between.
        remove(dir.path()).unwrap();
    }
}
