//! Retired node ids: every id a committed membership change removed. A
//! removed id never returns (docs/DECISIONS.md, "A removed node id never
//! returns"): its node may still hold a certificate naming it, and a node
//! under an old id may remember an old vote. The set is part of the
//! replicated state, decided from the log alone on every replica, and
//! carried in snapshots; this module is its pure part (the decision and the
//! bounded encoding), with no I/O.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::types::{Node, NodeId};

/// At most this many retired ids are kept. A removal that would go past it
/// is refused by the leader; it is more than a removal a day for eleven
/// years, and a retired id is never dropped to make room.
pub const MAX_RETIRED_IDS: usize = 4096;

/// The format of the retired list inside a snapshot body.
pub const RETIRED_FORMAT_VERSION: u32 = 1;

/// A membership as openraft stores it.
pub type Membership = openraft::Membership<NodeId, Node>;

/// The retired node ids, in increasing order, at most [`MAX_RETIRED_IDS`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetiredIds(BTreeSet<NodeId>);

/// What applying one membership change does to the retired ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retirement {
    /// Ids the change removed: retired from now on.
    pub retired: BTreeSet<NodeId>,
    /// Ids the change removed that do not fit under the bound (only when a
    /// removal raced past the leader's check): not recorded.
    pub over_bound: BTreeSet<NodeId>,
    /// Retired ids the new membership names again (only when an addition
    /// raced past the leader's check). They stay retired: their
    /// certificates stay refused.
    pub named_again: BTreeSet<NodeId>,
}

impl Retirement {
    /// Whether the change touches the retired ids or needs telling.
    pub fn is_empty(&self) -> bool {
        self.retired.is_empty() && self.over_bound.is_empty() && self.named_again.is_empty()
    }
}

/// The ids of every member of `m`, voters and learners.
fn member_ids(m: &Membership) -> BTreeSet<NodeId> {
    m.nodes().map(|(id, _)| *id).collect()
}

/// The ids in `previous` that are not in `next`: what a change from one to
/// the other removes.
pub fn removed_ids(previous: &Membership, next: &Membership) -> BTreeSet<NodeId> {
    let next = member_ids(next);
    member_ids(previous)
        .into_iter()
        .filter(|id| !next.contains(id))
        .collect()
}

impl RetiredIds {
    /// Ids given in any order (tests, and sets built by hand); `None` past
    /// the bound.
    pub fn from_ids(ids: impl IntoIterator<Item = NodeId>) -> Option<Self> {
        let set: BTreeSet<NodeId> = ids.into_iter().collect();
        (set.len() <= MAX_RETIRED_IDS).then_some(Self(set))
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.0.contains(&id)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn ids(&self) -> &BTreeSet<NodeId> {
        &self.0
    }

    /// How many more ids fit under the bound.
    pub fn room(&self) -> usize {
        MAX_RETIRED_IDS.saturating_sub(self.0.len())
    }

    /// What a committed change from `previous` to `next` does: the ids it
    /// removes are retired, as many as fit under the bound (the lowest
    /// first, so every replica keeps the same ones).
    pub fn decide(&self, previous: &Membership, next: &Membership) -> Retirement {
        let removed: BTreeSet<NodeId> = removed_ids(previous, next)
            .into_iter()
            .filter(|id| !self.contains(*id))
            .collect();
        let room = self.room();
        let retired: BTreeSet<NodeId> = removed.iter().copied().take(room).collect();
        let over_bound = removed.difference(&retired).copied().collect();
        let named_again = member_ids(next)
            .into_iter()
            .filter(|id| self.contains(*id))
            .collect();
        Retirement {
            retired,
            over_bound,
            named_again,
        }
    }

    /// Records what [`RetiredIds::decide`] retired; returns whether the set
    /// changed.
    pub fn record(&mut self, change: &Retirement) -> bool {
        let before = self.0.len();
        for id in &change.retired {
            if self.0.len() >= MAX_RETIRED_IDS {
                break;
            }
            self.0.insert(*id);
        }
        self.0.len() != before
    }

    /// The retired ids a new cluster made from a backup keeps: all but the
    /// ids its operator named as members of the new cluster.
    pub fn without_members(&self, members: &Membership) -> Self {
        let named = member_ids(members);
        Self(self.0.difference(&named).copied().collect())
    }
}

/// The encoded retired list: its own format version, then the ids.
#[derive(Serialize)]
#[serde(rename = "RetiredIds")]
struct RetiredIdsRef<'a> {
    format_version: u32,
    ids: &'a BTreeSet<NodeId>,
}

