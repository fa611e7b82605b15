//! A standby VMM process (`microagent-vmm vmm standby`): made before its
//! workspace is known, it leaves its starter, prepares a KVM VM with the
//! shape's vCPUs and guest memory's range registered, in cgroups with the
//! shape's limits (renamed to its workspace's at the claim), and waits on its
//! claim socket (`base::vmm::standby`). The launch it takes is then run as
//! a freshly started VMM process would run it, onto that VM, with the
//! claim's `vmm.log` as stderr and its owner's pidfd as
//! [`OWNER_FD`](base::vmm::spawn::OWNER_FD). Unclaimed, it ends.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use base::host::cgroup::{self, CgroupLimits, Placement};
use base::host::settings::own_pid;
use base::network::PasstAhead;
use base::store::workspace_dir::WorkspaceDir;
use base::store::StateDir;
use base::vmm::launch::VmmLaunch;
use base::vmm::spawn::OWNER_FD;
use base::vmm::standby::{
    ClaimListener, StandbyArgs, CGROUP_RECORD, PASST_LOG_EXTENSION, ROOT_EXTENSION, STANDBY_WAIT,
};
use vmm_core::machine::PreparedVm;

use crate::error::{Result, VmmProcessError};

/// A launch a standby took, with what it made ahead for it.
#[derive(Debug)]
pub struct Claimed {
    /// What to run.
    pub launch: VmmLaunch,
    /// The VM, groups and network namespace made ahead.
    pub ahead: MadeAhead,
}

/// What a standby made before its claim, for the VMM of the workspace
/// that claims it.
#[derive(Debug)]
pub struct MadeAhead {
    /// The VM made ahead.
    pub prepared: PreparedVm,
    /// The cgroups it joined ahead, with its shape's limits: renamed to
    /// the workspace's at its build.
    pub cgroup: Placement,
    /// An empty network namespace to enter once the ports are bound
    /// (making one is most of a millisecond, entering one microseconds);
    /// none without CAP_SYS_ADMIN, where the VMM makes its own inside the
    /// user namespace of its private root.
    pub empty_network: Option<OwnedFd>,
    /// The passt of a workspace like the one the standby was made like
    /// (`--like`), started before the claim rather than beside the
    /// restore; kept only for a workspace of the same namespace, taken
    /// only when its own passt setting is equal (the VMM otherwise starts
    /// its own).
    pub passt: Option<PasstAhead>,
    /// The seccomp filters for a VMM whose one child is that passt (or
    /// that has none, without one): compiled while waiting, used when the
    /// claim's children are those.
    pub filters: Option<vmm_core::seccomp::Filters>,
    /// The private root made ahead, in the mount namespace taken ahead:
    /// only beside a passt made ahead (a passt started later would share
    /// the namespace until it takes its own) and with CAP_SYS_ADMIN (else
    /// the namespace comes with a user namespace, taken at the claim).
    pub root: Option<base::host::jail::RootAhead>,
}

