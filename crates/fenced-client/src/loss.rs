//! Why a lease ended, as the client tells it. A module of its own because
//! the sessions (`session`) record losses too, and the keeper (`lease`)
//! imports `session`: kept in `lease`, it would make the two import each
//! other.

use std::fmt;

use fenced_core::LostReason;

/// Why a [`Lease`](crate::Lease) ended for this client: the cluster's own
/// reason when it refused a renewal, or what the client saw itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLoss {
    /// The cluster refused a renewal: the lease had expired, was released or
    /// was granted to a newer owner.
    Refused(LostReason),
    /// The local deadline passed without a successful renewal (the cluster
    /// was unreachable, or this process was paused). The cluster's own
    /// expiry is later, so nobody else can hold the lease yet.
    DeadlinePassed,
    /// This client released it.
    Released,
    /// A renewal failed in a way retrying cannot fix.
    Failed(String),
}

impl fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLoss::Refused(LostReason::Superseded { current_token }) => {
                write!(f, "renewal refused: superseded by token {current_token}")
            }
            LeaseLoss::Refused(r) => write!(f, "renewal refused: {}", r.as_str()),
            LeaseLoss::DeadlinePassed => {
                f.write_str("no successful renewal before the local deadline")
            }
            LeaseLoss::Released => f.write_str("released"),
            LeaseLoss::Failed(e) => write!(f, "renewal failed: {e}"),
        }
    }
}

/// So `lease.check()?` works in a function returning `Box<dyn Error>` or
/// `anyhow::Result`.
impl std::error::Error for LeaseLoss {}
