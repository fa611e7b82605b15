//! Host repositories workspaces may clone: an allowlist in
//! `<state>/repos/<alias>.json`, each entry a git work tree on the host.
//! Nothing else is ever cloned into a guest. What a create checks of a
//! workspace's repository is `checkout`; how a clone gets in and commits
//! come back is `guest` (the steps; the guest folder runs them on a
//! workspace's handle); the host's git is [`git`]; what a guest hands back
//! is checked by `incoming`.

pub(crate) mod checkout;
pub mod git;
pub(crate) mod guest;
pub mod incoming;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use base::code::ErrorCode;
use base::host::settings::now_ms;
use base::remedy::Remedy;
use base::store::name::{validate_name, NameError};
use base::store::records::{RecordError, RecordLayout, RecordStore};
use base::store::{StateDir, StoreError};

pub use git::GitError;

/// The directory of allowlist entries in the state directory.
pub const REPOS_DIR: &str = "repos";
/// Where a workspace's clone is, in the guest.
pub const GUEST_REPO_DIR: &str = "/workspace/repo";
/// The host ref a workspace's commits are pulled to (`<prefix><workspace>`).
pub const WORKSPACE_REF_PREFIX: &str = "refs/workspaces/";
/// The longest task command kept.
pub const MAX_TASK_COMMAND: usize = 4096;

/// Why a repository operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    /// Bad alias.
    #[error("invalid repository alias `{alias}`")]
    Alias {
        /// The alias given.
        alias: String,
        /// What is wrong with it.
        #[source]
        source: NameError,
    },
    /// Not on the allowlist.
    #[error("repository `{0}` is not on the allowlist")]
    NotAllowed(String),
    /// The alias is taken by another repository.
    #[error("alias `{alias}` already names {}", path.display())]
    AliasTaken {
        /// The alias.
        alias: String,
        /// The repository it names.
        path: PathBuf,
    },
    /// The workspace was not created from a repository.
    #[error("workspace `{0}` has no repository (create it with a repository)")]
    NoRepo(String),
    /// The workspace's image has no git.
    #[error("image `{0}` has no git, which a repository clone needs")]
    NoGit(String),
    /// A git step in the guest failed.
    #[error("{step} in workspace `{workspace}` failed: {detail}")]
    Guest {
        /// The workspace.
        workspace: String,
        /// What was being done.
        step: &'static str,
        /// What the guest's git said.
        detail: String,
    },
    /// A path, branch or command is unusable.
    #[error("{0}")]
    Invalid(String),
    /// The commits a guest bundled are over a limit; nothing was fetched.
    #[error("the commits of workspace `{workspace}` were not taken: {why}")]
    BundleRefused {
        /// The workspace.
        workspace: String,
        /// Which limit, with its config key.
        why: String,
    },
    /// A host step (git preparing a clone off the async runtime) stopped
    /// before it finished.
    #[error("the host's git step stopped before it finished: {0}")]
    HostStepStopped(String),
    /// A host-side file operation failed.
    #[error("{what} failed")]
    HostIo {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Git failed.
    #[error(transparent)]
    Git(#[from] GitError),
    /// Reading or writing the state directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading, writing, listing or removing an allowlist entry failed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl RepoError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            RepoError::Alias { .. }
            | RepoError::Invalid(_)
            | RepoError::NoRepo(_)
            | RepoError::NoGit(_)
            | RepoError::BundleRefused { .. } => ErrorCode::InvalidInput,
            RepoError::Guest { .. } | RepoError::HostStepStopped(_) | RepoError::HostIo { .. } => {
                ErrorCode::Internal
            }
            RepoError::NotAllowed(_) => ErrorCode::Forbidden,
            RepoError::AliasTaken { .. } => ErrorCode::Conflict,
            RepoError::Git(e) => e.code(),
            RepoError::Store(e) => e.code(),
            RepoError::Record(e) => e.code(),
        }
    }

    /// What resolves it, if the caller can do something.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            RepoError::NotAllowed(repo) => Some(Remedy::AllowRepo { repo: repo.clone() }),
            RepoError::AliasTaken { alias, .. } => Some(Remedy::ChooseAnotherAlias {
                alias: alias.clone(),
            }),
            RepoError::NoGit(image) => Some(Remedy::UseImageWithGit {
                image: image.clone(),
            }),
            _ => None,
        }
    }
}

