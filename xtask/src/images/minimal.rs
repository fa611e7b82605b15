//! The `minimal` image: Debian's static busybox with links for the common
//! applets, minimal /etc files; the agent and init come from `finish_tree`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use super::tree;
use crate::cache::InputHash;
use crate::sh;

const PACKAGE: &str = "busybox-static";
const BUSYBOX: &str = "/bin/busybox";

/// Applets linked in /bin (each must be in busybox's own list).
pub const APPLETS: &[&str] = &[
    "sh", "ls", "cat", "echo", "mkdir", "rm", "mv", "cp", "ps", "mount", "umount", "uname",
    "sleep", "env", "id", "grep", "sed", "head", "tail", "wc", "true", "false", "chmod", "chown",
    "ln", "df", "free", "hostname", "kill", "tar", "find", "xargs", "sort", "date", "touch", "dd",
    "reboot", "poweroff", "halt", "vi", "less", "which", "printf", "test", "sync", "seq", "tr",
    "cut", "tee", "awk", "timeout", // the network's tools:
    "wget", "nc", "ip", "ifconfig", "route", "ping", "nslookup", "netstat", "httpd",
];

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
/// Names from /etc/hosts first (`host.microagent.internal`, localhost), as
/// on Debian; without the file glibc asks DNS first.
const NSSWITCH: &str = "passwd: files\ngroup: files\nhosts: files dns\n";

pub fn ensure_debs() -> anyhow::Result<()> {
    sh::ensure_debs(&[PACKAGE])
}

fn busybox_version() -> String {
    sh::deb_version(PACKAGE).unwrap_or_default()
}

pub fn add_inputs(hash: &mut InputHash) -> anyhow::Result<()> {
    hash.add(PACKAGE, busybox_version().as_bytes())
        .add("applets", APPLETS.join(" ").as_bytes());
    hash.add_file(Path::new(BUSYBOX))?;
    hash.add("passwd", PASSWD.as_bytes())
        .add("group", GROUP.as_bytes())
        .add("nsswitch", NSSWITCH.as_bytes());
    Ok(())
}

/// Applets of `wanted` missing from `busybox --list` output.
fn missing_applets<'a>(list: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    let have: std::collections::HashSet<&str> = list.lines().map(str::trim).collect();
    wanted
        .iter()
        .copied()
        .filter(|a| !have.contains(a))
        .collect()
}

/// Lays out the tree; returns the Debian packages used, with versions.
pub fn populate(root: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let out = Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .with_context(|| format!("running {BUSYBOX} --list"))?;
    let missing = missing_applets(&String::from_utf8_lossy(&out.stdout), APPLETS);
    if !missing.is_empty() {
        bail!("{BUSYBOX} lacks applets {}", missing.join(", "));
    }
    std::fs::create_dir_all(root)?;
    for dir in ["bin", "sbin", "usr/bin", "usr/sbin", "etc"] {
        tree::mkdir(root, dir, 0o755)?;
    }
    let bytes =
        std::fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX} (package {PACKAGE})"))?;
    tree::write_file(root, "bin/busybox", &bytes, 0o755)?;
    for applet in APPLETS {
        tree::symlink(root, &format!("bin/{applet}"), "busybox")?;
    }
    tree::write_file(root, "etc/passwd", PASSWD.as_bytes(), 0o644)?;
    tree::write_file(root, "etc/group", GROUP.as_bytes(), 0o644)?;
    tree::write_file(root, "etc/nsswitch.conf", NSSWITCH.as_bytes(), 0o644)?;
    Ok(vec![(PACKAGE.to_owned(), busybox_version())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applet_list() {
        let unique: std::collections::HashSet<_> = APPLETS.iter().collect();
        assert_eq!(unique.len(), APPLETS.len(), "duplicate applet");
        for must in [
            "sh", "mount", "umount", "ps", "tar", "dd", "reboot", "poweroff",
        ] {
            assert!(APPLETS.contains(&must), "{must}");
        }
        assert!(APPLETS
            .iter()
            .all(|a| !a.is_empty() && a.chars().all(|c| c.is_ascii_lowercase())));
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
    }
}
