//! fenced-jepsen's checkers on a simulated history: the invariants over
//! grants, leases and cluster time, the nodes' final states, and
//! linearizability of the long-TTL resources against the mutex model.

use fenced_jepsen::{
    check::{
        invariants::{self, Finding, NodeFinal},
        linear::{self, Linearizable},
    },
    history::{self, Event, Op},
};

/// The clock-rate error the lease checkers allow: the nodes' skew (2%)
/// with room, as the jepsen campaign runs.
const RHO: f64 = 0.05;

/// Search budget per resource for the linearizability check.
const LIN_BUDGET: u64 = 2_000_000;

/// What one seed's run showed.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub seed: u64,
    /// Every event of the history, in order: equal for equal seeds.
    pub events: Vec<Event>,
    pub findings: Vec<Finding>,
    /// "PASS", or why not.
    pub linearizable: String,
    /// The nodes did not converge after the faults: why.
    pub convergence: Option<String>,
    /// What a stopped node's data dir or its restart showed wrong.
    pub node_findings: Vec<String>,
    pub faults: Vec<String>,
    pub ops: usize,
    pub grants: usize,
}

impl Verdict {
    /// The first violation, if any.
    pub fn failure(&self) -> Option<String> {
        if let Some(why) = self.node_findings.first() {
            return Some(why.clone());
        }
        if let Some(why) = &self.convergence {
            return Some(why.clone());
        }
        if let Some(f) = self.findings.iter().find(|f| !f.violations.is_empty()) {
            return Some(format!("{}: {}", f.name, f.violations[0]));
        }
        (self.linearizable != "PASS" && !self.linearizable.starts_with("UNKNOWN"))
            .then(|| self.linearizable.clone())
    }

    /// A hash of the whole history: equal seeds, equal hashes.
    pub fn history_hash(&self) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let text: Vec<String> = self.events.iter().map(|e| format!("{e:?}")).collect();
        BuildHasherDefault::<DefaultHasher>::default().hash_one(text)
    }

    /// One line: the seed, what ran, and the verdict.
    pub fn summary(&self) -> String {
        let checked: usize = self.findings.iter().map(|f| f.checked).sum();
        format!(
            "seed {} (history {:016x}): {} ops, {} grants, {} faults, {} cases checked, \
             linearizable {}: {}",
            self.seed,
            self.history_hash(),
            self.ops,
            self.grants,
            self.faults.len(),
            checked,
            self.linearizable,
            self.failure()
                .map_or("PASS".into(), |f| format!("FAIL ({f})"))
        )
    }
}

pub fn verdict(
    seed: u64,
    events: Vec<Event>,
    finals: anyhow::Result<Vec<NodeFinal>>,
    faults: Vec<String>,
    node_findings: Vec<String>,
) -> Verdict {
    let ops = history::pair(&events);
    let (finals, convergence) = match finals {
        Ok(f) => (f, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let (final_finding, _) = invariants::final_state(&ops, &finals);
    let mut findings = vec![
        invariants::tokens_unique(&ops),
        invariants::grants_ordered(&ops),
        invariants::renew_keeps_token(&ops, RHO),
        invariants::leases_respected(&ops, RHO),
        invariants::ended_leases_stay_ended(&ops),
        invariants::cluster_time_monotonic(&ops),
        invariants::cluster_time_not_ahead(&ops, RHO),
    ];
    if convergence.is_none() {
        findings.push(final_finding);
        findings.push(invariants::digests_equal(&finals));
    }
    let grants = ops.iter().filter(|o| o.granted_token().is_some()).count();
    Verdict {
        seed,
        linearizable: linearizable(&ops),
        ops: ops.len(),
        grants,
        events,
        findings,
        convergence,
        faults,
        node_findings,
    }
}

fn linearizable(ops: &[Op]) -> String {
    match linear::check_long_resources(ops, LIN_BUDGET).0 {
        Linearizable::Pass => "PASS".into(),
        Linearizable::Fail(c) => format!("FAIL (resource {})", c.resource),
        Linearizable::Unknown { steps } => {
            format!("UNKNOWN (budget exhausted after {steps} steps)")
        }
    }
}