impl Serialize for RetiredIds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RetiredIdsRef {
            format_version: RETIRED_FORMAT_VERSION,
            ids: &self.0,
        }
        .serialize(s)
    }
}

/// Why an encoded retired list is refused.
fn refused(why: impl std::fmt::Display) -> String {
    format!("retired node ids: {why}")
}

/// Checks one decoded id against the one before it: ids are written in
/// increasing order, none is 0.
fn check_next(previous: Option<NodeId>, id: NodeId) -> Result<(), String> {
    if id == 0 {
        return Err(refused("node id 0"));
    }
    if previous.is_some_and(|p| p >= id) {
        return Err(refused(format!(
            "not in increasing order ({} then {id})",
            previous.unwrap_or_default()
        )));
    }
    Ok(())
}

impl<'de> Deserialize<'de> for RetiredIds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct("RetiredIds", &["format_version", "ids"], ListVisitor)
    }
}

/// Reads the version, then the ids, refusing a newer version, more than
/// [`MAX_RETIRED_IDS`] ids (before reading them), and ids out of order.
struct ListVisitor;

impl<'de> serde::de::Visitor<'de> for ListVisitor {
    type Value = RetiredIds;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a retired node id list")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<RetiredIds, A::Error> {
        use serde::de::Error;
        let missing = |i| A::Error::invalid_length(i, &"a version and the ids");
        let version: u32 = seq.next_element()?.ok_or_else(|| missing(0))?;
        if version != RETIRED_FORMAT_VERSION {
            return Err(A::Error::custom(refused(format!(
                "format version {version} is not supported (this build reads \
                 {RETIRED_FORMAT_VERSION})"
            ))));
        }
        seq.next_element_seed(IdsSeed)?.ok_or_else(|| missing(1))
    }
}

struct IdsSeed;

