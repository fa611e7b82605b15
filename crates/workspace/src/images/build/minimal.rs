//! The `minimal` image's recipe: Debian's static busybox with links for
//! the common applets, minimal /etc files, our init as `/sbin/init` and the
//! agent as `/usr/bin/microagent-agent`, the mount points init uses.
//! `cargo xtask rootfs minimal` builds it from a checkout with the same
//! lists; `setup` builds it from the binaries installed beside
//! `microagent`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::ImageBuildError;

/// The Debian package with the static busybox.
pub const BUSYBOX_PACKAGE: &str = "busybox-static";
/// Where it installs it.
pub const BUSYBOX: &str = "/bin/busybox";
/// Where the agent goes in the image.
pub const AGENT_PATH: &str = "usr/bin/microagent-agent";
/// The agent binary's name where it is installed.
pub const AGENT_BINARY: &str = "microagent-agent";
/// The init binary's name where it is installed.
pub const INIT_BINARY: &str = "microagent-init";

/// Applets linked in /bin (each must be in busybox's own list).
pub const APPLETS: &[&str] = &[
    "sh", "ls", "cat", "echo", "mkdir", "rm", "mv", "cp", "ps", "mount", "umount", "uname",
    "sleep", "env", "id", "grep", "sed", "head", "tail", "wc", "true", "false", "chmod", "chown",
    "ln", "df", "free", "hostname", "kill", "tar", "find", "xargs", "sort", "date", "touch", "dd",
    "reboot", "poweroff", "halt", "vi", "less", "which", "printf", "test", "sync", "seq", "tr",
    "cut", "tee", "awk", "timeout", // the network's tools:
    "wget", "nc", "ip", "ifconfig", "route", "ping", "nslookup", "netstat", "httpd",
];

/// `/etc/passwd`: root, an unprivileged `user` (for `--user user`) and
/// nobody.
pub const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                          user:x:1000:1000:user:/home/user:/bin/sh\n\
                          nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
/// `/etc/group`.
pub const GROUP: &str = "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n";
/// The unprivileged user every built image has.
pub const USER: (&str, u32) = ("user", 1000);
/// Its home, relative to the tree.
pub const USER_HOME: &str = "home/user";
/// Names from /etc/hosts first (`host.microagent.internal`, localhost), as
/// on Debian; without the file glibc asks DNS first.
pub const NSSWITCH: &str = "passwd: files\ngroup: files\nhosts: files dns\n";
/// `/etc/hostname` of every built image.
pub const HOSTNAME: &str = "microagent\n";
/// `/etc/hosts` of every built image.
pub const HOSTS: &str = "127.0.0.1\tlocalhost\n127.0.1.1\tmicroagent\n";
/// Mount points the guest init and workspaces use.
pub const OVERLAY_DIRS: &[&str] = &[
    "overlay",
    "overlay/upper",
    "overlay/work",
    "overlay/lower",
    "overlay/new",
    "overlay/merged",
];

/// Where an installed binary of ours is: `$MICROAGENT_<NAME>_BIN`
/// (`MICROAGENT_AGENT_BIN`), else beside the running program (how
/// `cargo xtask dist` lays them out); in a release bundle, its
/// `libexec/microagent` first (a stale copy beside the binary from an
/// older install does not win).
pub fn installed_binary(name: &str) -> Result<PathBuf, ImageBuildError> {
    let var = format!(
        "MICROAGENT_{}_BIN",
        name.trim_start_matches("microagent-").to_uppercase()
    );
    if let Some(path) = std::env::var_os(&var).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)));
    let bundled = base::host::bundle::bundled_libexec_dir().map(|d| d.join(name));
    match [bundled, beside].into_iter().flatten().find(|p| p.is_file()) {
        Some(path) => Ok(path),
        None => Err(ImageBuildError::Request(format!(
            "{name} is not installed beside this program, in {} (a release bundle) or named by {var}; the `minimal` image is built from it",
            base::host::bundle::LIBEXEC_DIR
        ))),
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> ImageBuildError {
    move |source| ImageBuildError::Io { what, source }
}

fn mkdir(tree: &Path, rel: &str, mode: u32) -> Result<(), ImageBuildError> {
    let path = tree.join(rel);
    std::fs::create_dir_all(&path).map_err(io(format!("creating {}", path.display())))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("setting the mode of {}", path.display())))
}

fn write(tree: &Path, rel: &str, bytes: &[u8], mode: u32) -> Result<(), ImageBuildError> {
    let path = tree.join(rel);
    std::fs::write(&path, bytes).map_err(io(format!("writing {}", path.display())))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("setting the mode of {}", path.display())))
}

