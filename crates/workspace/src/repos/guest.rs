//! A workspace's repository in its guest: the first start clones the
//! commit `create` resolved (`checkout`) into `/workspace/repo` (owned by
//! the guest's `user`, on branch `task/<workspace>`); `pull` streams the
//! new commits back as a bundle and fetches them into the host repository
//! at `refs/workspaces/<workspace>`; `diff` shows what changed.
//!
//! The guest is above this folder, so these steps reach it through
//! [`RepoGuest`], which the guest folder implements on a workspace's
//! handle; they return its error.

use std::future::Future;
use std::path::Path;

use crate::repos::incoming::{check_bundle, RepoLimits};
use crate::repos::{git, RepoError, RepoPull, RepoStore, GUEST_REPO_DIR};
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

/// A command for the guest: `sh -c SCRIPT sh ARGS...` or a plain argv,
/// as an account, in a directory.
#[derive(Clone, Debug)]
pub(crate) struct GuestCommand {
    /// The argv.
    pub argv: Vec<String>,
    /// The guest account it runs as.
    pub user: &'static str,
    /// Its working directory, if not the account's home.
    pub cwd: Option<&'static str>,
}

/// What a finished guest command gave back.
#[derive(Clone, Debug)]
pub(crate) struct GuestOutput {
    /// Exit status 0.
    pub success: bool,
    /// Its exit code, if it exited.
    pub exit_code: Option<i32>,
    /// Its output.
    pub stdout: String,
    /// Its error output.
    pub stderr: String,
}

/// What a repository's steps need of a running workspace's guest.
pub(crate) trait RepoGuest: Sync {
    /// The error the steps return; a repository's own failure converts.
    type Error: From<RepoError> + Send;

    /// The workspace's full name.
    fn workspace(&self) -> &str;

    /// Runs `cmd` to its end.
    fn run(
        &self,
        cmd: GuestCommand,
    ) -> impl Future<Output = Result<GuestOutput, Self::Error>> + Send;

