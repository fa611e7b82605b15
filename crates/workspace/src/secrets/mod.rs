//! Named secrets: values kept in `<state>/secrets/` (directory 0700, one
//! file per secret, 0600) that a command gets as an environment variable
//! and nowhere else. Requests carry names only ([`crate::ExecRequest::secret`]);
//! values are read here when the agent's request is built, and what the
//! command prints is masked ([`SecretMask`]) before any caller sees it.

mod mask;
pub(crate) mod processes;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::Serialize;

use base::code::ErrorCode;
use base::remedy::Remedy;
use base::store::records::{RecordError, RecordFiles, RecordLayout};
use base::store::{StateDir, StoreError};

pub use mask::{MaskStream, SecretMask, MASK};

/// The directory of secrets in the state directory.
pub const SECRETS_DIR: &str = "secrets";
/// Longest secret name.
pub const MAX_SECRET_NAME: usize = 64;
/// Largest secret value, bytes.
pub const MAX_SECRET_VALUE: usize = 64 << 10;

/// Why a secret operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The name is not an environment variable's (`[A-Za-z_][A-Za-z0-9_]*`,
    /// at most 64 characters).
    #[error("invalid secret name `{name}`: {why}")]
    Name {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The value is empty, too large, holds a NUL byte or is not UTF-8.
    #[error("invalid value for secret `{name}`: {why}")]
    Value {
        /// The secret.
        name: String,
        /// What is wrong with it (never the value).
        why: &'static str,
    },
    /// No secret of that name.
    #[error("secret `{0}` does not exist")]
    NotFound(String),
    /// The request sets the same environment variable itself.
    #[error("environment variable `{0}` is given both as a secret and as a plain variable")]
    EnvClash(String),
    /// The secrets directory could not be made.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading, writing, listing or removing a secret's file failed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl SecretError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            SecretError::Name { .. } | SecretError::Value { .. } | SecretError::EnvClash(_) => {
                ErrorCode::InvalidInput
            }
            SecretError::NotFound(_) => ErrorCode::NotFound,
            SecretError::Store(e) => e.code(),
            SecretError::Record(e) => e.code(),
        }
    }

    /// What resolves it, if the caller can do something.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            SecretError::NotFound(name) => Some(Remedy::SetSecret {
                secret: name.clone(),
            }),
            _ => None,
        }
    }
}

/// Checks a secret name: an environment variable's, `[A-Za-z_][A-Za-z0-9_]*`,
/// at most [`MAX_SECRET_NAME`] characters.
pub fn validate_secret_name(name: &str) -> Result<(), SecretError> {
    let bad = |why| {
        Err(SecretError::Name {
            name: name.chars().take(MAX_SECRET_NAME + 8).collect(),
            why,
        })
    };
    let Some(first) = name.chars().next() else {
        return bad("it is empty");
    };
    if name.len() > MAX_SECRET_NAME {
        return bad("it is longer than 64 characters");
    }
    if !(first.is_ascii_alphabetic() || first == '_') {
        return bad("it must start with a letter or `_`");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return bad("use only letters, digits and `_`");
    }
    Ok(())
}

/// A secret's value. Its `Debug` shows no value, so a log line or a panic
/// message that prints a request never reveals it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Checks `bytes` as the value of secret `name`: non-empty, at most
    /// [`MAX_SECRET_VALUE`] bytes, no NUL byte (an environment variable
    /// cannot hold one), UTF-8.
    pub fn new(name: &str, bytes: Vec<u8>) -> Result<Self, SecretError> {
        let bad = |why| SecretError::Value {
            name: name.to_owned(),
            why,
        };
        if bytes.is_empty() {
            return Err(bad("it is empty"));
        }
        if bytes.len() > MAX_SECRET_VALUE {
            return Err(bad(TOO_LARGE));
        }
        if bytes.contains(&0) {
            return Err(bad("it holds a NUL byte"));
        }
        String::from_utf8(bytes)
            .map(Self)
            .map_err(|_| bad("it is not UTF-8"))
    }

    /// The value itself: for the agent's request and the mask only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(MASK)
    }
}

