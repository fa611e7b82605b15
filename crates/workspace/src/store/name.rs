//! Names of workspaces, images, snapshots and networks: what users type,
//! and a directory name in the state directory, so they are kept to a
//! safe, DNS-label-like alphabet. The messages name no noun: the error
//! that carries one says whose name it was.

/// Longest accepted name.
pub const MAX_NAME_LEN: usize = 63;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty.
    #[error("the name is empty")]
    Empty,
    /// Too long.
    #[error("the name is {0} characters long; at most {MAX_NAME_LEN} are allowed")]
    TooLong(usize),
    /// A character outside the alphabet.
    #[error("the name contains {0:?}; use lowercase letters, digits and '-'")]
    BadChar(char),
    /// Must start with a letter.
    #[error("the name must start with a lowercase letter")]
    BadStart,
    /// Must not end with '-'.
    #[error("the name cannot end with '-'")]
    BadEnd,
}

/// Checks a workspace name: 1-63 of `a-z`, `0-9`, `-`, starting with a
/// letter and not ending with `-`.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let first = name.chars().next().ok_or(NameError::Empty)?;
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(NameError::BadChar(c));
    }
    if !first.is_ascii_lowercase() {
        return Err(NameError::BadStart);
    }
    if name.ends_with('-') {
        return Err(NameError::BadEnd);
    }
    Ok(())
}

/// The built-in rootless network.
pub const USER_NETWORK: &str = "user";
/// No network device.
pub const NO_NETWORK: &str = "none";
/// The network a workspace gets unless it asks for another.
pub const DEFAULT_NETWORK: &str = USER_NETWORK;

/// Checks the form of a network name: a built-in one, or one that
/// [`validate_name`] accepts (whether it exists is the networks' concern).
pub fn validate_network_name(name: &str) -> Result<(), NameError> {
    match name {
        USER_NETWORK | NO_NETWORK => Ok(()),
        other => validate_name(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_label_like_names() {
        for ok in ["a", "dev", "agent-7", "x1-y2-z3", &"a".repeat(MAX_NAME_LEN)] {
            assert_eq!(validate_name(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(validate_name(&"a".repeat(64)), Err(NameError::TooLong(64)));
        assert_eq!(validate_name("Dev"), Err(NameError::BadChar('D')));
        assert_eq!(validate_name("a/b"), Err(NameError::BadChar('/')));
        assert_eq!(validate_name(".."), Err(NameError::BadChar('.')));
        assert_eq!(validate_name("a b"), Err(NameError::BadChar(' ')));
        assert_eq!(validate_name("é"), Err(NameError::BadChar('é')));
        assert_eq!(validate_name("1abc"), Err(NameError::BadStart));
        assert_eq!(validate_name("-abc"), Err(NameError::BadStart));
        assert_eq!(validate_name("abc-"), Err(NameError::BadEnd));
    }
}
