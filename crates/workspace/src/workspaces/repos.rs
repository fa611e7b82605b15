//! Repositories as workspaces use them: `create` checks the allowlist and
//! the image and bundles the repository into the workspace's directory;
//! the first start clones that bundle into `/workspace/repo` (owned by the
//! guest's `user`, on branch `task/<workspace>`); `pull` streams the new
//! commits back as a bundle and fetches them into the host repository at
//! `refs/workspaces/<workspace>`; `diff` shows what changed.

use std::path::Path;
use std::process::Command;

use super::manager::Workspaces;
use crate::guest::stream::ExecInput;
use crate::images::registry::ImageInfo;
use crate::repos::{
    git, RepoError, RepoInfo, RepoPull, RepoStore, GUEST_REPO_DIR, WORKSPACE_REF_PREFIX,
};
use crate::store::repo_checkout::RepoCheckout;
use crate::store::workspace_dir::WorkspaceDir;
use crate::workspaces::handle::Workspace;
use crate::{ExecRequest, Result};

/// The guest account a clone belongs to (`user` in the images microagent
/// builds).
const GUEST_USER: &str = "user";
/// Where git lives in images that have it (debugfs follows the `/bin`
/// link of merged-/usr images).
const GIT_PATHS: &[&str] = &["/usr/bin/git", "/usr/local/bin/git", "/bin/git"];
/// Where the guest writes the bundle `pull` copies out.
const GUEST_PULL_BUNDLE: &str = "/tmp/microagent-pull.bundle";

/// Runs as `user` in the new `/workspace/repo`: the bundle arrives on
/// stdin; every host branch and tag becomes a local one; the work branch
/// starts at the base commit. Arguments: base, work branch, name, email,
/// origin URL (may be empty).
const CLONE_SCRIPT: &str = r#"set -e
git -c init.defaultBranch=microagent-unborn init -q .
cat > .git/microagent-clone.bundle
git fetch -q --update-head-ok .git/microagent-clone.bundle '+refs/heads/*:refs/heads/*' '+refs/tags/*:refs/tags/*'
rm -f .git/microagent-clone.bundle
git checkout -q -B "$2" "$1"
git config user.name "$3"
git config user.email "$4"
if [ -n "$5" ]; then git remote add origin "$5"; fi
"#;

/// Runs as `user` in the clone: prints HEAD, the commits since the base
/// and the branch; bundles them when there are any. Arguments: base,
/// bundle path.
const PULL_SCRIPT: &str = r#"set -e
rm -f "$2"
head=$(git rev-parse HEAD)
count=$(git rev-list --count "$1..HEAD")
branch=$(git symbolic-ref -q --short HEAD || echo HEAD)
echo "$head $count $branch"
if [ "$count" != 0 ]; then git bundle create -q "$2" HEAD "^$1"; fi
"#;

impl Workspaces {
    /// The repository allowlist of this state directory.
    pub fn repos(&self) -> RepoStore {
        RepoStore::new(&self.state)
    }

    /// Checks a new workspace's repository (allowlisted, the branch
    /// exists, the image has git) and resolves its branch and base.
    pub(crate) fn resolve_checkout(
        &self,
        asked: &RepoCheckout,
        image: &ImageInfo,
    ) -> Result<(RepoInfo, RepoCheckout)> {
        let info = self.repos().get(&asked.repo)?;
        let branch = match &asked.branch {
            Some(b) => b.clone(),
            None => git::current_branch(&info.path).map_err(RepoError::from)?,
        };
        let base = match &asked.base {
            // A task fixed its base when it was asked for.
            Some(base) => git::commit_of(&info.path, base).map_err(RepoError::from)?,
            None => git::branch_commit(&info.path, &branch).map_err(RepoError::from)?,
        };
        if !rootfs_has_any(&image.rootfs, GIT_PATHS)? {
            return Err(RepoError::NoGit(image.name.clone()).into());
        }
        Ok((
            info.clone(),
            RepoCheckout {
                repo: info.alias,
                branch: Some(branch),
                base: Some(base),
            },
        ))
    }

