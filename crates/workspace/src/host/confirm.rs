//! The tokens that confirm a previewed [`Plan`]. A token is refused when it
//! is malformed or forged ([`ConfirmError::TokenWrong`]), older than
//! [`TOKEN_TTL_MS`] ([`ConfirmError::TokenExpired`]), already used once
//! ([`ConfirmError::TokenUsed`]), or issued for a plan other than the one
//! the operation would apply now ([`ConfirmError::PlanChanged`]: the host
//! or the request changed since).
//!
//! Tokens are `EXPIRES-NONCE-PLANDIGEST-MAC`: the MAC is keyed with a
//! random key kept in the state directory ([`KEY_FILE`], mode 0600), so
//! only this state directory's previews can be confirmed. A token is spent
//! by creating `SPENT_DIR/EXPIRES-NONCE` (O_EXCL: of two callers racing
//! with one token, one applies); spent names are swept once expired.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use base::host::plan::{Plan, Preview};

/// How long a preview's token can be confirmed.
pub const TOKEN_TTL_MS: u64 = 5 * 60 * 1000;
/// The key that signs tokens, in the state directory.
pub const KEY_FILE: &str = "plan.key";
/// The tokens used already, in the state directory (mode 0700).
pub const SPENT_DIR: &str = "plan.spent";
/// Hex digits of the plan digest a token carries.
const DIGEST_HEX: usize = 16;
/// Bytes of the key.
const KEY_LEN: usize = 32;

/// Why a token does not confirm a plan.
#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    /// The token is not one this state directory issued.
    #[error("the confirm token is not valid")]
    TokenWrong,
    /// The token is older than five minutes.
    #[error("the confirm token expired")]
    TokenExpired,
    /// The token confirmed a plan once already.
    #[error("the confirm token was used already; a token applies its plan once")]
    TokenUsed,
    /// What would be applied now differs from what the token was issued
    /// for.
    #[error("the plan changed since the preview (the host or the request changed)")]
    PlanChanged,
    /// The signing key could not be read or made.
    #[error("the plan key {}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The record of used tokens could not be written.
    #[error("recording the used token in {}", path.display())]
    Spend {
        /// The record.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl ConfirmError {
    /// The stable code front ends report.
    pub fn code(&self) -> base::code::ErrorCode {
        use base::code::ErrorCode as C;
        match self {
            Self::TokenWrong | Self::TokenExpired | Self::TokenUsed => C::InvalidInput,
            Self::PlanChanged => C::Conflict,
            Self::Key { .. } | Self::Spend { .. } => C::Internal,
        }
    }

    /// What the caller can do about it.
    pub fn remedy(&self) -> Option<base::remedy::Remedy> {
        match self {
            Self::TokenWrong | Self::TokenExpired | Self::TokenUsed | Self::PlanChanged => {
                Some(base::remedy::Remedy::PreviewAgain)
            }
            Self::Key { .. } | Self::Spend { .. } => None,
        }
    }
}

/// A token's parts.
struct Token<'a> {
    expires: &'a str,
    nonce: &'a str,
    digest: &'a str,
    mac: &'a str,
}

impl<'a> Token<'a> {
    fn parse(token: &'a str) -> Result<Self, ConfirmError> {
        let mut parts = token.trim().splitn(4, '-');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(expires), Some(nonce), Some(digest), Some(mac))
                if [expires, nonce, digest, mac]
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit())) =>
            {
                Ok(Self {
                    expires,
                    nonce,
                    digest,
                    mac,
                })
            }
            _ => Err(ConfirmError::TokenWrong),
        }
    }

    fn message(&self) -> String {
        format!("{}-{}-{}", self.expires, self.nonce, self.digest)
    }

    /// The name it is spent under.
    fn spent_name(&self) -> String {
        format!("{}-{}", self.expires, self.nonce)
    }
}

/// Issues, checks and spends tokens with the state directory's key.
#[derive(Clone)]
pub struct Confirmer {
    key: [u8; KEY_LEN],
    spent: PathBuf,
}

impl std::fmt::Debug for Confirmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Confirmer { .. }")
    }
}