/// A secret as front ends list it: never its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct SecretInfo {
    /// Its name (the environment variable a command gets).
    pub name: String,
    /// When it was last set (Unix ms).
    pub updated_at_ms: u64,
}

/// Why a value read back is refused when its file is over the bound.
const TOO_LARGE: &str = "it is larger than 64 KiB";

/// The secrets of one state directory.
#[derive(Clone, Debug)]
pub struct SecretStore {
    root: PathBuf,
}

impl SecretStore {
    /// The secrets of `state`.
    pub fn new(state: &StateDir) -> Self {
        Self {
            root: state.root().join(SECRETS_DIR),
        }
    }

    /// The secrets as files: one each, named as the secret, its value
    /// all it holds.
    fn files(&self) -> RecordFiles {
        RecordFiles::new(&self.root, RecordLayout::File(""), |name| {
            validate_secret_name(name).is_ok()
        })
        .max_bytes(MAX_SECRET_VALUE as u64)
    }

    /// Sets secret `name` to `value` (replacing it): written to a 0600
    /// temporary file, synced, then renamed over the old one, so a crash
    /// leaves the old value or the new one.
    pub fn set(&self, name: &str, value: &SecretValue) -> Result<SecretInfo, SecretError> {
        validate_secret_name(name)?;
        self.files().write(name, value.expose().as_bytes())?;
        self.info(name)
    }

    fn info(&self, name: &str) -> Result<SecretInfo, SecretError> {
        validate_secret_name(name)?;
        let meta = self
            .files()
            .metadata(name)?
            .ok_or_else(|| SecretError::NotFound(name.to_owned()))?;
        let updated_at_ms = u64::try_from(meta.mtime()).unwrap_or(0) * 1000
            + u64::try_from(meta.mtime_nsec()).unwrap_or(0) / 1_000_000;
        Ok(SecretInfo {
            name: name.to_owned(),
            updated_at_ms,
        })
    }

    /// Every secret's name and update time (never a value), by name.
    pub fn list(&self) -> Result<Vec<SecretInfo>, SecretError> {
        Ok(self
            .files()
            .names()?
            .iter()
            .filter_map(|n| self.info(n).ok())
            .collect())
    }

    /// Removes secret `name`.
    pub fn remove(&self, name: &str) -> Result<SecretInfo, SecretError> {
        let info = self.info(name)?;
        if !self.files().remove(name)? {
            return Err(SecretError::NotFound(name.to_owned()));
        }
        Ok(info)
    }

    /// Secret `name`'s value.
    pub fn get(&self, name: &str) -> Result<SecretValue, SecretError> {
        validate_secret_name(name)?;
        match self.files().read(name) {
            Ok(Some(bytes)) => SecretValue::new(name, bytes),
            Ok(None) => Err(SecretError::NotFound(name.to_owned())),
            Err(RecordError::TooLarge { .. }) => Err(SecretError::Value {
                name: name.to_owned(),
                why: TOO_LARGE,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// The values of `names`, in order; the first unknown name fails it.
    pub fn resolve<'a, I>(&self, names: I) -> Result<Vec<(String, SecretValue)>, SecretError>
    where
        I: IntoIterator<Item = &'a String>,
    {
        names
            .into_iter()
            .map(|n| Ok((n.clone(), self.get(n)?)))
            .collect()
    }

    /// Fails unless every one of `names` is a secret (NOT_FOUND for the
    /// first that is not): checked before a one-shot workspace is made.
    pub fn require<'a, I>(&self, names: I) -> Result<(), SecretError>
    where
        I: IntoIterator<Item = &'a String>,
    {
        for name in names {
            validate_secret_name(name)?;
            if !self.files().metadata(name)?.is_some_and(|m| m.is_file()) {
                return Err(SecretError::NotFound(name.clone()));
            }
        }
        Ok(())
    }

    /// The mask for `names`: those that no longer exist are left out (their
    /// values are gone; nothing can be masked by them).
    pub fn mask_for<'a, I>(&self, names: I) -> SecretMask
    where
        I: IntoIterator<Item = &'a String>,
    {
        SecretMask::new(
            names
                .into_iter()
                .filter_map(|n| self.get(n).ok())
                .collect::<Vec<_>>()
                .iter(),
        )
    }
}

#[cfg(test)]
mod tests;
