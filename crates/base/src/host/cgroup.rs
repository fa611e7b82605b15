//! A cgroup per VMM process, where the host gives us one: memory limited
//! to the guest's memory plus [`MEMORY_OVERHEAD_MIB`], CPU to the vCPU
//! count plus one (the device and control threads), and at most
//! [`PIDS_MAX`] tasks, so one workspace cannot starve the host whatever its
//! guest does. cgroup v1 controllers (memory, cpu, pids mounted apart, as
//! on our own hosts) get `<ctrl>/microagent/<id>/`; a unified cgroup v2
//! hierarchy is used when the process's own cgroup delegates memory, cpu
//! and pids to its children. The VMM joins before it builds the guest (the
//! network helper it starts inherits the group) and leaves and removes it
//! when it ends; a group a killed VMM left is reused by the next start.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where cgroup hierarchies are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// What a VMM process takes beyond its guest's memory: its own heap and
/// threads, the network helper, and the page cache of its disk I/O.
pub const MEMORY_OVERHEAD_MIB: u64 = 256;
/// Most tasks (threads and processes) in one VMM's group.
pub const PIDS_MAX: u64 = 128;
/// The CFS period the CPU quota is given in.
const CPU_PERIOD_US: u64 = 100_000;
/// Our parent group under each v1 controller.
const PARENT: &str = "microagent";

/// The limits of one VMM process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// CPU time per period, microseconds.
    pub cpu_quota_us: u64,
    /// Tasks.
    pub pids_max: u64,
}

impl CgroupLimits {
    /// The limits of a workspace of `vcpus` and `mem_mib`.
    pub fn for_workspace(vcpus: u8, mem_mib: u64) -> Self {
        Self {
            memory_bytes: mem_mib
                .saturating_add(MEMORY_OVERHEAD_MIB)
                .saturating_mul(1 << 20),
            cpu_quota_us: (u64::from(vcpus) + 1) * CPU_PERIOD_US,
            pids_max: PIDS_MAX,
        }
    }
}

/// Where a VMM process ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In its own group with `limits`.
    Joined {
        /// `v1` or `v2`.
        version: &'static str,
        /// The group's directories (one per v1 controller).
        dirs: Vec<PathBuf>,
        /// Its limits.
        limits: CgroupLimits,
    },
    /// No group could be had; why.
    Unavailable(String),
}

impl Placement {
    /// One line for the workspace's protections.
    pub fn describe(&self) -> String {
        match self {
            Self::Joined {
                version, limits, ..
            } => format!(
                "cgroup {version}: memory {} MiB, cpu {:.1}, pids {}",
                limits.memory_bytes >> 20,
                limits.cpu_quota_us as f64 / CPU_PERIOD_US as f64,
                limits.pids_max
            ),
            Self::Unavailable(why) => format!("no cgroup: {why}"),
        }
    }
}

/// The group name of workspace `name` of the state directory at `state`
/// (names repeat across state directories).
pub fn group_id(state: &Path, name: &str) -> String {
    let hash = Sha256::digest(state.as_os_str().as_encoded_bytes());
    let short: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{name}-{short}")
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| format!("writing {}: {e}", dir.join(file).display()))
}

/// The memory, cpu and pids v1 controllers under `root`, when all three
/// are mounted apart.
pub fn v1_controllers(root: &Path) -> Option<[PathBuf; 3]> {
    let v1 = ["memory", "cpu", "pids"].map(|c| root.join(c));
    v1.iter()
        .all(|d| d.join("cgroup.procs").exists())
        .then_some(v1)
}

/// Puts this process into group `id` under `root` with `limits`.
pub fn join(root: &Path, id: &str, limits: &CgroupLimits) -> Placement {
    if let Some(v1) = v1_controllers(root) {
        return match join_v1(&v1, id, limits) {
            Ok(dirs) => Placement::Joined {
                version: "v1",
                dirs,
                limits: *limits,
            },
            Err(why) => Placement::Unavailable(why),
        };
    }
    if root.join("cgroup.controllers").exists() {
        return match join_v2(root, id, limits) {
            Ok(dir) => Placement::Joined {
                version: "v2",
                dirs: vec![dir],
                limits: *limits,
            },
            Err(why) => Placement::Unavailable(why),
        };
    }
    Placement::Unavailable(format!(
        "{} has neither the memory, cpu and pids v1 controllers nor a v2 hierarchy",
        root.display()
    ))
}

