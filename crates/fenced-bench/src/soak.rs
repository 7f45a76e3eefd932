//! The soak's verdict (docs/BENCHMARKS.md, "Soak"): from samples of each
//! node's resources taken through a long run whose live state stays
//! bounded, which growth the live state does not explain. Pure: the
//! sampling is the scenario's.

/// One sample of one node process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the run began.
    pub at_s: f64,
    pub node: u64,
    /// The process sampled: a restarted node starts a new series.
    pub pid: u32,
    pub rss_mb: f64,
    pub open_files: u64,
    pub threads: u64,
    pub data_dir_mb: f64,
    /// Live leases in the node's table: the state that may explain growth.
    pub live_leases: u64,
}

/// How much each resource may grow between the settled window and the
/// last window before it is a leak, beyond what more live leases explain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slack {
    /// RSS: this factor of the settled median, plus `rss_mb`.
    pub rss_factor: f64,
    pub rss_mb: f64,
    /// Memory per live lease the table may take (about a hundred bytes a
    /// record with its indexes; generous).
    pub rss_mb_per_lease: f64,
    pub open_files: u64,
    pub threads: u64,
    /// The data directory: this factor of the settled maximum, plus
    /// `data_dir_mb` (a log between two snapshots, a snapshot being
    /// written beside the old one).
    pub data_dir_factor: f64,
    pub data_dir_mb: f64,
}

impl Default for Slack {
    fn default() -> Self {
        Self {
            rss_factor: 1.5,
            rss_mb: 32.0,
            rss_mb_per_lease: 0.001,
            open_files: 32,
            threads: 16,
            data_dir_factor: 1.5,
            data_dir_mb: 64.0,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The growths that are leaks: for each node process sampled over the
/// run, the window from a quarter to a half of its samples (settled after
/// the start) against its last quarter. A process with fewer than eight
/// samples is not judged.
pub fn leaks(samples: &[Sample], slack: &Slack) -> Vec<String> {
    let mut series: Vec<(u64, u32)> = samples.iter().map(|s| (s.node, s.pid)).collect();
    series.sort_unstable();
    series.dedup();
    let mut found = Vec::new();
    for (node, pid) in series {
        let own: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.node == node && s.pid == pid)
            .collect();
        let n = own.len();
        if n < 8 {
            continue;
        }
        let settled = &own[n / 4..n / 2];
        let last = &own[n - n / 4..];
        let of =
            |w: &[&Sample], f: fn(&Sample) -> f64| w.iter().map(|s| f(s)).collect::<Vec<f64>>();
        let max = |v: Vec<f64>| v.into_iter().fold(0.0, f64::max);
        let leases_then = max(of(settled, |s| s.live_leases as f64));
        let leases_now = max(of(last, |s| s.live_leases as f64));
        let more_leases = (leases_now - leases_then).max(0.0);

        let rss_then = median(of(settled, |s| s.rss_mb));
        let rss_now = median(of(last, |s| s.rss_mb));
        let rss_bound =
            rss_then * slack.rss_factor + slack.rss_mb + more_leases * slack.rss_mb_per_lease;
        if rss_now > rss_bound {
            found.push(format!(
                "node {node} (pid {pid}): RSS {rss_now:.1} MB at the end against {rss_then:.1} MB settled \
                 (bound {rss_bound:.1} MB; live leases {leases_then} then, {leases_now} now)"
            ));
        }
        let files_then = max(of(settled, |s| s.open_files as f64));
        let files_now = max(of(last, |s| s.open_files as f64));
        if files_now > files_then + slack.open_files as f64 {
            found.push(format!(
                "node {node} (pid {pid}): {files_now} open files at the end against {files_then} settled"
            ));
        }
        let threads_then = max(of(settled, |s| s.threads as f64));
        let threads_now = max(of(last, |s| s.threads as f64));
        if threads_now > threads_then + slack.threads as f64 {
            found.push(format!(
                "node {node} (pid {pid}): {threads_now} threads at the end against {threads_then} settled"
            ));
        }
        let dir_then = max(of(settled, |s| s.data_dir_mb));
        let dir_now = max(of(last, |s| s.data_dir_mb));
        let dir_bound = dir_then * slack.data_dir_factor + slack.data_dir_mb;
        if dir_now > dir_bound {
            found.push(format!(
                "node {node} (pid {pid}): data directory {dir_now:.1} MB at the end against {dir_then:.1} MB \
                 settled (bound {dir_bound:.1} MB)"
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: impl Fn(usize) -> Sample) -> Vec<Sample> {
        (0..40).map(f).collect()
    }

    fn steady(i: usize) -> Sample {
        Sample {
            at_s: i as f64 * 5.0,
            node: 1,
            pid: 100,
            // Start-up growth, then flat with noise.
            rss_mb: if i < 5 {
                10.0 + i as f64 * 5.0
            } else {
                40.0 + (i % 3) as f64
            },
            open_files: 30 + (i % 4) as u64,
            threads: 12,
            data_dir_mb: 5.0 + (i % 5) as f64,
            live_leases: 2_000,
        }
    }

    #[test]
    fn a_steady_node_has_no_leak() {
        assert_eq!(leaks(&run(steady), &Slack::default()), Vec::<String>::new());
    }

    #[test]
    fn memory_files_threads_or_disk_that_keep_growing_are_each_named() {
        let growing = run(|i| Sample {
            rss_mb: 40.0 + i as f64 * 8.0,
            open_files: 30 + i as u64 * 3,
            threads: 12 + i as u64,
            data_dir_mb: 5.0 + i as f64 * 10.0,
            ..steady(i)
        });
        let found = leaks(&growing, &Slack::default());
        assert_eq!(found.len(), 4, "{found:#?}");
        for what in ["RSS", "open files", "threads", "data directory"] {
            assert!(found.iter().any(|f| f.contains(what)), "{what}: {found:#?}");
        }
    }

    #[test]
    fn growth_that_more_live_leases_explain_is_not_a_leak() {
        let filling = run(|i| Sample {
            rss_mb: 40.0 + i as f64 * 4.0,
            live_leases: 2_000 + i as u64 * 5_000,
            ..steady(i)
        });
        assert_eq!(leaks(&filling, &Slack::default()), Vec::<String>::new());
    }

    #[test]
    fn a_restart_starts_a_new_series_and_a_short_one_is_not_judged() {
        let restarted = run(|i| Sample {
            pid: if i < 20 { 100 } else { 200 },
            // The new process starts small: no leak, no false drop.
            rss_mb: if i < 20 { 80.0 } else { 40.0 },
            ..steady(i)
        });
        assert_eq!(leaks(&restarted, &Slack::default()), Vec::<String>::new());
        let short: Vec<Sample> = run(steady).into_iter().take(7).collect();
        assert_eq!(leaks(&short, &Slack::default()), Vec::<String>::new());
    }
}
