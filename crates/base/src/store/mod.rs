//! The state directory (`$MICROAGENT_HOME`, else `~/.microagent`): crash-safe
//! metadata files and one lock per workspace.
//!
//! Layout: `workspaces/<name>/` holds a workspace's files (`meta.json`, its
//! disk, sockets, logs); `workspaces/<name>.lock` is its lock, kept beside
//! the directory so a delete can remove the directory while holding it;
//! `images/` holds registered images.
//!
//! Public for the VMM process (crates/vmm-host), which reads and updates
//! the same records.

pub mod console_log;
pub mod egress;
pub mod events;
pub mod file_lock;
pub mod kept_outputs;
pub mod name;
pub mod ports;
pub mod previews;
pub mod process;
pub mod records;
pub mod repo_checkout;
pub mod spec;
pub mod state;
pub mod subnet;
pub mod volume_mounts;
pub mod workspace_dir;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::code::ErrorCode;
use crate::store::name::{validate_full_name, NameError};

/// The directory of the state directory that holds snapshots.
pub const SNAPSHOTS_DIR: &str = "snapshots";

/// The metadata file of a workspace.
pub const META_FILE: &str = "meta.json";

/// Why the state directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Neither MICROAGENT_HOME nor HOME is set.
    #[error("set MICROAGENT_HOME (or HOME) to choose where microagent keeps its state")]
    NoHome,
    /// A directory could not be created.
    #[error("cannot create {}; check permissions and free space", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written (or made durable).
    #[error("cannot write {}; check permissions and free space", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A file does not exist.
    #[error("{} does not exist", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A file is not the JSON expected.
    #[error("{} is damaged (not the expected JSON); remove it or restore it from a backup", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A lock could not be taken.
    #[error("cannot lock {}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A workspace name was refused.
    #[error("invalid workspace name")]
    Name(#[from] NameError),
    /// The state directory could be changed by someone else: it holds the
    /// sockets that drive every workspace.
    #[error("{what} {} {why}; fix it with: {fix}", path.display())]
    Unsafe {
        /// Which directory: `state directory`, `warm snapshot directory`.
        what: &'static str,
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
        /// The command that fixes it.
        fix: String,
    },
}

impl StoreError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Missing { .. } => ErrorCode::NotFound,
            StoreError::Name(_) => ErrorCode::InvalidInput,
            StoreError::NoHome => ErrorCode::InvalidInput,
            StoreError::Unsafe { .. } => ErrorCode::Forbidden,
            _ => ErrorCode::Internal,
        }
    }
}

/// An open state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

fn create_dir(path: &Path) -> Result<(), StoreError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| StoreError::CreateDir {
            path: path.to_owned(),
            source,
        })
}

/// Makes `path` (and missing parents) mode 0700, then refuses it unless
/// it is private: this user's, and nobody else's to read or write but the
/// group `shared_gid` (the account VMMs run as: `crate::vmm::user`), when
/// given. `what` names it in the error.
pub fn private_dir_shared_with(
    path: &Path,
    what: &'static str,
    shared_gid: Option<u32>,
) -> Result<(), StoreError> {
    create_dir(path)?;
    check_owned_private(path, what, shared_gid)
}

/// The names (without `.json`) of the JSON records in `dir`, in no order;
/// none when `dir` does not exist (nothing was recorded yet). Each store
/// keeps its own checks of the names and its own errors.
pub(crate) fn json_record_names(dir: &Path) -> std::io::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .flatten()
            .filter_map(|e| Some(e.file_name().to_str()?.strip_suffix(".json")?.to_owned()))
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Makes `path` (and missing parents) a directory only this user may
/// enter: mode 0700, also when it existed (a directory of ours inside the
/// state directory, made by an older build).
pub fn make_private_dir(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    create_dir(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
        StoreError::CreateDir {
            path: path.to_owned(),
            source,
        }
    })
}

/// Refuses a directory another user owns or may read or write: guest
/// memory, snapshots and the sockets that drive workspaces live there.
fn check_owned_private(
    path: &Path,
    what: &'static str,
    shared_gid: Option<u32>,
) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| StoreError::Read {
        path: path.to_owned(),
        source,
    })?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let unsafe_dir = |why: String, fix: String| StoreError::Unsafe {
        what,
        path: path.to_owned(),
        why,
        fix,
    };
    if meta.uid() != me {
        return Err(unsafe_dir(
            format!("belongs to uid {}, not to this user (uid {me})", meta.uid()),
            format!("chown -R {me} {}", path.display()),
        ));
    }
    let others = if shared_gid == Some(meta.gid()) {
        0o007
    } else {
        0o077
    };
    if meta.mode() & others != 0 {
        return Err(unsafe_dir(
            format!(
                "can be read or written by others (mode {:o})",
                meta.mode() & 0o7777
            ),
            format!("chmod go-rwx {}", path.display()),
        ));
    }
    Ok(())
}

