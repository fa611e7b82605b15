//! Standby VMM processes: a VMM started before its workspace is known,
//! with its KVM VM, vCPUs and guest memory's range made for one shape
//! (vCPUs and memory), waiting on a socket for the one launch it will
//! serve. A restore that claims one skips the process start and those
//! ioctls (issue 59: a restore under 3 ms).
//!
//! A standby listens on
//! `<state>/standby/<vcpus>x<mem_mib>-<generation>-<pid>.sock` (the
//! directory 0700, the socket 0600), where the generation is a digest of
//! its program file's identity and the environment a VMM reads
//! ([`generation`]): a claimer takes only a standby that is the process it
//! would have started itself. A claimer takes a socket by renaming it
//! (only one rename wins), connects, and sends the launch: a length (u32,
//! little-endian) and the [`VmmLaunch`] arguments separated by NUL bytes,
//! at most [`MAX_CLAIM_BYTES`], with the workspace's `vmm.log` attached to
//! the first byte; then, when the launch watches an owner, one byte with
//! the owner's pidfd attached. The standby answers one byte once it has
//! taken the launch; the claimer, having recorded nothing yet, answers
//! `g` to say it goes on with this standby, and only then is the standby
//! that workspace's VMM process (a claimer that gave up never sends it,
//! and the standby ends). It accepts one claim, from its own user only,
//! for its own state directory, and ends by itself after [`STANDBY_WAIT`]
//! unclaimed or once its socket's name is gone.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod claimer;
mod listener;
#[cfg(test)]
mod tests;

pub use claimer::{claim, retire_all};
pub use listener::{Claim, ClaimListener};

/// The directory of the standbys' sockets, in the state directory.
pub const STANDBY_DIR: &str = "standby";
/// The extension of a standby's record of its cgroups, beside its socket
/// (`<name>.cgroups`): a sweep removes the groups of a standby gone.
pub const CGROUP_RECORD: &str = "cgroups";
/// The extension of the log of the passt a standby started ahead, beside
/// its socket (`<name>.passt.log`) until a workspace takes it.
pub const PASST_LOG_EXTENSION: &str = "passt.log";
/// The extension of the directory a standby mounts its private root on
/// ahead, beside its socket (`<name>.root`; empty on the host: the mount
/// is in the standby's own namespace).
pub const ROOT_EXTENSION: &str = "root";
/// The subcommand words of a standby process.
pub const STANDBY_SUBCOMMAND: [&str; 2] = ["vmm", "standby"];
/// Most bytes of a claim's arguments (a launch is a few hundred).
pub const MAX_CLAIM_BYTES: usize = 64 * 1024;
/// How long a standby waits for its claim before it ends.
pub const STANDBY_WAIT: Duration = Duration::from_secs(600);
/// How long a claimer waits for a standby to take its launch.
pub(super) const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// The most standbys of one shape a state directory keeps.
pub const MAX_STANDBYS: u8 = 8;
/// The most standbys of all shapes a state directory keeps.
pub const MAX_ALL_STANDBYS: usize = 8;
/// How old a name left by a claimer that died mid-claim must be before a
/// refill sweeps it.
const LEFTOVER_AGE: Duration = Duration::from_secs(60);
/// Its key in `config.json`.
const CONFIG_KEY: &str = "standby";

/// How many standbys of each shape in use to keep waiting (`config.json`
/// `{"standby": {"count": N}}`; 0, the default, keeps none): a restore
/// that claims one then starts another for the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandbyConfig {
    /// Standbys kept per shape, at most [`MAX_STANDBYS`].
    #[serde(default)]
    pub count: u8,
}

impl StandbyConfig {
    /// The setting of the state directory at `root` (none kept when the
    /// file or the key is absent).
    pub fn load(root: &Path) -> Result<Self, crate::host::settings::ConfigError> {
        let config: Self = crate::host::settings::config_section(root, CONFIG_KEY)?
            .map(|(c, _)| c)
            .unwrap_or_default();
        Ok(Self {
            count: config.count.min(MAX_STANDBYS),
        })
    }
}

/// Why a standby could not wait for or take a claim.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    /// Its directory or socket could not be made.
    #[error("making the standby socket {}", path.display())]
    Bind {
        /// The socket or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for or reading a claim failed.
    #[error("reading a claim")]
    Claim(#[source] std::io::Error),
    /// A claim that is not what a claimer writes.
    #[error("a malformed claim: {0}")]
    Malformed(&'static str),
}

/// What a standby is made for: its VM's vCPUs and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandbyShape {
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory, MiB.
    pub mem_mib: u64,
}

impl StandbyShape {
    /// The start of its sockets' names for a generation.
    fn prefix(&self, generation: &str) -> String {
        format!("{}x{}-{generation}-", self.vcpus, self.mem_mib)
    }
}

/// What makes two VMM processes the same process: the program file (its
/// device, inode, size and change time: an upgrade is another program)
/// and the environment a VMM reads (`MICROAGENT_*`, `XDG_*`, `HOME`,
/// `PATH`, `TMPDIR`: its seccomp switch, passt, the asset cache). 16 hex
/// digits; `None` when the program cannot be read.
pub fn generation(program: &Path) -> Option<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for n in crate::host::settings::program_identity(program)? {
        hasher.update(n.to_le_bytes());
    }
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.as_bytes();
            k.starts_with(b"MICROAGENT_")
                || k.starts_with(b"XDG_")
                || [&b"HOME"[..], b"PATH", b"TMPDIR"].contains(&k)
        })
        .collect();
    vars.sort();
    for (k, v) in vars {
        for part in [k.as_bytes(), v.as_bytes()] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    }
    Some(
        hasher.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// The standbys' directory of the state directory `home`.
pub fn standby_dir(home: &Path) -> PathBuf {
    home.join(STANDBY_DIR)
}

/// What a standby process is started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StandbyArgs {
    /// The state directory it serves.
    pub home: PathBuf,
    /// The VM it makes.
    pub shape: StandbyShape,
    /// The workspace whose restore started it: it makes ahead what a
    /// workspace like that one needs (its network's passt), as the next
    /// claim is most often another fork of the same snapshot.
    pub like: Option<String>,
}

