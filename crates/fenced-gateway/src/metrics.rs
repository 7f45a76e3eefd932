//! The gateway's counters and their Prometheus text.

use std::sync::atomic::{AtomicU64, Ordering};

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Forwarded; the upstream answered 2xx.
    Forwarded,
    /// Forwarded; the upstream answered something else.
    UpstreamRefused,
    /// The upstream failed or timed out.
    UpstreamFailed,
    /// An operation id already applied: answered without forwarding.
    Duplicate,
    /// A stale token (the ledger) or a lease not current (the cluster).
    Stale,
    /// Bad headers or an oversized body.
    BadRequest,
    /// Authentication or permission refused.
    Unauthorized,
    /// No turn, the cluster or the ledger unavailable.
    Unavailable,
}

const OUTCOMES: [(Outcome, &str); 8] = [
    (Outcome::Forwarded, "forwarded"),
    (Outcome::UpstreamRefused, "upstream_refused"),
    (Outcome::UpstreamFailed, "upstream_failed"),
    (Outcome::Duplicate, "duplicate"),
    (Outcome::Stale, "stale"),
    (Outcome::BadRequest, "bad_request"),
    (Outcome::Unauthorized, "unauthorized"),
    (Outcome::Unavailable, "unavailable"),
];

/// One request forwarded and not yet answered: counted while it lives,
/// whichever way it ends.
pub struct InFlight<'a>(&'a Metrics);

impl<'a> InFlight<'a> {
    /// Counts one more request in flight.
    pub fn start(metrics: &'a Metrics) -> Self {
        metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(metrics)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Never below zero, whatever the order of updates.
        let _ = self
            .0
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
    }
}

/// Counters shared by every connection.
#[derive(Debug, Default)]
pub struct Metrics {
    outcomes: [AtomicU64; 8],
    in_flight: AtomicU64,
    upstream_micros: AtomicU64,
    upstream_calls: AtomicU64,
    connections_refused: AtomicU64,
}

impl Metrics {
    /// Counts one request's end.
    pub fn count(&self, outcome: Outcome) {
        if let Some(i) = OUTCOMES.iter().position(|(o, _)| *o == outcome) {
            if let Some(c) = self.outcomes.get(i) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// One upstream call's duration.
    pub fn upstream(&self, took: std::time::Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.upstream_micros.fetch_add(micros, Ordering::Relaxed);
        self.upstream_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection refused at the connection bound.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// How many requests ended with `outcome`.
    pub fn get(&self, outcome: Outcome) -> u64 {
        OUTCOMES
            .iter()
            .position(|(o, _)| *o == outcome)
            .and_then(|i| self.outcomes.get(i))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP fenced_gateway_requests_total Requests by how they ended.\n");
        out.push_str("# TYPE fenced_gateway_requests_total counter\n");
        for (i, (_, name)) in OUTCOMES.iter().enumerate() {
            let v = self
                .outcomes
                .get(i)
                .map_or(0, |c| c.load(Ordering::Relaxed));
            out.push_str(&format!(
                "fenced_gateway_requests_total{{outcome=\"{name}\"}} {v}\n"
            ));
        }
        let gauge = |out: &mut String, name: &str, help: &str, kind: &str, v: String| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            ));
        };
        gauge(
            &mut out,
            "fenced_gateway_in_flight",
            "Requests forwarded and not yet answered.",
            "gauge",
            self.in_flight.load(Ordering::Relaxed).to_string(),
        );
        gauge(
            &mut out,
            "fenced_gateway_upstream_seconds_sum",
            "Time spent in upstream calls.",
            "counter",
            format!(
                "{:.6}",
                self.upstream_micros.load(Ordering::Relaxed) as f64 / 1e6
            ),
        );
        gauge(
            &mut out,
            "fenced_gateway_upstream_calls_total",
            "Upstream calls made.",
            "counter",
            self.upstream_calls.load(Ordering::Relaxed).to_string(),
        );
        gauge(
            &mut out,
            "fenced_gateway_connections_refused_total",
            "Connections closed at max_connections.",
            "counter",
            self.connections_refused.load(Ordering::Relaxed).to_string(),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_in_the_exposition() {
        let m = Metrics::default();
        m.count(Outcome::Stale);
        m.count(Outcome::Stale);
        let one = InFlight::start(&m);
        assert_eq!(m.get(Outcome::Stale), 2);
        let text = m.render();
        assert!(
            text.contains("fenced_gateway_requests_total{outcome=\"stale\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("fenced_gateway_in_flight 1\n"), "{text}");
        drop(one);
        assert!(m.render().contains("fenced_gateway_in_flight 0\n"));
    }
}
