//! The stable error codes every front end reports (CLI exit messages and
//! `--json`, MCP tool errors). Adding one is a compatible change; renaming
//! or removing one is not.

use serde::{Deserialize, Serialize};

/// What kind of failure an operation had, independent of its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The named workspace, image, file or exec does not exist.
    NotFound,
    /// The request itself is wrong (bad name, out-of-range value, ...).
    InvalidInput,
    /// The operation needs a running workspace.
    NotRunning,
    /// The request clashes with current state (name taken, image in use, ...).
    Conflict,
    /// Not allowed (permissions, a protected path).
    Forbidden,
    /// This host cannot do it (no /dev/kvm, missing capability).
    HostUnsupported,
    /// It did not finish in time.
    Timeout,
    /// A bug or an unexpected host failure.
    Internal,
}

impl ErrorCode {
    /// Every code, for `contract` output and tests.
    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::NotFound,
        ErrorCode::InvalidInput,
        ErrorCode::NotRunning,
        ErrorCode::Conflict,
        ErrorCode::Forbidden,
        ErrorCode::HostUnsupported,
        ErrorCode::Timeout,
        ErrorCode::Internal,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::InvalidInput => "INVALID_INPUT",
            ErrorCode::NotRunning => "NOT_RUNNING",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::HostUnsupported => "HOST_UNSUPPORTED",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::Internal => "INTERNAL",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_match_serde_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert!(seen.insert(code.as_str()));
        }
    }
}
