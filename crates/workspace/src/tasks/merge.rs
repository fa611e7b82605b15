//! A task's commits onto the branch it started from, on the host: a
//! fast-forward when the branch has not moved, else a rebase in a
//! temporary worktree. The user's checked-out worktree is only ever
//! fast-forwarded, and never when it has uncommitted changes; then the
//! branch is left and the reason given. The task's own commits stay at
//! `refs/tasks/<id>` whatever happens. Every git step runs through the
//! host-tool runner, and nothing is checked out that is over the
//! repository limits, under `.git`, or in place of an untracked or ignored
//! file ([`crate::repos::incoming`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::repos::git::{self, GitError};
use crate::repos::incoming::{check_checkout, check_commits, RepoLimits};

/// How commits reached the branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum MergeMethod {
    /// The branch had not moved: it now points at the task's commits.
    FastForward,
    /// The branch had moved: the task's commits were replayed onto it.
    Rebase,
}

/// What became of a task's commits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct MergeResult {
    /// The branch now has them.
    pub merged: bool,
    /// How, when merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<MergeMethod>,
    /// The task's commits (since its base).
    pub commits: u64,
    /// Files the rebase conflicted in.
    #[serde(default)]
    pub conflicts: Vec<String>,
    /// Where the task's own commits are kept.
    pub task_ref: String,
    /// Why they were not merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Git for one merge: a committer when the repository
/// names none (a rebase writes new commits), looked up once.
struct MergeGit<'a> {
    repo: &'a Path,
    needs_committer: bool,
}

impl<'a> MergeGit<'a> {
    fn new(repo: &'a Path) -> Self {
        Self {
            repo,
            needs_committer: git::config(repo, "user.email").is_none(),
        }
    }

    /// `git -C dir ARGS`.
    fn run(&self, dir: &Path, args: &[&str]) -> Result<String, GitError> {
        let mut tool = git::git(dir, args)?;
        if self.needs_committer {
            tool.command()
                .env("GIT_COMMITTER_NAME", "microagent")
                .env("GIT_COMMITTER_EMAIL", "microagent@localhost");
        }
        git::output(tool, dir)
    }
}

/// The worktree `branch` is checked out in, if any.
fn worktree_of(repo: &Path, branch: &str) -> Result<Option<std::path::PathBuf>, GitError> {
    let list = git::run(repo, ["worktree", "list", "--porcelain"])?;
    let want = format!("branch refs/heads/{branch}");
    let mut current = None;
    for line in list.lines() {
        if let Some(path) = line.strip_prefix("worktree ") {
            current = Some(std::path::PathBuf::from(path));
        } else if line == want {
            return Ok(current);
        }
    }
    Ok(None)
}

