//! The account a VMM process runs as once its machine is built, when its
//! starter is root (Firecracker's jailer `--uid/--gid`): by default the
//! system account [`DEFAULT_VMM_USER`] that `setup` creates, or the one
//! `config.json` names (`{"vmm_user": "NAME"}`; `"root"` keeps root). The
//! VMM opens everything privileged first (`/dev/kvm`, its disks, a TAP,
//! cgroups, its listeners), then changes to this account before it runs
//! the guest; the starter hands it the paths it still writes: its
//! workspace directory, its lock file, a snapshot being taken, the warm
//! snapshot it fills.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::code::ErrorCode;

/// The account `setup` creates for VMM processes.
pub const DEFAULT_VMM_USER: &str = "microagent-vmm";
/// The `config.json` key naming another account.
pub const CONFIG_KEY: &str = "vmm_user";
/// The setting that keeps root VMMs as root.
pub const KEEP_ROOT: &str = "root";

/// Why the VMM's account could not be found or given its files.
#[derive(Debug, thiserror::Error)]
pub enum VmmUserError {
    /// `config.json` exists but could not be read.
    #[error("reading {}", path.display())]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// `config.json`'s `vmm_user` is not a string.
    #[error("{} is not valid: `vmm_user` must be an account name", path.display())]
    ParseConfig {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// The configured account does not exist.
    #[error("the account `{0}` (config.json `vmm_user`) does not exist")]
    UnknownAccount(String),
    /// A running VMM runs as neither this process's account nor the
    /// configured VMM account (its record names another's process).
    #[error("process {pid} runs as uid {uid}, not as the VMM account")]
    NotTheVmmAccount {
        /// The process its record names.
        pid: u32,
        /// Its uid.
        uid: u32,
    },
    /// A path could not be given to the account.
    #[error("giving {} to the VMM's account", path.display())]
    HandOver {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl VmmUserError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            VmmUserError::ParseConfig { .. } | VmmUserError::UnknownAccount(_) => {
                ErrorCode::InvalidInput
            }
            VmmUserError::NotTheVmmAccount { .. } => ErrorCode::Conflict,
            VmmUserError::ReadConfig { .. } | VmmUserError::HandOver { .. } => ErrorCode::Internal,
        }
    }
}

/// An account a VMM runs as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct VmmUser {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    vmm_user: Option<String>,
}

/// The configured account name for the state directory `root`, if any.
fn configured(root: &Path) -> Result<Option<String>, VmmUserError> {
    let path = root.join(crate::host::settings::CONFIG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(VmmUserError::ReadConfig { path, source }),
    };
    let config: ConfigFile =
        serde_json::from_str(&text).map_err(|source| VmmUserError::ParseConfig { path, source })?;
    Ok(config.vmm_user)
}

/// The account VMMs started by this process for the state directory
/// `root` run as: `None` when this process is not root (its VMMs run as
/// its own user), when the setting keeps root, or when nothing is
/// configured and the default account does not exist.
pub fn for_state(root: &Path) -> Result<Option<VmmUser>, VmmUserError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    match configured(root)? {
        Some(name) if name == KEEP_ROOT => Ok(None),
        Some(name) => lookup(&name)
            .map(Some)
            .ok_or(VmmUserError::UnknownAccount(name)),
        None => Ok(lookup(DEFAULT_VMM_USER)),
    }
}

/// The account `name` from the system's user database.
pub fn lookup(name: &str) -> Option<VmmUser> {
    let c_name = CString::new(name).ok()?;
    // SAFETY: passwd is plain data the call fills; an all-zero value is a
    // valid starting point.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: every pointer is valid for the call and `buf` is as long as
    // the length given; `found` is set to `&entry` or null.
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return None;
    }
    Some(VmmUser {
        name: name.to_owned(),
        uid: entry.pw_uid,
        gid: entry.pw_gid,
    })
}

/// Whether root's VMMs for the state directory `root` lack their account:
/// nothing names another and the default one does not exist yet.
pub fn account_missing(state: &Path) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && matches!(configured(state), Ok(None)) && lookup(DEFAULT_VMM_USER).is_none()
}

