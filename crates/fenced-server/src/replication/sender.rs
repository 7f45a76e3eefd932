//! Who may send a Raft call on a peer connection (docs/DECISIONS.md, "A
//! node certificate speaks only as its node").
//!
//! Over mutual TLS the connection's certificate names one node. Every call
//! that claims a sender (a leader's append or snapshot, a candidate's vote
//! or pre-vote, a stopping leader's TimeoutNow) must claim that node, and
//! that node must be a voter: a learner only receives. The rule is pure;
//! [`super::follower`] applies it to every decoded frame before openraft or
//! the election sees it.

use std::fmt;

use crate::types::NodeId;

/// Why a frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The frame claims another node than the certificate names.
    Impersonation {
        certificate: NodeId,
        claimed: Option<NodeId>,
    },
    /// The certificate's node is not a voter here (a learner, or a member
    /// this node's view does not list as a voter).
    NotVoter { node: NodeId },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Impersonation {
                certificate,
                claimed: Some(claimed),
            } => write!(
                f,
                "the certificate names node {certificate} but the frame claims node {claimed}"
            ),
            Refusal::Impersonation {
                certificate,
                claimed: None,
            } => write!(
                f,
                "the certificate names node {certificate} but the frame claims no sender"
            ),
            Refusal::NotVoter { node } => write!(
                f,
                "node {node} is not a voter: only voters send votes, appends and snapshots"
            ),
        }
    }
}

/// Whether node `certificate` (the connection's certificate; `None` without
/// TLS, where nothing is checked) may send a call claiming `claimed`, given
/// whether that node is a voter in this node's view. The same rule holds for
/// every call: each one a node sends moves a follower's term, vote or log.
pub fn check(
    certificate: Option<NodeId>,
    claimed: Option<NodeId>,
    certificate_is_voter: bool,
) -> Result<(), Refusal> {
    let Some(certificate) = certificate else {
        return Ok(());
    };
    if claimed != Some(certificate) {
        return Err(Refusal::Impersonation {
            certificate,
            claimed,
        });
    }
    if !certificate_is_voter {
        return Err(Refusal::NotVoter { node: certificate });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voter_sends_as_itself() {
        assert_eq!(check(Some(2), Some(2), true), Ok(()));
    }

    #[test]
    fn a_certificate_never_speaks_for_another_node() {
        assert_eq!(
            check(Some(9), Some(3), true),
            Err(Refusal::Impersonation {
                certificate: 9,
                claimed: Some(3)
            })
        );
        // Claiming another node is refused before the voter check, so a
        // learner learns nothing of who is a voter.
        assert!(matches!(
            check(Some(9), Some(1), false),
            Err(Refusal::Impersonation { .. })
        ));
        assert!(matches!(
            check(Some(9), None, true),
            Err(Refusal::Impersonation { claimed: None, .. })
        ));
    }

    #[test]
    fn a_learner_only_receives() {
        assert_eq!(
            check(Some(4), Some(4), false),
            Err(Refusal::NotVoter { node: 4 })
        );
    }

    #[test]
    fn without_tls_nothing_is_checked() {
        assert_eq!(check(None, Some(3), false), Ok(()));
    }
}
