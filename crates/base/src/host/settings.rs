//! Where things are and what time it is: the guest asset cache, host tools,
//! the operator's `config.json`, the clock and unique ids. Every other
//! module asks here, so none of them depends on another for these.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where `cargo xtask` builds and caches guest assets: `$MICROAGENT_CACHE`,
/// else `~/.cache/microagent`. The xtask and the tests use this same root.
pub fn asset_cache_root() -> Option<PathBuf> {
    match std::env::var_os("MICROAGENT_CACHE") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/microagent")),
    }
}

/// The `current/` directory of the asset cache, whose links name the newest
/// build of each asset.
pub fn asset_dir() -> Option<PathBuf> {
    asset_cache_root().map(|root| root.join("current"))
}

/// Where warm snapshots are kept instead of the state directory's `warm/`:
/// `$MICROAGENT_WARM_DIR`, so several state directories (test suites) can
/// share them. A warm snapshot is only used when its image files are the
/// same files (hard links count), so sharing is safe.
pub fn warm_dir_override() -> Option<PathBuf> {
    std::env::var_os("MICROAGENT_WARM_DIR").map(PathBuf::from)
}

/// Where a host program microagent runs (`mkfs.ext4`, `debugfs`, `passt`)
/// is installed, if it is: /usr/local/sbin, /usr/local/bin (a local build
/// wins, as in the usual PATH), /usr/sbin, /sbin or /usr/bin.
pub fn host_tool(name: &str) -> Option<PathBuf> {
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/sbin",
        "/usr/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(name))
    .find(|p| p.exists())
}

/// Which program file `path` is: its device, inode, size and change time
/// (seconds, nanoseconds). An upgrade, even in place, gives other numbers;
/// `None` when it cannot be read.
pub fn program_identity(path: &Path) -> Option<[u64; 5]> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some([
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.ctime() as u64,
        meta.ctime_nsec() as u64,
    ])
}

/// The version of a Debian package that is installed (not one removed
/// with only its configuration left), if any.
pub fn deb_version(package: &str) -> Option<String> {
    let out = std::process::Command::new("dpkg-query")
        .args(["-W", "-f=${Status} ${Version}", package])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.strip_prefix("install ok installed ")
        .map(str::to_owned)
}

/// The Debian packages of `packages` that are not installed.
pub fn missing_debs(packages: &[&str]) -> Vec<String> {
    packages
        .iter()
        .filter(|p| deb_version(p).is_none())
        .map(|p| (*p).to_owned())
        .collect()
}

/// Bytes free for this user on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    disk_bytes(path).map(|(_, free)| free)
}

/// Total bytes of the filesystem holding `path`, and those free for this
/// user.
pub fn disk_bytes(path: &Path) -> std::io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    // SAFETY: an all-zero statvfs is a valid value for the out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st is a valid, writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((
        st.f_blocks.saturating_mul(st.f_frsize),
        st.f_bavail.saturating_mul(st.f_frsize),
    ))
}

/// `timeout` from now; a timeout past what an `Instant` can hold (a user's
/// `--timeout 18446744073709551615`) is a century, not a panic.
pub fn deadline_after(timeout: std::time::Duration) -> std::time::Instant {
    const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    let now = std::time::Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

/// `CAP_SYS_ADMIN`'s number (`<linux/capability.h>`): namespaces and
/// mounts.
pub const CAP_SYS_ADMIN: u32 = 21;

/// Whether this process has capability number `bit` (`<linux/capability.h>`)
/// in its effective set.
pub fn has_capability(bit: u32) -> bool {
    proc_self_status("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .is_some_and(|caps| bit < 64 && caps & (1 << bit) != 0)
}

/// This process's pid on the host: in a PID namespace of its own (a VMM
/// started by root) its pid there is 1, while `/proc`, the host's, names
/// it by its host pid.
pub fn own_pid() -> u32 {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse().ok())
        .unwrap_or_else(std::process::id)
}

/// Threads of this process now (0 when /proc cannot tell).
pub fn threads_of_this_process() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

/// A field of this process's /proc/self/status (`Umask`, `CapEff`,
/// `Seccomp`), its value trimmed; `None` when /proc cannot tell.
pub fn proc_self_status(field: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    })
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A short id no other call in any process on this host returns at the same
/// time: the process id, a per-process counter and the clock's low bits, in
/// hex (valid in workspace names and file names).
pub fn unique_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:x}{:04x}", std::process::id(), n, nanos & 0xffff)
}

/// The Landlock ABI this kernel offers, if it has Landlock.
pub fn landlock_abi() -> Option<i64> {
    // SAFETY: with a null attribute, size 0 and the version flag the call
    // only reports the ABI.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (abi > 0).then_some(abi)
}