    /// Copies the host tree `host` to `guest`.
    fn copy_in(
        &self,
        host: &Path,
        guest: &str,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Copies the guest file `guest` to the new host file `host`.
    fn copy_out(
        &self,
        guest: &str,
        host: &Path,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Up to `max` bytes of the guest file `guest`, if it reads.
    fn read_small(&self, guest: &str, max: u64) -> impl Future<Output = Option<Vec<u8>>> + Send;
}

/// Clones `checkout` into the guest, once (while `ws` has the pending
/// mark `create` left): the clone is made on the host (fast: git on the
/// host costs milliseconds, in this guest seconds per process), copied in
/// through the agent, and given to the guest's `user`, whose `~/.cache`
/// points at a task's slot cache when `has_cache`. After that it lives on
/// the workspace's disk.
pub(crate) async fn clone_pending<G: RepoGuest>(
    guest: &G,
    store: &RepoStore,
    ws: &WorkspaceDir,
    checkout: &RepoCheckout,
    has_cache: bool,
) -> Result<(), G::Error> {
    let pending = ws.repo_pending();
    if !pending.exists() {
        return Ok(());
    }
    let info = store.get(&checkout.repo)?;
    let tree = ws.path().join("repo-clone");
    let _ = std::fs::remove_dir_all(&tree);
    let made = {
        let tree = tree.clone();
        let work_branch = RepoCheckout::work_branch(guest.workspace());
        let base = checkout.base.clone().unwrap_or_default();
        tokio::task::spawn_blocking(move || {
            let who = git::Identity {
                name: git::config(&info.path, "user.name").unwrap_or_else(|| "microagent".into()),
                email: git::config(&info.path, "user.email")
                    .unwrap_or_else(|| "agent@microagent.invalid".into()),
            };
            let origin = git::network_origin(&info.path);
            git::prepare_clone(
                &info.path,
                &tree,
                &base,
                &work_branch,
                &who,
                origin.as_deref(),
            )
        })
        .await
        .map_err(|e| RepoError::HostStepStopped(e.to_string()))?
        .map_err(RepoError::from)
    };
    let copied = match made {
        Ok(()) => guest.copy_in(&tree, GUEST_REPO_DIR).await,
        Err(e) => Err(e.into()),
    };
    let _ = std::fs::remove_dir_all(&tree);
    copied?;
    let cache = if has_cache { CACHE_MOUNT } else { "" };
    let mut own = script(OWN_SCRIPT, [GUEST_USER, cache]);
    own.user = "root";
    guest_step(guest, "giving the clone to the guest's user", own).await?;
    std::fs::remove_file(&pending).map_err(|source| RepoError::HostIo {
        what: format!("removing {}", pending.display()),
        source,
    })?;
    Ok(())
}

/// Brings the workspace's new commits (since `checkout`'s base) back to
/// the host repository as `host_ref`: the guest bundles them, the bundle
/// is copied out through the agent into `ws`, checked against the limits
/// of `state_root`'s config.json, and fetched. No new commits leaves the
/// host as it was.
pub(crate) async fn pull<G: RepoGuest>(
    guest: &G,
    store: &RepoStore,
    state_root: &Path,
    ws: &WorkspaceDir,
    checkout: &RepoCheckout,
    host_ref: &str,
) -> Result<RepoPull, G::Error> {
    let name = guest.workspace();
    let base = checkout.base.clone().unwrap_or_default();
    let info = store.get(&checkout.repo)?;
    let mut req = script(PULL_SCRIPT, [base.as_str(), GUEST_PULL_BUNDLE]);
    req.cwd = Some(GUEST_REPO_DIR);
    let said = guest_step(guest, "bundling the new commits", req).await?;
    let branch = guest
        .read_small(&format!("{GUEST_REPO_DIR}/.git/HEAD"), 4096)
        .await
        .map(|data| String::from_utf8_lossy(&data).trim().to_owned())
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
    let local = ws.path().join("repo-pull.bundle");
    let _ = std::fs::remove_file(&local);
    guest.copy_out(GUEST_PULL_BUNDLE, &local).await?;
    let limits = RepoLimits::load(state_root).map_err(RepoError::Invalid)?;
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

/// The workspace's changes since `checkout`'s base, committed or not, as
/// a unified diff (`stat`: a summary per file instead).
pub(crate) async fn diff<G: RepoGuest>(
    guest: &G,
    checkout: &RepoCheckout,
    stat: bool,
) -> Result<String, G::Error> {
    let base = checkout.base.clone().unwrap_or_default();
    let mut argv: Vec<String> = ["git", "diff", "--no-color", "--no-ext-diff"]
        .map(String::from)
        .into();
    if stat {
        argv.push("--stat".into());
    }
    argv.push(base);
    let req = GuestCommand {
        argv,
        user: GUEST_USER,
        cwd: Some(GUEST_REPO_DIR),
    };
    guest_step(guest, "diffing the clone", req).await
}

/// Runs one guest step of a repository operation; its stdout when it
/// succeeds.
async fn guest_step<G: RepoGuest>(
    guest: &G,
    step: &'static str,
    cmd: GuestCommand,
) -> Result<String, G::Error> {
    let done = guest.run(cmd).await?;
    if done.success {
        return Ok(done.stdout);
    }
    let detail = match done.stderr.trim() {
        "" => format!("exit {:?}", done.exit_code),
        text => text.to_owned(),
    };
    Err(RepoError::Guest {
        workspace: guest.workspace().to_owned(),
        step,
        detail,
    }
    .into())
}

/// `sh -c SCRIPT sh ARGS...` as the guest's `user`: values reach the
/// script as positional arguments, never spliced into its text.
fn script<const N: usize>(script: &str, args: [&str; N]) -> GuestCommand {
    let head = ["sh", "-c", script, "sh"].map(String::from);
    GuestCommand {
        argv: head.into_iter().chain(args.map(String::from)).collect(),
        user: GUEST_USER,
        cwd: None,
    }
}
