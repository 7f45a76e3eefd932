//! Latency histograms per operation type (HdrHistogram, microseconds).

use std::{collections::BTreeMap, time::Duration};

use hdrhistogram::Histogram;

/// Highest latency recorded exactly: 5 minutes.
const MAX_MICROS: u64 = 300_000_000;

/// Latencies per operation type plus an error count, for one client task;
/// merged into one at the end of a run.
#[derive(Debug, Clone)]
pub struct Recorder {
    ops: BTreeMap<&'static str, Histogram<u64>>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

// The bounds are constants (1 µs .. 5 min, 3 significant digits), valid for
// every input; nothing a peer or a file says can make this fail.
#[allow(clippy::expect_used)]
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("constant histogram bounds are valid")
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            ops: BTreeMap::new(),
            errors: 0,
            first_error: None,
        }
    }

    /// Records one operation of type `op` that took `latency`.
    pub fn record(&mut self, op: &'static str, latency: Duration) {
        let micros = u64::try_from(latency.as_micros())
            .unwrap_or(MAX_MICROS)
            .clamp(1, MAX_MICROS);
        let h = self.ops.entry(op).or_insert_with(histogram);
        // Within bounds by the clamp above.
        let _ = h.record(micros);
    }

    /// Counts a failed operation, keeping the first message.
    pub fn error(&mut self, message: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message());
        }
    }

    pub fn merge(&mut self, other: &Recorder) {
        for (op, h) in &other.ops {
            let mine = self.ops.entry(op).or_insert_with(histogram);
            let _ = mine.add(h);
        }
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }

    /// Operations of type `op` recorded.
    pub fn count(&self, op: &str) -> u64 {
        self.ops.get(op).map_or(0, Histogram::len)
    }

    /// The `q` quantile (0..=1) of `op`, in microseconds.
    pub fn quantile_micros(&self, op: &str, q: f64) -> Option<u64> {
        self.ops
            .get(op)
            .filter(|h| !h.is_empty())
            .map(|h| h.value_at_quantile(q))
    }

    pub fn ops(&self) -> impl Iterator<Item = (&'static str, &Histogram<u64>)> {
        self.ops.iter().map(|(k, v)| (*k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_recorders_keep_counts_and_quantiles() {
        let mut a = Recorder::new();
        let mut b = Recorder::new();
        for i in 1..=99 {
            a.record("cycle", Duration::from_micros(i * 10));
        }
        b.record("cycle", Duration::from_millis(50));
        b.error(|| "boom".into());
        a.merge(&b);
        assert_eq!(a.count("cycle"), 100);
        assert_eq!(a.errors, 1);
        assert_eq!(a.first_error.as_deref(), Some("boom"));
        let p50 = a.quantile_micros("cycle", 0.5).unwrap_or(0);
        assert!((495..=505).contains(&p50), "p50 {p50}");
        let max = a.quantile_micros("cycle", 1.0).unwrap_or(0);
        assert!(max >= 49_900, "max {max}");
    }
}