// config.json in the state directory: the operator's settings, one
// top-level key per concern (`price`, `task`, `search_registries`, ...),
// each read through `config_section`; an absent file or key means that
// concern's defaults.

/// The settings file's name in the state directory.
pub const CONFIG_FILE: &str = "config.json";

/// Why a section could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file could not be replaced.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON, or the key does not hold what it should.
    #[error("{} `{key}` is not valid", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The key (empty: the file as a whole).
        key: &'static str,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// Sets `key` in `root`'s config.json to `value`, keeping the other keys.
pub fn set_config_section<T: serde::Serialize>(
    root: &Path,
    key: &'static str,
    value: &T,
) -> Result<(), ConfigError> {
    let path = root.join(CONFIG_FILE);
    let parse = |key| {
        let path = path.clone();
        move |source| ConfigError::Parse { path, key, source }
    };
    let mut all: serde_json::Map<String, serde_json::Value> = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(parse(""))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Map::new(),
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    all.insert(
        key.to_owned(),
        serde_json::to_value(value).map_err(parse(key))?,
    );
    // Replaced whole: a reader sees the old file or the new one.
    let text = serde_json::to_vec_pretty(&all).map_err(parse(key))?;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            ConfigError::Write { path, source }
        })
}

/// The value of `key` in `root`'s config.json, and the file's path; `None`
/// when the file or the key is absent.
pub fn config_section<T: serde::de::DeserializeOwned>(
    root: &Path,
    key: &'static str,
) -> Result<Option<(T, PathBuf)>, ConfigError> {
    let path = root.join(CONFIG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let parse = |key, path: &Path| {
        let path = path.to_owned();
        move |source| ConfigError::Parse { path, key, source }
    };
    let mut all: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).map_err(parse("", &path))?;
    match all.remove(key) {
        None => Ok(None),
        Some(value) => {
            let value = serde_json::from_value(value).map_err(parse(key, &path))?;
            Ok(Some((value, path)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_name_safe() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| unique_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in ids.iter().take(10) {
            assert!(
                crate::store::name::validate_name(&format!("run-{id}")).is_ok(),
                "{id}"
            );
        }
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ms();
        assert!(a > 1_600_000_000_000, "{a}");
        assert!(now_ms() >= a);
    }

    #[test]
    fn finds_installed_tools_only() {
        assert!(host_tool("no-such-e2fs-tool").is_none());
        assert_eq!(
            proc_self_status("Pid"),
            Some(std::process::id().to_string())
        );
        assert_eq!(proc_self_status("No-such-field"), None);
        let far = deadline_after(std::time::Duration::MAX);
        assert!(far > std::time::Instant::now() + std::time::Duration::from_secs(3600));
    }

    #[test]
    fn a_section_is_read_from_its_key_only() {
        let dir = std::env::temp_dir().join(format!("ma-config-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let none: Option<(u32, _)> = config_section(&dir, "n").unwrap();
        assert!(none.is_none(), "no file: defaults");
        std::fs::write(dir.join(CONFIG_FILE), r#"{"n": 3, "other": "x"}"#).unwrap();
        let (n, path) = config_section::<u32>(&dir, "n").unwrap().unwrap();
        assert_eq!((n, path), (3, dir.join(CONFIG_FILE)));
        assert!(config_section::<u32>(&dir, "absent").unwrap().is_none());
        assert!(matches!(
            config_section::<u32>(&dir, "other"),
            Err(ConfigError::Parse { key: "other", .. })
        ));
        std::fs::write(dir.join(CONFIG_FILE), "not json").unwrap();
        assert!(matches!(
            config_section::<u32>(&dir, "n"),
            Err(ConfigError::Parse { key: "", .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_section_written_keeps_the_others() {
        let dir = std::env::temp_dir().join(format!("ma-config-set-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(CONFIG_FILE), r#"{"price": {"x": 1}}"#).unwrap();
        set_config_section(&dir, "pool", &serde_json::json!({"minimal": 2})).unwrap();
        let (pool, _) = config_section::<serde_json::Value>(&dir, "pool")
            .unwrap()
            .unwrap();
        assert_eq!(pool["minimal"], 2);
        assert!(config_section::<serde_json::Value>(&dir, "price")
            .unwrap()
            .is_some());
        std::fs::write(dir.join(CONFIG_FILE), "not json").unwrap();
        assert!(matches!(
            set_config_section(&dir, "pool", &1),
            Err(ConfigError::Parse { .. })
        ));
        assert_eq!(
            std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap(),
            "not json"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
