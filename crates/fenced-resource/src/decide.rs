//! The fence decision, as a pure function of a key's state and a write.
//!
//! The sled store applies its result in one compare-and-swap; the PostgreSQL
//! adapter makes the same decision in SQL and uses this function to explain
//! a refusal.

use std::collections::VecDeque;

use fenced_core::{InvalidArgument, OwnerId, ResourceName, Token};

use crate::{
    limits::IDEMPOTENCY_RECORDS_PER_KEY, Current, Mode, RejectReason, Rejection, Write,
    WriteOutcome,
};

/// One remembered accepted write, by idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Remembered {
    pub idempotency_key: String,
    pub fingerprint: u64,
    pub token: u64,
    pub version: u64,
}

/// Everything the store keeps for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyState {
    pub resource: ResourceName,
    pub mode: Mode,
    pub token: Token,
    pub owner: OwnerId,
    pub version: u64,
    /// The last sequence number accepted for (`owner`, `token`).
    pub sequence: Option<u64>,
    pub value: Vec<u8>,
    /// The most recent accepted writes that carried an idempotency key,
    /// oldest first, at most [`IDEMPOTENCY_RECORDS_PER_KEY`].
    pub remembered: VecDeque<Remembered>,
}

impl KeyState {
    pub fn current(&self, key: &str) -> Current {
        Current {
            key: key.to_string(),
            resource: self.resource.as_str().to_string(),
            token: self.token.get(),
            version: self.version,
            mode: self.mode,
            value: self.value.clone(),
        }
    }
}

/// What to do with a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Store this state, then answer `Accepted`.
    Apply(Box<KeyState>),
    /// Answer without writing anything.
    Answer(WriteOutcome),
    /// The request contradicts the key (a reused idempotency key, a changed
    /// contract); nothing is written.
    Invalid(InvalidArgument),
}

/// Decides `write` against the key's state (`None`: the key does not exist).
/// `default_mode` is the contract of a new key whose first write names none.
pub(crate) fn decide(current: Option<&KeyState>, write: &Write, default_mode: Mode) -> Decision {
    let reject = |highest_token: u64, reason: RejectReason| {
        Decision::Answer(WriteOutcome::Rejected(Rejection {
            key: write.key.clone(),
            token: write.token.get(),
            highest_token,
            owner: write.owner,
            operation_id: write.operation_id.clone(),
            reason,
        }))
    };
    let fingerprint = write.fingerprint();
    let remember = |remembered: &mut VecDeque<Remembered>, version: u64| {
        if let Some(k) = &write.idempotency_key {
            if remembered.len() >= IDEMPOTENCY_RECORDS_PER_KEY {
                remembered.pop_front();
            }
            remembered.push_back(Remembered {
                idempotency_key: k.clone(),
                fingerprint,
                token: write.token.get(),
                version,
            });
        }
    };
    let Some(s) = current else {
        if let Some(expected) = write.expected_version {
            if expected != 0 {
                return reject(
                    0,
                    RejectReason::VersionMismatch {
                        expected,
                        actual: 0,
                    },
                );
            }
        }
        let mut remembered = VecDeque::new();
        remember(&mut remembered, 1);
        return Decision::Apply(Box::new(KeyState {
            resource: write.resource.clone(),
            mode: write.mode.unwrap_or(default_mode),
            token: write.token,
            owner: write.owner,
            version: 1,
            sequence: write.sequence,
            value: write.value.clone(),
            remembered,
        }));
    };
    if let Some(k) = &write.idempotency_key {
        if let Some(r) = s.remembered.iter().find(|r| &r.idempotency_key == k) {
            if r.fingerprint != fingerprint {
                return Decision::Invalid(InvalidArgument::new(
                    "idempotency_key",
                    format!(
                        "{k:?} was already used for a different write to key {:?}; use a new idempotency key for a new write",
                        write.key
                    ),
                ));
            }
            return Decision::Answer(WriteOutcome::Accepted {
                token: r.token,
                version: r.version,
            });
        }
    }
    if let Some(mode) = write.mode {
        if mode != s.mode {
            return Decision::Invalid(InvalidArgument::new(
                "mode",
                format!(
                    "key {:?} uses the {} contract; a write may not change it to {}",
                    write.key, s.mode, mode
                ),
            ));
        }
    }
    let highest = s.token.get();
    if write.resource != s.resource {
        return reject(
            highest,
            RejectReason::WrongResource {
                bound: s.resource.as_str().to_string(),
            },
        );
    }
    if write.token < s.token {
        return reject(highest, RejectReason::StaleToken);
    }
    let same_generation = write.token == s.token;
    if same_generation {
        if write.owner != s.owner {
            return reject(highest, RejectReason::OwnerMismatch);
        }
        if s.mode == Mode::Strict {
            return Decision::Answer(WriteOutcome::AlreadyApplied {
                token: highest,
                version: s.version,
            });
        }
        if let (Some(presented), Some(last)) = (write.sequence, s.sequence) {
            if presented <= last {
                return reject(highest, RejectReason::StaleSequence { last, presented });
            }
        }
    }
    if let Some(expected) = write.expected_version {
        if expected != s.version {
            return reject(
                highest,
                RejectReason::VersionMismatch {
                    expected,
                    actual: s.version,
                },
            );
        }
    }
    let version = s.version.saturating_add(1);
    let mut remembered = s.remembered.clone();
    remember(&mut remembered, version);
    Decision::Apply(Box::new(KeyState {
        resource: s.resource.clone(),
        mode: s.mode,
        token: write.token,
        owner: write.owner,
        version,
        sequence: if same_generation {
            write.sequence.or(s.sequence)
        } else {
            write.sequence
        },
        value: write.value.clone(),
        remembered,
    }))
}
