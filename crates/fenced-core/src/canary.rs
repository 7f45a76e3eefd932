//! Deliberately planted bugs, for the checkers to prove they catch them.
//!
//! A build with the `canaries` feature can plant one of these at start
//! (`FENCED_CANARY=NAME` for `fenced`, `--canary NAME` for `fenced-sim`),
//! and the fault campaign or the simulation must then FAIL. One build
//! serves every canary. Without the feature, [`on`] is a constant `false`
//! and nothing can plant one: a release build carries no planted bug.

use std::fmt;
use std::str::FromStr;

/// One planted bug: what the broken build does instead of the right thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Canary {
    /// Grants over another owner's live lease.
    SkipLeaseCheck,
    /// Any owner id and token release the current lease.
    AnyoneRelease,
    /// A loaded table counts tokens again from 0.
    ReuseToken,
    /// A fenced put is applied whoever holds the resource.
    KvSkipHolderCheck,
    /// Every read is served from the node's local state.
    LocalDescribe,
    /// Leases run on the wall clock.
    WallClockExpiry,
    /// A new leader's clock starts from the last entry's stamp alone.
    ClockFromLastStamp,
    /// The cluster-time floor compares times alone, not (term, time).
    FloorByTime,
    /// The log is purged past the snapshot on disk.
    PurgePastSnapshot,
    /// A snapshot built while a newer one was installed replaces it.
    OlderSnapshotWins,
    /// A file whose CRC fails is loaded anyway.
    SkipChecksum,
    /// A failed log flush is reported done.
    AckFailedFlush,
    /// A node stays up after a failed write.
    SurviveStorageFailure,
}

impl Canary {
    pub const ALL: [Canary; 13] = [
        Canary::SkipLeaseCheck,
        Canary::AnyoneRelease,
        Canary::ReuseToken,
        Canary::KvSkipHolderCheck,
        Canary::LocalDescribe,
        Canary::WallClockExpiry,
        Canary::ClockFromLastStamp,
        Canary::FloorByTime,
        Canary::PurgePastSnapshot,
        Canary::OlderSnapshotWins,
        Canary::SkipChecksum,
        Canary::AckFailedFlush,
        Canary::SurviveStorageFailure,
    ];

    /// The name the scripts and flags use.
    pub fn name(self) -> &'static str {
        match self {
            Canary::SkipLeaseCheck => "skip-lease-check",
            Canary::AnyoneRelease => "anyone-release",
            Canary::ReuseToken => "reuse-token",
            Canary::KvSkipHolderCheck => "kv-skip-holder-check",
            Canary::LocalDescribe => "local-describe",
            Canary::WallClockExpiry => "wall-clock-expiry",
            Canary::ClockFromLastStamp => "clock-from-last-stamp",
            Canary::FloorByTime => "floor-by-time",
            Canary::PurgePastSnapshot => "purge-past-snapshot",
            Canary::OlderSnapshotWins => "older-snapshot-wins",
            Canary::SkipChecksum => "skip-checksum",
            Canary::AckFailedFlush => "ack-failed-flush",
            Canary::SurviveStorageFailure => "survive-storage-failure",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u8)
    }
}

impl fmt::Display for Canary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Canary {
    type Err = String;

    fn from_str(s: &str) -> Result<Canary, String> {
        Canary::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Canary::ALL.iter().map(|c| c.name()).collect();
                format!("canary {s:?} is not one of: {}", names.join(", "))
            })
    }
}

#[cfg(feature = "canaries")]
static PLANTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether `canary` was planted in this process. Always `false` in a build
/// without the `canaries` feature.
#[inline]
pub fn on(canary: Canary) -> bool {
    #[cfg(feature = "canaries")]
    {
        PLANTED.load(std::sync::atomic::Ordering::Relaxed) & canary.bit() != 0
    }
    #[cfg(not(feature = "canaries"))]
    {
        let _ = canary.bit();
        false
    }
}

/// Plants `canary` for the rest of the process's life. Refused by a build
/// without the `canaries` feature, so that no setting can break a real
/// node.
pub fn plant(canary: Canary) -> Result<(), String> {
    #[cfg(feature = "canaries")]
    {
        PLANTED.fetch_or(canary.bit(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    #[cfg(not(feature = "canaries"))]
    {
        Err(format!(
            "canary {canary} asked for, but this build has no canaries (feature `canaries`)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_bits_are_distinct() {
        let mut bits = 0u32;
        for c in Canary::ALL {
            assert_eq!(c.name().parse::<Canary>(), Ok(c));
            assert_eq!(bits & c.bit(), 0, "{c} shares a bit");
            bits |= c.bit();
        }
        let Err(err) = "skip-everything".parse::<Canary>() else {
            panic!("an unknown name parsed");
        };
        assert!(
            err.contains("skip-everything") && err.contains("skip-checksum"),
            "{err}"
        );
    }

    #[cfg(not(feature = "canaries"))]
    #[test]
    fn a_build_without_canaries_refuses_to_plant_one() {
        for c in Canary::ALL {
            assert!(plant(c).is_err());
            assert!(!on(c));
        }
    }
}