impl Confirmer {
    /// The confirmer of the state directory at `root` (its key is made on
    /// first use).
    pub fn open(root: &Path) -> Result<Self, ConfirmError> {
        let path = root.join(KEY_FILE);
        let spent = root.join(SPENT_DIR);
        let err = |source| ConfirmError::Key {
            path: path.clone(),
            source,
        };
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() == KEY_LEN => {
                let mut key = [0; KEY_LEN];
                key.copy_from_slice(&bytes);
                return Ok(Self { key, spent });
            }
            Ok(_) => {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("it is not {KEY_LEN} bytes; remove it and preview again"),
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        let mut key = [0u8; KEY_LEN];
        // SAFETY: getrandom writes at most `key.len()` bytes into it.
        let got = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
        if got != KEY_LEN as isize {
            return Err(err(std::io::Error::last_os_error()));
        }
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()));
        match made {
            Ok(()) => Ok(Self { key, spent }),
            // Another process made it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::open(root),
            Err(e) => Err(err(e)),
        }
    }

    /// Checks that a token could be this state directory's at all (a key
    /// exists: some preview was made) without making anything, so a
    /// stray token changes nothing.
    pub fn expect_issued(root: &Path, token: &str) -> Result<(), ConfirmError> {
        Token::parse(token)?;
        if root.join(KEY_FILE).exists() {
            Ok(())
        } else {
            Err(ConfirmError::TokenWrong)
        }
    }

    /// A confirmer with a given key, spending into `spent`.
    #[cfg(test)]
    pub(crate) fn with_key(key: [u8; KEY_LEN], spent: PathBuf) -> Self {
        Self { key, spent }
    }

    fn mac(&self, message: &str) -> String {
        let inner = Sha256::new()
            .chain_update(self.key)
            .chain_update(message.as_bytes())
            .finalize();
        let outer = Sha256::new()
            .chain_update(self.key)
            .chain_update(inner)
            .finalize();
        format!("{outer:x}")
    }

    /// The preview of `plan` at `now_ms`: with a token unless it is empty.
    pub fn preview(&self, plan: Plan, now_ms: u64) -> Preview {
        if plan.is_empty() {
            return Preview {
                plan,
                token: None,
                expires_at_ms: None,
            };
        }
        let expires = now_ms + TOKEN_TTL_MS;
        let digest = &plan.digest()[..DIGEST_HEX];
        let nonce = base::host::dirfd::random_hex();
        let message = format!("{expires:x}-{nonce}-{digest}");
        let token = format!("{message}-{}", self.mac(&message));
        Preview {
            plan,
            token: Some(token),
            expires_at_ms: Some(expires),
        }
    }

    /// Checks that `token` confirms `plan` at `now_ms` and was not used.
    pub fn check(&self, plan: &Plan, token: &str, now_ms: u64) -> Result<(), ConfirmError> {
        let t = Token::parse(token)?;
        // Both are hex of one length: comparing all bytes costs the same
        // whatever matches.
        let want = self.mac(&t.message());
        let same = want.len() == t.mac.len()
            && want
                .bytes()
                .zip(t.mac.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(ConfirmError::TokenWrong);
        }
        let expires = u64::from_str_radix(t.expires, 16).map_err(|_| ConfirmError::TokenWrong)?;
        if now_ms > expires {
            return Err(ConfirmError::TokenExpired);
        }
        if self.spent.join(t.spent_name()).exists() {
            return Err(ConfirmError::TokenUsed);
        }
        if plan.digest()[..DIGEST_HEX] != *t.digest {
            return Err(ConfirmError::PlanChanged);
        }
        Ok(())
    }

    /// Uses up `token` (one [`Confirmer::check`] passed): a second spend,
    /// here or in another process, is [`ConfirmError::TokenUsed`]. Spent
    /// names that expired by `now_ms` are swept.
    pub fn spend(&self, token: &str, now_ms: u64) -> Result<(), ConfirmError> {
        let t = Token::parse(token)?;
        let err = |path: &Path| {
            let path = path.to_owned();
            move |source| ConfirmError::Spend { path, source }
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&self.spent) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(err(&self.spent)(e))
            }
            _ => {}
        }
        self.sweep(now_ms);
        let path = self.spent.join(t.spent_name());
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(ConfirmError::TokenUsed),
            Err(e) => Err(err(&path)(e)),
        }
    }

    /// Removes spent names whose tokens expired: they cannot be checked.
    fn sweep(&self, now_ms: u64) {
        let Ok(entries) = std::fs::read_dir(&self.spent) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let expires = name
                .to_str()
                .and_then(|n| n.split_once('-'))
                .and_then(|(e, _)| u64::from_str_radix(e, 16).ok());
            if expires.is_some_and(|e| e < now_ms) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::host::plan::Step;

    fn plan(arg: &str) -> Plan {
        Plan {
            action: "test".into(),
            steps: vec![Step::new("say it", "true", &[arg])],
            ..Plan::default()
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ma-confirm-{tag}-{}",
            base::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A confirmer whose scratch directory goes with it.
    struct Scratch(Confirmer);

    impl std::ops::Deref for Scratch {
        type Target = Confirmer;
        fn deref(&self) -> &Confirmer {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            if let Some(dir) = self.0.spent.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn confirmer(key: u8) -> Scratch {
        Scratch(Confirmer::with_key(
            [key; KEY_LEN],
            scratch("spent").join(SPENT_DIR),
        ))
    }

    #[test]
    fn a_token_confirms_its_own_plan_only_and_only_in_time() {
        let c = confirmer(7);
        let p = plan("a");
        let preview = c.preview(p.clone(), 1_000);
        let token = preview.token.unwrap();
        assert_eq!(preview.expires_at_ms, Some(1_000 + TOKEN_TTL_MS));
        c.check(&p, &token, 1_000).unwrap();
        c.check(&p, &token, 1_000 + TOKEN_TTL_MS).unwrap();
        assert!(matches!(
            c.check(&p, &token, 1_001 + TOKEN_TTL_MS),
            Err(ConfirmError::TokenExpired)
        ));
        assert!(matches!(
            c.check(&plan("b"), &token, 2_000),
            Err(ConfirmError::PlanChanged)
        ));
    }

    #[test]
    fn a_token_applies_its_plan_once() {
        let c = confirmer(7);
        let p = plan("a");
        let token = c.preview(p.clone(), 1_000).token.unwrap();
        let again = c.preview(p.clone(), 1_000).token.unwrap();
        assert_ne!(token, again, "each preview's token is its own");
        c.check(&p, &token, 1_000).unwrap();
        c.spend(&token, 1_000).unwrap();
        assert!(matches!(
            c.check(&p, &token, 1_001),
            Err(ConfirmError::TokenUsed)
        ));
        // A second process with the same state directory, racing.
        let twin = Confirmer::with_key([7; KEY_LEN], c.spent.clone());
        assert!(matches!(
            twin.spend(&token, 1_001),
            Err(ConfirmError::TokenUsed)
        ));
        c.check(&p, &again, 1_001).unwrap();
        // Spent names go once their tokens expired.
        let later = c
            .preview(p.clone(), 1_000 + 2 * TOKEN_TTL_MS)
            .token
            .unwrap();
        c.spend(&later, 1_001 + TOKEN_TTL_MS).unwrap();
        let names: Vec<_> = std::fs::read_dir(&c.spent).unwrap().collect();
        assert_eq!(names.len(), 1, "only the unexpired one is kept");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&c.spent).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn forged_and_malformed_tokens_are_wrong() {
        let c = confirmer(7);
        let p = plan("a");
        let token = c.preview(p.clone(), 1_000).token.unwrap();
        let other = confirmer(8);
        assert!(matches!(
            other.check(&p, &token, 1_000),
            Err(ConfirmError::TokenWrong)
        ));
        // A later expiry with the old MAC.
        let (_, rest) = token.split_once('-').unwrap();
        let extended = format!("{:x}-{rest}", 1_000 + 10 * TOKEN_TTL_MS);
        assert!(matches!(
            c.check(&p, &extended, 1_000),
            Err(ConfirmError::TokenWrong)
        ));
        let cut = &token[..token.len() - 1];
        for bad in ["", "x", "1-2", "1-2-3", "1-2-3-", "---", "g-1-2-3", cut] {
            assert!(
                matches!(c.check(&p, bad, 1_000), Err(ConfirmError::TokenWrong)),
                "{bad:?}"
            );
        }
        assert!(matches!(
            c.spend("1-2", 1_000),
            Err(ConfirmError::TokenWrong)
        ));
    }

    #[test]
    fn an_empty_plan_needs_no_token() {
        let c = confirmer(7);
        let empty = Plan {
            action: "test".into(),
            steps: vec![],
            ..Plan::default()
        };
        assert_eq!(c.preview(empty, 1).token, None);
        let writes = Plan {
            writes: vec!["/x".into()],
            ..Plan::new("test")
        };
        assert!(c.preview(writes, 1).token.is_some());
    }

    #[test]
    fn the_key_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("key");
        let a = Confirmer::open(&dir).unwrap();
        let b = Confirmer::open(&dir).unwrap();
        assert_eq!(a.key, b.key);
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = a.preview(plan("a"), 5).token.unwrap();
        b.check(&plan("a"), &token, 5).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
