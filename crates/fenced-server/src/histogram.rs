//! A Prometheus histogram over fixed bucket bounds, lock-free, and the
//! bounds the node's histograms use. Updated where things happen, rendered
//! by [`crate::observe::metrics`].

use std::{
    fmt::Write,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

/// Bucket upper bounds for latencies, in microseconds (10 µs … 1 s).
pub const LATENCY_US_BOUNDS: &[u64] = &[
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    1_000_000,
];

/// Bucket upper bounds for building a snapshot, in microseconds (1 ms … 60 s).
pub const SNAPSHOT_US_BOUNDS: &[u64] = &[
    1_000, 5_000, 10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000, 30_000_000, 60_000_000,
];

/// Bucket upper bounds for commands per log entry (1 … `MAX_BATCH_COMMANDS`).
pub const BATCH_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1_024, 2_048, 4_096];

/// A Prometheus histogram over fixed bucket bounds, lock-free.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// Per bucket (not cumulative); the last one is `+Inf`.
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|b| *b < value);
        if let Some(bucket) = self.buckets.get(i) {
            bucket.fetch_add(1, Relaxed);
        }
        self.sum.fetch_add(value, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// Writes the histogram; values are multiplied by `scale` (1e-6 turns
    /// microseconds into the seconds Prometheus expects).
    pub fn render(&self, out: &mut String, name: &str, help: &str, scale: f64) {
        header(out, name, help, "histogram");
        self.render_series(out, name, "", scale);
    }

    /// Writes one series of a histogram family whose header is already out;
    /// `labels` (`a="x",b="y"`, or empty) go on every line.
    pub fn render_series(&self, out: &mut String, name: &str, labels: &str, scale: f64) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Relaxed);
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{{labels}{sep}le=\"{}\"}} {cumulative}",
                        *b as f64 * scale
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
                    );
                }
            }
        }
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{labels} {}",
            self.sum.load(Relaxed) as f64 * scale
        );
        let _ = writeln!(out, "{name}_count{labels} {cumulative}");
    }
}

pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the text format requires it between its quotes:
/// backslash, double quote and newline escaped. Every label value of the
/// exposition goes through it, so no text can end a label or a line early.
pub(crate) fn label_value(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return std::borrow::Cow::Borrowed(v);
    }
    let mut out = String::with_capacity(v.len() + 8);
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let h = Histogram::new(&[1, 10]);
        for v in [0, 1, 5, 10, 11] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help", 1.0);
        assert!(out.contains("x_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"10\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("x_sum 27\n"), "{out}");
        assert!(out.contains("x_count 5\n"), "{out}");
        assert_eq!(h.count(), 5);
    }

    #[test]
    fn label_values_are_escaped_as_the_text_format_requires() {
        assert_eq!(
            label_value("fenced.v1.Lock/Acquire"),
            "fenced.v1.Lock/Acquire"
        );
        assert_eq!(label_value("x\",port=\"peer"), "x\\\",port=\\\"peer");
        assert_eq!(label_value("a\\b\nc"), "a\\\\b\\nc");
    }
}