/// Merges `task_ref` (commits on top of `base`) onto `branch` of `repo`;
/// `scratch` is a path for a temporary worktree (removed after).
pub fn merge_task(
    repo: &Path,
    branch: &str,
    base: &str,
    task_ref: &str,
    scratch: &Path,
    limits: &RepoLimits,
) -> Result<MergeResult, GitError> {
    let range = format!("{base}..{task_ref}");
    let commits: u64 = git::run(repo, ["rev-list", "--count", &range])?
        .parse()
        .unwrap_or(0);
    let mut result = MergeResult {
        merged: false,
        method: None,
        commits,
        conflicts: Vec::new(),
        task_ref: task_ref.to_owned(),
        reason: None,
    };
    if commits == 0 {
        result.reason = Some("the task made no commits".into());
        return Ok(result);
    }
    let Ok(tip) = git::branch_commit(repo, branch) else {
        result.reason = Some(format!("branch `{branch}` no longer exists"));
        return Ok(result);
    };
    let worktree = worktree_of(repo, branch)?;
    let g = MergeGit::new(repo);
    if let Some(wt) = &worktree {
        let dirty = g.run(wt, &["status", "--porcelain", "--untracked-files=no"])?;
        if !dirty.is_empty() {
            result.reason = Some(format!(
                "branch `{branch}` is checked out in {} with uncommitted changes; it was not touched",
                wt.display()
            ));
            return Ok(result);
        }
    }
    // What the task adds over its base, before anything is checked out
    // (the rebase's scratch worktree included).
    let checked = match check_checkout(repo, None, Some(base), task_ref, limits)? {
        Ok(()) => check_commits(repo, base, task_ref, limits)?,
        refused => refused,
    };
    if let Err(why) = checked {
        result.reason = Some(format!("the task's commits were not merged: {why}"));
        return Ok(result);
    }
    let fast_forward = g
        .run(repo, &["merge-base", "--is-ancestor", &tip, task_ref])
        .is_ok();
    let new_tip = if fast_forward {
        result.method = Some(MergeMethod::FastForward);
        git::run(repo, ["rev-parse", &format!("{task_ref}^{{commit}}")])?
    } else {
        result.method = Some(MergeMethod::Rebase);
        match rebase(&g, &tip, task_ref, scratch)? {
            Ok(new) => new,
            Err(conflicts) => {
                result.method = None;
                result.reason = Some(format!(
                    "replaying the task's commits onto `{branch}` conflicted in {}",
                    conflicts.join(", ")
                ));
                result.conflicts = conflicts;
                return Ok(result);
            }
        }
    };
    match &worktree {
        Some(wt) => {
            if let Err(why) = check_checkout(repo, Some(wt), Some(&tip), &new_tip, limits)? {
                result.method = None;
                result.reason = Some(format!(
                    "the task's commits were not merged into {}: {why}",
                    wt.display()
                ));
                return Ok(result);
            }
            if let Err(e) = g.run(wt, &["merge", "--ff-only", "--quiet", &new_tip]) {
                result.method = None;
                result.reason = Some(format!(
                    "fast-forwarding the worktree {} failed: {e}",
                    wt.display()
                ));
                return Ok(result);
            }
        }
        None => {
            // Compare and swap: a branch moved meanwhile is not overwritten.
            let name = format!("refs/heads/{branch}");
            if let Err(e) = g.run(repo, &["update-ref", &name, &new_tip, &tip]) {
                result.method = None;
                result.reason = Some(format!("moving `{branch}` failed: {e}"));
                return Ok(result);
            }
        }
    }
    result.merged = true;
    Ok(result)
}

