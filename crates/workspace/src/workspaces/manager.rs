//! The collection of workspaces as every concern reaches it: how it is
//! made, its directories and locks, its limits, images, agents and
//! secrets, and what `list` and `inspect` return. Its creates and lists
//! are `collection`'s, the life cycle `lifecycle`'s. Every change to a
//! workspace happens under its lock; the running VMM process records its
//! own state changes.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::secrets::{SecretMask, SecretStore, SecretValue};
use base::host_tool::HostTool;
use base::images::registry::ImageRegistry;
use base::store::process;
use base::store::spec::{Limits, Meta, WorkspaceSpec, LIMITS};
use base::store::state::State;
use base::store::workspace_dir::{WorkspaceDir, WorkspaceDirError};
use base::store::{StateDir, WorkspaceLock};
use base::vmm::launch::GUEST_CMDLINE;
use vmm_core::KernelVariant;

/// `inspect`: the record plus what is known live.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct WorkspaceInfo {
    /// The record.
    #[serde(flatten)]
    pub meta: Meta,
    /// The workspace directory.
    pub dir: PathBuf,
    /// Milliseconds since creation.
    pub age_ms: u64,
    /// Milliseconds since the current run started (null when no VMM runs).
    pub uptime_ms: Option<u64>,
    /// Host bytes the writable disk uses.
    pub disk_used_bytes: u64,
    /// The guest's network as it is now (null on `none`, or when the
    /// network's record is gone).
    #[serde(default)]
    pub network: Option<base::network::GuestNetwork>,
    /// While it runs on the `user` network: what its egress filter refused
    /// since it started, and the last ones (where, why, when).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<base::store::egress::EgressDenials>,
    /// Its services and their companions' states.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<crate::services::ServiceInfo>,
}

/// Filters for `list`.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<State>,
    /// Only this image.
    pub image: Option<String>,
    /// Only workspaces with all these labels.
    pub labels: Vec<(String, String)>,
    /// Other agents' workspaces too (an agent's view lists only what it
    /// may use otherwise); they stay FORBIDDEN to use.
    pub all_agents: bool,
    /// Only the workspaces this agent owns (devbox's `user`); lists
    /// another agent's as `all_agents` does.
    pub agent: Option<String>,
}

/// The workspaces of one state directory.
///
/// # Blocking
///
/// The synchronous methods do file I/O under a per-workspace lock (`flock`),
/// so any of them may wait while another caller, in this process or another,
/// changes the same workspace. Some take seconds even uncontended:
///
/// - [`create`](Self::create) formats the writable disk (`mkfs.ext4`);
/// - [`halt`](crate::Workspace::halt) waits up to 10 s for the VMM process to die;
/// - [`delete`](crate::Workspace::delete) halts a running workspace first (with
///   `force`), then removes its directory and disk;
/// - [`set_ttl`](crate::Workspace::set_ttl) asks a running VMM over its control socket
///   (up to 5 s);
/// - [`remove_image`](Self::remove_image) and the image imports of
///   [`images`](Self::images) remove or copy image files;
/// - [`new`](Self::new) and [`from_env`](Self::from_env) may run a short KVM
///   probe to pick the kernel variant.
///
/// [`get`](crate::Workspace::get), [`list`](Self::list), [`inspect`](crate::Workspace::inspect) and
/// `logs` read small files and return quickly when no lock is held.
///
/// An async caller runs the synchronous methods with
/// `tokio::task::spawn_blocking`, as the MCP server does. The async methods
/// wait with `tokio::time::sleep` and talk to the guest agent
/// asynchronously, but run their own quick synchronous steps inline; two
/// can still block their task for long: [`stop`](crate::Workspace::stop) falls back to
/// [`halt`](crate::Workspace::halt) when the guest does not shut down in time, and
/// [`start`](crate::Workspace::start) halts a VM that did not boot within its timeout.
/// `copy_in` builds the archive of a host directory in memory before
/// sending it.
#[derive(Clone, Debug)]
pub struct Workspaces {
    pub(crate) state: StateDir,
    pub(crate) images: ImageRegistry,
    /// The asset directory built images are imported from.
    pub(crate) assets: Option<PathBuf>,
    pub(crate) vmm_binary: PathBuf,
    /// The VMM program also runs standbys (`vmm standby`): restores may
    /// be handed to them (`WorkspacesBuilder::standby_vmms`).
    pub(crate) standby_vmms: bool,
    /// What `create` and `set_ttl` accept.
    pub(crate) limits: Limits,
    /// Where warm snapshots are kept, when not `$MICROAGENT_WARM_DIR` or
    /// the state directory's `warm/`.
    pub(crate) warm_dir: Option<PathBuf>,
    /// The program task supervisors run as (`task supervise ID`).
    pub(crate) task_program: Option<PathBuf>,
    /// The namespace short names are in, and listings show (`*`: all).
    pub(crate) namespace: String,
    /// The MCP session this view acts for (none: the host's human, who
    /// may use everything).
    pub(crate) caller: Option<std::sync::Arc<crate::agents::access::Caller>>,
}