/// Applets of `wanted` missing from `busybox --list` output.
pub fn missing_applets<'a>(list: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    let have: std::collections::HashSet<&str> = list.lines().map(str::trim).collect();
    wanted
        .iter()
        .copied()
        .filter(|a| !have.contains(a))
        .collect()
}

/// Lays out the whole `minimal` tree in `tree` (a new directory) from the
/// host's busybox, `agent` and `init`.
pub fn populate(tree: &Path, agent: &Path, init: &Path) -> Result<(), ImageBuildError> {
    let out = Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .map_err(io(format!("running {BUSYBOX} --list")))?;
    let missing = missing_applets(&String::from_utf8_lossy(&out.stdout), APPLETS);
    if !missing.is_empty() {
        return Err(ImageBuildError::Request(format!(
            "{BUSYBOX} lacks applets {}",
            missing.join(", ")
        )));
    }
    for dir in [
        "bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "proc", "sys", "run", "mnt",
    ] {
        mkdir(tree, dir, 0o755)?;
    }
    mkdir(tree, "root", 0o700)?;
    mkdir(tree, USER_HOME, 0o755)?;
    mkdir(tree, "tmp", 0o1777)?;
    for dir in OVERLAY_DIRS {
        mkdir(tree, dir, 0o755)?;
    }
    let read = |path: &Path| std::fs::read(path).map_err(io(format!("reading {}", path.display())));
    write(tree, "bin/busybox", &read(Path::new(BUSYBOX))?, 0o755)?;
    for applet in APPLETS {
        let link = tree.join("bin").join(applet);
        std::os::unix::fs::symlink("busybox", &link)
            .map_err(io(format!("linking {}", link.display())))?;
    }
    write(tree, AGENT_PATH, &read(agent)?, 0o755)?;
    write(tree, "sbin/init", &read(init)?, 0o755)?;
    for (rel, text) in [
        ("etc/passwd", PASSWD),
        ("etc/group", GROUP),
        ("etc/nsswitch.conf", NSSWITCH),
        ("etc/hostname", HOSTNAME),
        ("etc/hosts", HOSTS),
    ] {
        write(tree, rel, text.as_bytes(), 0o644)?;
    }
    Ok(())
}

/// Gives the user's home to the user in the ext4 `image` (made with
/// every file root's): one `debugfs -w` script, no privileges needed.
pub fn own_user_home(image: &Path) -> Result<(), ImageBuildError> {
    let (_, id) = USER;
    let script = format!("sif /{USER_HOME} uid {id}\nsif /{USER_HOME} gid {id}\n");
    base::host_tool::debugfs_write(image, &script).map_err(|e| {
        ImageBuildError::Request(format!(
            "setting the owner of /{USER_HOME} in {}: {}",
            image.display(),
            base::error_chain::error_chain(&e)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applet_list() {
        let unique: std::collections::HashSet<_> = APPLETS.iter().collect();
        assert_eq!(unique.len(), APPLETS.len(), "duplicate applet");
        for must in [
            "sh", "mount", "umount", "ps", "tar", "dd", "reboot", "xargs", "grep",
        ] {
            assert!(APPLETS.contains(&must), "{must}");
        }
        assert_eq!(
            missing_applets("sh\nls\n  cat\n", &["sh", "cat", "dd"]),
            ["dd"]
        );
    }

    #[test]
    fn etc_files_are_well_formed() {
        for line in PASSWD.lines() {
            assert_eq!(line.split(':').count(), 7, "{line}");
        }
        for line in GROUP.lines() {
            assert_eq!(line.split(':').count(), 4, "{line}");
        }
        assert!(PASSWD.starts_with("root:x:0:0:"));
        let user = format!("{}:x:{}:{}:", USER.0, USER.1, USER.1);
        assert!(PASSWD.contains(&user) && PASSWD.contains(USER_HOME));
    }

    #[test]
    fn binaries_are_found_by_variable() {
        // The variable wins over the directory of the running program.
        std::env::set_var("MICROAGENT_TESTONLY_BIN", "/x/agent");
        assert_eq!(
            installed_binary("microagent-testonly").unwrap(),
            Path::new("/x/agent")
        );
        std::env::remove_var("MICROAGENT_TESTONLY_BIN");
        let err = installed_binary("microagent-testonly")
            .unwrap_err()
            .to_string();
        assert!(err.contains("MICROAGENT_TESTONLY_BIN"), "{err}");
    }
}