/// An allowlisted repository.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct RepoInfo {
    /// The name workspaces and tasks use for it.
    pub alias: String,
    /// Its work tree's top directory on the host.
    pub path: PathBuf,
    /// When it was allowed (ms since the epoch).
    pub added: u64,
    /// The command a task runs in the guest's clone (`repo allow
    /// --task-command`); `None` uses the state directory's `task.command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_command: Option<String>,
}

/// What `repo pull` brought back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RepoPull {
    /// The workspace.
    pub workspace: String,
    /// The allowlisted repository.
    pub repo: String,
    /// The host ref now holding the workspace's HEAD (`None` when there
    /// were no new commits).
    pub host_ref: Option<String>,
    /// The workspace's HEAD commit, when it has new commits (else the
    /// base).
    pub head: String,
    /// Commits since the clone's base.
    pub commits: u64,
    /// The guest branch HEAD is on.
    pub branch: String,
    /// The commit the clone started at.
    pub base: String,
}

/// The allowlist of one state directory.
#[derive(Clone, Debug)]
pub struct RepoStore {
    records: RecordStore<RepoInfo>,
}

impl RepoStore {
    /// The allowlist of `state`.
    pub fn new(state: &StateDir) -> Self {
        Self {
            records: RecordStore::new(
                state.root().join(REPOS_DIR),
                RecordLayout::File(".json"),
                |alias| validate_name(alias).is_ok(),
            ),
        }
    }

    /// Refuses a bad alias with the rule it breaks (the records would
    /// refuse it too, without saying which).
    fn check_alias(alias: &str) -> Result<(), RepoError> {
        validate_name(alias).map_err(|source| RepoError::Alias {
            alias: alias.to_owned(),
            source,
        })
    }

