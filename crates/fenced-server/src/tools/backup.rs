//! Backups of a cluster's state and new clusters laid down from them
//! (`fenced restore`), or from one survivor's data (`fenced recover
//! --force-new-cluster`).
//!
//! The rule that keeps fencing safe across both: a new cluster never grants
//! a token at or below one the old cluster may have granted. The old cluster
//! may have gone on granting after the backup (or its dead majority may have
//! committed grants the survivor never saw), so the token counter, which is
//! the table's own and serves every resource, known or new, is raised by a
//! gap ([`default_token_gap`]) or to a floor the operator states. Leases in
//! the state keep their expiry in cluster time, and the new cluster's clock
//! starts at the state's last stamp, so a lease live in the backup stays
//! held for at least the time it had left.
//!
//! A backup file: the magic `fncdbkp\0`, the format version (u32 BE), the
//! body's length (u64 BE), the body ([`BackupBody`] in the versioned codec)
//! and the SHA-256 of everything before it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use openraft::{storage::RaftStateMachine, CommittedLeaderId, Membership, RaftLogReader};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use fenced_core::MAX_TOKEN_FLOOR;

use crate::{
    codec,
    state_machine::parking::Parking,
    state_machine::{self, RestoredState, StateExport, StateMachine},
    storage::data_format,
    storage::log_store::LogStore,
    types::{LogId, Node, NodeId, StoredMembership},
};

pub const MAGIC: &[u8; 8] = b"fncdbkp\0";
/// The backup file's layout. Version 1 is the only one so far.
pub const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 8;
const DIGEST_LEN: usize = 32;
/// The largest backup read or accepted (the state of 100,000 leases is
/// tens of MB).
pub const MAX_BACKUP_BYTES: u64 = 1 << 31;

/// An upper bound on the grants a cluster makes in a second: more than a
/// hundred times the highest rate measured (about 8,400 cycles/s, docs/BENCHMARKS.md),
/// and what 4,096-command entries committed every 4 ms would give.
pub const MAX_GRANTS_PER_SECOND: u64 = 1_000_000;
/// Added to a backup's age when the gap is computed: the time the old
/// cluster may have run on before it was stopped, and the disagreement of
/// the clocks that date the backup and the restore.
pub const GAP_MARGIN_SECONDS: u64 = 86_400;

/// What a backup holds: the state machine's snapshot body and the facts a
/// restore checks or prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupBody {
    /// Wall clock of the node that took it (dates the backup for the gap).
    pub created_unix_ms: u64,
    pub source_node: NodeId,
    pub last_applied: Option<LogId>,
    pub cluster_time_ms: u64,
    pub last_token: u64,
    pub live_leases: u64,
    /// Everything the state machine holds, as its snapshots encode it.
    pub state: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a fenced backup ({reason})")]
    NotABackup { path: PathBuf, reason: String },
    #[error(
        "{path}: backup format version {found} is not supported (this build reads {supported})"
    )]
    Version {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error(
        "{path}: corrupt or truncated backup: {reason}; use another copy of it, or take a new \
         one (fencectl snapshot save)"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error("{0}")]
    Refused(String),
}