/// The arguments after the program name of a standby.
pub fn standby_args(standby: &StandbyArgs) -> Vec<OsString> {
    let mut args: Vec<OsString> = STANDBY_SUBCOMMAND.iter().map(OsString::from).collect();
    args.push("--home".into());
    args.push(standby.home.as_os_str().to_owned());
    args.push("--vcpus".into());
    args.push(standby.shape.vcpus.to_string().into());
    args.push("--mem-mib".into());
    args.push(standby.shape.mem_mib.to_string().into());
    if let Some(like) = &standby.like {
        args.push("--like".into());
        args.push(like.into());
    }
    args
}

/// Reads a standby's arguments (as [`standby_args`] writes them).
pub fn standby_from_args(args: &[OsString]) -> Option<StandbyArgs> {
    let (words, rest) = args.split_at_checked(STANDBY_SUBCOMMAND.len())?;
    if words.iter().zip(STANDBY_SUBCOMMAND).any(|(w, s)| w != s) {
        return None;
    }
    let (rest, like) = match rest {
        [rest @ .., flag, name] if flag == "--like" => {
            let name = name.to_str()?;
            crate::store::name::validate_full_name(name).ok()?;
            (rest, Some(name.to_owned()))
        }
        rest => (rest, None),
    };
    let [home_flag, home, vcpus_flag, vcpus, mem_flag, mem] = rest else {
        return None;
    };
    if (
        home_flag.to_str()?,
        vcpus_flag.to_str()?,
        mem_flag.to_str()?,
    ) != ("--home", "--vcpus", "--mem-mib")
    {
        return None;
    }
    let shape = StandbyShape {
        vcpus: vcpus
            .to_str()?
            .parse()
            .ok()
            .filter(|v| (1..=vmm_core::arch::mptable::MAX_VCPUS).contains(v))?,
        mem_mib: mem.to_str()?.parse().ok().filter(|m| {
            (vmm_core::memory::MIN_MEM_MIB..=vmm_core::memory::MAX_MEM_MIB).contains(m)
        })?,
    };
    Some(StandbyArgs {
        home: PathBuf::from(home),
        shape,
        like,
    })
}

/// A standby's socket in the directory: its name's parts.
pub(super) struct Waiting {
    path: PathBuf,
    name: String,
    pid: u32,
}

/// The live standbys' sockets in `home` whose names start with `prefix`
/// (all when empty), in no particular order.
pub(super) fn live_sockets(home: &Path, prefix: &str) -> Vec<Waiting> {
    let Ok(entries) = std::fs::read_dir(standby_dir(home)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid = standby_pid(name.strip_suffix(".sock")?)?;
            name.starts_with(prefix).then_some(Waiting {
                path: e.path(),
                name,
                pid,
            })
        })
        .filter(|w| is_running(w.pid))
        .collect()
}

/// The pid a standby's name ends in (`...-<pid>`, its extension off).
fn standby_pid(stem: &str) -> Option<u32> {
    stem.rsplit_once('-')?.1.parse().ok()
}

/// Whether a process `pid` is there.
fn is_running(pid: u32) -> bool {
    crate::store::process::start_ticks(pid).is_some()
}

/// How many standbys of `shape` for the VMM program `program` wait in
/// `home`.
pub fn waiting(home: &Path, shape: StandbyShape, program: &Path) -> usize {
    generation(program).map_or(0, |g| live_sockets(home, &shape.prefix(&g)).len())
}

/// How many standbys of every shape and program wait in `home`.
pub fn waiting_all(home: &Path) -> usize {
    live_sockets(home, "").len()
}

/// Removes what standbys and claimers that died left in `home`'s standby
/// directory: sockets of processes gone and their cgroups, and names a
/// claimer renamed a socket to more than a minute ago.
pub fn sweep(home: &Path) {
    let Ok(entries) = std::fs::read_dir(standby_dir(home)) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let of_a_process_gone = |stem: &str| standby_pid(stem).is_none_or(|pid| !is_running(pid));
        if let Some(stem) = name.strip_suffix(&format!(".{CGROUP_RECORD}")) {
            if of_a_process_gone(stem) {
                crate::host::cgroup::remove_recorded_at(&entry.path());
            }
            continue;
        }
        if let Some(stem) = name.strip_suffix(&format!(".{PASST_LOG_EXTENSION}")) {
            if of_a_process_gone(stem) {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        if let Some(stem) = name.strip_suffix(&format!(".{ROOT_EXTENSION}")) {
            if of_a_process_gone(stem) {
                let _ = std::fs::remove_dir(entry.path());
            }
            continue;
        }
        let gone = match name.strip_suffix(".sock") {
            Some(stem) => of_a_process_gone(stem),
            None if name.contains(".claimed-") || name.contains(".retiring-") => entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > LEFTOVER_AGE),
            None => false,
        };
        if gone {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
