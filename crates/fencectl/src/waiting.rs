//! While `acquire --wait`, `lock` or `run` waits for a held resource, a
//! line on stderr says who holds it and for how long.
//!
//! What to print is decided by [`Notice`], a pure function of what the last
//! look at the resource showed and when; the loop around it only asks the
//! cluster once a second and prints.

use std::{future::Future, time::Duration};

use fenced_client::Client;
use tokio::time::Instant;

/// How often the resource is looked at, and the most lines a second.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// A line repeats, with the time left, at most this often when nothing
/// changed: enough to see the wait progress in a log, not a line a second.
pub const REPEAT_EVERY: Duration = Duration::from_secs(5);

/// One look at the resource (from Describe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub held: bool,
    pub token: u64,
    pub remaining_ms: u64,
    pub waiters: u64,
}

/// What was last printed, to print again only on a change or after
/// [`REPEAT_EVERY`].
#[derive(Debug, Default)]
pub struct Notice {
    last: Option<(Seen, Duration)>,
}

impl Notice {
    /// The line to print for `seen`, `at` since the wait started, if any.
    pub fn line(&mut self, resource: &str, seen: Seen, at: Duration) -> Option<String> {
        if !seen.held {
            // Free: the acquire is about to be granted; nothing to explain.
            return None;
        }
        let due = match self.last {
            None => true,
            Some((last, printed)) => {
                let since = at.saturating_sub(printed);
                since >= LOOK_EVERY
                    && (last.token != seen.token
                        || last.waiters != seen.waiters
                        || since >= REPEAT_EVERY)
            }
        };
        if !due {
            return None;
        }
        self.last = Some((seen, at));
        let others = seen.waiters.saturating_sub(1);
        Some(format!(
            "fencectl: waiting for {resource}: held by token {}, {} left{}",
            seen.token,
            humantime::format_duration(Duration::from_secs(seen.remaining_ms.div_ceil(1000))),
            match others {
                0 => String::new(),
                1 => ", 1 other waiting".to_string(),
                n => format!(", {n} others waiting"),
            }
        ))
    }
}

/// Runs `wait` (an acquire that may wait on the server); meanwhile, if
/// `talk`, looks at `resource` once a second and prints what [`Notice`]
/// decides. A look that fails (no `read` role, say) ends the looking, with
/// one line that says what is awaited.
pub async fn while_waiting<T>(
    client: &Client,
    resource: &str,
    talk: bool,
    wait: impl Future<Output = T>,
) -> T {
    if !talk {
        return wait.await;
    }
    let looker = client.clone().with_call_timeout(LOOK_EVERY);
    let look = async {
        let started = Instant::now();
        let mut notice = Notice::default();
        // Give an acquire of a free resource time to be granted unremarked.
        tokio::time::sleep(Duration::from_millis(200)).await;
        loop {
            match looker.describe(resource).await {
                Ok(d) => {
                    let seen = Seen {
                        held: d.held,
                        token: d.last_token,
                        remaining_ms: d.remaining_ms,
                        waiters: u64::from(d.waiters),
                    };
                    if let Some(line) = notice.line(resource, seen, started.elapsed()) {
                        eprintln!("{line}");
                    }
                }
                Err(e) => {
                    eprintln!("fencectl: waiting for {resource} (who holds it is not shown: {e})");
                    return std::future::pending().await;
                }
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    };
    tokio::select! {
        out = wait => out,
        never = look => never,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn held(token: u64, remaining_ms: u64, waiters: u64) -> Seen {
        Seen {
            held: true,
            token,
            remaining_ms,
            waiters,
        }
    }

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn the_first_look_says_who_holds_and_for_how_long() {
        let mut n = Notice::default();
        assert_eq!(
            n.line("demo", held(1, 26_400, 1), s(0.2)).as_deref(),
            Some("fencectl: waiting for demo: held by token 1, 27s left")
        );
    }

    #[test]
    fn a_free_resource_prints_nothing() {
        let mut n = Notice::default();
        let free = Seen {
            held: false,
            ..held(3, 0, 0)
        };
        assert_eq!(n.line("demo", free, s(0.2)), None);
    }

    #[test]
    fn nothing_new_repeats_every_five_seconds_only() {
        let mut n = Notice::default();
        assert!(n.line("demo", held(1, 30_000, 1), s(0.0)).is_some());
        for t in 1..5 {
            assert_eq!(
                n.line("demo", held(1, 30_000 - t * 1000, 1), s(t as f64)),
                None
            );
        }
        let again = n.line("demo", held(1, 25_000, 1), s(5.0)).unwrap();
        assert!(again.ends_with("held by token 1, 25s left"), "{again}");
    }

    #[test]
    fn a_new_holder_or_waiter_is_said_at_the_next_second() {
        let mut n = Notice::default();
        n.line("demo", held(1, 30_000, 1), s(0.0)).unwrap();
        // At most one line a second, whatever changes.
        assert_eq!(n.line("demo", held(2, 30_000, 1), s(0.5)), None);
        let line = n.line("demo", held(2, 30_000, 3), s(1.0)).unwrap();
        assert!(
            line.ends_with("held by token 2, 30s left, 2 others waiting"),
            "{line}"
        );
        let line = n.line("demo", held(2, 29_000, 2), s(2.0)).unwrap();
        assert!(line.ends_with(", 1 other waiting"), "{line}");
    }
}