impl StateDir {
    /// `$MICROAGENT_HOME`, else `$HOME/.microagent`.
    pub fn from_env() -> Result<Self, StoreError> {
        let root = match std::env::var_os("MICROAGENT_HOME") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(std::env::var_os("HOME").ok_or(StoreError::NoHome)?)
                .join(".microagent"),
        };
        Self::at(root)
    }

    /// Opens (creating if needed, mode 0700) the state directory at `root`.
    /// An existing directory must belong to this user, and others may
    /// neither read nor write it.
    pub fn at(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        for sub in ["workspaces", "images"] {
            create_dir(&root.join(sub))?;
        }
        check_owned_private(&root, "state directory", None)?;
        Ok(Self { root })
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A workspace's directory (the name is validated).
    pub fn workspace_dir(&self, name: &str) -> Result<PathBuf, StoreError> {
        validate_full_name(name)?;
        Ok(self.root.join("workspaces").join(name))
    }

    /// Names of the workspaces that have metadata, sorted.
    pub fn list_workspaces(&self) -> Result<Vec<String>, StoreError> {
        let dir = self.root.join("workspaces");
        let entries = std::fs::read_dir(&dir).map_err(|source| StoreError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join(META_FILE).is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| validate_full_name(n).is_ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Takes the workspace's lock, waiting for another holder to let go.
    pub fn lock_workspace(&self, name: &str) -> Result<WorkspaceLock, StoreError> {
        self.lock(name, false)
            .map(|l| l.expect("a blocking lock is always taken"))
    }

    /// Takes the workspace's lock if nobody holds it.
    pub fn try_lock_workspace(&self, name: &str) -> Result<Option<WorkspaceLock>, StoreError> {
        self.lock(name, true)
    }

    /// A workspace's lock file (`name` is validated by the callers).
    pub fn lock_path(&self, name: &str) -> PathBuf {
        self.root.join("workspaces").join(format!("{name}.lock"))
    }

    fn lock(&self, name: &str, nonblocking: bool) -> Result<Option<WorkspaceLock>, StoreError> {
        validate_full_name(name)?;
        let path = self.lock_path(name);
        let err = |source| StoreError::Lock {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(err)?;
        let op = libc::LOCK_EX | if nonblocking { libc::LOCK_NB } else { 0 };
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                // A delete may have unlinked the file while we waited: a lock
                // on that old inode guards nothing, so start over.
                if same_file(&file, &path) {
                    return Ok(Some(WorkspaceLock { _file: file }));
                }
                return self.lock(name, nonblocking);
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) if nonblocking => return Ok(None),
                _ => return Err(err(e)),
            }
        }
    }
}

/// The prefix of a workspace directory being deleted: renamed first, so a
/// delete that dies half-way never leaves a workspace that looks whole.
pub const DELETING_PREFIX: &str = ".deleting-";

/// The pid a leftover's name ends with (`<...>-<pid>` or `<...>.<pid>.<ext>`).
pub fn leftover_pid(name: &str, separator: char) -> Option<u32> {
    name.rsplit(separator).next()?.parse().ok()
}

impl StateDir {
    /// Removes what processes killed in the middle of an operation left
    /// under `workspaces/`: a delete's renamed directory (its process gone),
    /// a create's directory without metadata and a lock file without a
    /// directory (both only when nobody holds their lock). Best effort:
    /// listing goes on whatever this cannot remove.
    pub fn sweep_abandoned(&self) {
        let dir = self.root.join("workspaces");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                continue;
            };
            if let Some(rest) = name.strip_prefix(DELETING_PREFIX) {
                if leftover_pid(rest, '-')
                    .is_none_or(|pid| crate::store::process::start_ticks(pid).is_none())
                {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
                continue;
            }
            let (workspace, is_lock) = match name.strip_suffix(".lock") {
                Some(w) => (w, true),
                None => (name, false),
            };
            if validate_full_name(workspace).is_err() {
                continue;
            }
            let ws_dir = dir.join(workspace);
            if ws_dir.join(META_FILE).exists() || (is_lock && ws_dir.exists()) {
                continue;
            }
            // A create holds the lock until its metadata is written.
            let Ok(Some(lock)) = self.try_lock_workspace(workspace) else {
                continue;
            };
            if ws_dir.join(META_FILE).exists() {
                continue;
            }
            let _ = std::fs::remove_dir_all(&ws_dir);
            let _ = self.remove_lock(workspace, lock);
        }
    }
}

fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

impl StateDir {
    /// Removes a deleted workspace's lock file while holding its lock
    /// (waiters notice the unlinked file and retry on a fresh one).
    pub fn remove_lock(&self, name: &str, lock: WorkspaceLock) -> Result<(), StoreError> {
        validate_full_name(name)?;
        let path = self.lock_path(name);
        let removed = std::fs::remove_file(&path);
        drop(lock);
        removed.map_err(|source| StoreError::Write { path, source })
    }
}

/// A held workspace lock; released when dropped (or when the process dies,
/// so a crashed CLI never leaves a workspace locked).
#[derive(Debug)]
pub struct WorkspaceLock {
    _file: File,
}

/// Writes `value` as JSON to `path` atomically: a temporary file in the same
/// directory, fsync, rename over `path`, fsync of the directory. A crash at
/// any point leaves either the old file or the new one, never a mix.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), StoreError> {
    let bytes = json_file_bytes(value).map_err(|e| StoreError::Write {
        path: path.to_owned(),
        source: std::io::Error::other(e),
    })?;
    write_file_atomic(path, &bytes)
}

/// What [`write_json_atomic`] writes for `value`: pretty JSON and a newline.
pub(crate) fn json_file_bytes<T: Serialize>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Writes `bytes` to `path` (mode 0600) as [`write_json_atomic`] does: a
/// temporary file of a name no other writer uses, fsync, rename, fsync of
/// the directory.
pub(crate) fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let err = |source| StoreError::Write {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Unique per call, not per process: two threads writing one record
    // must not share a temporary file.
    let tmp = dir.join(format!(
        ".{file_name}.tmp{}",
        crate::host::settings::unique_id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?;
        share_like(&f, dir)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// Gives the new file `f` the group of its directory `dir`, readable and
/// writable by it, when `dir` is shared with another group (a workspace
/// directory shared with the account its VMM runs as: `crate::vmm::user`).
fn share_like(f: &File, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(dir)?;
    // SAFETY: getegid has no preconditions.
    let mine = unsafe { libc::getegid() };
    if meta.mode() & 0o070 != 0o070 || meta.gid() == mine {
        return Ok(());
    }
    std::os::unix::fs::fchown(f, None, Some(meta.gid()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o660))
}

/// Reads JSON written by [`write_json_atomic`].
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, StoreError> {
    let bytes = std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => StoreError::Missing {
            path: path.to_owned(),
        },
        _ => StoreError::Read {
            path: path.to_owned(),
            source,
        },
    })?;
    serde_json::from_slice(&bytes).map_err(|source| StoreError::Parse {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_state(test: &str) -> StateDir {
        let root =
            std::env::temp_dir().join(format!("microagent-store-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        StateDir::at(root).unwrap()
    }

    #[test]
    fn what_killed_operations_left_is_swept_and_nothing_else() {
        let state = temp_state("sweep");
        let dir = state.root().join("workspaces");
        let mkdir = |name: &str| std::fs::create_dir_all(dir.join(name)).unwrap();
        // A delete killed half-way, and one still going (this process).
        mkdir(&format!("{DELETING_PREFIX}gone-{}", u32::MAX));
        let live = format!("{DELETING_PREFIX}busy-{}", std::process::id());
        mkdir(&live);
        // A create killed after its directory, one still going (its lock
        // held), a whole workspace, a lock file whose directory never came.
        mkdir("half");
        std::fs::write(dir.join("half/disk.ext4"), b"").unwrap();
        drop(state.lock_workspace("half").unwrap());
        mkdir("making");
        let making = state.lock_workspace("making").unwrap();
        mkdir("whole");
        std::fs::write(dir.join("whole").join(META_FILE), b"{}").unwrap();
        drop(state.lock_workspace("whole").unwrap());
        drop(state.lock_workspace("orphan").unwrap());

        state.sweep_abandoned();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = vec![
            live,
            "making".to_owned(),
            "making.lock".to_owned(),
            "whole".to_owned(),
            "whole.lock".to_owned(),
        ];
        want.sort();
        assert_eq!(left, want);
        drop(making);
        std::fs::remove_dir_all(state.root()).unwrap();
    }

    #[test]
    fn a_state_directory_others_can_read_or_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let state = temp_state("shared");
        let root = state.root().to_owned();
        for mode in [0o777, 0o755, 0o750, 0o701] {
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = StateDir::at(&root).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Forbidden);
            assert!(err.to_string().contains("chmod go-rwx"), "{err}");
        }
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        StateDir::at(&root).unwrap();
        // A new one is made private.
        let fresh = root.join("inner");
        let what = "warm snapshot directory";
        private_dir_shared_with(&fresh, what, None).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = private_dir_shared_with(&fresh, what, None).unwrap_err();
        assert!(err.to_string().starts_with(what), "{err}");
        // Its group may have rights when it is the group shared with, never
        // other users.
        use std::os::unix::fs::MetadataExt;
        let group = std::fs::metadata(&fresh).unwrap().gid();
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o770)).unwrap();
        private_dir_shared_with(&fresh, what, Some(group)).unwrap();
        private_dir_shared_with(&fresh, what, Some(group + 1)).unwrap_err();
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o771)).unwrap();
        private_dir_shared_with(&fresh, what, Some(group)).unwrap_err();
        std::fs::remove_dir_all(root).unwrap();
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Meta {
        name: String,
        vcpus: u8,
    }

    #[test]
    fn atomic_json_round_trip_leaves_no_temporaries() {
        let state = temp_state("json");
        let dir = state.workspace_dir("dev").unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(META_FILE);
        write_json_atomic(
            &path,
            &Meta {
                name: "dev".into(),
                vcpus: 1,
            },
        )
        .unwrap();
        write_json_atomic(
            &path,
            &Meta {
                name: "dev".into(),
                vcpus: 2,
            },
        )
        .unwrap();
        assert_eq!(
            read_json::<Meta>(&path).unwrap(),
            Meta {
                name: "dev".into(),
                vcpus: 2
            }
        );
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files, vec![std::ffi::OsString::from(META_FILE)]);
        std::fs::remove_dir_all(state.root()).unwrap();
    }

    #[test]
    fn missing_and_damaged_files_are_told_apart() {
        let state = temp_state("damaged");
        let path = state.root().join("nope.json");
        let err = read_json::<Meta>(&path).unwrap_err();
        assert!(matches!(err, StoreError::Missing { .. }));
        assert_eq!(err.code(), ErrorCode::NotFound);
        std::fs::write(&path, b"{\"name\": 3").unwrap();
        let err = read_json::<Meta>(&path).unwrap_err();
        assert!(matches!(err, StoreError::Parse { .. }));
        assert!(err.to_string().contains("damaged"));
        std::fs::remove_dir_all(state.root()).unwrap();
    }

    #[test]
    fn one_holder_per_workspace_lock() {
        let state = temp_state("lock");
        let held = state.lock_workspace("dev").unwrap();
        assert!(
            state.try_lock_workspace("dev").unwrap().is_none(),
            "second holder refused"
        );
        assert!(
            state.try_lock_workspace("other").unwrap().is_some(),
            "locks are per workspace"
        );
        drop(held);
        assert!(state.try_lock_workspace("dev").unwrap().is_some());
        // A blocking lock waits for the holder.
        let held = state.lock_workspace("dev").unwrap();
        let s2 = state.clone();
        let waiter = std::thread::spawn(move || s2.lock_workspace("dev").map(drop));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        drop(held);
        waiter.join().unwrap().unwrap();
        std::fs::remove_dir_all(state.root()).unwrap();
    }

    #[test]
    fn names_are_checked_and_listing_sees_only_workspaces() {
        let state = temp_state("list");
        assert!(matches!(
            state.workspace_dir("../etc"),
            Err(StoreError::Name(_))
        ));
        assert_eq!(
            state.workspace_dir("../etc").unwrap_err().code(),
            ErrorCode::InvalidInput
        );
        for name in ["beta", "alpha"] {
            let dir = state.workspace_dir(name).unwrap();
            std::fs::create_dir_all(&dir).unwrap();
            write_json_atomic(
                &dir.join(META_FILE),
                &Meta {
                    name: name.into(),
                    vcpus: 1,
                },
            )
            .unwrap();
        }
        std::fs::create_dir_all(state.workspace_dir("half-made").unwrap()).unwrap();
        let _lock = state.lock_workspace("alpha").unwrap();
        assert_eq!(
            state.list_workspaces().unwrap(),
            vec!["alpha".to_string(), "beta".to_string()]
        );
        std::fs::remove_dir_all(state.root()).unwrap();
    }
}
