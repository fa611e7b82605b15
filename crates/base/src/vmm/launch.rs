//! How a workspace's VMM process is started: the program to run and the
//! arguments that name the workspace, turned into argv in this one place.
//! The `microagent` binary runs VMM processes as its hidden `vmm
//! serve-workspace` command; a program that embeds the library and runs
//! `vmm_host::VmmProcess` (crates/vmm-host) itself accepts the same arguments.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use vmm_core::KernelVariant;

/// The workspace guest's command line before its hostname. The guest uses
/// kvm-clock, which a restore resumes where it was saved: on hosts that
/// cannot offset the guest's TSC a TSC clocksource would jump by the time
/// between snapshot and restore.
pub const GUEST_CMDLINE: &str =
    "root=/dev/vda ro rootfstype=ext4 clocksource=kvm-clock microagent_overlay=/dev/vdb";

/// The subcommand words before the options.
pub const VMM_SUBCOMMAND: [&str; 2] = ["vmm", "serve-workspace"];

/// One VMM process to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmmLaunch {
    /// The program (by default the running executable).
    pub program: PathBuf,
    /// The state directory.
    pub home: PathBuf,
    /// The workspace.
    pub workspace: String,
    /// The guest kernel variant, chosen once by the starter (so the VMM
    /// process does not probe the host again).
    pub kernel: KernelVariant,
    /// A snapshot directory to restore instead of booting.
    pub restore: Option<PathBuf>,
    /// A directory (holding only `warm.json`) to write the image's warm
    /// snapshot into once the agent answers.
    pub keep_warm: Option<PathBuf>,
    /// The starter's launch ticket (see `WorkspaceDir::launch_ticket`):
    /// with it the process builds its machine before the starter has
    /// recorded it.
    pub ticket: Option<String>,
    /// Whether the process gets its owner's pidfd as
    /// [`OWNER_FD`](crate::vmm::spawn::OWNER_FD).
    pub owner_fd: bool,
    /// The account (uid, gid) the process runs as once its machine is
    /// built, when started as root (see [`crate::vmm::user`]).
    pub user: Option<(u32, u32)>,
    /// When the starter launched it (`CLOCK_MONOTONIC` ns): what the
    /// process times its steps from (`vmm.log`, the record's figures).
    pub launched_ns: Option<u64>,
}

impl VmmLaunch {
    /// The process for `workspace` of the state directory `home`, run by
    /// `program`, booting the `kernel` variant.
    pub fn new(program: &Path, home: &Path, workspace: &str, kernel: KernelVariant) -> Self {
        Self {
            program: program.to_path_buf(),
            home: home.to_path_buf(),
            workspace: workspace.to_owned(),
            kernel,
            restore: None,
            keep_warm: None,
            ticket: None,
            owner_fd: false,
            user: None,
            launched_ns: None,
        }
    }

    /// Says when the starter launched it (`CLOCK_MONOTONIC` ns).
    pub fn launched_at(mut self, ns: u64) -> Self {
        self.launched_ns = Some(ns);
        self
    }

    /// Hands the process its owner's pidfd.
    pub fn watching_owner(mut self) -> Self {
        self.owner_fd = true;
        self
    }

    /// Runs the machine as `uid`:`gid` once it is built.
    pub fn as_user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    /// Carries the starter's launch ticket.
    pub fn with_ticket(mut self, ticket: &str) -> Self {
        self.ticket = Some(ticket.to_owned());
        self
    }

    /// Keeps a warm snapshot in `dir` once the agent answers.
    pub fn keeping_warm(mut self, dir: &Path) -> Self {
        self.keep_warm = Some(dir.to_path_buf());
        self
    }

    /// Restores the snapshot in `dir` instead of booting.
    pub fn restoring(mut self, dir: &Path) -> Self {
        self.restore = Some(dir.to_path_buf());
        self
    }