/// The step that creates [`DEFAULT_VMM_USER`]: a system account with its
/// own group, no home and no login shell.
pub fn account_step() -> crate::host::plan::Step {
    crate::host::plan::Step::new(
        format!("creating the system account {DEFAULT_VMM_USER} that VMM processes run as"),
        "useradd",
        &[
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "microagent VMM processes",
            DEFAULT_VMM_USER,
        ],
    )
}

/// The (uid, gid) the process `pid` runs as (its real ids).
pub fn of_process(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let first = |field: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((first("Uid:")?, first("Gid:")?))
}

/// Shares the directory `dir` with the account the running VMM `pid` runs
/// as, when that is not this process's (a snapshot it is asked to write
/// there); true when it did, and [`take_back`] is then due. Only the VMM
/// account configured for the state directory `root` is let in: `pid`
/// comes from a record that VMM can write.
pub fn share_with_running(pid: u32, dir: &Path, root: &Path) -> Result<bool, VmmUserError> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match of_process(pid) {
        Some((uid, _)) if uid != me => {
            let account = for_state(root)?
                .filter(|a| a.uid == uid)
                .ok_or(VmmUserError::NotTheVmmAccount { pid, uid })?;
            account.share(dir)?;
            if let Some(parent) = dir.parent() {
                pass_through(parent, account.gid)?;
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

impl VmmUser {
    /// Gives the file `path` to the account (a link is changed, never
    /// followed).
    pub fn hand_over(&self, path: &Path) -> Result<(), VmmUserError> {
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid)).map_err(handing(path))
    }

    /// Lets the account make, rename and remove files in the directory
    /// `dir`, which stays its owner's: its group becomes the account's,
    /// with every right. Its owner keeps it too: root without
    /// `CAP_DAC_OVERRIDE` (passt opening its log there) still enters it.
    pub fn share(&self, dir: &Path) -> Result<(), VmmUserError> {
        regroup(dir, self.gid, |mode| mode | 0o070)
    }

    /// Shares `dir` (see [`VmmUser::share`]) and the directories beneath it,
    /// and hands over every other file in them.
    pub fn hand_over_tree(&self, dir: &Path) -> Result<(), VmmUserError> {
        self.share(dir)?;
        for entry in std::fs::read_dir(dir).map_err(handing(dir))? {
            let entry = entry.map_err(handing(dir))?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                self.hand_over_tree(&entry.path())?;
            } else {
                self.hand_over(&entry.path())?;
            }
        }
        Ok(())
    }
}

/// Lets the group `gid` pass through the directory `dir` to what it shares
/// beneath (a snapshot being written): search, no listing or writing.
fn pass_through(dir: &Path, gid: u32) -> Result<(), VmmUserError> {
    regroup(dir, gid, |mode| (mode & !0o070) | 0o010)
}

/// Takes back a directory [`VmmUser::share`] shared: this process's group
/// again and no rights for it, so no VMM enters it any more.
pub fn take_back(dir: &Path) -> Result<(), VmmUserError> {
    // SAFETY: getegid has no preconditions.
    let gid = unsafe { libc::getegid() };
    regroup(dir, gid, |mode| mode & !0o070)
}

/// Gives the directory `dir` the group `gid` and the mode `mode` makes of
/// its current one (its owner stays).
fn regroup(dir: &Path, gid: u32, mode: impl FnOnce(u32) -> u32) -> Result<(), VmmUserError> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::lchown(dir, None, Some(gid)).map_err(handing(dir))?;
    let now = std::fs::metadata(dir)
        .map_err(handing(dir))?
        .permissions()
        .mode();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode(now))).map_err(handing(dir))
}

