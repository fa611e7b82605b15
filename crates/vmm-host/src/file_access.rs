//! Landlock for the VMM process (cloud-hypervisor's model): once its
//! machine is built it may read and write only beneath what its private
//! root keeps (its workspace directory and lock file, the snapshots
//! directory, its warm directory) and read its own `/proc` entry; it may
//! not bind or connect TCP sockets, nor connect to abstract Unix sockets
//! made outside it. This holds where the private root could not be had
//! (user namespaces blocked, as Ubuntu's AppArmor does by default), and
//! adds a second wall where it could.

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use workspace::host::jail::Keep;

/// The newest ABI whose rights this policy asks for; older kernels
/// enforce what they know (best effort), and the protection says so.
const ABI_WANTED: ABI = ABI::V6;

/// Restricts the calling thread (the VMM's only one, so every thread it
/// starts inherits it) to `keep`. Returns the protection now on
/// (`landlock`, `landlock (partial: ...)`), or why none is.
pub fn confine(keep: &[Keep]) -> Result<String, String> {
    let fs = AccessFs::from_all(ABI_WANTED);
    let mut rules = Vec::new();
    for k in keep {
        let (path, access) = match k {
            Keep::Dir(p) => (p, fs),
            Keep::File(p) => (p, AccessFs::from_file(ABI_WANTED)),
        };
        let fd = PathFd::new(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
        rules.push(PathBeneath::new(fd, access));
    }
    let proc_self = PathFd::new("/proc/self").map_err(|e| format!("opening /proc/self: {e}"))?;
    rules.push(PathBeneath::new(proc_self, AccessFs::from_read(ABI_WANTED)));
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(fs)
        .and_then(|r| r.handle_access(AccessNet::from_all(ABI_WANTED)))
        .and_then(|r| r.scope(Scope::AbstractUnixSocket))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(rules.into_iter().map(Ok::<_, landlock::RulesetError>)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| e.to_string())?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok("landlock".to_owned()),
        RulesetStatus::PartiallyEnforced => Ok(format!(
            "landlock (partial: this kernel's ABI is older than {ABI_WANTED:?})"
        )),
        RulesetStatus::NotEnforced => Err("this kernel has no Landlock".to_owned()),
    }
}
