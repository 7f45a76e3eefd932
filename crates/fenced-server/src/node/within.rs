//! A whole-number setting and its bounds in one type: a flag, a `FENCED_*`
//! variable or a config-file key outside `MIN..=MAX` is refused where it is
//! read (by clap or by serde), naming the setting and both bounds, so the
//! node's configuration never holds one out of range.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// A `u64` in `MIN..=MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Within<const MIN: u64, const MAX: u64>(u64);

/// A value outside a setting's bounds, or not a whole number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfBounds {
    min: u64,
    max: u64,
    got: String,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "must be a whole number between {} and {}, got {}",
            self.min, self.max, self.got
        )
    }
}

impl std::error::Error for OutOfBounds {}

impl<const MIN: u64, const MAX: u64> Within<MIN, MAX> {
    /// The lowest value the setting takes.
    pub const MIN: u64 = MIN;
    /// The highest value the setting takes.
    pub const MAX: u64 = MAX;

    /// `value` if it is within the bounds.
    pub fn new(value: u64) -> Result<Self, OutOfBounds> {
        if (MIN..=MAX).contains(&value) {
            Ok(Self(value))
        } else {
            Err(Self::refusal(value.to_string()))
        }
    }

    /// The value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The value as a `usize` (every bound used fits one on the platforms
    /// fenced builds for; a larger one saturates rather than wraps).
    pub fn get_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }

    fn refusal(got: String) -> OutOfBounds {
        OutOfBounds {
            min: MIN,
            max: MAX,
            got,
        }
    }
}

impl<const MIN: u64, const MAX: u64> TryFrom<u64> for Within<MIN, MAX> {
    type Error = OutOfBounds;

    fn try_from(value: u64) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl<const MIN: u64, const MAX: u64> From<Within<MIN, MAX>> for u64 {
    fn from(value: Within<MIN, MAX>) -> u64 {
        value.0
    }
}

/// How clap reads a flag or variable: a negative number, a fraction or a
/// number past `u64` is refused like one past `MAX`, never wrapped.
impl<const MIN: u64, const MAX: u64> FromStr for Within<MIN, MAX> {
    type Err = OutOfBounds;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let value = s
            .trim()
            .parse::<u64>()
            .map_err(|_| Self::refusal(format!("{s:?}")))?;
        Self::new(value)
    }
}

impl<const MIN: u64, const MAX: u64> fmt::Display for Within<MIN, MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    type Percent = Within<1, 100>;

    #[test]
    fn the_bounds_are_inclusive_and_every_refusal_names_both() {
        assert_eq!(Percent::new(1).unwrap().get(), 1);
        assert_eq!(Percent::new(100).unwrap().get(), 100);
        for bad in [0, 101, u64::MAX] {
            let e = Percent::new(bad).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("must be a whole number between 1 and 100, got {bad}")
            );
        }
    }

    #[test]
    fn text_that_is_not_a_whole_number_is_refused_not_wrapped() {
        assert_eq!("42".parse::<Percent>().unwrap().get(), 42);
        for bad in ["-1", "1.5", "", "18446744073709551616", "0x10", "ten"] {
            let e = bad.parse::<Percent>().unwrap_err().to_string();
            assert!(
                e.starts_with("must be a whole number between 1 and 100"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn serde_refuses_out_of_bounds_and_round_trips_within() {
        #[derive(Debug, Serialize, Deserialize)]
        struct File {
            share: Percent,
        }
        let f: File = toml::from_str("share = 40").unwrap();
        assert_eq!(f.share.get(), 40);
        let table = toml::Table::try_from(&f).unwrap();
        assert_eq!(table["share"].as_integer(), Some(40));
        for bad in ["share = 0", "share = 101", "share = -5"] {
            let e = toml::from_str::<File>(bad).unwrap_err().to_string();
            assert!(e.contains("share"), "{bad}: {e}");
        }
        let e = toml::from_str::<File>("share = 101")
            .unwrap_err()
            .to_string();
        assert!(e.contains("between 1 and 100, got 101"), "{e}");
    }
}
