//! What a dropped `lock` leaves on the server, given back.
//!
//! An acquire whose caller stops waiting (a timeout around `lock`, a
//! `select!`, a shutdown) may already be on the server: queued, or granted
//! to an owner id nobody else knows. Left alone it would hold the resource
//! for its TTL, or, in the client's session, for as long as the process
//! lives. Like a dropped [`crate::Lease`], the attempt is finished in the
//! background and whatever it brought is released.

use std::time::{Duration, Instant};

use fenced_core::OwnerId;

use crate::calls::{AcquireOutcome, Calls};

/// Armed from the moment an acquire may be sent until its caller holds the
/// answer (a `Lease`, or word that someone else holds the resource).
pub(crate) struct GiveBackIfDropped {
    calls: Calls,
    resource: String,
    owner: OwnerId,
    ttl: Duration,
    wait_ends: Instant,
    armed: bool,
}

impl GiveBackIfDropped {
    pub(crate) fn arm(
        calls: &Calls,
        resource: &str,
        owner: OwnerId,
        ttl: Duration,
        wait: Duration,
    ) -> GiveBackIfDropped {
        let now = Instant::now();
        GiveBackIfDropped {
            calls: calls.clone(),
            resource: resource.to_string(),
            owner,
            ttl,
            wait_ends: now.checked_add(wait).unwrap_or(now),
            armed: true,
        }
    }

    /// The caller has the answer: nothing to give back.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for GiveBackIfDropped {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let calls = self.calls.clone();
        let resource = std::mem::take(&mut self.resource);
        let (owner, ttl) = (self.owner, self.ttl);
        // Asking again with the same owner id finds the first request: its
        // grant, or its place in the queue until its wait ends.
        let wait = self.wait_ends.saturating_duration_since(Instant::now());
        rt.spawn(async move {
            if let Ok((AcquireOutcome::Granted { token, .. }, _)) =
                calls.acquire_sent(&resource, owner, ttl, wait).await
            {
                tracing::debug!(%resource, token = token.get(), "gave back the grant of a dropped acquire");
                let _ = calls.release(&resource, owner, token).await;
            }
        });
    }
}