    /// Clones the bundle `create` left into the guest, once: after that the
    /// clone lives on the workspace's disk.
    pub(crate) async fn clone_pending_repo(&self, name: &str) -> Result<()> {
        let ws = self.dir(name)?;
        let bundle = ws.repo_bundle();
        if !bundle.exists() {
            return Ok(());
        }
        let meta = self.at(name).get()?;
        let Some(checkout) = meta.spec.repo.clone() else {
            return Ok(());
        };
        let info = self.repos().get(&checkout.repo).ok();
        let identity = |key: &str, fallback: &str| {
            info.as_ref()
                .and_then(|i| git::config(&i.path, key))
                .unwrap_or_else(|| fallback.to_owned())
        };
        let prepare = script(
            r#"mkdir -p "$1" && chown "$2:$2" /workspace "$1""#,
            [GUEST_REPO_DIR, GUEST_USER],
        )
        .user("root");
        self.guest_step(name, "preparing /workspace/repo", prepare, ExecInput::None)
            .await?;
        let file = tokio::fs::File::open(&bundle)
            .await
            .map_err(crate::Error::host_io(format!(
                "opening {}",
                bundle.display()
            )))?;
        let clone = script(
            CLONE_SCRIPT,
            [
                checkout.base.clone().unwrap_or_default(),
                RepoCheckout::work_branch(name),
                identity("user.name", "microagent"),
                identity("user.email", "agent@microagent.invalid"),
                info.as_ref()
                    .and_then(|i| git::network_origin(&i.path))
                    .unwrap_or_default(),
            ],
        )
        .user(GUEST_USER)
        .cwd(GUEST_REPO_DIR);
        self.guest_step(
            name,
            "cloning the repository",
            clone,
            ExecInput::Reader(Box::new(file)),
        )
        .await?;
        std::fs::remove_file(&bundle).map_err(crate::Error::host_io(format!(
            "removing {}",
            bundle.display()
        )))?;
        Ok(())
    }

    /// Runs one guest step of a repository operation; its stdout when it
    /// succeeds.
    async fn guest_step(
        &self,
        name: &str,
        step: &'static str,
        req: ExecRequest,
        input: ExecInput,
    ) -> Result<String> {
        let done = self.at(name).exec_collect(req, input).await?;
        if done.success() {
            return Ok(done.stdout);
        }
        let detail = match done.stderr.trim() {
            "" => format!("exit {:?}", done.exit_code),
            text => text.to_owned(),
        };
        Err(RepoError::Guest {
            workspace: name.to_owned(),
            step,
            detail,
        }
        .into())
    }
}

