//! The fencing headers of a guarded request, read and bounded.

use fenced_core::{OwnerId, ResourceName, Token};
use http::HeaderMap;

use crate::refusal::Refusal;

/// The lock resource the token was granted for.
pub const RESOURCE_HEADER: &str = "x-fencing-resource";
/// The fencing token, in decimal.
pub const TOKEN_HEADER: &str = "x-fencing-token";
/// The owner id of the acquisition that holds the token (a UUID).
pub const OWNER_HEADER: &str = "x-fencing-owner";
/// The caller's id for this operation: a retry with the same id is applied
/// once.
pub const OPERATION_HEADER: &str = "x-fencing-operation-id";

/// The highest token a ledger stores (SQL `bigint`).
pub const TOKEN_MAX: u64 = fenced_sql::TOKEN_MAX;

/// A guarded request's fence, as the layer read it. The handler finds it in
/// the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    /// The lock resource.
    pub resource: ResourceName,
    /// The fencing token presented.
    pub token: Token,
    /// The owner id presented.
    pub owner: OwnerId,
    /// The operation id, if one was sent.
    pub operation_id: Option<String>,
    /// `owner` as the ledgers record it (hyphenated, lower case).
    owner_text: String,
}

impl Fenced {
    /// The fence as the ledgers take it.
    pub fn as_fence(&self, contract: fenced_sql::Contract) -> fenced_sql::Fence<'_> {
        fenced_sql::Fence {
            resource: self.resource.as_str(),
            token: self.token.get(),
            owner_id: &self.owner_text,
            operation_id: self.operation_id.as_deref(),
            contract,
        }
    }
}

/// Reads the fence of a request. Each header must appear once; the error
/// names the header and its bound. `require_operation` makes
/// [`OPERATION_HEADER`] required.
///
/// ```
/// use http::HeaderMap;
/// let mut h = HeaderMap::new();
/// h.insert("x-fencing-resource", "statement:7".parse().unwrap());
/// h.insert("x-fencing-token", "42".parse().unwrap());
/// h.insert("x-fencing-owner", "5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21".parse().unwrap());
/// let fenced = fenced_http::parse_headers(&h, false).unwrap();
/// assert_eq!(fenced.token.get(), 42);
/// h.insert("x-fencing-token", "0".parse().unwrap());
/// let refusal = fenced_http::parse_headers(&h, false).unwrap_err();
/// assert!(refusal.message.starts_with("x-fencing-token: "));
/// ```
pub fn parse_headers(headers: &HeaderMap, require_operation: bool) -> Result<Fenced, Refusal> {
    let resource_text = one(headers, RESOURCE_HEADER)?.ok_or_else(|| {
        missing(
            RESOURCE_HEADER,
            "the lock resource the token was granted for",
        )
    })?;
    let resource = ResourceName::new(resource_text)
        .map_err(|e| Refusal::bad_header(RESOURCE_HEADER, e.to_string()))?;
    let token_text = one(headers, TOKEN_HEADER)?
        .ok_or_else(|| missing(TOKEN_HEADER, "the lease's fencing token"))?;
    let token =
        parse_token(token_text).map_err(|reason| Refusal::bad_header(TOKEN_HEADER, reason))?;
    let owner_text =
        one(headers, OWNER_HEADER)?.ok_or_else(|| missing(OWNER_HEADER, "the lease's owner id"))?;
    let owner =
        OwnerId::parse(owner_text).map_err(|e| Refusal::bad_header(OWNER_HEADER, e.to_string()))?;
    let operation_id = match one(headers, OPERATION_HEADER)? {
        None if require_operation => {
            return Err(missing(
                OPERATION_HEADER,
                "an id for this operation, the same on every retry",
            ))
        }
        None => None,
        Some(op) if op.is_empty() || op.len() > fenced_sql::OPERATION_ID_MAX_BYTES => {
            return Err(Refusal::bad_header(
                OPERATION_HEADER,
                format!(
                    "must be 1 to {} bytes, got {}",
                    fenced_sql::OPERATION_ID_MAX_BYTES,
                    op.len()
                ),
            ))
        }
        Some(op) => Some(op.to_string()),
    };
    Ok(Fenced {
        owner_text: owner.as_uuid().hyphenated().to_string(),
        resource,
        token,
        owner,
        operation_id,
    })
}