/// Replays `task_ref`'s commits onto `onto` in a detached worktree at
/// `scratch`: the new tip, or the conflicting files.
fn rebase(
    g: &MergeGit<'_>,
    onto: &str,
    task_ref: &str,
    scratch: &Path,
) -> Result<Result<String, Vec<String>>, GitError> {
    let wt = scratch.to_string_lossy().into_owned();
    let _ = g.run(g.repo, &["worktree", "remove", "-f", &wt]);
    let _ = std::fs::remove_dir_all(scratch);
    g.run(
        g.repo,
        &["worktree", "add", "--quiet", "--detach", &wt, task_ref],
    )?;
    let outcome = match g.run(scratch, &["rebase", "--quiet", onto]) {
        Ok(_) => git::run(scratch, ["rev-parse", "HEAD"]).map(Ok),
        Err(_) => {
            let files =
                git::run(scratch, ["diff", "--name-only", "--diff-filter=U"]).unwrap_or_default();
            let _ = g.run(scratch, &["rebase", "--abort"]);
            Ok(Err(files.lines().map(str::to_owned).collect()))
        }
    };
    let _ = g.run(g.repo, &["worktree", "remove", "-f", &wt]);
    let _ = g.run(g.repo, &["worktree", "prune"]);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::hostile_tests::sh;

    /// [`merge_task`] under the default limits.
    fn merge(repo: &Path, branch: &str, base: &str, task_ref: &str, scratch: &Path) -> MergeResult {
        merge_task(
            repo,
            branch,
            base,
            task_ref,
            scratch,
            &RepoLimits::default(),
        )
        .unwrap()
    }

    /// A repository on `main` with one commit, and a task branch with one
    /// commit changing `file` to `task`.
    fn fixture(test: &str) -> Option<(std::path::PathBuf, String)> {
        base::host::settings::host_tool("git")?;
        let root = std::env::temp_dir().join(format!("ma-merge-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let repo = root.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        sh(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("file"), "one\n").unwrap();
        std::fs::write(repo.join("other"), "x\n").unwrap();
        sh(&repo, &["add", "."]);
        sh(&repo, &["commit", "-qm", "first"]);
        let base = sh(&repo, &["rev-parse", "HEAD"]);
        sh(&repo, &["checkout", "-qb", "work"]);
        std::fs::write(repo.join("file"), "task\n").unwrap();
        sh(&repo, &["commit", "-qam", "task"]);
        sh(&repo, &["update-ref", "refs/tasks/t1", "HEAD"]);
        sh(&repo, &["checkout", "-q", "main"]);
        Some((repo, base))
    }

    #[test]
    fn fast_forwards_a_clean_checked_out_branch() {
        let Some((repo, base)) = fixture("ff") else {
            return;
        };
        let scratch = repo.with_file_name("scratch");
        let r = merge(&repo, "main", &base, "refs/tasks/t1", &scratch);
        assert!(r.merged, "{r:?}");
        assert_eq!((r.method, r.commits), (Some(MergeMethod::FastForward), 1));
        assert_eq!(
            std::fs::read_to_string(repo.join("file")).unwrap(),
            "task\n"
        );
    }

    #[test]
    fn rebases_onto_a_moved_branch_and_reports_conflicts() {
        let Some((repo, base)) = fixture("rebase") else {
            return;
        };
        let scratch = repo.with_file_name("scratch");
        std::fs::write(repo.join("other"), "moved\n").unwrap();
        sh(&repo, &["commit", "-qam", "moved"]);
        let r = merge(&repo, "main", &base, "refs/tasks/t1", &scratch);
        assert_eq!(
            (r.merged, r.method),
            (true, Some(MergeMethod::Rebase)),
            "{r:?}"
        );
        assert_eq!(
            sh(&repo, &["log", "--format=%s", "main"]),
            "task\nmoved\nfirst"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("file")).unwrap(),
            "task\n"
        );
        assert!(!scratch.exists());
        // The same line changed on main since: a conflict, main unchanged.
        std::fs::write(repo.join("file"), "main\n").unwrap();
        sh(&repo, &["commit", "-qam", "main edit"]);
        let tip = sh(&repo, &["rev-parse", "main"]);
        // A second task from the same base changed that line too.
        sh(&repo, &["checkout", "-q", "-b", "second", &base]);
        std::fs::write(repo.join("file"), "second task\n").unwrap();
        sh(&repo, &["commit", "-qam", "second"]);
        sh(&repo, &["update-ref", "refs/tasks/t2", "HEAD"]);
        sh(&repo, &["checkout", "-q", "main"]);
        let r = merge(&repo, "main", &base, "refs/tasks/t2", &scratch);
        assert!(!r.merged, "{r:?}");
        assert_eq!(r.conflicts, ["file"]);
        assert_eq!(sh(&repo, &["rev-parse", "main"]), tip);
        assert_eq!(sh(&repo, &["status", "--porcelain"]), "");
    }

    #[test]
    fn leaves_a_dirty_worktree_alone() {
        let Some((repo, base)) = fixture("dirty") else {
            return;
        };
        let scratch = repo.with_file_name("scratch");
        std::fs::write(repo.join("other"), "uncommitted\n").unwrap();
        let tip = sh(&repo, &["rev-parse", "main"]);
        let r = merge(&repo, "main", &base, "refs/tasks/t1", &scratch);
        assert!(
            !r.merged && r.reason.as_deref().unwrap().contains("uncommitted"),
            "{r:?}"
        );
        assert_eq!(sh(&repo, &["rev-parse", "main"]), tip);
        assert_eq!(
            std::fs::read_to_string(repo.join("other")).unwrap(),
            "uncommitted\n"
        );
        assert_eq!(std::fs::read_to_string(repo.join("file")).unwrap(), "one\n");
    }

    #[test]
    fn moves_a_branch_no_worktree_has() {
        let Some((repo, base)) = fixture("ref") else {
            return;
        };
        let scratch = repo.with_file_name("scratch");
        sh(&repo, &["branch", "side", &base]);
        let r = merge(&repo, "side", &base, "refs/tasks/t1", &scratch);
        assert_eq!((r.merged, r.method), (true, Some(MergeMethod::FastForward)));
        assert_eq!(sh(&repo, &["log", "--format=%s", "-1", "side"]), "task");
    }
}