impl Workspace<'_> {
    /// The workspace's repository, with its resolved base.
    fn checkout(self) -> Result<(RepoCheckout, String)> {
        let meta = self.get()?;
        match meta.spec.repo {
            Some(c) => {
                let base = c.base.clone().unwrap_or_default();
                Ok((c, base))
            }
            None => Err(RepoError::NoRepo(self.name().to_owned()).into()),
        }
    }

    /// Brings the workspace's new commits (since the clone's base) back to
    /// the host repository as `refs/workspaces/<workspace>`: the guest
    /// bundles them, the bundle is copied out through the agent, verified
    /// and fetched. No new commits leaves the host as it was.
    pub async fn pull_repo(self) -> Result<RepoPull> {
        let host_ref = format!("{WORKSPACE_REF_PREFIX}{}", self.name);
        self.pull_repo_to(&host_ref).await
    }

    /// [`Workspace::pull_repo`] into `host_ref`.
    pub(crate) async fn pull_repo_to(self, host_ref: &str) -> Result<RepoPull> {
        let (all, name) = (self.all, self.name);
        let (checkout, base) = self.checkout()?;
        let info = all.repos().get(&checkout.repo)?;
        let req = script(PULL_SCRIPT, [base.as_str(), GUEST_PULL_BUNDLE])
            .user(GUEST_USER)
            .cwd(GUEST_REPO_DIR);
        let said = all
            .guest_step(name, "bundling the new commits", req, ExecInput::None)
            .await?;
        let (head, commits, branch) = parse_pull_line(&said).ok_or_else(|| RepoError::Guest {
            workspace: name.to_owned(),
            step: "bundling the new commits",
            detail: format!("unexpected output `{}`", said.trim()),
        })?;
        let mut pull = RepoPull {
            workspace: name.to_owned(),
            repo: info.alias.clone(),
            host_ref: None,
            head,
            commits,
            branch,
            base,
        };
        if commits == 0 {
            return Ok(pull);
        }
        let ws = all.dir(name)?;
        let local = pull_bundle_path(&ws);
        let _ = std::fs::remove_file(&local);
        all.at(name).copy_out(GUEST_PULL_BUNDLE, &local).await?;
        let fetched = git::fetch_bundle_head(&info.path, &local, host_ref);
        let _ = std::fs::remove_file(&local);
        fetched.map_err(RepoError::from)?;
        pull.host_ref = Some(host_ref.to_owned());
        Ok(pull)
    }

    /// The workspace's changes since the clone's base, committed or not,
    /// as a unified diff (`stat`: a summary per file instead).
    pub async fn repo_diff(self, stat: bool) -> Result<String> {
        let (all, name) = (self.all, self.name);
        let (_, base) = self.checkout()?;
        let mut argv = vec!["git", "diff", "--no-color", "--no-ext-diff"];
        if stat {
            argv.push("--stat");
        }
        argv.push(&base);
        let req = ExecRequest::argv(argv).user(GUEST_USER).cwd(GUEST_REPO_DIR);
        all.guest_step(name, "diffing the clone", req, ExecInput::None)
            .await
    }
}

/// `sh -c SCRIPT sh ARGS...`: values reach the script as positional
/// arguments, never spliced into its text.
fn script<I, S>(script: &str, args: I) -> ExecRequest
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let head = ["sh", "-c", script, "sh"].map(String::from);
    ExecRequest::argv(head.into_iter().chain(args.into_iter().map(Into::into)))
}

fn pull_bundle_path(ws: &WorkspaceDir) -> std::path::PathBuf {
    ws.path().join("repo-pull.bundle")
}

/// `HEAD COUNT BRANCH` as [`PULL_SCRIPT`] prints it.
fn parse_pull_line(out: &str) -> Option<(String, u64, String)> {
    let mut words = out.split_whitespace();
    let head = words.next()?;
    let count = words.next()?.parse().ok()?;
    let branch = words.next()?;
    (head.len() >= 40 && head.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| (head.to_owned(), count, branch.to_owned()))
}

/// True when the ext4 image `rootfs` has any of `paths` (read with
/// debugfs, without mounting).
fn rootfs_has_any(rootfs: &Path, paths: &[&str]) -> Result<bool> {
    let Some(debugfs) = crate::host::settings::host_tool("debugfs") else {
        // Without debugfs the clone itself says so, once the guest is up.
        return Ok(true);
    };
    for path in paths {
        let out = Command::new(&debugfs)
            .arg("-R")
            .arg(format!("stat {path}"))
            .arg(rootfs)
            .output()
            .map_err(crate::Error::host_io("running debugfs"))?;
        if String::from_utf8_lossy(&out.stdout).contains("Inode:") {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_pull_script_prints() {
        let head = "a".repeat(40);
        assert_eq!(
            parse_pull_line(&format!("{head} 2 task/dev\n")),
            Some((head.clone(), 2, "task/dev".into()))
        );
        assert_eq!(parse_pull_line("nonsense"), None);
        assert_eq!(parse_pull_line(&format!("{head} x task/dev")), None);
    }
}
