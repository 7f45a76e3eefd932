//! The caller's deadline, from the gRPC `grpc-timeout` header, on this
//! node's monotonic clock. A command whose caller has given up is not
//! forwarded or proposed: otherwise a request held up on the way (a paused
//! follower, a stalled connection) could be written long after its caller
//! retried elsewhere.

use std::time::{Duration, Instant};

use tonic::Request;

const GRPC_TIMEOUT: &str = "grpc-timeout";

/// When the caller of `req` stops waiting: the `grpc-timeout` it sent,
/// counted from now (the request's arrival on this node). `None` when the
/// caller sent no deadline or one that does not parse.
pub fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    let timeout = parse_grpc_timeout(req.metadata().get(GRPC_TIMEOUT)?.to_str().ok()?)?;
    Instant::now().checked_add(timeout)
}

/// A `grpc-timeout` value: at most 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let unit_at = value.len().checked_sub(1)?;
    let (digits, unit) = (value.get(..unit_at)?, value.get(unit_at..)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3_600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn every_unit_of_the_spec_parses() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7_200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("4S"), Some(Duration::from_secs(4)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            parse_grpc_timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
    }

    #[test]
    fn malformed_values_are_no_deadline() {
        for bad in ["", "m", "5", "5x", "123456789m", "-5m", "+5m", "5é", "1 m"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_deadline_is_counted_from_arrival() {
        let mut req = Request::new(());
        req.set_timeout(Duration::from_millis(500));
        let before = Instant::now();
        let deadline = deadline_of(&req).expect("a deadline");
        assert!(deadline >= before + Duration::from_millis(500));
        assert!(deadline <= Instant::now() + Duration::from_millis(500));
        assert_eq!(deadline_of(&Request::new(())), None);
    }
}