/// Encodes a backup file.
pub fn encode(body: &BackupBody) -> Result<Vec<u8>, codec::CodecError> {
    let encoded = codec::encode("backup", body)?;
    let mut out = Vec::with_capacity(HEADER_LEN + encoded.len() + DIGEST_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    out.extend_from_slice(&(encoded.len() as u64).to_be_bytes());
    out.extend_from_slice(&encoded);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    Ok(out)
}

/// A backup of what `shared`'s state machine holds now.
pub fn from_export(export: StateExport, source_node: NodeId, created_unix_ms: u64) -> BackupBody {
    BackupBody {
        created_unix_ms,
        source_node,
        last_applied: export.last_applied,
        cluster_time_ms: export.cluster_time.as_millis(),
        last_token: export.last_token,
        live_leases: export.live_leases,
        state: export.body,
    }
}

/// Checks and decodes a backup file's bytes: magic, version, length,
/// checksum, then the body and the state in it, as a load would.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<BackupBody, BackupError> {
    let corrupt = |reason: String| BackupError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(BackupError::NotABackup {
            path: path.to_path_buf(),
            reason: "it does not start with the backup magic".into(),
        });
    }
    if bytes.len() < HEADER_LEN + DIGEST_LEN {
        return Err(corrupt(format!(
            "{} bytes, shorter than a header and checksum ({})",
            bytes.len(),
            HEADER_LEN + DIGEST_LEN
        )));
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&bytes[8..12]);
    let version = u32::from_be_bytes(v);
    if version != FORMAT_VERSION {
        return Err(BackupError::Version {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let mut l = [0u8; 8];
    l.copy_from_slice(&bytes[12..20]);
    let declared = u64::from_be_bytes(l);
    let actual = (bytes.len() - HEADER_LEN - DIGEST_LEN) as u64;
    if declared != actual {
        return Err(corrupt(format!(
            "the header declares {declared} body bytes (at offset 12), the file has {actual}"
        )));
    }
    let (content, digest) = bytes.split_at(bytes.len() - DIGEST_LEN);
    if Sha256::digest(content).as_slice() != digest {
        return Err(corrupt(format!(
            "the SHA-256 checksum does not match (the one at offset {0}, of bytes 0..{0})",
            content.len()
        )));
    }
    let body: BackupBody = codec::decode("backup", &content[HEADER_LEN..])
        .map_err(|e| corrupt(format!("body: {e}")))?;
    let state =
        state_machine::inspect_export(&body.state).map_err(|e| corrupt(format!("state: {e}")))?;
    // The floor is computed from the header's token: it must be the state's.
    if state.last_token != body.last_token {
        return Err(corrupt(format!(
            "the header's last token {} is not the state's {}",
            body.last_token, state.last_token
        )));
    }
    Ok(body)
}

/// Reads and checks a backup file (at most [`MAX_BACKUP_BYTES`]).
pub fn read(path: &Path) -> Result<BackupBody, BackupError> {
    let io = |source| BackupError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_BACKUP_BYTES {
        return Err(BackupError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("{len} bytes, more than the bound {MAX_BACKUP_BYTES}"),
        });
    }
    decode(path, &std::fs::read(path).map_err(io)?)
}

/// How far above a backup's last token a restore starts by default:
/// [`MAX_GRANTS_PER_SECOND`] times the backup's age plus
/// [`GAP_MARGIN_SECONDS`], so more than the old cluster could have granted
/// since, even at a hundred times its measured rate.
pub fn default_token_gap(created_unix_ms: u64, now_unix_ms: u64) -> u64 {
    let age_s = now_unix_ms.saturating_sub(created_unix_ms) / 1_000;
    MAX_GRANTS_PER_SECOND.saturating_mul(age_s.saturating_add(GAP_MARGIN_SECONDS))
}

/// Checks `--token-floor`: a whole number at most [`MAX_TOKEN_FLOOR`].
pub fn parse_token_floor(text: &str) -> Result<u64, String> {
    let bound = || format!("--token-floor must be a whole number at most {MAX_TOKEN_FLOOR} (2^62)");
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{}, got {text:?}", bound()))?;
    if n > MAX_TOKEN_FLOOR {
        return Err(format!("{}, got {n}", bound()));
    }
    Ok(n)
}

/// The floor for a new cluster from a state whose highest token is
/// `last_token`: `stated` if given (it must not be below `last_token`),
/// else `last_token` plus `gap`.
/// Either is refused above [`MAX_TOKEN_FLOOR`]: room for grants stays above
/// it, and a floor at the end of the counter would wrap to 0.
pub fn token_floor(last_token: u64, gap: u64, stated: Option<u64>) -> Result<u64, BackupError> {
    match stated {
        Some(n) if n > MAX_TOKEN_FLOOR => Err(BackupError::Refused(format!(
            "--token-floor: {n} is above the bound {MAX_TOKEN_FLOOR} (2^62)"
        ))),
        Some(n) if n < last_token => Err(BackupError::Refused(format!(
            "--token-floor: {n} is below the highest token in the state ({last_token}); \
             it must be at least that, and above every token the old cluster may have issued"
        ))),
        Some(n) => Ok(n),
        None => last_token
            .checked_add(gap)
            .filter(|f| *f <= MAX_TOKEN_FLOOR)
            .ok_or_else(|| {
                BackupError::Refused(format!(
                    "token floor: the state's highest token {last_token} plus the gap {gap} is \
                     above the bound {MAX_TOKEN_FLOOR} (2^62); state --token-floor between \
                     {last_token} and {MAX_TOKEN_FLOOR} if every token the old cluster may \
                     have issued is below it"
                ))
            }),
    }
}

pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a new data directory was laid down with.
#[derive(Debug, Clone)]
pub struct LaidDown {
    pub data_dir: PathBuf,
    pub state: RestoredState,
    pub token_floor: u64,
    pub members: BTreeSet<NodeId>,
}

/// Refuses a data directory that holds anything.
fn require_empty(dir: &Path) -> Result<(), BackupError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::Refused(format!(
                    "--data-dir {}: not empty; a restore lays down a new node and \
                     overwrites nothing",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BackupError::Io {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| BackupError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

/// Lays down, all or nothing, a data directory whose node starts from
/// `state` (an exported state machine body) as a member of `members`:
/// built beside `data_dir` under a temporary name, synced, then renamed
/// into place (`data_dir` must be missing or empty).
pub fn lay_down(
    data_dir: &Path,
    state: &[u8],
    index: u64,
    members: &BTreeMap<NodeId, Node>,
    token_floor: u64,
) -> Result<LaidDown, BackupError> {
    require_empty(data_dir)?;
    let name = data_dir
        .file_name()
        .ok_or_else(|| {
            BackupError::Refused(format!(
                "--data-dir {}: names no directory",
                data_dir.display()
            ))
        })?
        .to_string_lossy()
        .to_string();
    let parent = match data_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|source| BackupError::Io {
        path: parent.clone(),
        source,
    })?;
    let tmp = parent.join(format!(".{name}.laying-down"));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BackupError::Io { path, source }
    };
    if tmp.exists() {
        // Left by an attempt that failed before its rename: never in use.
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    let result = (|| {
        for d in [
            tmp.clone(),
            tmp.join(crate::storage::data_format::STATE_DIR),
        ] {
            data_format::private_dir(&d).map_err(io(&d))?;
        }
        data_format::write(&tmp).map_err(io(&tmp))?;
        // Term 0: the new cluster's first election is term 1, above it.
        let at = LogId::new(CommittedLeaderId::new(0, 0), index);
        let voters: BTreeSet<NodeId> = members.keys().copied().collect();
        let membership = StoredMembership::new(
            Some(at),
            Membership::new(vec![voters.clone()], members.clone()),
        );
        let state = state_machine::write_restored_state(
            &tmp.join(crate::storage::data_format::STATE_DIR),
            state,
            at,
            membership,
            token_floor,
        )
        .map_err(|e| BackupError::Refused(format!("writing the state: {e}")))?;
        sync_dir(&tmp)?;
        Ok(LaidDown {
            data_dir: data_dir.to_path_buf(),
            state,
            token_floor,
            members: voters,
        })
    })();
    let laid = match result {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    if data_dir.exists() {
        std::fs::remove_dir(data_dir).map_err(io(data_dir))?;
    }
    std::fs::rename(&tmp, data_dir).map_err(io(data_dir))?;
    sync_dir(&parent)?;
    Ok(laid)
}

/// `fenced restore`: checks the backup, then lays down `data_dir` for node
/// `node_id` of the new cluster `members`.
pub fn restore(
    from: &Path,
    data_dir: &Path,
    node_id: NodeId,
    members: &BTreeMap<NodeId, Node>,
    stated_floor: Option<u64>,
) -> Result<(BackupBody, LaidDown), BackupError> {
    if !members.contains_key(&node_id) {
        return Err(BackupError::Refused(format!(
            "--initial-cluster: does not name this node's id {node_id}"
        )));
    }
    require_empty(data_dir)?;
    let body = read(from)?;
    let gap = default_token_gap(body.created_unix_ms, unix_now_ms());
    let floor = token_floor(body.last_token, gap, stated_floor)?;
    let index = body.last_applied.map_or(1, |l| l.index.max(1));
    let laid = lay_down(data_dir, &body.state, index, members, floor)?;
    Ok((body, laid))
}

/// `fenced recover --force-new-cluster`: the state of a survivor's data
/// directory, every entry of its log applied (entries it had not seen
/// committed too: the dead majority may have committed and acknowledged
/// them), made the start of a one-node cluster of `node_id` alone. The old
/// directory is kept beside it, renamed `<dir>.before-recover-<unix ms>`.
pub async fn recover(
    data_dir: &Path,
    node_id: NodeId,
    me: Node,
    stated_floor: Option<u64>,
) -> Result<(PathBuf, StateExport, LaidDown), BackupError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BackupError::Io { path, source }
    };
    if !data_dir.join(crate::storage::data_format::LOG_DIR).is_dir() {
        return Err(BackupError::Refused(format!(
            "--data-dir {}: holds no fenced node's data (no {}/)",
            data_dir.display(),
            crate::storage::data_format::LOG_DIR
        )));
    }
    data_format::check(data_dir).map_err(io(data_dir))?;
    let export = {
        let mut log = LogStore::open(&data_dir.join(crate::storage::data_format::LOG_DIR))
            .map_err(io(data_dir))?;
        let mut sm = StateMachine::open(
            &data_dir.join(crate::storage::data_format::STATE_DIR),
            Parking::new(1),
            log.purge_horizon(),
            // The table's own default: a snapshot holds at most that many
            // grants per resource when it is loaded again.
            fenced_core::DEFAULT_HISTORY_PER_RESOURCE,
        )
        .map_err(|e| BackupError::Refused(format!("{}: {e}", data_dir.display())))?;
        let from = sm
            .shared()
            .last_applied()
            .map_or(0, |l| l.index.saturating_add(1));
        let entries = log.try_get_log_entries(from..).await.map_err(|e| {
            BackupError::Refused(format!("{}: reading the log: {e}", data_dir.display()))
        })?;
        let applied = entries.len();
        sm.apply(entries).await.map_err(|e| {
            BackupError::Refused(format!("{}: applying the log: {e}", data_dir.display()))
        })?;
        tracing::info!(entries = applied, "survivor's log applied");
        sm.shared()
            .export()
            .map_err(|e| BackupError::Refused(format!("exporting the state: {e}")))?
        // The log's lock is released here, before the directory moves.
    };
    let floor = token_floor(
        export.last_token,
        default_token_gap(unix_now_ms(), unix_now_ms()),
        stated_floor,
    )?;
    let kept = {
        let mut name = data_dir.as_os_str().to_owned();
        name.push(format!(".before-recover-{}", unix_now_ms()));
        PathBuf::from(name)
    };
    // The new directory is complete and synced before the old one moves;
    // a crash between the two renames leaves both, named, for the operator.
    let staging = {
        let mut name = data_dir.as_os_str().to_owned();
        name.push(".recovered");
        PathBuf::from(name)
    };
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    let index = export.last_applied.map_or(1, |l| l.index.saturating_add(1));
    let members = BTreeMap::from([(node_id, me)]);
    let laid = lay_down(&staging, &export.body, index, &members, floor)?;
    // The survivor's cluster-time floor stays with it: clients may have
    // seen a time up to it.
    let time_file = data_dir.join(crate::clock::floor::FILE_NAME);
    if time_file.exists() {
        std::fs::copy(&time_file, staging.join(crate::clock::floor::FILE_NAME))
            .map_err(io(&time_file))?;
        std::fs::File::open(staging.join(crate::clock::floor::FILE_NAME))
            .and_then(|f| f.sync_all())
            .map_err(io(&staging))?;
    }
    std::fs::rename(data_dir, &kept).map_err(io(data_dir))?;
    std::fs::rename(&staging, data_dir).map_err(io(data_dir))?;
    if let Some(parent) = data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok((
        kept,
        export,
        LaidDown {
            data_dir: data_dir.to_path_buf(),
            ..laid
        },
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn body() -> BackupBody {
        BackupBody {
            created_unix_ms: 1,
            source_node: 1,
            last_applied: None,
            cluster_time_ms: 0,
            last_token: 0,
            live_leases: 0,
            state: Vec::new(),
        }
    }

    #[test]
    fn damaged_files_are_refused_by_name() {
        let path = Path::new("b.fncd");
        let good = encode(&body()).unwrap();
        // A flipped byte anywhere fails the checksum (or the header).
        for i in [HEADER_LEN, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 1;
            let e = decode(path, &bad).unwrap_err().to_string();
            assert!(e.contains("b.fncd") && e.contains("corrupt"), "{e}");
        }
        let e = decode(path, &good[..good.len() - 5])
            .unwrap_err()
            .to_string();
        assert!(e.contains("declares"), "{e}");
        let e = decode(path, b"hello").unwrap_err().to_string();
        assert!(e.contains("not a fenced backup"), "{e}");
        let mut newer = good.clone();
        newer[8..12].copy_from_slice(&2u32.to_be_bytes());
        let e = decode(path, &newer).unwrap_err().to_string();
        assert!(e.contains("format version 2 is not supported"), "{e}");
    }

    #[test]
    fn the_gap_grows_with_the_backups_age_and_a_stated_floor_must_cover_the_state() {
        let day_ms = GAP_MARGIN_SECONDS * 1_000;
        assert_eq!(
            default_token_gap(0, 0),
            MAX_GRANTS_PER_SECOND * GAP_MARGIN_SECONDS
        );
        assert_eq!(
            default_token_gap(0, day_ms),
            2 * MAX_GRANTS_PER_SECOND * GAP_MARGIN_SECONDS
        );
        // A clock behind the backup's counts as no age, never less.
        assert_eq!(default_token_gap(day_ms, 0), default_token_gap(0, 0));
        assert_eq!(token_floor(10, 5, None).unwrap(), 15);
        assert_eq!(token_floor(10, 5, Some(10)).unwrap(), 10);
        assert!(token_floor(10, 5, Some(9)).is_err());
        // Never past the bound, whichever way the floor comes, so never wrapped.
        assert_eq!(
            token_floor(10, 5, Some(MAX_TOKEN_FLOOR)).unwrap(),
            MAX_TOKEN_FLOOR
        );
        for stated in [MAX_TOKEN_FLOOR + 1, u64::MAX - 1, u64::MAX] {
            let e = token_floor(10, 5, Some(stated)).unwrap_err().to_string();
            assert!(e.contains("--token-floor") && e.contains("2^62"), "{e}");
        }
        assert_eq!(
            token_floor(MAX_TOKEN_FLOOR - 5, 5, None).unwrap(),
            MAX_TOKEN_FLOOR
        );
        for last in [MAX_TOKEN_FLOOR - 4, u64::MAX - 1] {
            let e = token_floor(last, 5, None).unwrap_err().to_string();
            assert!(e.contains("2^62"), "{e}");
        }
    }

    #[test]
    fn the_token_floor_flag_is_bounded_by_2_pow_62() {
        assert_eq!(parse_token_floor("5000000"), Ok(5_000_000));
        assert_eq!(
            parse_token_floor(&MAX_TOKEN_FLOOR.to_string()),
            Ok(MAX_TOKEN_FLOOR)
        );
        for bad in [
            "4611686018427387905",
            "18446744073709551614",
            "18446744073709551615",
            "18446744073709551616",
            "-1",
            "",
            "1e9",
        ] {
            let e = parse_token_floor(bad).unwrap_err();
            assert!(
                e.contains("--token-floor") && e.contains("4611686018427387904 (2^62)"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_non_empty_data_dir_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), b"keep").unwrap();
        let e = lay_down(dir.path(), &[], 1, &BTreeMap::new(), 0).unwrap_err();
        assert!(e.to_string().contains("not empty"), "{e}");
        assert_eq!(std::fs::read(dir.path().join("x")).unwrap(), b"keep");
    }

    #[test]
    fn a_failed_lay_down_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("node");
        // Not a state body: refused after the temporary directory was made.
        assert!(lay_down(&target, b"junk", 1, &BTreeMap::new(), 0).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
