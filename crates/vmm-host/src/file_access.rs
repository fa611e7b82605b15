//! Landlock for the VMM process (cloud-hypervisor's model): once its
//! machine is built it may read and write only beneath what its private
//! root keeps (its workspace directory and lock file, the snapshots
//! directory, its warm directory) and read its own `/proc` entry; it may
//! not bind or connect TCP sockets, nor connect to abstract Unix sockets
//! made outside it. This holds where the private root could not be had
//! (user namespaces blocked, as Ubuntu's AppArmor does by default), and
//! adds a second wall where it could.

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;

use base::host::jail::Keep;
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The newest ABI whose rights this policy asks for; older kernels
/// enforce what they know (best effort), and the protection says so.
const ABI_WANTED: ABI = ABI::V6;

/// Why the VMM has no Landlock domain.
#[derive(Debug, thiserror::Error)]
pub enum FileAccessError {
    /// A path it keeps could not be opened for its rule.
    #[error("opening {} for its Landlock rule", path.display())]
    Open {
        /// The path.
        path: std::path::PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The ruleset could not be made or enforced.
    #[error("making or enforcing the Landlock ruleset")]
    Ruleset(#[source] landlock::RulesetError),
    /// The kernel has no Landlock (or it is off at boot).
    #[error("this kernel has no Landlock")]
    Unsupported,
}

/// Restricts the calling thread (the VMM's only one, so every thread it
/// starts inherits it) to `keep`, and to removing directories beneath
/// `removable` (its cgroups' parents, opened before its root went
/// private: it removes its own groups at the end). Returns the protection
/// now on (`landlock`, `landlock (partial: ...)`).
pub fn confine(keep: &[Keep], removable: Vec<OwnedFd>) -> Result<String, FileAccessError> {
    let fs = AccessFs::from_all(ABI_WANTED);
    // Handles for the rules only (O_PATH: nothing is read through them).
    let open = |path: &std::path::Path| -> Result<OwnedFd, FileAccessError> {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(path)
            .map(OwnedFd::from)
            .map_err(|source| FileAccessError::Open {
                path: path.to_owned(),
                source,
            })
    };
    let mut rules = Vec::new();
    for k in keep {
        let (path, access) = match k {
            Keep::Dir(p) => (p, fs),
            Keep::File(p) => (p, AccessFs::from_file(ABI_WANTED)),
        };
        rules.push(PathBeneath::new(open(path)?, access));
    }
    for dir in removable {
        rules.push(PathBeneath::new(dir, AccessFs::RemoveDir));
    }
    let proc_self = open(std::path::Path::new("/proc/self"))?;
    rules.push(PathBeneath::new(proc_self, AccessFs::from_read(ABI_WANTED)));
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(fs)
        .and_then(|r| r.handle_access(AccessNet::from_all(ABI_WANTED)))
        .and_then(|r| r.scope(Scope::AbstractUnixSocket))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(rules.into_iter().map(Ok::<_, landlock::RulesetError>)))
        .and_then(|r| r.restrict_self())
        .map_err(FileAccessError::Ruleset)?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok("landlock".to_owned()),
        RulesetStatus::PartiallyEnforced => Ok(format!(
            "landlock (partial: this kernel's ABI is older than {ABI_WANTED:?})"
        )),
        RulesetStatus::NotEnforced => Err(FileAccessError::Unsupported),
    }
}
