//! Inputs and outputs of the repository tools (list_repos, repo_pull,
//! repo_diff) and `repo`/`branch` of workspace_create.

pub mod tasks;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::repos::{RepoInfo, RepoPull};

use crate::output::Render;

/// Every allowlisted repository.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RepoList {
    /// The repositories, by alias.
    pub repos: Vec<RepoInfo>,
}

/// `repo_pull`, `repo_diff`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepoWorkspaceParams {
    /// A workspace created with `repo`.
    pub name: String,
    /// repo_diff only: a summary per file instead of the patch.
    #[serde(default)]
    pub stat: bool,
}

/// What `repo_pull` brought back.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RepoPullResult {
    /// The pull.
    #[serde(flatten)]
    pub pull: RepoPull,
}

/// What `repo_diff` shows.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RepoDiffResult {
    /// The workspace.
    pub workspace: String,
    /// Its changes since it was made, committed or not (a unified diff,
    /// or a per-file summary).
    pub diff: String,
}

impl Render for RepoList {
    fn render(&self) -> String {
        if self.repos.is_empty() {
            return "no repositories are allowed; a human allows one with `microagent repo allow PATH`".into();
        }
        self.repos
            .iter()
            .map(|r| format!("{}: {}", r.alias, r.path.display()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Render for RepoPullResult {
    fn render(&self) -> String {
        let p = &self.pull;
        match &p.host_ref {
            Some(r) => format!(
                "{} new commit(s) of {} (branch {}) are at {r} in repository `{}`",
                p.commits, p.workspace, p.branch, p.repo
            ),
            None => format!("{} has no new commits since it was made", p.workspace),
        }
    }
}

impl Render for RepoDiffResult {
    fn render(&self) -> String {
        if self.diff.is_empty() {
            return format!("{} has changed nothing", self.workspace);
        }
        self.diff.clone()
    }
}