/// Prepares the VM of `shape` and waits for the launch that takes it:
/// `None` when none came in [`STANDBY_WAIT`] (the process should end).
/// Runs first in the process, while it is its only thread.
pub fn wait_for_claim(standby: &StandbyArgs) -> Result<Option<Claimed>> {
    let (home, shape) = (standby.home.as_path(), standby.shape);
    crate::guard::leave_starter(false);
    // The owner's pidfd goes to a fixed number: held by /dev/null until
    // then, so none of the descriptors opened below takes it.
    let placeholder = std::fs::File::open("/dev/null")
        .map_err(VmmProcessError::host_io("opening /dev/null".to_owned()))?;
    move_to(placeholder.into(), OWNER_FD)?;
    // Its groups first, with its shape's limits (what a workspace of this
    // shape gets), so that what the VM's making costs counts there.
    let cgroup = cgroup::join(
        Path::new(cgroup::CGROUP_ROOT),
        &cgroup::group_id(home, &format!("standby-{}", own_pid())),
        &CgroupLimits::for_workspace(shape.vcpus, shape.mem_mib),
    );
    let leave = |cgroup: &Placement| cgroup::Leaving::prepare(cgroup).leave();
    let prepared = match PreparedVm::with_memory(shape.vcpus, shape.mem_mib) {
        Ok(prepared) => prepared,
        Err(e) => {
            leave(&cgroup);
            return Err(VmmProcessError::StandbyVm(e));
        }
    };
    // A standby whose namespace could not be made ends: made on a thread
    // of its own, its failure leaves the process where it was, but a
    // thread that did not end would keep its mount namespace from it.
    let empty_network = match crate::guard::empty_network_ahead() {
        Ok(namespace) => namespace,
        Err(why) => {
            leave(&cgroup);
            return Err(VmmProcessError::StandbyNetwork(why));
        }
    };
    let listener = match ClaimListener::bind(home, shape) {
        Ok(listener) => listener,
        Err(e) => {
            leave(&cgroup);
            return Err(e.into());
        }
    };
    // Where a standby killed before its claim left its groups, for the
    // next refill's sweep.
    let record = listener.path().with_extension(CGROUP_RECORD);
    cgroup::record_at(&cgroup, &record);
    // Still the process's only thread: passt's socket end is handed over
    // without a step in the child.
    let passt = standby
        .like
        .as_deref()
        .and_then(|like| passt_ahead(home, like, &listener));
    let children = passt.as_ref().and_then(PasstAhead::pid);
    let filters =
        vmm_core::seccomp::Filters::with_children(&crate::seccomp::CONTROL, children.as_slice())
            .inspect_err(|e| {
                tracing::info!(
                    "no seccomp filters ahead: {}",
                    base::error_chain::error_chain(e)
                )
            })
            .ok();
    // A standby whose namespace could not be made ends (as above).
    let root = match passt
        .as_ref()
        .map(|_| root_ahead(home, &listener))
        .transpose()
    {
        Ok(root) => root.flatten(),
        Err(e) => {
            drop(passt);
            leave(&cgroup);
            let _ = std::fs::remove_file(&record);
            return Err(e);
        }
    };
    tracing::info!(socket = %listener.path().display(), "standby waiting for its claim");
    let claim = match listener.wait(STANDBY_WAIT) {
        Ok(Some(claim)) => claim,
        other => {
            // Its groups are removable once passt is out of them.
            drop(passt);
            if let Some(root) = root {
                root.remove();
            }
            leave(&cgroup);
            let _ = std::fs::remove_file(&record);
            tracing::info!("standby unclaimed: ending");
            return other.map(|_| None).map_err(Into::into);
        }
    };
    // The groups become the workspace's, recorded in its directory.
    let _ = std::fs::remove_file(&record);
    // Another namespace's workspace gets a passt of its own: whether the
    // one made ahead would have fitted says something of the workspace
    // the standby was made like.
    let same_namespace = |like: &str| {
        base::store::name::namespace_of(like)
            == base::store::name::namespace_of(claim.launch.workspace.as_str())
    };
    let passt = passt.filter(|_| standby.like.as_deref().is_some_and(same_namespace));
    move_to(claim.log, libc::STDERR_FILENO)?;
    match claim.owner {
        Some(owner) => move_to(owner, OWNER_FD)?,
        // SAFETY: closes the placeholder this function put there.
        None => unsafe {
            libc::close(OWNER_FD);
        },
    }
    Ok(Some(Claimed {
        launch: claim.launch,
        ahead: MadeAhead {
            prepared,
            cgroup,
            empty_network,
            passt,
            filters,
            root,
        },
    }))
}

/// Starts the passt a workspace like `like` gets, its log beside the
/// standby's socket (the sweep removes one left by a standby gone);
/// `None` when it has none or it cannot start (the VMM then starts one at
/// the claim, as it would without a standby).
fn passt_ahead(home: &Path, like: &str, listener: &ClaimListener) -> Option<PasstAhead> {
    let setting = (|| -> std::result::Result<_, String> {
        let run_as = base::vmm::user::for_state(home).map_err(|e| e.to_string())?;
        let state = StateDir::at(home).map_err(|e| e.to_string())?;
        let spec = WorkspaceDir::new(&state, like)
            .and_then(|ws| ws.read_meta())
            .map_err(|e| base::error_chain::error_chain(&e))?
            .spec;
        base::network::attach::passt_for(&state, &spec, run_as.map(|u| (u.uid, u.gid)))
            .map_err(|e| base::error_chain::error_chain(&e))
    })();
    let setting = match setting {
        Ok(setting) => setting?,
        Err(why) => {
            tracing::info!("no passt ahead: {why}");
            return None;
        }
    };
    let log = listener.path().with_extension(PASST_LOG_EXTENSION);
    PasstAhead::start(log, setting)
        .inspect_err(|e| tracing::info!("no passt ahead: {}", base::error_chain::error_chain(e)))
        .ok()
}

/// Takes the mount namespace and makes the private root ahead, on a
/// directory beside the standby's socket (the sweep removes one left by
/// a standby gone), keeping what every workspace of `home` keeps; `None`
/// without CAP_SYS_ADMIN. Runs while the process has one thread.
fn root_ahead(
    home: &Path,
    listener: &ClaimListener,
) -> Result<Option<base::host::jail::RootAhead>> {
    use base::host::settings::{has_capability, CAP_SYS_ADMIN};
    if !has_capability(CAP_SYS_ADMIN) {
        return Ok(None);
    }
    let dir = listener.path().with_extension(ROOT_EXTENSION);
    base::host::jail::unshare()
        .and_then(|()| base::host::jail::RootAhead::make(&dir, &crate::guard::state_keeps(home)))
        .map(Some)
        .map_err(VmmProcessError::StandbyRoot)
}

/// Puts `fd` at the number `to` (closing what was there), without
/// close-on-exec as an inherited descriptor would be.
fn move_to(fd: OwnedFd, to: i32) -> Result<()> {
    if fd.as_raw_fd() == to {
        std::mem::forget(fd);
        return Ok(());
    }
    // SAFETY: dup2 onto a number this process reserved for it (stderr, or
    // the owner's slot held by the placeholder); `fd` is closed on drop.
    if unsafe { libc::dup2(fd.as_raw_fd(), to) } < 0 {
        return Err(
            VmmProcessError::host_io(format!("placing descriptor {to}"))(
                std::io::Error::last_os_error(),
            ),
        );
    }
    Ok(())
}