fn handing(path: &Path) -> impl Fn(std::io::Error) -> VmmUserError + '_ {
    move |source| VmmUserError::HandOver {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_and_a_made_up_account_is_not() {
        let root = lookup("root").expect("every system has root");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(lookup("no-such-account-microagent"), None);
        assert_eq!(lookup("nul\0byte"), None);
    }

    #[test]
    fn a_process_has_its_ids() {
        // SAFETY: getuid and getgid have no preconditions.
        let mine = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!(of_process(std::process::id()), Some(mine));
        assert_eq!(of_process(u32::MAX), None);
    }

    #[test]
    fn the_setting_is_read_from_config_json() {
        let dir = std::env::temp_dir().join(format!("ma-vmm-user-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(configured(&dir).unwrap(), None);
        let file = dir.join(crate::host::settings::CONFIG_FILE);
        std::fs::write(&file, r#"{"price": {"currency": "EUR"}}"#).unwrap();
        assert_eq!(configured(&dir).unwrap(), None);
        std::fs::write(&file, r#"{"vmm_user": "root"}"#).unwrap();
        assert_eq!(configured(&dir).unwrap().as_deref(), Some("root"));
        // A root test keeps root; anyone else's VMMs run as themselves.
        assert_eq!(for_state(&dir).unwrap(), None);
        std::fs::write(&file, r#"{"vmm_user": "no-such-account-microagent"}"#).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let err = for_state(&dir).unwrap_err();
            assert!(matches!(err, VmmUserError::UnknownAccount(_)), "{err}");
            assert_eq!(err.code(), ErrorCode::InvalidInput);
        }
        std::fs::write(&file, r#"{"vmm_user": 7}"#).unwrap();
        assert_eq!(
            configured(&dir).unwrap_err().code(),
            ErrorCode::InvalidInput
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_tree_is_handed_over_whole() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return crate::test_support::skip(
                "a_tree_is_handed_over_whole",
                "changing a file's owner needs root",
            );
        }
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("ma-vmm-tree-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/file"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
        let nobody = VmmUser {
            name: "n".into(),
            uid: 65534,
            gid: 65534,
        };
        nobody.hand_over_tree(&dir).unwrap();
        for p in ["", "sub"] {
            let m = std::fs::metadata(dir.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (0, 65534), "{p}: shared, still root's");
            assert_eq!(m.mode() & 0o070, 0o070, "{p}");
        }
        assert_eq!(
            std::fs::metadata(dir.join("sub/file")).unwrap().uid(),
            65534
        );
        let link = std::fs::symlink_metadata(dir.join("link")).unwrap();
        assert_eq!(link.uid(), 65534);
        assert_eq!(
            std::fs::metadata("/etc/passwd").unwrap().uid(),
            0,
            "not followed"
        );
        take_back(&dir).unwrap();
        let m = std::fs::metadata(&dir).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o070), (0, 0), "taken back");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_snapshot_directory_is_shared_with_the_vmm_account_only() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return crate::host::jail::tests::skip(
                "a_snapshot_directory_is_shared_with_the_vmm_account_only: needs root to run a process as another account",
            );
        }
        let root =
            std::env::temp_dir().join(format!("ma-share-{}", crate::host::settings::unique_id()));
        let dir = root.join("snapshots/s");
        std::fs::create_dir_all(&dir).unwrap();
        // `nobody` is no VMM account: a record naming its process lets
        // nothing in.
        std::fs::write(root.join("config.json"), r#"{"vmm_user": "root"}"#).unwrap();
        let mut other = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sleep",
                "30",
            ])
            .spawn()
            .unwrap();
        let pid = other.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while of_process(pid).map(|(uid, _)| uid) != Some(65534) {
            assert!(std::time::Instant::now() < deadline, "setpriv never ran");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let before = std::fs::metadata(&dir).unwrap();
        let refused = share_with_running(pid, &dir, &root).unwrap_err();
        assert!(
            matches!(refused, VmmUserError::NotTheVmmAccount { uid: 65534, .. }),
            "{refused}"
        );
        let after = std::fs::metadata(&dir).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((before.gid(), before.mode()), (after.gid(), after.mode()));
        // This process's own: nothing to share.
        assert!(!share_with_running(std::process::id(), &dir, &root).unwrap());
        let _ = other.kill();
        let _ = other.wait();
        let _ = std::fs::remove_dir_all(root);
    }
}