impl<'de> serde::de::DeserializeSeed<'de> for IdsSeed {
    type Value = RetiredIds;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<RetiredIds, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for IdsSeed {
    type Value = RetiredIds;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "at most {MAX_RETIRED_IDS} node ids")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<RetiredIds, A::Error> {
        use serde::de::Error;
        let too_many =
            |n: usize| A::Error::custom(refused(format!("{n} ids, at most {MAX_RETIRED_IDS}")));
        if let Some(n) = seq.size_hint().filter(|n| *n > MAX_RETIRED_IDS) {
            return Err(too_many(n));
        }
        let mut ids = BTreeSet::new();
        let mut previous = None;
        while let Some(id) = seq.next_element::<NodeId>()? {
            if ids.len() >= MAX_RETIRED_IDS {
                return Err(too_many(ids.len().saturating_add(1)));
            }
            check_next(previous, id).map_err(A::Error::custom)?;
            ids.insert(id);
            previous = Some(id);
        }
        Ok(RetiredIds(ids))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::BTreeMap;

    use super::*;
    use crate::codec;

    /// A membership of `voters` and `learners`.
    fn membership(voters: &[NodeId], learners: &[NodeId]) -> Membership {
        let nodes: BTreeMap<NodeId, Node> = voters
            .iter()
            .chain(learners)
            .map(|id| (*id, Node::default()))
            .collect();
        Membership::new(vec![voters.iter().copied().collect()], nodes)
    }

    fn ids(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_removed_voter_or_learner_is_retired_and_nothing_else() {
        let none = RetiredIds::default();
        let three = membership(&[1, 2, 3], &[]);
        // Adding, promoting, the first membership: nothing retired.
        let with_4 = membership(&[1, 2, 3], &[4]);
        assert!(none.decide(&three, &with_4).is_empty());
        assert!(none
            .decide(&with_4, &membership(&[1, 2, 3, 4], &[]))
            .is_empty());
        assert!(none.decide(&Membership::default(), &three).is_empty());
        // A learner removed.
        assert_eq!(none.decide(&with_4, &three).retired, ids(&[4]));
        // A voter kept as a learner is not removed yet; then it is.
        let demoted = membership(&[1, 3], &[2]);
        assert!(none.decide(&three, &demoted).is_empty());
        assert_eq!(
            none.decide(&demoted, &membership(&[1, 3], &[])).retired,
            ids(&[2])
        );
        // A voter removed in one change, and a joint membership on the way.
        let joint = Membership::new(
            vec![ids(&[1, 2, 3]), ids(&[1, 3])],
            BTreeMap::from([1, 2, 3].map(|i| (i, Node::default()))),
        );
        assert!(none.decide(&three, &joint).is_empty());
        assert_eq!(
            none.decide(&joint, &membership(&[1, 3], &[])).retired,
            ids(&[2])
        );
        // Two at once.
        assert_eq!(
            none.decide(&membership(&[1, 2, 3], &[4, 5]), &three)
                .retired,
            ids(&[4, 5])
        );
    }

    #[test]
    fn a_retired_id_stays_retired_even_when_named_again() {
        let mut retired = RetiredIds::default();
        let change = retired.decide(&membership(&[1, 2, 3], &[]), &membership(&[1, 3], &[]));
        assert!(retired.record(&change));
        assert!(retired.contains(2));
        // A membership naming it again (an addition that raced the check).
        let back = retired.decide(&membership(&[1, 3], &[]), &membership(&[1, 3], &[2]));
        assert_eq!(back.named_again, ids(&[2]));
        assert!(back.retired.is_empty());
        assert!(!retired.record(&back));
        // And removed again: already retired, nothing new.
        let again = retired.decide(&membership(&[1, 3], &[2]), &membership(&[1, 3], &[]));
        assert!(again.retired.is_empty());
        assert!(retired.contains(2));
    }

    #[test]
    fn the_bound_keeps_the_lowest_ids_and_never_drops_one() {
        let mut retired = RetiredIds::from_ids(100..100 + MAX_RETIRED_IDS as u64 - 1).unwrap();
        assert_eq!(retired.room(), 1);
        let change = retired.decide(
            &membership(&[1, 2, 3], &[5, 4]),
            &membership(&[1, 2, 3], &[]),
        );
        assert_eq!(change.retired, ids(&[4]));
        assert_eq!(change.over_bound, ids(&[5]));
        assert!(retired.record(&change));
        assert_eq!(retired.len(), MAX_RETIRED_IDS);
        assert!(retired.contains(100) && retired.contains(4) && !retired.contains(5));
        assert!(RetiredIds::from_ids(1..=MAX_RETIRED_IDS as u64 + 1).is_none());
    }

    #[test]
    fn a_new_cluster_keeps_the_retired_ids_it_does_not_name() {
        let retired = RetiredIds::from_ids([2, 4, 7]).unwrap();
        let new = retired.without_members(&membership(&[1, 2, 3], &[]));
        assert_eq!(new.ids(), &ids(&[4, 7]));
    }

    #[test]
    fn the_list_round_trips_and_damaged_lists_are_refused_by_name() {
        let retired = RetiredIds::from_ids([9, 2, 4]).unwrap();
        let bytes = codec::encode("retired", &retired).unwrap();
        assert_eq!(
            codec::decode::<RetiredIds>("retired", &bytes).unwrap(),
            retired
        );
        let full = RetiredIds::from_ids(1..=MAX_RETIRED_IDS as u64).unwrap();
        let bytes = codec::encode("retired", &full).unwrap();
        assert_eq!(
            codec::decode::<RetiredIds>("retired", &bytes).unwrap(),
            full
        );
        let refusal = |version: u32, ids: Vec<u64>| {
            #[derive(Serialize)]
            struct Raw {
                format_version: u32,
                ids: Vec<u64>,
            }
            let bytes = codec::encode(
                "retired",
                &Raw {
                    format_version: version,
                    ids,
                },
            )
            .unwrap();
            codec::decode::<RetiredIds>("retired", &bytes)
                .unwrap_err()
                .to_string()
        };
        let over = (1..=MAX_RETIRED_IDS as u64 + 1).collect();
        let e = refusal(1, over);
        assert!(
            e.contains("retired node ids: 4097 ids, at most 4096"),
            "{e}"
        );
        let e = refusal(1, vec![2, 2]);
        assert!(
            e.contains("retired node ids: not in increasing order"),
            "{e}"
        );
        let e = refusal(1, vec![3, 1]);
        assert!(e.contains("not in increasing order (3 then 1)"), "{e}");
        let e = refusal(1, vec![0]);
        assert!(e.contains("retired node ids: node id 0"), "{e}");
        let e = refusal(2, vec![1]);
        assert!(e.contains("retired node ids: format version 2"), "{e}");
        // A length past the bound is refused before any id is read.
        let mut bytes = vec![codec::FORMAT_VERSION, 1];
        bytes.extend([0xfd]);
        bytes.extend(u64::MAX.to_le_bytes());
        let e = codec::decode::<RetiredIds>("retired", &bytes)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("retired node ids:") && e.contains("at most 4096"),
            "{e}"
        );
    }
}
