//! Times for people: the leader's wall clock as RFC 3339 (UTC), beside the
//! cluster time that leases actually run on.

use std::time::{Duration, UNIX_EPOCH};

/// `2026-12-06T17:01:02.345Z`; `None` for 0 (the cluster had no
/// wall-clock anchor yet).
pub fn rfc3339(unix_ms: u64) -> Option<String> {
    (unix_ms > 0).then(|| {
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
    })
}

/// A time for a line of text: the date and time, else the cluster time.
pub fn when(unix_ms: u64, cluster_ms: u64) -> String {
    rfc3339(unix_ms).unwrap_or_else(|| format!("cluster time {cluster_ms} ms"))
}

/// `, at 2026-12-06T17:01:02.345Z` to end a line; nothing when unknown.
pub fn at(unix_ms: u64) -> String {
    rfc3339(unix_ms)
        .map(|t| format!(", at {t}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_utc_dates_and_unknown_ones_as_cluster_time() {
        assert_eq!(
            rfc3339(1_800_000_000_123).as_deref(),
            Some("2027-01-15T08:00:00.123Z")
        );
        assert_eq!(rfc3339(0), None);
        assert_eq!(when(0, 188_721), "cluster time 188721 ms");
        assert_eq!(at(1_800_000_000_123), ", at 2027-01-15T08:00:00.123Z");
        assert_eq!(at(0), "");
        // The latest time a node accepts still formats.
        assert_eq!(
            rfc3339(fenced_core::MAX_UNIX_MS).as_deref(),
            Some("9999-12-31T23:59:59.999Z")
        );
    }
}
