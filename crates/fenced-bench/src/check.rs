//! The correctness check every benchmark run makes as it goes: per resource,
//! the tokens of successive grants strictly increase (docs/DESIGN.md §2, guarantee 1).

use std::{collections::HashMap, fmt, sync::Mutex};

/// A grant whose token did not exceed the previous grant's on its resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub resource: String,
    pub previous_token: u64,
    pub token: u64,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "token order violated on {}: granted token {} after token {}",
            self.resource, self.token, self.previous_token
        )
    }
}

impl std::error::Error for Violation {}

/// The last granted token per resource, in the order grants were observed.
///
/// A grant is recorded by its holder before the holder releases, so on one
/// resource the observations are ordered like the grants themselves: the
/// next holder can only be granted after the release.
#[derive(Debug, Default)]
pub struct TokenLedger {
    last: Mutex<HashMap<String, u64>>,
}

impl TokenLedger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a grant of `token` on `resource`; a token not greater than the
    /// previous one on that resource is a violation (and is not recorded).
    pub fn record(&self, resource: &str, token: u64) -> Result<(), Violation> {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.get_mut(resource) {
            Some(previous) if *previous >= token => Err(Violation {
                resource: resource.to_string(),
                previous_token: *previous,
                token,
            }),
            Some(previous) => {
                *previous = token;
                Ok(())
            }
            None => {
                last.insert(resource.to_string(), token);
                Ok(())
            }
        }
    }

    /// How many resources were granted at least once.
    pub fn resources(&self) -> usize {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

/// Checks a whole history of (resource, token) grants in commit order.
pub fn check_history<'a>(
    grants: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), Violation> {
    let ledger = TokenLedger::new();
    for (resource, token) in grants {
        ledger.record(resource, token)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increasing_tokens_per_resource_pass() {
        let history = [("a", 1), ("b", 2), ("a", 3), ("b", 7), ("a", 9)];
        assert_eq!(check_history(history), Ok(()));
    }

    #[test]
    fn a_reused_token_fails_the_run() {
        let history = [("a", 1), ("a", 4), ("b", 2), ("a", 4)];
        assert_eq!(
            check_history(history),
            Err(Violation {
                resource: "a".into(),
                previous_token: 4,
                token: 4
            })
        );
    }

    #[test]
    fn a_regressing_token_fails_the_run() {
        let history = [("r", 10), ("r", 11), ("r", 5)];
        let err = check_history(history).err();
        assert_eq!(
            err.map(|v| (v.previous_token, v.token)),
            Some((11, 5)),
            "a token lower than the previous grant must be reported"
        );
    }

    #[test]
    fn tokens_of_other_resources_do_not_interfere() {
        // Sparse tokens from one global counter are fine per resource.
        let history = [("a", 5), ("b", 1), ("a", 6), ("b", 2)];
        assert_eq!(check_history(history), Ok(()));
    }
}
