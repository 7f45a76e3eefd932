//! Elections with a pre-vote (Raft thesis §9.6), run by fenced instead of
//! openraft's own election timer.
//!
//! openraft 0.9 has no pre-vote, and a voter that refuses a candidate for its
//! log does not take up the candidate's term. When a leader dies with its
//! followers' logs one entry apart and the follower with the shorter log
//! times out first, both followers end up candidates in the same term, each
//! with its own vote, and the cluster waits out another election timeout
//! (seen in fenced-bench S6: 3.5–4.2 s instead of 1.9 s). With a pre-vote a
//! node stands for election only after a majority, itself included, says it
//! would vote for it: none of them has heard from a leader for a leader
//! lease, and none has a longer log. The follower with the shorter log is
//! refused before it raises any term, and the other one wins at its next
//! check. A node cut off from a working leader cannot win a pre-vote either,
//! so when it comes back it does not raise the term and depose that leader.
//!
//! Only the decision to stand moves here; the election itself is still
//! openraft's (`trigger().elect()`), with its own vote rules, its leader
//! lease check on every voter, and its durable votes. The decisions are
//! [`super::pre_vote`]'s (sans-IO); this is their timer and their I/O.

use std::{
    hash::{BuildHasher, RandomState},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

// tokio's clock: the simulation runs it paused, and the real one otherwise.
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use super::pre_vote::{self, Candidacy, Check, PreVoteRequest, PreVoteResponse, Tally};
use crate::{
    codec,
    peer::network::{Peer, RaftCall, Reachability, Wire},
    repair::RepairGate,
    security::tls::NodeTls,
    storage::log_store::LogStore,
    types::{NodeId, Raft},
};

/// The election state of one node: when it last heard from a leader, and
/// its timing.
pub struct Election {
    me: NodeId,
    /// openraft's leader lease: how long after hearing from a leader a
    /// voter refuses another candidate.
    lease: Duration,
    /// The time between two checks is drawn from this range each time. A
    /// check while a leader is heard from costs nothing; after the lease it
    /// decides how soon a node stands, and the random spread keeps two
    /// nodes from standing at the same moment and splitting the vote.
    check_min: Duration,
    check_max: Duration,
    /// A voter that has not answered a pre-vote within this (the shortest
    /// election timeout) counts as refusing it; apart from the checks,
    /// which may come much more often than a slow voter answers.
    ask_within: Duration,
    last_contact: Mutex<Option<Instant>>,
    /// This node's candidacy as its pre-vote answers see it, and since when
    /// (a promise or a stand lasts one lease).
    candidacy: Mutex<(Candidacy, Instant)>,
    /// Held while a vote request is answered and while this node decides
    /// to stand: a vote granted during a pre-vote is seen by the decision,
    /// and one asked after it reaches openraft after the election started.
    deciding: tokio::sync::Mutex<()>,
    /// Seeds the spread of the checks: random, or the simulation's seed.
    jitter: u64,
    /// This node's log: the last log id a pre-vote compares.
    log: LogStore,
    /// Pre-votes go over mutual TLS when set.
    tls: Option<Arc<NodeTls>>,
    /// Where a voter that cannot be reached is told (and logged, once per
    /// outage); a voter that is slow to answer is not counted there.
    reachability: Option<Arc<Reachability>>,
    /// Pre-votes go over this instead of TCP when set (simulation).
    wire: Option<Arc<dyn Wire>>,
    /// A node being repaired neither stands nor grants a pre-vote.
    repair: Arc<RepairGate>,
}

impl Election {
    pub fn new(
        me: NodeId,
        election_timeout_min: Duration,
        election_timeout_max: Duration,
        log: LogStore,
    ) -> Self {
        Self {
            me,
            lease: election_timeout_max,
            check_min: election_timeout_min / 10,
            check_max: election_timeout_min / 5,
            ask_within: election_timeout_min,
            last_contact: Mutex::new(None),
            candidacy: Mutex::new((Candidacy::Idle, Instant::now())),
            deciding: tokio::sync::Mutex::new(()),
            jitter: RandomState::new().hash_one(me),
            log,
            tls: None,
            reachability: None,
            wire: None,
            repair: Arc::default(),
        }
    }

    /// Checks every half of `check` to `check` instead of every tenth to
    /// fifth of the election timeout: how soon after the lease runs out a
    /// node stands (`--election-check-ms`), apart from the lease that
    /// decides whether it may.
    pub fn with_check_interval(self, check: Duration) -> Self {
        Self {
            check_min: check / 2,
            check_max: check,
            ..self
        }
    }

    /// Spreads the checks from `seed`: the same seed, the same checks.
    pub fn with_jitter_seed(self, seed: u64) -> Self {
        Self {
            jitter: seed,
            ..self
        }
    }

    /// Asks for pre-votes over `wire` instead of TCP (simulation).
    pub fn with_wire(self, wire: Option<Arc<dyn Wire>>) -> Self {
        Self { wire, ..self }
    }

    /// Tells `reachability` which voters a pre-vote reached.
    pub fn with_reachability(self, reachability: Arc<Reachability>) -> Self {
        Self {
            reachability: Some(reachability),
            ..self
        }
    }

    /// Neither stands nor grants pre-votes while `repair` is shut.
    pub fn with_repair(self, repair: Arc<RepairGate>) -> Self {
        Self { repair, ..self }
    }

    /// Asks for pre-votes over mutual TLS.
    pub fn with_tls(self, tls: Option<Arc<NodeTls>>) -> Self {
        Self { tls, ..self }
    }

    /// This node accepted a message from a leader (an AppendEntries or a
    /// snapshot that was not refused for a lower vote), or granted its vote.
    pub fn heard_from_leader(&self) {
        *self
            .last_contact
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// Whether this node heard from a leader within the lease. A node that
    /// never did (just started) has not.
    pub fn heard_lately(&self) -> bool {
        self.last_contact
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|t| t.elapsed() < self.lease)
    }

    /// Held while a vote request is answered (see `deciding`).
    pub async fn voting(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.deciding.lock().await
    }

    /// The voter side of a pre-vote.
    pub fn answer(&self, raft: &Raft, req: &PreVoteRequest) -> PreVoteResponse {
        let state = raft.metrics().borrow().state;
        self.answer_in(state, req)
    }

    fn answer_in(&self, state: openraft::ServerState, req: &PreVoteRequest) -> PreVoteResponse {
        let granted = {
            let mut candidacy = self.lock_candidacy();
            let mine = self.current(&candidacy);
            let answer = pre_vote::answer(
                self.me,
                state,
                self.heard_lately(),
                req,
                self.log.last(),
                mine,
            );
            let granted = answer.granted && self.repair.may_vote();
            if granted && answer.promises {
                *candidacy = (Candidacy::Promised(req.candidate), Instant::now());
            }
            granted
        };
        tracing::debug!(candidate = req.candidate, granted, "pre-vote answered");
        PreVoteResponse { granted }
    }

    fn lock_candidacy(&self) -> std::sync::MutexGuard<'_, (Candidacy, Instant)> {
        self.candidacy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The candidacy held: a promise or a stand lasts a lease, and a
    /// promise then lapses for another.
    fn current(&self, held: &(Candidacy, Instant)) -> Candidacy {
        let (mine, since) = *held;
        let age = since.elapsed();
        match mine {
            Candidacy::Promised(_) if age >= self.lease.saturating_mul(2) => Candidacy::Idle,
            Candidacy::Promised(to) if age >= self.lease => Candidacy::Lapsed(to),
            Candidacy::Stood if age >= self.lease => Candidacy::Idle,
            mine => mine,
        }
    }

    /// Marks this node's own pre-vote out if [`pre_vote::check`] says a
    /// node in `state`, voter or not, asks now; the candidacy is read and
    /// set under one lock, so no promise comes in between.
    fn begin_asking(&self, state: openraft::ServerState, is_voter: bool) -> bool {
        let mut candidacy = self.lock_candidacy();
        let mine = self.current(&candidacy);
        if pre_vote::check(self.heard_lately(), state, is_voter, mine) == Check::Wait {
            return false;
        }
        *candidacy = (Candidacy::Asking, Instant::now());
        true
    }

    fn next_check(&self, round: u64) -> Duration {
        let spread = self.check_max.saturating_sub(self.check_min);
        let nanos = spread.as_nanos() as u64;
        let offset = match nanos {
            0 => 0,
            // SipHash with fixed keys over (seed, round): spread, and
            // replayable for a given seed.
            n => {
                std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default()
                    .hash_one((self.jitter, round))
                    % n
            }
        };
        self.check_min + Duration::from_nanos(offset)
    }

    /// Checks at random intervals (a tenth to a fifth of the election
    /// timeout, or half of `--election-check-ms` to it) whether this node
    /// should stand, until `stop`: a voter that is not the leader, has not
    /// heard from one within the lease and has not promised its pre-vote to
    /// another candidate asks the other voters, and calls an election when
    /// a majority would vote for it.
    pub async fn run(&self, raft: Raft, stop: CancellationToken) {
        let mut round = 0u64;
        loop {
            round += 1;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.next_check(round)) => {}
            }
            if self.heard_lately() || !self.repair.may_vote() {
                // The common case, without reading Raft's metrics.
                continue;
            }
            let (state, term, voters) = {
                let metrics = raft.metrics();
                let m = metrics.borrow();
                let membership = m.membership_config.membership();
                let voters: Vec<(NodeId, String)> = membership
                    .voter_ids()
                    .filter_map(|id| membership.get_node(&id).map(|n| (id, n.peer_addr.clone())))
                    .collect();
                (m.state, m.current_term, voters)
            };
            let is_voter = voters.iter().any(|(id, _)| *id == self.me);
            if !self.begin_asking(state, is_voter) {
                continue;
            }
            let req = PreVoteRequest {
                candidate: self.me,
                last_log_id: self.log.last(),
            };
            let asked_with = self.log.vote();
            let granted = 1 + self.ask(&voters, &req).await;
            let won = pre_vote::is_majority(granted, voters.len());
            tracing::info!(
                term,
                granted,
                voters = voters.len(),
                won,
                "pre-vote: no leader heard within the lease"
            );
            let Some(deciding) = self.decide(won, asked_with).await else {
                if won {
                    tracing::info!(
                        term,
                        "pre-vote won, but this node voted, heard from a leader or gave way \
                         to a higher candidate meanwhile"
                    );
                }
                continue;
            };
            // Sent while `deciding` is held: a vote request answered after
            // this decision reaches openraft after the election began.
            let elected = raft.trigger().elect().await;
            drop(deciding);
            if let Err(e) = elected {
                tracing::warn!(error = %e, "election not started");
                return;
            }
        }
    }

    /// Decides, once no vote request is being answered, whether this node
    /// stands; if it does, returns `deciding` held, to be released once the
    /// election is called.
    async fn decide(
        &self,
        won: bool,
        asked_with: Option<openraft::Vote<NodeId>>,
    ) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let deciding = self.deciding.lock().await;
        self.stands(won, asked_with).then_some(deciding)
    }

    /// Whether this node, having won (or lost) a pre-vote asked while it
    /// held `asked_with`, calls an election now
    /// ([`pre_vote::stands_after_pre_vote`]); ends the asking either way.
    fn stands(&self, won: bool, asked_with: Option<openraft::Vote<NodeId>>) -> bool {
        let mut candidacy = self.lock_candidacy();
        // The grants counted are promised for a lease from when they were
        // given, after the ask began: a decision later than that (a vote
        // answered meanwhile waited on a slow disk) could meet them
        // promised to another.
        let fresh = self.lease.saturating_sub(self.ask_within / 2);
        let asking = candidacy.0 == Candidacy::Asking;
        let still_asking = asking && candidacy.1.elapsed() < fresh;
        let stands = pre_vote::stands_after_pre_vote(
            won,
            still_asking,
            asked_with,
            self.log.vote(),
            self.heard_lately(),
        );
        if stands {
            *candidacy = (Candidacy::Stood, Instant::now());
        } else if asking {
            *candidacy = (Candidacy::Idle, Instant::now());
        }
        stands
    }

    /// How many other voters grant `req`, counted until, with this node's
    /// own, they make a majority (an unreachable voter is not waited for
    /// then); one that does not answer within the shortest election timeout
    /// counts as a refusal.
    async fn ask(&self, voters: &[(NodeId, String)], req: &PreVoteRequest) -> usize {
        let payload = match codec::encode("pre_vote", req) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "pre-vote not encoded");
                return 0;
            }
        };
        let mut asks = JoinSet::new();
        for (id, addr) in voters.iter().filter(|(id, _)| *id != self.me) {
            let mut peer = Peer::new(*id, addr.clone())
                .with_tls(self.tls.clone())
                .with_reachability(self.reachability.clone())
                .with_wire(self.wire.clone());
            let payload = payload.clone();
            let timeout = self.ask_within;
            asks.spawn(async move {
                let reply =
                    tokio::time::timeout(timeout, peer.exchange(RaftCall::PreVote, &payload))
                        .await
                        .ok()?
                        .ok()?;
                codec::decode::<PreVoteResponse>("pre_vote", &reply).ok()
            });
        }
        let mut tally = Tally::new(voters.len());
        while let Some(answer) = asks.join_next().await {
            if tally.count(answer.ok().flatten()) {
                break;
            }
        }
        tally.granted()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use openraft::ServerState::Follower;

    use super::*;

    /// A voter at a local port that answers every pre-vote with `granted`,
    /// or never answers when `granted` is `None`.
    async fn voter(granted: Option<bool>) -> String {
        crate::peer::network::fake_peer(move |_| {
            std::future::ready(
                granted.map(|granted| {
                    codec::encode("pre_vote", &PreVoteResponse { granted }).unwrap()
                }),
            )
        })
        .await
    }

    #[tokio::test]
    async fn a_pre_vote_does_not_wait_for_a_silent_voter_once_it_has_a_majority() {
        // Answers count as refusals after the shortest election timeout, 2 s.
        let (e, _dir) = election(2_000, 4_000);
        let req = pre_vote_of(1);
        let granting = voter(Some(true)).await;
        let refusing = voter(Some(false)).await;
        let silent = voter(None).await;

        let voters = vec![(1, String::new()), (2, granting), (3, silent.clone())];
        let started = Instant::now();
        assert_eq!(e.ask(&voters, &req).await, 1);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited {:?} for the silent voter",
            started.elapsed()
        );

        // Without a majority in hand the silent voter is waited for, up to
        // the bound, and counts as a refusal.
        let voters = vec![(1, String::new()), (2, refusing), (3, silent)];
        let started = Instant::now();
        assert_eq!(e.ask(&voters, &req).await, 0);
        assert!(started.elapsed() >= Duration::from_millis(1_900));
    }

    #[tokio::test]
    async fn a_node_that_votes_for_another_while_its_pre_vote_is_out_does_not_stand() {
        use openraft::{storage::RaftLogStorage, Vote};

        let (e, _dir) = election(4_000, 8_000);
        let req = pre_vote_of(1);
        // Voter 2 grants the pre-vote; before its answer arrives, node 3's
        // vote request (its own pre-vote won at the same moment) has reached
        // this node and been granted: the vote this node holds is node 3's.
        let log = e.log.clone();
        let granting_while_voting = crate::peer::network::fake_peer(move |_| {
            let mut log = log.clone();
            async move {
                log.save_vote(&Vote::new(1, 3)).await.unwrap();
                Some(codec::encode("pre_vote", &PreVoteResponse { granted: true }).unwrap())
            }
        })
        .await;
        let voters = vec![(1, String::new()), (2, granting_while_voting)];
        assert!(e.begin_asking(Follower, true));
        let asked_with = e.log.vote();
        let granted = e.ask(&voters, &req).await;
        assert!(pre_vote::is_majority(1 + granted, voters.len()), "won");
        assert_eq!(e.log.vote(), Some(Vote::new(1, 3)));
        assert!(
            !e.stands(true, asked_with),
            "standing now would depose node 3, elected with this node's vote"
        );

        // Asked again while holding that vote, and nothing changes: it stands.
        assert!(e.begin_asking(Follower, true));
        let asked_with = e.log.vote();
        assert!(!e.stands(false, asked_with), "a lost pre-vote never stands");
        assert!(e.begin_asking(Follower, true));
        assert!(e.stands(true, asked_with));
        assert!(
            !e.begin_asking(Follower, true),
            "having stood, it does not ask again at once"
        );
    }

    #[tokio::test]
    async fn a_vote_being_granted_during_a_pre_vote_is_seen_by_the_decision_to_stand() {
        // The race of a five-node start: node 4 granted node 3's vote
        // while its own pre-vote was out; openraft had set the vote before
        // node 4 asked, and the grant was recorded after node 4 decided, so
        // node 4 stood with a higher term and deposed node 3.
        let (e, _dir) = election(200, 400);
        let e = Arc::new(e);
        assert!(e.begin_asking(Follower, true));
        let asked_with = e.log.vote();
        let voting = e.voting().await;
        let deciding = tokio::spawn({
            let e = Arc::clone(&e);
            async move { e.decide(true, asked_with).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !deciding.is_finished(),
            "decided while a vote was being answered"
        );
        // The vote is granted: the node heard from a would-be leader.
        e.heard_from_leader();
        drop(voting);
        assert!(!deciding.await.unwrap(), "stood after granting a vote");
    }

    #[test]
    fn a_pre_vote_grant_is_one_at_a_time_for_a_lease() {
        let (e, _dir) = election(20, 40);
        let req = pre_vote_of;
        assert!(e.answer_in(Follower, &req(2)).granted);
        assert!(
            e.answer_in(Follower, &req(2)).granted,
            "the same candidate again"
        );
        assert!(!e.answer_in(Follower, &req(3)).granted, "another candidate");
        assert!(!e.begin_asking(Follower, true), "promised: it does not ask");
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            e.answer_in(Follower, &req(3)).granted,
            "the promise ran out"
        );
    }

    #[test]
    fn a_candidate_that_cannot_win_does_not_hold_its_voters_by_asking_again() {
        // Five voters, the leader gone: node 2's log is shorter than nodes
        // 4 and 5's, as long as this node's. Node 2 asks every check and
        // loses every time (4 and 5 refuse it); were each grant a new
        // promise, this node would stay promised to it and nodes 4 and 5
        // could never win either.
        // A promise lasts the lease, 200 ms, and lapses for as long again.
        let (e, _dir) = election(100, 200);
        let req = pre_vote_of;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(120) {
            assert!(e.answer_in(Follower, &req(2)).granted, "node 2, promised");
            assert!(
                !e.answer_in(Follower, &req(4)).granted,
                "promised to node 2"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(220).saturating_sub(started.elapsed()));
        assert!(
            !e.answer_in(Follower, &req(2)).granted,
            "asking again did not lengthen the promise, and it lapsed for node 2"
        );
        assert!(e.answer_in(Follower, &req(4)).granted, "node 4 may win now");
        assert!(
            !e.answer_in(Follower, &req(2)).granted,
            "promised to node 4"
        );
    }

    #[test]
    fn a_decision_later_than_its_grants_promises_does_not_stand_and_asks_again() {
        // The lease is 40 ms, the shortest election timeout 20: grants
        // counted more than 30 ms ago may be promised to another by now.
        let (e, _dir) = election(20, 40);
        assert!(e.begin_asking(Follower, true));
        std::thread::sleep(Duration::from_millis(35));
        assert!(
            !e.stands(true, None),
            "stood on grants that may have lapsed"
        );
        assert!(e.begin_asking(Follower, true), "free to ask again");
        assert!(e.stands(true, None));
    }

    #[test]
    fn an_asking_node_gives_its_grant_only_to_a_higher_candidate_and_then_does_not_stand() {
        let (e, _dir) = election(200, 400);
        assert!(e.begin_asking(Follower, true));
        let (lower, higher) = (pre_vote_of(0), pre_vote_of(2));
        assert!(
            !e.answer_in(Follower, &lower).granted,
            "keeps its own grant"
        );
        assert!(e.stands(true, None), "still its own");
        let (e, _dir) = election(200, 400);
        assert!(e.begin_asking(Follower, true));
        assert!(e.answer_in(Follower, &higher).granted, "gives way upwards");
        assert!(!e.stands(true, None), "its grant went to node 2");
    }

    /// `candidate` asks, with an empty log.
    fn pre_vote_of(candidate: NodeId) -> PreVoteRequest {
        PreVoteRequest {
            candidate,
            last_log_id: None,
        }
    }

    fn election(min_ms: u64, max_ms: u64) -> (Election, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(dir.path()).unwrap();
        let e = Election::new(
            1,
            Duration::from_millis(min_ms),
            Duration::from_millis(max_ms),
            log,
        );
        (e, dir)
    }

    #[test]
    fn leader_contact_lasts_one_lease() {
        let (e, _dir) = election(20, 40);
        assert!(!e.heard_lately(), "a node that never heard from a leader");
        e.heard_from_leader();
        assert!(e.heard_lately());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!e.heard_lately(), "the lease ran out");
    }

    #[test]
    fn checks_are_spread_over_a_tenth_to_a_fifth_of_the_election_timeout() {
        let (e, _dir) = election(500, 1000);
        let draws: Vec<Duration> = (0..200).map(|r| e.next_check(r)).collect();
        assert!(draws
            .iter()
            .all(|d| *d >= Duration::from_millis(50) && *d < Duration::from_millis(100)));
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 150, "{} distinct of 200", distinct.len());
    }

    #[test]
    fn a_check_interval_of_its_own_moves_the_checks_not_the_lease() {
        let (e, _dir) = election(200, 400);
        let e = e.with_check_interval(Duration::from_millis(40));
        let draws: Vec<Duration> = (0..200).map(|r| e.next_check(r)).collect();
        assert!(draws
            .iter()
            .all(|d| *d >= Duration::from_millis(20) && *d < Duration::from_millis(40)));
        assert_eq!(e.lease, Duration::from_millis(400));
    }
}
