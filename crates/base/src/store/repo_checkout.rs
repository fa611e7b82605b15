//! The repository a workspace was created from, as its record keeps it:
//! which allowlisted repository, which branch, and the commit the clone
//! started at (what `repo pull` counts new commits from).

use serde::{Deserialize, Serialize};

/// A workspace's repository. Front ends fill `repo` (an alias) and maybe
/// `branch`; `create` resolves the branch and records `base`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct RepoCheckout {
    /// The allowlisted repository's alias.
    pub repo: String,
    /// The host branch the clone starts from (default: the repository's
    /// current branch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit `branch` was at when the workspace was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

impl RepoCheckout {
    /// Clone `repo` at `branch` (its current branch when `None`).
    pub fn new(repo: impl Into<String>, branch: Option<String>) -> Self {
        Self {
            repo: repo.into(),
            branch,
            base: None,
        }
    }

    /// The branch the workspace works on in its clone.
    pub fn work_branch(workspace: &str) -> String {
        format!("task/{workspace}")
    }
}