/// A decimal token from 1 to [`TOKEN_MAX`], digits only.
fn parse_token(text: &str) -> Result<Token, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "must be a decimal number from 1 to {TOKEN_MAX}, got {text:?}"
        ));
    }
    let value: u64 = text
        .parse()
        .map_err(|_| format!("must be at most {TOKEN_MAX}, got {text}"))?;
    if value > TOKEN_MAX {
        return Err(format!("must be at most {TOKEN_MAX}, got {value}"));
    }
    Token::new(value).map_err(|_| "must be at least 1 (fenced issues tokens from 1), got 0".into())
}

/// The one value of `name`: two values are refused, since a proxy and the
/// caller could each have set one and the layer cannot tell which counts.
fn one<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, Refusal> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Refusal::bad_header(
            name,
            "must appear once, got it more than once",
        ));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| Refusal::bad_header(name, "must be visible ASCII"))
}

fn missing(name: &'static str, what: &str) -> Refusal {
    Refusal::bad_header(name, format!("required: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap_or_else(|_| panic!("{v}")));
        }
        h
    }

    const OWNER: &str = "5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21";

    fn message(pairs: &[(&'static str, &str)], require_operation: bool) -> String {
        match parse_headers(&headers(pairs), require_operation) {
            Err(r) => r.message,
            Ok(f) => panic!("accepted {f:?}"),
        }
    }

    #[test]
    fn every_header_is_required_and_named() {
        let all = [
            (RESOURCE_HEADER, "r"),
            (TOKEN_HEADER, "3"),
            (OWNER_HEADER, OWNER),
        ];
        for skip in 0..all.len() {
            let some: Vec<_> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, p)| *p)
                .collect();
            assert!(message(&some, false).starts_with(&format!("{}: required", all[skip].0)));
        }
        assert!(message(&all, true).starts_with("x-fencing-operation-id: required"));
        let ok = parse_headers(&headers(&all), false).unwrap_or_else(|r| panic!("{r:?}"));
        assert_eq!(ok.resource.as_str(), "r");
        assert_eq!(ok.token.get(), 3);
        assert_eq!(ok.operation_id, None);
    }

    #[test]
    fn tokens_are_bounded_and_decimal() {
        for (bad, why) in [
            ("0", "must be at least 1"),
            ("-1", "must be a decimal number"),
            ("+5", "must be a decimal number"),
            (" 5", "must be a decimal number"),
            ("0x10", "must be a decimal number"),
            ("9223372036854775808", "must be at most 9223372036854775807"),
            (
                "18446744073709551616",
                "must be at most 9223372036854775807",
            ),
        ] {
            let m = message(
                &[
                    (RESOURCE_HEADER, "r"),
                    (TOKEN_HEADER, bad),
                    (OWNER_HEADER, OWNER),
                ],
                false,
            );
            assert!(m.starts_with("x-fencing-token: "), "{m}");
            assert!(m.contains(why), "{bad}: {m}");
        }
        let max = parse_headers(
            &headers(&[
                (RESOURCE_HEADER, "r"),
                (TOKEN_HEADER, "9223372036854775807"),
                (OWNER_HEADER, OWNER),
            ]),
            false,
        );
        assert_eq!(max.map(|f| f.token.get()).ok(), Some(TOKEN_MAX));
    }

    #[test]
    fn a_repeated_header_is_refused() {
        let m = message(
            &[
                (RESOURCE_HEADER, "r"),
                (TOKEN_HEADER, "9"),
                (TOKEN_HEADER, "3"),
                (OWNER_HEADER, OWNER),
            ],
            false,
        );
        assert_eq!(
            m,
            "x-fencing-token: must appear once, got it more than once"
        );
    }

    #[test]
    fn owner_resource_and_operation_are_bounded() {
        let m = message(
            &[
                (RESOURCE_HEADER, "r"),
                (TOKEN_HEADER, "3"),
                (OWNER_HEADER, "nobody"),
            ],
            false,
        );
        assert!(m.starts_with("x-fencing-owner: "), "{m}");
        let long = "r".repeat(fenced_core::RESOURCE_NAME_MAX_BYTES + 1);
        let m = message(
            &[
                (RESOURCE_HEADER, &long),
                (TOKEN_HEADER, "3"),
                (OWNER_HEADER, OWNER),
            ],
            false,
        );
        assert!(m.starts_with("x-fencing-resource: "), "{m}");
        let op = "o".repeat(129);
        let m = message(
            &[
                (RESOURCE_HEADER, "r"),
                (TOKEN_HEADER, "3"),
                (OWNER_HEADER, OWNER),
                (OPERATION_HEADER, &op),
            ],
            false,
        );
        assert_eq!(m, "x-fencing-operation-id: must be 1 to 128 bytes, got 129");
    }
}