/// The kernel variant built images are imported with: the one built, or
/// when both are, the one this host needs.
fn kernel_variant(assets: Option<&PathBuf>) -> KernelVariant {
    let has = |v: KernelVariant| assets.is_some_and(|a| a.join(v.vmlinux_file()).exists());
    match (has(KernelVariant::Compat), has(KernelVariant::Standard)) {
        (true, false) => KernelVariant::Compat,
        // No built kernel: no built image to import, nothing to choose.
        (false, _) => KernelVariant::Standard,
        // Both: ask the host (a short KVM probe).
        (true, true) => vmm_core::host::probe()
            .map(|p| p.kernel_variant())
            .unwrap_or(KernelVariant::Standard),
    }
}

impl Workspaces {
    /// Workspaces in `state`, built images from `assets`, VMM processes run
    /// as `vmm_binary vmm serve-workspace`.
    pub fn new(state: StateDir, assets: Option<PathBuf>, vmm_binary: PathBuf) -> Self {
        let variant = kernel_variant(assets.as_ref());
        let images = ImageRegistry::new(&state, assets.clone(), variant);
        Self {
            state,
            images,
            assets,
            vmm_binary,
            standby_vmms: false,
            limits: LIMITS,
            warm_dir: None,
            task_program: None,
            namespace: base::store::name::DEFAULT_NAMESPACE.to_owned(),
            caller: None,
        }
    }

