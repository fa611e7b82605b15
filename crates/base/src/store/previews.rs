//! Preview URLs' records (issue 61): a web app on a guest port reached
//! through an HTTP server of the host (`serve mcp --http`, `serve
//! preview`) at `/preview/<token>/`. A preview is a capability: whoever
//! holds its token reaches that one port of that one workspace, until it
//! expires or is revoked. Tokens are 32 random bytes (64 hex digits),
//! shown once; the state directory keeps only their SHA-256
//! (`<state>/previews/<hash>.json`, directory 0700), so reading it gives no
//! preview away. A preview names its workspace and the time that
//! workspace was made: one made again under the same name is not reached
//! by the old token. The library's calls are `workspace::previews`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::code::ErrorCode;
use crate::store::file_lock::FileLock;
use crate::store::records::{RecordError, RecordLayout, RecordStore};
use crate::store::StateDir;

/// The directory of previews in the state directory.
pub const PREVIEWS_DIR: &str = "previews";
/// The path prefix a preview is served under.
pub const PREVIEW_PATH: &str = "/preview/";
/// How long a preview lasts unless asked otherwise.
pub const DEFAULT_PREVIEW_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest a preview may last.
pub const MAX_PREVIEW_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// The most previews a state directory keeps (expired ones are swept
/// before a new one is counted).
pub const MAX_PREVIEWS: usize = 256;
/// The most previews one workspace has, so that no one tenant fills the
/// state directory's.
pub const MAX_WORKSPACE_PREVIEWS: usize = 16;
/// Random bytes in a token.
const TOKEN_BYTES: usize = 32;

/// Why a preview could not be made, found or revoked.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The guest port is 0.
    #[error("port 0 cannot be previewed: give the guest port the web app listens on")]
    Port,
    /// The lifetime asked for is 0 or longer than [`MAX_PREVIEW_TTL`].
    #[error("a preview lasts from 1 s to {} days; {asked} s was asked", MAX_PREVIEW_TTL.as_secs() / 86_400)]
    Lifetime {
        /// Seconds asked for.
        asked: u64,
    },
    /// The state directory holds [`MAX_PREVIEWS`] previews already, or
    /// the workspace [`MAX_WORKSPACE_PREVIEWS`].
    #[error(
        "{0} previews exist already: revoke some first (port_preview_revoke, `port unpreview`)"
    )]
    TooMany(usize),
    /// The token source of the host failed.
    #[error("no random bytes for a token")]
    Random(#[source] std::io::Error),
    /// The store's lock (`<state>/previews.lock`) could not be taken.
    #[error("locking the previews")]
    Lock(#[source] std::io::Error),
    /// A preview's record could not be read, written or removed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl PreviewError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            PreviewError::Port | PreviewError::Lifetime { .. } | PreviewError::TooMany(_) => {
                ErrorCode::InvalidInput
            }
            PreviewError::Random(_) | PreviewError::Lock(_) => ErrorCode::Internal,
            PreviewError::Record(e) => e.code(),
        }
    }
}

/// What the state directory keeps of a preview (never its token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewRecord {
    /// The workspace's full name.
    pub workspace: String,
    /// When that workspace was made (a workspace made again under its
    /// name is another one).
    pub workspace_created_at_ms: u64,
    /// The guest port.
    pub port: u16,
    /// When it was made, Unix ms.
    pub created_at_ms: u64,
    /// When it stops working, Unix ms.
    pub expires_at_ms: u64,
    /// The agent that made it, when an agent's session did: it works only
    /// while that agent may use the workspace (a share taken back ends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// One line of a listing of a workspace's previews: its port, until when,
/// and the agent that made it (the CLI's and the MCP server's words).
pub fn describe(port: u16, expires_at_ms: u64, agent: Option<&str>) -> String {
    let by = agent
        .map(|a| format!(", made by agent {a}"))
        .unwrap_or_default();
    format!("port {port} until {expires_at_ms} (Unix ms){by}")
}

/// A preview just made: its token, shown this once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IssuedPreview {
    /// The token (64 hex digits): `/preview/<token>/` reaches the port.
    pub token: String,
    /// The path it is served at on a preview server.
    pub path: String,
    /// The first label of its own origin's host name
    /// (`<label>.localhost:PORT`, or `<label>.DOMAIN` with
    /// `--preview-domain`).
    pub origin_label: String,
    /// What it reaches and until when.
    #[serde(flatten)]
    pub record: PreviewRecord,
}

/// The previews of a state directory.
#[derive(Clone, Debug)]
pub struct PreviewStore {
    records: RecordStore<PreviewRecord>,
}

