use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::InvalidArgument;

/// A UUID id chosen by the client, validated (never nil) with errors naming
/// `$field`.
macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh random id (UUID v4) (feature `random`, on for every
            /// crate of the workspace but the core itself).
            #[cfg(feature = "random")]
            pub fn random() -> Self {
                Self(Uuid::new_v4())
            }

            /// Validates a UUID: the nil UUID is refused.
            pub fn new(id: Uuid) -> Result<Self, InvalidArgument> {
                if id.is_nil() {
                    return Err(InvalidArgument::new(
                        $field,
                        "must be a non-nil UUID (16 bytes)",
                    ));
                }
                Ok(Self(id))
            }

            /// Validates 16 raw bytes from the wire.
            pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidArgument> {
                let id = Uuid::from_slice(bytes).map_err(|_| {
                    InvalidArgument::new(
                        $field,
                        format!("must be exactly 16 bytes (a UUID), got {}", bytes.len()),
                    )
                })?;
                Self::new(id)
            }

            /// Parses the text form (`67e55044-10b1-426f-9247-bb680e5fe0c8`).
            pub fn parse(text: &str) -> Result<Self, InvalidArgument> {
                let id = Uuid::parse_str(text)
                    .map_err(|e| InvalidArgument::new($field, format!("must be a UUID: {e}")))?;
                Self::new(id)
            }

            pub fn as_bytes(&self) -> &[u8; 16] {
                self.0.as_bytes()
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

uuid_id!(
    /// The id of ONE acquisition attempt, chosen by the client (a UUID).
    ///
    /// Together with the token it is the capability to renew or release, so it is
    /// never shown to other clients. A new attempt uses a new id.
    ///
    /// ```
    /// use fenced_core::OwnerId;
    /// let owner = OwnerId::random();
    /// assert_eq!(OwnerId::from_bytes(owner.as_bytes())?, owner);
    /// assert!(OwnerId::from_bytes(&[0; 16]).is_err()); // the nil UUID
    /// # Ok::<(), fenced_core::InvalidArgument>(())
    /// ```
    OwnerId,
    "owner_id"
);

uuid_id!(
    /// The id of a session ([`crate::Command::OpenSession`]), chosen by the
    /// client (a UUID), so that a retried open finds the session it opened.
    ///
    /// ```
    /// use fenced_core::SessionId;
    /// let err = SessionId::from_bytes(&[1; 3]).unwrap_err();
    /// assert_eq!(err.field(), "session_id");
    /// ```
    SessionId,
    "session_id"
);

/// A fencing token: the ownership generation of a resource, always ≥ 1.
///
/// Compare tokens; derive no other meaning from the number.
///
/// ```
/// use fenced_core::Token;
/// assert_eq!(Token::new(7)?.get(), 7);
/// assert!(Token::new(0).is_err());
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Token(u64);

impl Token {
    /// Validates a token presented by a client: 0 is never issued.
    pub fn new(value: u64) -> Result<Self, InvalidArgument> {
        if value == 0 {
            return Err(InvalidArgument::new(
                "token",
                "must be at least 1 (tokens start at 1)",
            ));
        }
        Ok(Self(value))
    }

    /// A token issued by the table's counter, which starts at 1.
    pub(crate) fn issued(value: u64) -> Self {
        debug_assert!(value >= 1);
        Self(value)
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", self.0)
    }
}