/// A fresh memory-capped group `id` that nobody has joined yet (for a
/// host tool: see [`crate::host_tool`]), where this process may make one:
/// its directory and the file a process writes `0` to in order to join
/// (v1 `tasks`, v2 `cgroup.procs`). The caller removes the directory.
pub fn memory_group(root: &Path, id: &str, memory_bytes: u64) -> Option<(PathBuf, &'static str)> {
    let made = |dir: PathBuf, limit: &str, join: &'static str| {
        std::fs::create_dir_all(&dir).ok()?;
        if write(&dir, limit, &memory_bytes.to_string()).is_err() {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some((dir, join))
    };
    if let Some([memory, _, _]) = v1_controllers(root) {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let dir = memory
            .join(own_v1_group(&own, "memory"))
            .join(PARENT)
            .join(id);
        return made(dir, "memory.limit_in_bytes", "tasks");
    }
    let parent = own_v2_group(root)?;
    let delegated = std::fs::read_to_string(parent.join("cgroup.subtree_control")).ok()?;
    if !delegated.split_whitespace().any(|c| c == "memory") {
        return None;
    }
    made(
        parent.join(format!("{PARENT}-{id}")),
        "memory.max",
        "cgroup.procs",
    )
}

/// This process's group under v1 controller `name`, relative to its
/// mount (`4:memory:/a/b` is `a/b`); the root when not listed.
fn own_v1_group(cgroups: &str, name: &str) -> PathBuf {
    cgroups
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == name)
                .then(|| PathBuf::from(path.trim_start_matches('/')))
        })
        .next()
        .unwrap_or_default()
}

