//! The host's git, run through the host-tool runner ([`HostTool::git`]):
//! a program (never a shell), prompts off, a fixed locale, every config
//! key that names a program overridden, and bounds on memory, file sizes,
//! output and time, since what it reads may be a guest's.

use base::code::ErrorCode;
use base::host_tool::{HostTool, HostToolError};
use std::path::{Path, PathBuf};

/// Why a git command failed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// git is not installed on the host.
    #[error("git is not installed on the host")]
    Missing,
    /// The path is not inside a git work tree.
    #[error("{} is not a git work tree", path.display())]
    NotAWorkTree {
        /// The path given.
        path: PathBuf,
    },
    /// The repository has no such branch.
    #[error("{} has no branch `{branch}`", repo.display())]
    NoBranch {
        /// The repository.
        repo: PathBuf,
        /// The branch asked for.
        branch: String,
    },
    /// A branch name git would not accept.
    #[error("`{0}` is not a usable branch name")]
    BadBranch(String),
    /// HEAD is not on a branch, and none was named.
    #[error("{} is not on a branch (detached HEAD); name one", repo.display())]
    Detached {
        /// The repository.
        repo: PathBuf,
    },
    /// Running git failed (it could not start, ran past its deadline or
    /// printed past its bound).
    #[error("running git {what}")]
    Tool {
        /// The subcommand.
        what: String,
        /// What the runner said.
        #[source]
        source: HostToolError,
    },
    /// git ran and failed.
    #[error("git {what} failed in {}: {stderr}", repo.display())]
    Failed {
        /// The subcommand.
        what: String,
        /// The repository.
        repo: PathBuf,
        /// What git said.
        stderr: String,
    },
}

impl GitError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            GitError::Missing => ErrorCode::HostUnsupported,
            GitError::NotAWorkTree { .. }
            | GitError::NoBranch { .. }
            | GitError::BadBranch(_)
            | GitError::Detached { .. } => ErrorCode::InvalidInput,
            GitError::Tool {
                source: HostToolError::TimedOut { .. },
                ..
            } => ErrorCode::Timeout,
            GitError::Tool { .. } | GitError::Failed { .. } => ErrorCode::Internal,
        }
    }
}

/// `git -C repo ARGS...` through the host-tool runner: every config key
/// that names a program overridden, prompts off, memory, file sizes and
/// time bounded ([`HostTool::git`]).
pub(crate) fn git<I, S>(repo: &Path, args: I) -> Result<HostTool, GitError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let tool = HostTool::git(repo).map_err(|e| match e {
        HostToolError::Missing { .. } => GitError::Missing,
        source => GitError::Tool {
            what: "start".into(),
            source,
        },
    })?;
    Ok(tool.args(args))
}

/// The subcommand of a git run: the first word past `-C DIR` and
/// `-c KEY=VALUE`.
fn subcommand(tool: &mut HostTool) -> String {
    let mut args = tool
        .command()
        .get_args()
        .map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = args.next() {
        if a == "-C" || a == "-c" {
            args.next();
        } else {
            return a;
        }
    }
    String::new()
}

/// Runs `tool` (made by [`git`]); its stdout, trimmed, when it succeeds.
pub(crate) fn output(tool: HostTool, repo: &Path) -> Result<String, GitError> {
    output_bytes(tool, repo).map(|out| String::from_utf8_lossy(&out).trim().to_owned())
}