    /// The same, accepting only specs within `limits`.
    pub(crate) fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self.images = self.images.with_limits(limits);
        self
    }

    /// The limits `create` and `set_ttl` check against.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The asset directory these workspaces were built with (where
    /// `cargo xtask setup` puts kernels and built images), if any: what
    /// `doctor` checks.
    pub fn assets(&self) -> Option<&Path> {
        self.assets.as_deref()
    }

    /// The state directory.
    pub fn state_dir(&self) -> &StateDir {
        &self.state
    }

    /// The agents registered by MCP sessions on this state directory.
    pub fn agents(&self) -> crate::agents::AgentStore {
        crate::agents::AgentStore::new(&self.state)
    }

    /// The image registry.
    pub fn image_registry(&self) -> &ImageRegistry {
        &self.images
    }

    /// What workspaces of `image` start with, their sizes among it
    /// (nothing for an image not registered here; a pulled image's are
    /// known once it is converted).
    pub fn image_defaults(&self, image: &str) -> base::images::oci::config::ImageDefaults {
        self.images
            .find(image)
            .ok()
            .flatten()
            .map(|i| i.defaults)
            .unwrap_or_default()
    }

    pub(crate) fn dir(&self, name: &str) -> Result<WorkspaceDir> {
        Ok(WorkspaceDir::new(&self.state, name)?)
    }

    pub(crate) fn lock(&self, name: &str) -> Result<WorkspaceLock> {
        Ok(self.state.lock_workspace(name)?)
    }

    /// Takes the lock of an existing workspace and reads its record. If it
    /// was deleted meanwhile, the lock file this made is removed again.
    pub(crate) fn lock_existing(&self, name: &str) -> Result<(WorkspaceLock, Meta)> {
        let lock = self.lock(name)?;
        match self.dir(name)?.read_meta() {
            Ok(meta) => Ok((lock, meta)),
            Err(e @ WorkspaceDirError::NotFound(_)) => {
                let _ = self.state.remove_lock(name, lock);
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Workspaces {
    /// The secrets of this state directory.
    pub fn secrets(&self) -> SecretStore {
        SecretStore::new(&self.state)
    }

    /// The values of `names` and the mask of their output; an unknown name
    /// is NOT_FOUND.
    pub(crate) fn resolve_secrets(
        &self,
        names: &[String],
    ) -> Result<(Vec<(String, SecretValue)>, SecretMask)> {
        let values = self.secrets().resolve(names)?;
        let mask = SecretMask::new(values.iter().map(|(_, v)| v));
        Ok((values, mask))
    }
}

impl Workspaces {
    /// The warm snapshot's key for `spec` and the fingerprint of what it
    /// depends on: what a warm start looks up and a pool member must
    /// match (both above this file).
    pub(crate) fn warm_identity(&self, spec: &WorkspaceSpec) -> Result<(String, String)> {
        let image = self.image_registry().get(&spec.image)?;
        let variant = self.image_registry().kernel_variant();
        let net = base::network::NetworkStore::new(self.state_dir()).get(&spec.network)?;
        // Each guest on a tap network has an address of its own, which a
        // restored guest takes from the VMM: one warm snapshot serves all
        // tap networks.
        let (network, addressing) = if net.backend == Some(base::network::Backend::Tap) {
            ("tap".to_owned(), "re-addressed at restore".to_owned())
        } else {
            (
                spec.network.clone(),
                base::network::guest_cmdline(
                    base::network::attach::addressing(&net, spec).as_ref(),
                )
                .unwrap_or_default(),
            )
        };
        let key = format!(
            "{}-{}c-{}m-{}d-{}-{}",
            image.name,
            spec.vcpus,
            spec.mem_mib,
            spec.disk_mib,
            variant.name(),
            network
        );
        let inputs = [
            format!("format {}", vmm_core::snapshot::format::FORMAT_VERSION),
            file_identity(&image.kernel),
            file_identity(&image.rootfs),
            format!(
                "cmdline {GUEST_CMDLINE} {}",
                image.boot_args.as_deref().unwrap_or_default()
            ),
            format!("network {addressing}"),
            format!("volume slots {}", base::store::volume_mounts::VOLUME_SLOTS),
            key.clone(),
        ];
        let fingerprint = format!("{:x}", Sha256::digest(inputs.join("\n")));
        Ok((key, fingerprint))
    }
}

/// Which file `path` is (device, inode, size, modification time): the same
/// for every hard link of an image file (each state directory links the
/// built images), different once it is rebuilt.
fn file_identity(path: &Path) -> String {
    std::fs::metadata(path).map_or_else(
        |_| format!("{} missing", path.display()),
        |m| {
            format!(
                "{}:{} {} {}.{}",
                m.dev(),
                m.ino(),
                m.len(),
                m.mtime(),
                m.mtime_nsec()
            )
        },
    )
}

/// True when the record expects a VMM that is no longer there.
pub(crate) fn vmm_died(meta: &Meta) -> bool {
    meta.state.has_vmm()
        && meta
            .runtime
            .as_ref()
            .is_none_or(|rt| !process::is_alive(rt.pid, rt.pid_start))
}

/// A sparse file of `mib` MiB formatted ext4.
pub(crate) fn make_disk(path: &Path, mib: u64) -> Result<()> {
    // The guest's disk: nobody else's to read.
    let file = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true),
        0o600,
    )
    .open(path)
    .map_err(Error::host_io(format!("creating {}", path.display())))?;
    file.set_len(mib << 20)
        .map_err(Error::host_io(format!("sizing {}", path.display())))?;
    let mkfs = HostTool::new("mkfs.ext4").map_err(|_| {
        Error::HostUnsupported(
            "mkfs.ext4 is not installed; install e2fsprogs (apt-get install e2fsprogs)".into(),
        )
    })?;
    let out = mkfs
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1",
        ])
        .arg(path)
        .limits(base::host_tool::ToolLimits::writing(mib << 20))
        .output()
        .map_err(|e| Error::HostIo {
            what: format!("mkfs.ext4 {}", path.display()),
            source: std::io::Error::other(base::error_chain::error_chain(&e)),
        })?;
    if !out.status.success() {
        return Err(Error::HostIo {
            what: format!("mkfs.ext4 {}", path.display()),
            source: std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        });
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    // Life-cycle tests that need no KVM: a fake image, and fake VMM processes.

    use super::*;
    use std::time::Duration;

    use base::code::ErrorCode;
    use base::host::settings::{host_tool, now_ms};
    use base::images::registry::{KERNEL_FILE, ROOTFS_FILE};
    use base::store::events::EventKind;
    use base::store::spec::{DeleteOptions, Runtime, WorkspaceSpec};
    use base::store::workspace_dir::VMM_LOG;
    use base::vmm::confinement::seccomp_violation;

    pub(crate) struct Fixture {
        root: PathBuf,
        pub(crate) ws: Workspaces,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    pub(crate) fn fixture(test: &str, vmm_binary: &str) -> Fixture {
        let root = PathBuf::from(format!("/tmp/ma-mgr-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let src = root.join("src");
        base::test_support::fake_image_files(&src);
        assert!(src.join(KERNEL_FILE).exists() && src.join(ROOTFS_FILE).exists());
        let state = StateDir::at(root.join("state")).unwrap();
        let ws = Workspaces::new(state, None, PathBuf::from(vmm_binary));
        ws.image_registry().import_dir("fake", &src).unwrap();
        Fixture { root, ws }
    }

    pub(crate) fn spec() -> WorkspaceSpec {
        WorkspaceSpec {
            image: "fake".into(),
            disk_mib: 64,
            ..WorkspaceSpec::default()
        }
    }

    /// `ws` as a session of `agent` (None: a session without one) sees it.
    pub(crate) fn session(ws: &Workspaces, agent: Option<&str>) -> Workspaces {
        let caller = std::sync::Arc::new(crate::agents::access::Caller::new());
        if let Some(agent) = agent {
            caller.set_agent(agent);
        }
        ws.for_caller(caller)
    }

    /// Whether mkfs.ext4 is here (else `test` is recorded as skipped).
    pub(crate) fn have_mkfs(test: &str) -> bool {
        base::test_support::have_mkfs(test, host_tool("mkfs.ext4").is_some())
    }

    #[test]
    fn a_workspace_of_an_ended_owner_goes_at_the_next_listing() {
        if !have_mkfs("a_workspace_of_an_ended_owner_goes_at_the_next_listing") {
            return;
        }
        let f = fixture("orphan", "/nonexistent");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let owner = base::store::spec::Owner {
            pid,
            start_ticks: base::store::process::start_ticks(pid).unwrap(),
        };
        let scoped = WorkspaceSpec {
            owner: Some(owner),
            delete_with_owner: true,
            ..spec()
        };
        f.ws.create("session", scoped).unwrap();
        let merely_owned = WorkspaceSpec {
            owner: Some(owner),
            ..spec()
        };
        f.ws.create("one-shot", merely_owned).unwrap();
        let names = |ws: &Workspaces| -> Vec<String> {
            let all = ws.list(&ListFilter::default()).unwrap();
            all.into_iter().map(|m| m.name).collect()
        };
        assert_eq!(names(&f.ws), ["one-shot", "session"], "the owner lives");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(names(&f.ws), ["one-shot"], "only the session's goes");
        assert!(f.ws.at("session").get().is_err());
    }

    #[test]
    fn create_list_inspect_delete() {
        if !have_mkfs("create_list_inspect_delete") {
            return;
        }
        let f = fixture("cycle", "/nonexistent");
        let meta = f.ws.create("dev", spec()).unwrap();
        assert_eq!(meta.state, State::Stopped);
        assert_eq!(
            f.ws.create("dev", spec()).unwrap_err().code(),
            ErrorCode::Conflict
        );
        let info = f.ws.at("dev").inspect().unwrap();
        assert!(info.dir.join("disk.ext4").exists());
        assert_eq!(
            std::fs::metadata(info.dir.join("disk.ext4")).unwrap().len(),
            64 << 20
        );
        assert_eq!(f.ws.list(&ListFilter::default()).unwrap().len(), 1);
        let only_running = ListFilter {
            state: Some(State::Running),
            ..ListFilter::default()
        };
        assert!(f.ws.list(&only_running).unwrap().is_empty());
        assert_eq!(
            f.ws.images().users("fake").unwrap(),
            vec!["dev".to_string()]
        );
        assert_eq!(
            f.ws.images().remove("fake").unwrap_err().code(),
            ErrorCode::Conflict
        );
        // Halting or stopping a stopped workspace changes nothing.
        assert_eq!(f.ws.at("dev").halt().unwrap().state, State::Stopped);
        f.ws.at("dev").delete(DeleteOptions::default()).unwrap();
        let left: Vec<_> = std::fs::read_dir(f.ws.state_dir().root().join("workspaces"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "delete removes the directory and the lock");
        assert_eq!(
            f.ws.at("dev").get().unwrap_err().code(),
            ErrorCode::NotFound
        );
        f.ws.images().remove("fake").unwrap();
    }

    #[test]
    fn a_dead_vmm_is_recorded_as_crashed_once() {
        if !have_mkfs("a_dead_vmm_is_recorded_as_crashed_once") {
            return;
        }
        let f = fixture("crash", "/nonexistent");
        f.ws.create("dev", spec()).unwrap();
        let dir = f.ws.dir("dev").unwrap();
        std::fs::write(dir.path().join("console.log"), "booting\nKernel says hi\n").unwrap();
        // A process that ran and is gone stands for a VMM killed with -9.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let ticks = process::start_ticks(pid).unwrap_or(1);
        child.wait().unwrap();
        let mut meta = dir.read_meta().unwrap();
        meta.state = State::Running;
        let mut runtime = Runtime::launched(pid, ticks, now_ms(), None);
        runtime.ready_at_ms = Some(now_ms());
        meta.runtime = Some(runtime);
        dir.write_meta(&meta).unwrap();
        std::fs::write(dir.control(), b"").unwrap();

        let seen = f.ws.at("dev").get().unwrap();
        assert_eq!(seen.state, State::Crashed);
        let exit = seen.last_exit.unwrap();
        assert!(exit.reason.contains(&pid.to_string()));
        assert_eq!(exit.console_tail, vec!["booting", "Kernel says hi"]);
        assert!(
            !dir.control().exists(),
            "the dead VMM's sockets are removed"
        );
        assert_eq!(f.ws.at("dev").get().unwrap().state, State::Crashed);
        let crashes = dir
            .events()
            .read_after(0)
            .unwrap()
            .into_iter()
            .filter(|e| matches!(e.kind, EventKind::Crashed { .. }))
            .count();
        assert_eq!(crashes, 1, "recorded once, however often it is looked at");
        let err = futures_exec(&f.ws);
        assert_eq!(err.code(), ErrorCode::NotRunning);
    }

    fn futures_exec(ws: &Workspaces) -> Error {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(ws.at("dev").exec_true()).unwrap_err()
    }

    #[test]
    fn a_start_whose_vmm_cannot_run_changes_nothing() {
        if !have_mkfs("a_start_whose_vmm_cannot_run_changes_nothing") {
            return;
        }
        let f = fixture("nostart", "/nonexistent/microagent");
        f.ws.create("dev", spec()).unwrap();
        let before = f.ws.at("dev").get().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt
            .block_on(f.ws.at("dev").start(Duration::from_secs(5), |_| {}))
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Internal);
        assert!(err.full_message().contains("/nonexistent/microagent"));
        assert_eq!(f.ws.at("dev").get().unwrap(), before);
        assert_eq!(
            rt.block_on(f.ws.at("ghost").start(Duration::from_secs(5), |_| {}))
                .unwrap_err()
                .code(),
            ErrorCode::NotFound
        );
    }

    #[test]
    fn concurrent_creates_of_one_name_make_one_workspace() {
        if !have_mkfs("concurrent_creates_of_one_name_make_one_workspace") {
            return;
        }
        let f = fixture("race", "/nonexistent");
        let results: Vec<Result<Meta>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| f.ws.create("same", spec())))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert_eq!(r.code(), ErrorCode::Conflict);
        }
        assert_eq!(f.ws.list(&ListFilter::default()).unwrap().len(), 1);
        // Delete racing with deletes: one wins, the others find nothing.
        let deleted: Vec<Result<Meta>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|_| s.spawn(|| f.ws.at("same").delete(DeleteOptions::default().force(true))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(deleted.iter().filter(|r| r.is_ok()).count(), 1);
        let left: Vec<_> = std::fs::read_dir(f.ws.state_dir().root().join("workspaces"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "losing deletes leave no lock file: {left:?}"
        );
    }

    #[test]
    fn a_damaged_record_does_not_hide_the_others() {
        if !have_mkfs("a_damaged_record_does_not_hide_the_others") {
            return;
        }
        let f = fixture("damaged", "/nonexistent");
        f.ws.create("good", spec()).unwrap();
        f.ws.create("bad", spec()).unwrap();
        std::fs::write(f.ws.dir("bad").unwrap().meta_path(), b"{ torn").unwrap();
        let names: Vec<String> =
            f.ws.list(&ListFilter::default())
                .unwrap()
                .into_iter()
                .map(|m| m.name)
                .collect();
        assert_eq!(names, vec!["good".to_string()]);
        let err = f.ws.at("bad").inspect().unwrap_err();
        assert!(
            err.full_message().contains("damaged"),
            "{}",
            err.full_message()
        );
    }

    #[test]
    fn waiting_for_events_returns_new_ones_or_times_out() {
        if !have_mkfs("waiting_for_events_returns_new_ones_or_times_out") {
            return;
        }
        let f = fixture("events-wait", "/nonexistent");
        f.ws.create("dev", spec()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let last = rt
            .block_on(f.ws.at("dev").events(0, Duration::ZERO))
            .unwrap()
            .last()
            .map_or(0, |e| e.seq);
        let start = std::time::Instant::now();
        let none = rt
            .block_on(f.ws.at("dev").events(last, Duration::from_millis(300)))
            .unwrap();
        assert!(none.is_empty());
        assert!(start.elapsed() >= Duration::from_millis(300));
        let writer = f.ws.dir("dev").unwrap().events();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            writer.append(EventKind::TtlExpired).unwrap();
        });
        let got = rt
            .block_on(f.ws.at("dev").events(last, Duration::from_secs(10)))
            .unwrap();
        assert_eq!(got[0].kind, EventKind::TtlExpired);
        t.join().unwrap();
    }

    #[test]
    fn extending_a_stopped_workspaces_ttl_adds_to_it() {
        if !have_mkfs("extending_a_stopped_workspaces_ttl_adds_to_it") {
            return;
        }
        let f = fixture("ttlext", "/nonexistent");
        f.ws.create("dev", spec()).unwrap();
        // No TTL yet: the extension becomes it.
        assert_eq!(
            f.ws.at("dev").extend_ttl(1800).unwrap().spec.ttl_secs,
            Some(1800)
        );
        assert_eq!(
            f.ws.at("dev").extend_ttl(3600).unwrap().spec.ttl_secs,
            Some(5400)
        );
        let max = base::store::spec::LIMITS.max_ttl_secs;
        let err = f.ws.at("dev").extend_ttl(max).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput, "{err}");
        assert_eq!(
            f.ws.at("dev").extend_ttl(0).unwrap_err().code(),
            ErrorCode::InvalidInput
        );
        assert_eq!(
            f.ws.at("dev").get().unwrap().spec.ttl_secs,
            Some(5400),
            "refusals change nothing"
        );
        assert_eq!(
            f.ws.at("ghost").extend_ttl(60).unwrap_err().code(),
            ErrorCode::NotFound
        );
    }

    #[test]
    fn a_seccomp_kill_is_named_from_the_vmm_log() {
        let f = fixture("seccomp", "/nonexistent-vmm");
        f.ws.create("dev", spec()).unwrap();
        let ws = f.ws.dir("dev").unwrap();
        assert_eq!(seccomp_violation(&ws), None, "no log yet");
        let log = format!(
            "INFO machine built\n{} the devices thread made syscall 59, outside its filter\n",
            vmm_core::seccomp::VIOLATION_PREFIX
        );
        std::fs::write(ws.path().join(VMM_LOG), log).unwrap();
        assert_eq!(
            seccomp_violation(&ws).as_deref(),
            Some("the devices thread made syscall 59, outside its filter")
        );
    }

    #[test]
    fn a_snapshot_take_or_delete_killed_half_way_is_swept_by_the_next_listing() {
        let f = fixture("snapsweep", "/nonexistent/vmm");
        let dir = f.ws.state_dir().root().join(base::store::SNAPSHOTS_DIR);
        let dead = [
            format!(".s1.{}.tmp", u32::MAX),
            format!(".s2.{}.rm", u32::MAX),
        ];
        let live = format!(".s3.{}.tmp", std::process::id());
        for name in dead.iter().chain([&live]) {
            std::fs::create_dir_all(dir.join(name)).unwrap();
        }
        assert!(f.ws.snapshots().list(None, false).unwrap().is_empty());
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, [live]);
    }
}