/// A record's name: the token's SHA-256, 64 lowercase hex digits.
fn is_digest_name(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The record name of `token`, when it has a token's form (64 hex digits).
pub(crate) fn digest_of(token: &str) -> Option<String> {
    if !(token.len() == 2 * TOKEN_BYTES && token.bytes().all(|b| b.is_ascii_hexdigit())) {
        return None;
    }
    let digest = Sha256::digest(token.to_ascii_lowercase().as_bytes());
    Some(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// Hex digits of a token's digest in its preview's short name.
const ID_DIGITS: usize = 16;
/// What a preview's own host name begins with (`pv<id>.localhost`).
pub const ORIGIN_LABEL_PREFIX: &str = "pv";

/// The first label of the host name of the preview `token` opens
/// (`pv` and 16 hex digits of its digest, no secret): each preview is a
/// web origin of its own, so one guest's pages share no storage, cookies
/// or service workers with another's.
pub fn origin_label(token: &str) -> Option<String> {
    digest_of(token).map(|d| label_of(&d))
}

/// The origin label of a token's `digest` (its record's name).
fn label_of(digest: &str) -> String {
    format!("{ORIGIN_LABEL_PREFIX}{}", &digest[..ID_DIGITS])
}

/// What the cookies of the preview `token` opens are renamed with
/// (`c<12 hex digits>_`): from the token under another name than its
/// digest, so a page that knows a preview's host name cannot set cookies
/// that preview's app would be given.
pub fn cookie_prefix(token: &str) -> Option<String> {
    digest_of(token)?;
    let keyed = Sha256::digest(format!("preview cookies\0{}", token.to_ascii_lowercase()));
    let hex: String = keyed.iter().take(6).map(|b| format!("{b:02x}")).collect();
    Some(format!("c{hex}_"))
}

/// Whether `label` (lowercase) has the form of an [`origin_label`].
pub fn is_origin_label(label: &str) -> bool {
    label.strip_prefix(ORIGIN_LABEL_PREFIX).is_some_and(|id| {
        id.len() == ID_DIGITS && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// A new token from the host's random source.
pub(crate) fn new_token() -> Result<String, PreviewError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: getrandom writes at most the length given into the
        // buffer's unfilled part.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(PreviewError::Random(e));
        }
        filled += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl PreviewStore {
    /// The previews of `state`.
    pub fn new(state: &StateDir) -> Self {
        Self {
            records: RecordStore::new(
                state.root().join(PREVIEWS_DIR),
                RecordLayout::File(".json"),
                is_digest_name,
            ),
        }
    }

    /// Keeps `record` under a new token; expired previews go first, and
    /// past [`MAX_PREVIEWS`] none is made.
    pub fn create(
        &self,
        record: PreviewRecord,
        now_ms: u64,
    ) -> Result<IssuedPreview, PreviewError> {
        if record.port == 0 {
            return Err(PreviewError::Port);
        }
        // Counted and made under one lock: creates at once cannot
        // overshoot the caps.
        let _lock = FileLock::exclusive(&self.records.dir().with_extension("lock"))
            .map_err(PreviewError::Lock)?;
        let live = self.sweep(now_ms)?;
        if live >= MAX_PREVIEWS {
            return Err(PreviewError::TooMany(MAX_PREVIEWS));
        }
        let workspace = &record.workspace;
        if self
            .list_where(now_ms, |r| &r.workspace == workspace)?
            .len()
            >= MAX_WORKSPACE_PREVIEWS
        {
            return Err(PreviewError::TooMany(MAX_WORKSPACE_PREVIEWS));
        }
        let token = new_token()?;
        let name = digest_of(&token).ok_or(PreviewError::Port)?;
        self.records.create(&name, &record)?;
        Ok(IssuedPreview {
            path: format!("{PREVIEW_PATH}{token}/"),
            origin_label: label_of(&name),
            token,
            record,
        })
    }

    /// The live preview `token` opens, if any (an expired one goes).
    pub fn find(&self, token: &str, now_ms: u64) -> Result<Option<PreviewRecord>, PreviewError> {
        let Some(name) = digest_of(token) else {
            return Ok(None);
        };
        match self.records.get(&name)? {
            Some(record) if record.expires_at_ms > now_ms => Ok(Some(record)),
            Some(_) => {
                self.records.remove(&name)?;
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Removes the previews `matches` picks; how many went.
    pub fn remove_where(
        &self,
        matches: impl Fn(&PreviewRecord) -> bool,
    ) -> Result<usize, PreviewError> {
        let mut removed = 0;
        for name in self.records.names()? {
            if self.records.get(&name)?.is_some_and(|r| matches(&r))
                && self.records.remove(&name)?
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The live previews `matches` picks.
    pub fn list_where(
        &self,
        now_ms: u64,
        matches: impl Fn(&PreviewRecord) -> bool,
    ) -> Result<Vec<PreviewRecord>, PreviewError> {
        let mut live = Vec::new();
        for name in self.records.names()? {
            if let Some(record) = self.records.get(&name)? {
                if record.expires_at_ms > now_ms && matches(&record) {
                    live.push(record);
                }
            }
        }
        live.sort_by_key(|r| (r.port, r.created_at_ms));
        Ok(live)
    }

    /// Removes expired previews; how many live ones are left.
    fn sweep(&self, now_ms: u64) -> Result<usize, PreviewError> {
        self.remove_where(|r| r.expires_at_ms <= now_ms)?;
        Ok(self.records.names()?.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(test: &str) -> (PreviewStore, std::path::PathBuf) {
        let root = std::env::temp_dir().join(format!("ma-previews-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        (PreviewStore::new(&StateDir::at(&root).unwrap()), root)
    }

    fn record(expires_at_ms: u64) -> PreviewRecord {
        PreviewRecord {
            workspace: "dev".into(),
            workspace_created_at_ms: 1,
            port: 80,
            created_at_ms: 1,
            expires_at_ms,
            agent: None,
        }
    }

    #[test]
    fn expired_previews_open_nothing_and_make_room() {
        let (store, root) = store("expire");
        let made = store.create(record(100), 50).unwrap();
        assert!(store.find(&made.token, 99).unwrap().is_some());
        assert_eq!(store.find(&made.token, 100).unwrap(), None);
        assert_eq!(
            store.find(&made.token, 99).unwrap(),
            None,
            "removed once expired"
        );
        // A workspace has a few; the state directory more.
        for _ in 0..MAX_WORKSPACE_PREVIEWS {
            store.create(record(1_000), 500).unwrap();
        }
        assert!(matches!(
            store.create(record(2_000), 500),
            Err(PreviewError::TooMany(MAX_WORKSPACE_PREVIEWS))
        ));
        for i in MAX_WORKSPACE_PREVIEWS..MAX_PREVIEWS {
            let other = PreviewRecord {
                workspace: format!("w{}", i / MAX_WORKSPACE_PREVIEWS),
                ..record(1_000)
            };
            store.create(other, 500).unwrap();
        }
        let one_more = PreviewRecord {
            workspace: "fresh".into(),
            ..record(2_000)
        };
        assert!(matches!(
            store.create(one_more, 500),
            Err(PreviewError::TooMany(MAX_PREVIEWS))
        ));
        // Once they expired there is room again.
        store.create(record(3_000), 1_000).unwrap();
        assert_eq!(store.list_where(1_000, |_| true).unwrap().len(), 1);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn creates_at_once_do_not_overshoot_a_cap() {
        let (store, root) = store("race");
        std::fs::create_dir_all(&root).unwrap();
        let made: usize = std::thread::scope(|scope| {
            let tries: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..MAX_WORKSPACE_PREVIEWS)
                            .filter(|_| store.create(record(1_000), 1).is_ok())
                            .count()
                    })
                })
                .collect();
            tries.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert_eq!(made, MAX_WORKSPACE_PREVIEWS);
        assert_eq!(
            store.list_where(1, |_| true).unwrap().len(),
            MAX_WORKSPACE_PREVIEWS
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn only_the_digest_is_kept_and_only_a_tokens_form_is_looked_up() {
        let (store, root) = store("digest");
        let made = store.create(record(u64::MAX), 1).unwrap();
        assert_eq!(made.token.len(), 64);
        assert_eq!(made.path, format!("/preview/{}/", made.token));
        // Its own origin's label: from the digest, whatever the case.
        assert_eq!(Some(&made.origin_label), origin_label(&made.token).as_ref());
        assert_eq!(
            origin_label(&made.token.to_uppercase()),
            Some(made.origin_label.clone())
        );
        assert!(is_origin_label(&made.origin_label));
        assert!(!made.origin_label.contains(&made.token[..16]));
        // Its cookies' prefix is not to be had from its host name.
        let cookies = cookie_prefix(&made.token).unwrap();
        assert_eq!(cookies.len(), 14);
        assert!(!made.origin_label.contains(&cookies[1..13]));
        assert_eq!(cookie_prefix(&made.token.to_uppercase()), Some(cookies));
        assert_eq!(cookie_prefix("not a token"), None);
        for not_one in [
            "pv",
            "pv0123",
            "px0123456789abcdef",
            "pv0123456789ABCDEF",
            "pv0123456789abcdefa",
        ] {
            assert!(!is_origin_label(not_one), "{not_one}");
        }
        assert_eq!(origin_label("not a token"), None);
        let files: Vec<_> = std::fs::read_dir(root.join(PREVIEWS_DIR))
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(files.len(), 1);
        assert!(!std::fs::read_to_string(files[0].path())
            .unwrap()
            .contains(&made.token));
        assert_eq!(
            files[0].file_name().to_string_lossy(),
            format!("{}.json", digest_of(&made.token).unwrap())
        );
        assert!(store.find(&made.token.to_uppercase(), 2).unwrap().is_some());
        let other = new_token().unwrap();
        for wrong in [
            other.as_str(),
            "",
            "../../etc/passwd",
            &made.token[..63],
            "g".repeat(64).as_str(),
        ] {
            assert_eq!(store.find(wrong, 2).unwrap(), None, "{wrong}");
        }
        assert!(matches!(
            store.create(
                PreviewRecord {
                    port: 0,
                    ..record(5)
                },
                1
            ),
            Err(PreviewError::Port)
        ));
        std::fs::remove_dir_all(root).unwrap();
    }
}
