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

/// The namespace of everything that names none, and of all state made
/// before namespaces existed.
pub const DEFAULT_NAMESPACE: &str = "default";
/// What a listing takes to span every namespace.
pub const ALL_NAMESPACES: &str = "*";
/// Longest namespace name (a full name must fit a socket path).
pub const MAX_NAMESPACE_LEN: usize = 31;
/// Longest full name: `name.namespace`.
pub const MAX_FULL_NAME_LEN: usize = MAX_NAME_LEN + 1 + MAX_NAMESPACE_LEN;

/// Checks a namespace name: the name rules, at most 31 characters.
pub fn validate_namespace(namespace: &str) -> Result<(), NameError> {
    validate_name(namespace)?;
    if namespace.len() > MAX_NAMESPACE_LEN {
        return Err(NameError::TooLong(namespace.len()));
    }
    Ok(())
}

/// The full name of `name` in `namespace`: `name` itself in the default
/// namespace (so state made before namespaces keeps its names), else
/// `name.namespace`, as a DNS name reads (the guest's short hostname stays
/// `name`). A name that is full already (it has a `.`) is kept: a full
/// name means the same thing from every namespace.
pub fn full_name(namespace: &str, name: &str) -> Result<String, NameError> {
    if name.contains('.') {
        validate_full_name(name)?;
        return Ok(name.to_owned());
    }
    validate_name(name)?;
    if namespace == DEFAULT_NAMESPACE || namespace == ALL_NAMESPACES {
        return Ok(name.to_owned());
    }
    validate_namespace(namespace)?;
    Ok(format!("{name}.{namespace}"))
}

/// Checks a full name: `name` or `name.namespace`.
pub fn validate_full_name(full: &str) -> Result<(), NameError> {
    match full.split_once('.') {
        Some((name, namespace)) if namespace != DEFAULT_NAMESPACE => {
            validate_name(name)?;
            validate_namespace(namespace)
        }
        // `dev.default` would be a second spelling of `dev`.
        Some(_) => Err(NameError::BadChar('.')),
        None => validate_name(full),
    }
}

/// The namespace a full name is in.
pub fn namespace_of(full: &str) -> &str {
    full.split_once('.').map_or(DEFAULT_NAMESPACE, |(_, ns)| ns)
}

/// Whether a thing in namespace `of` is shown in `view` (everything is in
/// `*`).
pub fn shown_in(of: &str, view: &str) -> bool {
    view == ALL_NAMESPACES || of == view
}

/// A full name held by value (it is `Copy`, as the handles holding it
/// are). Made only from a checked name, so it is ASCII.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FullName {
    bytes: [u8; MAX_FULL_NAME_LEN],
    len: u8,
}

impl FullName {
    /// Holds `full` after checking it.
    pub fn new(full: &str) -> Result<Self, NameError> {
        validate_full_name(full)?;
        let mut bytes = [0; MAX_FULL_NAME_LEN];
        bytes[..full.len()].copy_from_slice(full.as_bytes());
        Ok(Self {
            bytes,
            len: full.len() as u8,
        })
    }

    /// Holds a name the crate read from its own state, unchecked (a
    /// damaged one reads as empty, which every lookup refuses).
    pub fn held(name: &str) -> Self {
        let len = name.len().min(MAX_FULL_NAME_LEN);
        let mut bytes = [0; MAX_FULL_NAME_LEN];
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        Self {
            bytes,
            len: len as u8,
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Checked ASCII when made; the fallback is unreachable.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::ops::Deref for FullName {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for FullName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

impl std::fmt::Display for FullName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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

    #[test]
    fn full_names_carry_their_namespace() {
        assert_eq!(full_name("default", "dev").unwrap(), "dev");
        assert_eq!(full_name("*", "dev").unwrap(), "dev");
        assert_eq!(full_name("team-a", "dev").unwrap(), "dev.team-a");
        // A full name is the same from everywhere.
        assert_eq!(full_name("team-b", "dev.team-a").unwrap(), "dev.team-a");
        assert!(full_name("team-a", "dev.default").is_err());
        assert!(full_name("Team", "dev").is_err());
        assert!(full_name(&"n".repeat(32), "dev").is_err());
        assert!(full_name("a", "x.y.z").is_err());
        assert_eq!(namespace_of("dev"), "default");
        assert_eq!(namespace_of("dev.team-a"), "team-a");
        let of = namespace_of("dev.team-a");
        assert!(shown_in(of, "*") && !shown_in(of, "default"));
        assert!(validate_full_name(&format!("{}.{}", "a".repeat(63), "b".repeat(31))).is_ok());
    }
}
