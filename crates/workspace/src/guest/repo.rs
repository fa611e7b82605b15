//! A workspace's repository in its guest: the first start clones the
//! bundle `create` made (workspaces/repos.rs) into `/workspace/repo`
//! (owned by the guest's `user`, on branch `task/<workspace>`); `pull`
//! streams the new commits back as a bundle and fetches them into the
//! host repository at `refs/workspaces/<workspace>`; `diff` shows what
//! changed.

use crate::error::Result;
use crate::guest::exec::ExecRequest;
use crate::guest::stream::ExecInput;
use crate::repos::incoming::{check_bundle, RepoLimits};
use crate::repos::{git, RepoError, RepoPull, GUEST_REPO_DIR, WORKSPACE_REF_PREFIX};
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::Workspaces;
use base::store::repo_checkout::RepoCheckout;
use base::store::workspace_dir::WorkspaceDir;
use base::volumes::CACHE_MOUNT;

/// The guest account a clone belongs to (`user` in the images microagent
/// builds).
const GUEST_USER: &str = "user";
/// Where the guest writes the bundle `pull` copies out.
const GUEST_PULL_BUNDLE: &str = "/tmp/microagent-pull.bundle";

/// Runs as `user` in the clone: bundles HEAD's commits since the base
/// (argument 1) into argument 2, or says `empty` when there are none. One
/// git process: each costs seconds on a host that emulates the guest's
/// kernel.
const PULL_SCRIPT: &str = r#"rm -f "$2"
if out=$(git bundle create -q "$2" HEAD "^$1" 2>&1); then echo bundled; exit 0; fi
case "$out" in *"empty bundle"*) echo empty; exit 0;; esac
echo "$out" >&2
exit 1
"#;

/// Runs as root once the clone is in: the guest's `user` (argument 1) owns
/// /workspace; when argument 2 names a cache volume's mount, the user's
/// `~/.cache` points at it. One script, few processes: each costs seconds
/// on a host that emulates the guest's kernel.
const OWN_SCRIPT: &str = r#"set -e
chown -R "$1:$1" /workspace
[ -n "$2" ] || exit 0
eval "home=~$1"
if [ -d "$home/.cache" ] && [ ! -L "$home/.cache" ]; then rm -rf "$home/.cache"; fi
ln -sfn "$2" "$home/.cache"
"#;

impl Workspaces {
    /// Clones the repository `create` recorded into the guest, once: the
    /// clone is made on the host (fast: git on the host costs
    /// milliseconds, in this guest seconds per process), copied in through
    /// the agent, and given to the guest's `user`. After that it lives on
    /// the workspace's disk.
    pub(crate) async fn clone_pending_repo(&self, name: &str) -> Result<()> {
        let ws = self.dir(name)?;
        let pending = ws.repo_pending();
        if !pending.exists() {
            return Ok(());
        }
        let meta = self.at(name).get_here()?;
        let Some(checkout) = meta.spec.repo.clone() else {
            return Ok(());
        };
        let info = self.repos().get(&checkout.repo)?;
        let tree = ws.path().join("repo-clone");
        let _ = std::fs::remove_dir_all(&tree);
        let made = {
            let (tree, name) = (tree.clone(), name.to_owned());
            let base = checkout.base.clone().unwrap_or_default();
            self.blocking(move |_| {
                let who = git::Identity {
                    name: git::config(&info.path, "user.name")
                        .unwrap_or_else(|| "microagent".into()),
                    email: git::config(&info.path, "user.email")
                        .unwrap_or_else(|| "agent@microagent.invalid".into()),
                };
                let origin = git::network_origin(&info.path);
                git::prepare_clone(
                    &info.path,
                    &tree,
                    &base,
                    &RepoCheckout::work_branch(&name),
                    &who,
                    origin.as_deref(),
                )
                .map_err(|e| RepoError::from(e).into())
            })
            .await
        };
        let copied = match made {
            Ok(()) => self
                .at(name)
                .files()
                .copy_in(&tree, GUEST_REPO_DIR)
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_dir_all(&tree);
        copied?;
        // A task's slot cache (its root already the user's) also serves
        // as ~/.cache, set up in the same guest process.
        let has_cache = meta.spec.volumes.iter().any(|v| v.path == CACHE_MOUNT);
        let cache = if has_cache { CACHE_MOUNT } else { "" };
        let own = script(OWN_SCRIPT, [GUEST_USER, cache]).user("root");
        self.guest_step(
            name,
            "giving the clone to the guest's user",
            own,
            ExecInput::None,
        )
        .await?;
        std::fs::remove_file(&pending).map_err(crate::error::Error::host_io(format!(
            "removing {}",
            pending.display()
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
        let meta = self.get_here()?;
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
        let (all, name) = (self.all, self.name.as_str());
        let (checkout, base) = self.checkout()?;
        let info = all.repos().get(&checkout.repo)?;
        let req = script(PULL_SCRIPT, [base.as_str(), GUEST_PULL_BUNDLE])
            .user(GUEST_USER)
            .cwd(GUEST_REPO_DIR);
        let said = all
            .guest_step(name, "bundling the new commits", req, ExecInput::None)
            .await?;
        let branch = all
            .at(name)
            .files()
            .read_file(&format!("{GUEST_REPO_DIR}/.git/HEAD"), None, Some(4096))
            .await
            .ok()
            .map(|r| String::from_utf8_lossy(&r.data).trim().to_owned())
            .map(|head| {
                head.strip_prefix("ref: refs/heads/")
                    .map_or("HEAD".to_owned(), str::to_owned)
            })
            .unwrap_or_else(|| "HEAD".into());
        let mut pull = RepoPull {
            workspace: name.to_owned(),
            repo: info.alias.clone(),
            host_ref: None,
            head: base.clone(),
            commits: 0,
            branch,
            base: base.clone(),
        };
        if said.trim() != "bundled" {
            return Ok(pull);
        }
        let ws = all.dir(name)?;
        let local = pull_bundle_path(&ws);
        let _ = std::fs::remove_file(&local);
        all.at(name)
            .files()
            .copy_out(GUEST_PULL_BUNDLE, &local)
            .await?;
        let limits = RepoLimits::load(all.state.root()).map_err(RepoError::Invalid)?;
        if let Err(why) = check_bundle(&local, &limits) {
            let _ = std::fs::remove_file(&local);
            return Err(RepoError::BundleRefused {
                workspace: name.to_owned(),
                why,
            }
            .into());
        }
        let fetched = (|| {
            let head = git::bundle_head(&info.path, &local)?;
            git::fetch_bundle_head(&info.path, &local, host_ref)?;
            let count = git::run(
                &info.path,
                ["rev-list", "--count", &format!("{base}..{head}")],
            )?;
            Ok::<_, git::GitError>((head, count.parse().unwrap_or(0)))
        })();
        let _ = std::fs::remove_file(&local);
        let (head, commits) = fetched.map_err(RepoError::from)?;
        pull.head = head;
        pull.commits = commits;
        pull.host_ref = Some(host_ref.to_owned());
        Ok(pull)
    }

    /// The workspace's changes since the clone's base, committed or not,
    /// as a unified diff (`stat`: a summary per file instead).
    pub async fn repo_diff(self, stat: bool) -> Result<String> {
        let (all, name) = (self.all, self.name.as_str());
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