    /// The arguments after the program name: `vmm serve-workspace --home
    /// HOME --kernel VARIANT [--restore DIR] [--keep-warm DIR] [--ticket T]
    /// [--owner-fd 3] [--user UID:GID] [--launched-ns NS] WORKSPACE`.
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = VMM_SUBCOMMAND.iter().map(OsString::from).collect();
        args.push("--home".into());
        args.push(self.home.clone().into_os_string());
        args.push("--kernel".into());
        args.push(self.kernel.name().into());
        for (flag, dir) in [
            ("--restore", &self.restore),
            ("--keep-warm", &self.keep_warm),
        ] {
            if let Some(dir) = dir {
                args.push(flag.into());
                args.push(dir.clone().into_os_string());
            }
        }
        if let Some(ticket) = &self.ticket {
            args.push("--ticket".into());
            args.push(ticket.into());
        }
        if self.owner_fd {
            args.push("--owner-fd".into());
            args.push(crate::vmm::spawn::OWNER_FD.to_string().into());
        }
        if let Some((uid, gid)) = self.user {
            args.push("--user".into());
            args.push(format!("{uid}:{gid}").into());
        }
        if let Some(ns) = self.launched_ns {
            args.push("--launched-ns".into());
            args.push(ns.to_string().into());
        }
        args.push(self.workspace.clone().into());
        args
    }

    /// Reads this program's own arguments (`args` after the program name):
    /// `Some` when they ask it to be a VMM process, as [`VmmLaunch::args`]
    /// writes them. For programs that embed the library and are their
    /// workspaces' VMM program.
    pub fn from_args(args: impl IntoIterator<Item = OsString>) -> Option<Self> {
        let program = std::env::current_exe().ok()?;
        let args: Vec<OsString> = args.into_iter().collect();
        let (words, rest) = args.split_at_checked(VMM_SUBCOMMAND.len())?;
        if words.iter().zip(VMM_SUBCOMMAND).any(|(w, s)| w != s) {
            return None;
        }
        let (workspace, mut options) = rest.split_last()?;
        let (mut home, mut kernel, mut restore, mut keep_warm, mut ticket) =
            (None, None, None, None, None);
        let (mut owner_fd, mut user, mut launched_ns) = (None, None, None);
        while let [flag, value, more @ ..] = options {
            let slot = match flag.to_str()? {
                "--home" => &mut home,
                "--kernel" => &mut kernel,
                "--restore" => &mut restore,
                "--keep-warm" => &mut keep_warm,
                "--ticket" => &mut ticket,
                "--owner-fd" => &mut owner_fd,
                "--user" => &mut user,
                "--launched-ns" => &mut launched_ns,
                _ => return None,
            };
            if slot.replace(value.clone()).is_some() {
                return None;
            }
            options = more;
        }
        if !options.is_empty() {
            return None;
        }
        Some(Self {
            program,
            home: PathBuf::from(home?),
            workspace: workspace.to_str()?.to_owned(),
            kernel: KernelVariant::from_name(kernel?.to_str()?)?,
            restore: restore.map(PathBuf::from),
            keep_warm: keep_warm.map(PathBuf::from),
            ticket: match ticket {
                Some(t) => Some(t.into_string().ok()?),
                None => None,
            },
            // The descriptor is always the same one: anything else is not
            // what this library wrote.
            owner_fd: match owner_fd {
                Some(fd) if fd.to_str()? == crate::vmm::spawn::OWNER_FD.to_string() => true,
                Some(_) => return None,
                None => false,
            },
            user: match user {
                Some(ids) => {
                    let (uid, gid) = ids.to_str()?.split_once(':')?;
                    Some((uid.parse().ok()?, gid.parse().ok()?))
                }
                None => None,
            },
            launched_ns: match launched_ns {
                Some(ns) => Some(ns.to_str()?.parse().ok()?),
                None => None,
            },
        })
    }

    /// Starts the process: stderr to `log`, the owner's pidfd handed over
    /// when [`VmmLaunch::watching_owner`] said so.
    pub fn spawn(
        &self,
        log: &std::fs::File,
        owner: Option<&std::os::fd::OwnedFd>,
    ) -> Result<crate::vmm::spawn::Spawned, crate::vmm::spawn::SpawnError> {
        crate::vmm::spawn::spawn(
            &self.program,
            &self.args(),
            log,
            owner.filter(|_| self.owner_fd),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_names_the_home_and_workspace() {
        let l = VmmLaunch::new(
            Path::new("/bin/prog"),
            Path::new("/tmp/h"),
            "dev",
            KernelVariant::Compat,
        );
        assert_eq!(
            l.args(),
            [
                "vmm",
                "serve-workspace",
                "--home",
                "/tmp/h",
                "--kernel",
                "compat",
                "dev"
            ]
            .map(OsString::from)
            .to_vec()
        );
        let back = VmmLaunch::from_args(l.args()).unwrap();
        assert_eq!(
            (back.home, back.workspace, back.kernel),
            (l.home.clone(), l.workspace.clone(), l.kernel)
        );
        let restoring = l.clone().restoring(Path::new("/tmp/h/snap"));
        assert_eq!(
            restoring.args()[6..8],
            ["--restore", "/tmp/h/snap"].map(OsString::from)
        );
        let back = VmmLaunch::from_args(restoring.args()).unwrap();
        assert_eq!(back.restore.as_deref(), Some(Path::new("/tmp/h/snap")));
        assert_eq!(back.workspace, "dev");
        let warm = l.clone().keeping_warm(Path::new("/tmp/h/warm/.p"));
        let back = VmmLaunch::from_args(warm.args()).unwrap();
        assert_eq!(back.keep_warm.as_deref(), Some(Path::new("/tmp/h/warm/.p")));
        assert_eq!(back.restore, None);
        let owned = l.clone().watching_owner().as_user(990, 991);
        let back = VmmLaunch::from_args(owned.args()).unwrap();
        assert_eq!((back.owner_fd, back.user), (true, Some((990, 991))));
        let mut other_fd = owned.args();
        let at = other_fd.iter().position(|a| a == "--owner-fd").unwrap();
        other_fd[at + 1] = "7".into();
        assert!(
            VmmLaunch::from_args(other_fd).is_none(),
            "another descriptor"
        );
        let ticketed = l.clone().with_ticket("abc");
        let back = VmmLaunch::from_args(ticketed.args()).unwrap();
        assert_eq!(back.ticket.as_deref(), Some("abc"));
        let timed = l.clone().launched_at(123_456_789);
        let back = VmmLaunch::from_args(timed.args()).unwrap();
        assert_eq!(back.launched_ns, Some(123_456_789));
        let mut not_a_time = timed.args();
        let at = not_a_time
            .iter()
            .position(|a| a == "--launched-ns")
            .unwrap();
        not_a_time[at + 1] = "-1".into();
        assert!(VmmLaunch::from_args(not_a_time).is_none(), "not a time");
        let mut twice = warm.args();
        twice.insert(6, "/x".into());
        twice.insert(6, "--home".into());
        assert!(VmmLaunch::from_args(twice).is_none(), "a repeated flag");
        let mut unknown_kernel = l.args();
        unknown_kernel[5] = "mystery".into();
        assert!(VmmLaunch::from_args(unknown_kernel).is_none());
        assert!(VmmLaunch::from_args(["list".into()]).is_none());
        assert!(
            VmmLaunch::from_args(["vmm", "serve-workspace", "--home"].map(OsString::from))
                .is_none()
        );
    }
}