    /// Allows the git work tree at `path` (its top directory is what is
    /// kept) as `alias` (default: that directory's name). Allowing the same
    /// repository under the same alias again updates its task command.
    pub fn allow(
        &self,
        path: &Path,
        alias: Option<&str>,
        task_command: Option<String>,
    ) -> Result<RepoInfo, RepoError> {
        let top = git::work_tree_top(path)?;
        let alias = match alias {
            Some(a) => a.to_owned(),
            None => top
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| {
                    RepoError::Invalid(format!(
                        "{} has no directory name; pass an alias",
                        top.display()
                    ))
                })?,
        };
        if let Some(cmd) = &task_command {
            if cmd.trim().is_empty() || cmd.len() > MAX_TASK_COMMAND || cmd.contains('\0') {
                return Err(RepoError::Invalid(format!(
                    "a task command is a non-empty shell line of at most {MAX_TASK_COMMAND} bytes"
                )));
            }
        }
        Self::check_alias(&alias)?;
        let added = match self.get(&alias) {
            Ok(old) if old.path != top => {
                return Err(RepoError::AliasTaken {
                    alias,
                    path: old.path,
                })
            }
            Ok(old) => old.added,
            Err(RepoError::NotAllowed(_)) => now_ms(),
            Err(e) => return Err(e),
        };
        let info = RepoInfo {
            alias,
            path: top,
            added,
            task_command,
        };
        self.records.put(&info.alias, &info)?;
        Ok(info)
    }

    /// The entry `alias`; a path (of an allowed repository's work tree)
    /// finds its entry too. Anything else is [`RepoError::NotAllowed`].
    pub fn get(&self, alias_or_path: &str) -> Result<RepoInfo, RepoError> {
        if alias_or_path.contains('/') || alias_or_path == "." {
            let top = git::work_tree_top(Path::new(alias_or_path))
                .map_err(|_| RepoError::NotAllowed(alias_or_path.to_owned()))?;
            return self
                .list()?
                .into_iter()
                .find(|r| r.path == top)
                .ok_or_else(|| RepoError::NotAllowed(alias_or_path.to_owned()));
        }
        Self::check_alias(alias_or_path)?;
        self.records
            .get(alias_or_path)?
            .ok_or_else(|| RepoError::NotAllowed(alias_or_path.to_owned()))
    }

    /// Every allowed repository, by alias.
    pub fn list(&self) -> Result<Vec<RepoInfo>, RepoError> {
        let mut out = Vec::new();
        for alias in self.records.names()? {
            match self.records.get(&alias) {
                Ok(info) => out.extend(info),
                Err(e) => tracing::warn!("skipping repository {alias}: {e}"),
            }
        }
        out.sort_by(|a, b| a.alias.cmp(&b.alias));
        Ok(out)
    }

    /// Takes `alias` off the allowlist; returns what it was. The host
    /// repository itself is not touched.
    pub fn remove(&self, alias: &str) -> Result<RepoInfo, RepoError> {
        let info = self.get(alias)?;
        self.records.remove(&info.alias)?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git_repo(dir: &Path) -> bool {
        if base::host::settings::host_tool("git").is_none() {
            eprintln!("skipped: git is not installed");
            return false;
        }
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("git")
            .args(["init", "-q", "-b", "main"])
            .current_dir(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok);
        true
    }

    fn fixture(test: &str) -> (PathBuf, RepoStore) {
        let root = std::env::temp_dir().join(format!("ma-repos-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let state = StateDir::at(root.join("state")).unwrap();
        (root, RepoStore::new(&state))
    }

    #[test]
    fn allow_list_get_remove() {
        let (root, store) = fixture("cycle");
        let repo = root.join("proj");
        if !git_repo(&repo) {
            return;
        }
        std::fs::create_dir(repo.join("sub")).unwrap();
        let info = store.allow(&repo.join("sub"), None, None).unwrap();
        assert_eq!(info.alias, "proj");
        assert_eq!(info.path, repo.canonicalize().unwrap());
        // Again, with a command: the same entry, updated.
        let again = store.allow(&repo, None, Some("make".into())).unwrap();
        assert_eq!(
            (again.added, again.task_command.as_deref()),
            (info.added, Some("make"))
        );
        assert_eq!(store.list().unwrap(), vec![again.clone()]);
        assert_eq!(store.get(repo.to_str().unwrap()).unwrap(), again);
        let other = root.join("other");
        assert!(git_repo(&other));
        let taken = store.allow(&other, Some("proj"), None).unwrap_err();
        assert_eq!(taken.code(), ErrorCode::Conflict);
        assert_eq!(store.get("other").unwrap_err().code(), ErrorCode::Forbidden);
        assert_eq!(
            store.get(other.to_str().unwrap()).unwrap_err().code(),
            ErrorCode::Forbidden
        );
        store.remove("proj").unwrap();
        assert!(store.list().unwrap().is_empty());
        assert_eq!(
            store.remove("proj").unwrap_err().code(),
            ErrorCode::Forbidden
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn refuses_what_is_not_a_work_tree() {
        let (root, store) = fixture("refuse");
        if base::host::settings::host_tool("git").is_none() {
            return;
        }
        let plain = root.join("plain");
        std::fs::create_dir(&plain).unwrap();
        let e = store.allow(&plain, None, None).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidInput, "{e}");
        let e = store.allow(&root.join("missing"), None, None).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidInput, "{e}");
        let repo = root.join("r");
        assert!(git_repo(&repo));
        let e = store.allow(&repo, Some("Bad Alias"), None).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidInput);
        let e = store.allow(&repo, None, Some(" ".into())).unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidInput);
        assert!(store.list().unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