/// Runs `tool` (made by [`git`]); its stdout as it is, when it succeeds.
pub(crate) fn output_bytes(mut run: HostTool, repo: &Path) -> Result<Vec<u8>, GitError> {
    let what = subcommand(&mut run);
    let out = run.output().map_err(|source| GitError::Tool {
        what: what.clone(),
        source,
    })?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    Err(GitError::Failed {
        what,
        repo: repo.to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

/// `git -C repo ARGS...`'s trimmed stdout.
pub(crate) fn run<I, S>(repo: &Path, args: I) -> Result<String, GitError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    output(git(repo, args)?, repo)
}

/// The top directory of the work tree `path` is in.
pub fn work_tree_top(path: &Path) -> Result<PathBuf, GitError> {
    let not = || GitError::NotAWorkTree {
        path: path.to_owned(),
    };
    let real = path.canonicalize().map_err(|_| not())?;
    if !real.is_dir() {
        return Err(not());
    }
    let inside = run(&real, ["rev-parse", "--is-inside-work-tree"]).map_err(|e| match e {
        GitError::Failed { .. } => not(),
        e => e,
    })?;
    if inside != "true" {
        return Err(not());
    }
    let top = run(&real, ["rev-parse", "--show-toplevel"])?;
    PathBuf::from(top).canonicalize().map_err(|_| not())
}

/// The branch `repo`'s HEAD is on.
pub(crate) fn current_branch(repo: &Path) -> Result<String, GitError> {
    run(repo, ["symbolic-ref", "--quiet", "--short", "HEAD"]).map_err(|e| match e {
        GitError::Failed { .. } => GitError::Detached {
            repo: repo.to_owned(),
        },
        e => e,
    })
}

/// Refuses a branch name git would not take, or one that reads as an
/// option.
pub(crate) fn check_branch_name(repo: &Path, branch: &str) -> Result<(), GitError> {
    if branch.starts_with('-') || branch.is_empty() {
        return Err(GitError::BadBranch(branch.to_owned()));
    }
    run(repo, ["check-ref-format", "--branch", branch])
        .map(drop)
        .map_err(|e| match e {
            GitError::Failed { .. } => GitError::BadBranch(branch.to_owned()),
            e => e,
        })
}

/// The commit local branch `branch` of `repo` points to.
pub(crate) fn branch_commit(repo: &Path, branch: &str) -> Result<String, GitError> {
    check_branch_name(repo, branch)?;
    run(
        repo,
        [
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}^{{commit}}"),
        ],
    )
    .map_err(|e| match e {
        GitError::Failed { .. } => GitError::NoBranch {
            repo: repo.to_owned(),
            branch: branch.to_owned(),
        },
        e => e,
    })
}

/// The full id of commit `rev` of `repo`.
pub(crate) fn commit_of(repo: &Path, rev: &str) -> Result<String, GitError> {
    if rev.starts_with('-') {
        return Err(GitError::BadBranch(rev.to_owned()));
    }
    run(
        repo,
        [
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )
}

/// Who a clone's commits are by.
pub(crate) struct Identity {
    /// `user.name`.
    pub name: String,
    /// `user.email`.
    pub email: String,
}

/// Makes at `dir` (which must not exist) a repository with every branch
/// and tag of `repo` as its own, the work tree checked out on a new
/// `work_branch` at `base`, commits by `who`, and `origin` only when
/// given. Hooks are off; nothing in `dir` points back at `repo`.
pub(crate) fn prepare_clone(
    repo: &Path,
    dir: &Path,
    base: &str,
    work_branch: &str,
    who: &Identity,
    origin: Option<&str>,
) -> Result<(), GitError> {
    let init = git(
        repo,
        [
            "-c",
            "init.defaultBranch=microagent-unborn",
            "init",
            "-q",
            "--template=",
        ],
    )?
    .arg(dir);
    output(init, repo)?;
    let in_dir = |args: &[&str]| -> Result<String, GitError> { output(git(dir, args)?, dir) };
    let source = repo.to_string_lossy().into_owned();
    in_dir(&[
        "fetch",
        "-q",
        "--no-write-fetch-head",
        &source,
        "+refs/heads/*:refs/heads/*",
        "+refs/tags/*:refs/tags/*",
    ])?;
    in_dir(&["checkout", "-q", "-B", work_branch, base])?;
    in_dir(&["config", "user.name", &who.name])?;
    in_dir(&["config", "user.email", &who.email])?;
    if let Some(url) = origin {
        in_dir(&["remote", "add", "origin", url])?;
    }
    Ok(())
}

/// The commit a bundle's `HEAD` names.
pub(crate) fn bundle_head(repo: &Path, file: &Path) -> Result<String, GitError> {
    let heads = output(git(repo, ["bundle", "list-heads"])?.arg(file), repo)?;
    heads
        .lines()
        .find_map(|l| l.strip_suffix(" HEAD"))
        .map(str::to_owned)
        .ok_or_else(|| GitError::Failed {
            what: "bundle list-heads".into(),
            repo: repo.to_owned(),
            stderr: "the bundle has no HEAD".into(),
        })
}

/// Checks that `file` is a bundle `repo` can take (it has what the bundle
/// builds on), then fetches its `HEAD` into `dst` (forced).
pub(crate) fn fetch_bundle_head(repo: &Path, file: &Path, dst: &str) -> Result<(), GitError> {
    output(git(repo, ["bundle", "verify", "--quiet"])?.arg(file), repo)?;
    // fsck what comes from a guest: it refuses trees naming `.git`,
    // `..` or unsafe `.gitmodules`, which no checkout should meet.
    let fetch = git(
        repo,
        [
            "-c",
            "fetch.fsckObjects=true",
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
        ],
    )?
    .arg(file)
    .arg(format!("+HEAD:{dst}"));
    output(fetch, repo).map(drop)
}

/// `key` from `repo`'s git config (its own, the user's or the system's).
pub(crate) fn config(repo: &Path, key: &str) -> Option<String> {
    run(repo, ["config", "--get", key])
        .ok()
        .filter(|v| !v.is_empty())
}

/// `origin`'s URL when it is a network address: a clone may keep that,
/// never a path on the host.
pub(crate) fn network_origin(repo: &Path) -> Option<String> {
    config(repo, "remote.origin.url").filter(|url| is_network_url(url))
}

/// True for `scheme://host/...` (not `file://`) and scp-like `host:path`.
fn is_network_url(url: &str) -> bool {
    if let Some((scheme, rest)) = url.split_once("://") {
        return scheme != "file" && !rest.is_empty();
    }
    match url.split_once(':') {
        Some((host, path)) => !host.is_empty() && !host.contains('/') && !path.is_empty(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_network_urls_count_as_network() {
        for url in [
            "https://github.com/a/b.git",
            "git@github.com:a/b.git",
            "ssh://git@host/x",
        ] {
            assert!(is_network_url(url), "{url}");
        }
        for url in ["/srv/repo", "../repo", "file:///srv/repo", "./a:b", ""] {
            assert!(!is_network_url(url), "{url}");
        }
    }
}