/// v1: `<ctrl>/<own group>/microagent/<id>` for memory, cpu and pids, so
/// the groups nest under where the starter was (and its own limits still
/// apply).
fn join_v1(
    controllers: &[PathBuf; 3],
    id: &str,
    limits: &CgroupLimits,
) -> Result<Vec<PathBuf>, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let dirs: Vec<PathBuf> = controllers
        .iter()
        .zip(["memory", "cpu", "pids"])
        .map(|(c, name)| c.join(own_v1_group(&own, name)).join(PARENT).join(id))
        .collect();
    for dir in &dirs {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    write(
        &dirs[0],
        "memory.limit_in_bytes",
        &limits.memory_bytes.to_string(),
    )?;
    write(&dirs[1], "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
    write(
        &dirs[1],
        "cpu.cfs_quota_us",
        &limits.cpu_quota_us.to_string(),
    )?;
    write(&dirs[2], "pids.max", &limits.pids_max.to_string())?;
    let (file, value) = v1_membership(crate::host::settings::threads_of_this_process());
    for dir in &dirs {
        write(dir, file, &value)?;
    }
    Ok(dirs)
}

/// How a process of `threads` threads joins a v1 group. A single-threaded
/// one (the VMM process before it starts any thread) writes 0 to `tasks`:
/// that moves the calling thread, which is then the whole process, without
/// the kernel's wait for an RCU grace period that moving a whole thread
/// group through `cgroup.procs` takes (3 to 19 ms a start on our hosts).
/// Any other writes its pid to `cgroup.procs`, so no thread stays behind.
fn v1_membership(threads: usize) -> (&'static str, String) {
    match threads {
        1 => ("tasks", "0".to_owned()),
        _ => ("cgroup.procs", std::process::id().to_string()),
    }
}

/// This process's group in the unified hierarchy (`0::/path`).
fn own_v2_group(root: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(root.join(path.trim_start_matches('/')))
}

fn join_v2(root: &Path, id: &str, limits: &CgroupLimits) -> Result<PathBuf, String> {
    let parent = own_v2_group(root).ok_or("this process has no cgroup v2 group")?;
    let delegated =
        std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    let missing: Vec<&str> = ["memory", "cpu", "pids"]
        .into_iter()
        .filter(|c| !delegated.split_whitespace().any(|d| d == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "cgroup v2: {} does not delegate {} to its children",
            parent.display(),
            missing.join(", ")
        ));
    }
    let dir = parent.join(format!("{PARENT}-{id}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    write(&dir, "memory.max", &limits.memory_bytes.to_string())?;
    write(
        &dir,
        "cpu.max",
        &format!("{} {CPU_PERIOD_US}", limits.cpu_quota_us),
    )?;
    write(&dir, "pids.max", &limits.pids_max.to_string())?;
    write(&dir, "cgroup.procs", &std::process::id().to_string())?;
    Ok(dir)
}

/// The file in a workspace's directory naming its VMM's groups, so that
/// whoever ends a VMM the hard way (halt, delete, a crash noticed) removes
/// them once it is gone.
pub const RECORD_FILE: &str = "cgroups";

/// Records `placement`'s groups in the workspace directory `ws`.
pub fn record(placement: &Placement, ws: &Path) {
    if let Placement::Joined { dirs, .. } = placement {
        let text: String = dirs.iter().map(|d| format!("{}\n", d.display())).collect();
        let _ = std::fs::write(ws.join(RECORD_FILE), text);
    }
}

/// Records `placement`'s groups in the file `record` (a standby VMM's,
/// beside its socket).
pub fn record_at(placement: &Placement, record: &Path) {
    if let Placement::Joined { dirs, .. } = placement {
        let text: String = dirs.iter().map(|d| format!("{}\n", d.display())).collect();
        let _ = std::fs::write(record, text);
    }
}

/// Gives the groups of `placement` the name `id`, in place: the process
/// stays in them, limits and all. How a standby VMM's groups, made ahead
/// for its shape, become its workspace's. `None` when a rename failed (a
/// group of that name is there already): the groups keep their names.
pub fn rename(placement: &Placement, id: &str) -> Option<Placement> {
    let Placement::Joined {
        version,
        dirs,
        limits,
    } = placement
    else {
        return None;
    };
    let leaf = match *version {
        "v2" => format!("{PARENT}-{id}"),
        _ => id.to_owned(),
    };
    let mut renamed: Vec<(PathBuf, PathBuf)> = Vec::new();
    for dir in dirs {
        let to = dir.with_file_name(&leaf);
        if std::fs::rename(dir, &to).is_err() {
            for (from, to) in renamed.iter().rev() {
                let _ = std::fs::rename(to, from);
            }
            return None;
        }
        renamed.push((dir.clone(), to));
    }
    Some(Placement::Joined {
        version,
        dirs: renamed.into_iter().map(|(_, to)| to).collect(),
        limits: *limits,
    })
}

/// Removes the groups recorded in `ws` (their VMM is gone); a group whose
/// tasks are still leaving is retried for up to a second.
pub fn remove_recorded(ws: &Path) {
    remove_recorded_at(&ws.join(RECORD_FILE));
}

/// Removes the groups recorded in the file `record`, then the file.
pub fn remove_recorded_at(record: &Path) {
    let Ok(text) = std::fs::read_to_string(record) else {
        return;
    };
    for dir in text.lines().map(Path::new) {
        // Only groups of ours: a record is no way to remove others'.
        let named_ours = dir.components().any(|c| c.as_os_str() == PARENT)
            || dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(PARENT));
        let ours = dir.starts_with(CGROUP_ROOT) && named_ours;
        for _ in 0..20 {
            if !ours || std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let _ = std::fs::remove_file(record);
}

/// What leaving a group takes, opened in advance: the VMM opens these
/// before its root becomes a private one without `/sys/fs/cgroup`
/// (`vmm_jail`), and at its end moves back to each group's parent and
/// removes the groups through them (best effort: an ending VMM has nothing
/// better to do about a failure).
#[derive(Debug, Default)]
pub struct Leaving {
    /// Per group: the `cgroup.procs` to move into, the directory holding
    /// the group, and the group's name in it.
    groups: Vec<(std::fs::File, std::fs::File, std::ffi::CString)>,
}

impl Leaving {
    /// Opens what leaving `placement` needs (nothing when it has no group).
    pub fn prepare(placement: &Placement) -> Self {
        let Placement::Joined { dirs, .. } = placement else {
            return Self::default();
        };
        let mut groups = Vec::new();
        for dir in dirs {
            let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
                continue;
            };
            // v1 groups sit in microagent/ whose parent is the controller
            // root; a v2 group's parent is the group it was made in.
            let home = if parent.ends_with(PARENT) {
                parent.parent().unwrap_or(parent)
            } else {
                parent
            };
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(home.join("cgroup.procs"));
            let holder = std::fs::File::open(parent);
            let name = std::ffi::CString::new(name.as_encoded_bytes());
            if let (Ok(procs), Ok(holder), Ok(name)) = (procs, holder, name) {
                groups.push((procs, holder, name));
            }
        }
        Self { groups }
    }

    /// The directories the groups are removed from (duplicated
    /// descriptors), for a file-access policy that must let that removal
    /// through.
    pub fn holders(&self) -> Vec<std::os::fd::OwnedFd> {
        self.groups
            .iter()
            .filter_map(|(_, holder, _)| holder.try_clone().ok().map(Into::into))
            .collect()
    }

    /// Moves this process out of its groups and removes them; false when
    /// one could not be removed (a VMM running as its own account may not
    /// write the directory holding it).
    pub fn leave(self) -> bool {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let me = std::process::id().to_string();
        let mut removed = true;
        for (mut procs, holder, name) in self.groups {
            let _ = procs.write_all(me.as_bytes());
            // SAFETY: `holder` is an open directory and `name` a valid C
            // string; unlinkat touches nothing of this process's memory.
            let rc =
                unsafe { libc::unlinkat(holder.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
            removed &= rc == 0;
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_workspace() {
        let l = CgroupLimits::for_workspace(2, 512);
        assert_eq!(l.memory_bytes, (512 + MEMORY_OVERHEAD_MIB) << 20);
        assert_eq!(l.cpu_quota_us, 300_000);
        assert_eq!(l.pids_max, PIDS_MAX);
        let p = Placement::Joined {
            version: "v1",
            dirs: vec![],
            limits: l,
        };
        assert_eq!(p.describe(), "cgroup v1: memory 768 MiB, cpu 3.0, pids 128");
    }

    #[test]
    fn group_ids_differ_across_state_directories() {
        let a = group_id(Path::new("/a"), "dev");
        assert!(a.starts_with("dev-") && a.len() == "dev-".len() + 8, "{a}");
        assert_ne!(a, group_id(Path::new("/b"), "dev"));
    }

    /// v1 against a stand-in tree of plain files: the limits are written
    /// where the kernel reads them and this process is named in each
    /// group.
    #[test]
    fn v1_groups_get_their_limits_and_the_process() {
        let root =
            std::env::temp_dir().join(format!("ma-cgroup-{}", crate::host::settings::unique_id()));
        for c in ["memory", "cpu", "pids"] {
            std::fs::create_dir_all(root.join(c)).unwrap();
            std::fs::write(root.join(c).join("cgroup.procs"), "").unwrap();
        }
        let limits = CgroupLimits::for_workspace(1, 256);
        let placed = join(&root, "dev-0001", &limits);
        let Placement::Joined { version, dirs, .. } = &placed else {
            panic!("{placed:?}");
        };
        assert_eq!(*version, "v1");
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let group = |c: &str| {
            root.join(c)
                .join(own_v1_group(&own, c))
                .join(PARENT)
                .join("dev-0001")
        };
        assert_eq!(
            read(group("memory").join("memory.limit_in_bytes")),
            (512u64 << 20).to_string()
        );
        assert_eq!(read(group("cpu").join("cpu.cfs_quota_us")), "200000");
        assert_eq!(read(group("pids").join("pids.max")), "128");
        // As this process joins (its threads decide how).
        let (file, value) = v1_membership(crate::host::settings::threads_of_this_process());
        assert_eq!(read(group("pids").join(file)), value);
        assert_eq!(dirs.len(), 3);
        // Renamed in place to a workspace's name; a name taken refuses
        // the rename and leaves every group as it was.
        let taken = dirs[1].with_file_name("ws-0002");
        std::fs::create_dir(&taken).unwrap();
        std::fs::write(taken.join("x"), "").unwrap();
        assert_eq!(rename(&placed, "ws-0002"), None);
        assert!(dirs.iter().all(|d| d.exists()));
        let renamed = rename(&placed, "ws-0003").unwrap();
        let Placement::Joined { dirs: moved, .. } = &renamed else {
            panic!("{renamed:?}")
        };
        assert!(dirs.iter().all(|d| !d.exists()));
        assert!(moved.iter().all(|d| d.ends_with("ws-0003")), "{moved:?}");
        assert!(moved[2].join("pids.max").exists(), "the group moved whole");
        let record = root.join("standby.cgroups");
        record_at(&renamed, &record);
        assert_eq!(std::fs::read_to_string(&record).unwrap().lines().count(), 3);
        assert_eq!(rename(&Placement::Unavailable("none".into()), "x"), None);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_single_threaded_process_joins_as_its_one_thread() {
        assert_eq!(v1_membership(1), ("tasks", "0".to_owned()));
        for threads in [0, 2, 9] {
            assert_eq!(
                v1_membership(threads),
                ("cgroup.procs", std::process::id().to_string())
            );
        }
    }

    #[test]
    fn own_v1_groups_are_read_per_controller() {
        let text = "9:name=systemd:/\n4:memory:/process_api/ab\n1:cpu,cpuacct:/x\n0::/\n";
        assert_eq!(own_v1_group(text, "memory"), Path::new("process_api/ab"));
        assert_eq!(own_v1_group(text, "cpu"), Path::new("x"));
        assert_eq!(own_v1_group(text, "pids"), Path::new(""));
    }

    #[test]
    fn no_hierarchy_says_why() {
        let root =
            std::env::temp_dir().join(format!("ma-cgroup-{}", crate::host::settings::unique_id()));
        std::fs::create_dir_all(&root).unwrap();
        let placed = join(&root, "x", &CgroupLimits::for_workspace(1, 64));
        assert!(
            matches!(&placed, Placement::Unavailable(why) if why.contains("neither")),
            "{placed:?}"
        );
        let _ = std::fs::remove_dir_all(root);
    }
}
