//! The `debian` image: bookworm minbase with python3, nodejs and git, by
//! `mmdebstrap --mode=root --skip=chroot/mount`: packages are unpacked and
//! configured by dpkg chrooted into the tree, with no /proc, /sys or /dev
//! mounted into it (nothing is mounted at all, so nothing can be left behind).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use super::tree;
use crate::cache::InputHash;
use crate::sh;

const SUITE: &str = "bookworm";
const VARIANT: &str = "minbase";
/// Beyond minbase (bash and coreutils are in it already; listed to be sure).
pub const INCLUDE: &[&str] = &[
    "python3",
    "nodejs",
    "ca-certificates",
    "procps",
    "coreutils",
    "bash",
    // Repositories are cloned into workspaces and pulled back (docs/tasks.md).
    "git",
    "openssh-client",
];
/// The image's apt sources (also written to its /etc/apt/sources.list).
/// The keyring is named (package debian-archive-keyring, on the host and in
/// the image) so that mmdebstrap need not guess it with gpg.
const SOURCES: &[&str] = &[
    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main",
    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main",
    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main",
];
/// The host's resolver has no meaning in the guest, which has no network.
const RESOLV_CONF: &str = "# microagent guests have no network interface by default\n";

/// Root, mmdebstrap and the archive keyring.
pub fn preflight() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the debian image needs root (mmdebstrap --mode=root runs dpkg chrooted into \
             the tree); run `sudo cargo xtask rootfs debian`, or build `minimal` only"
        );
    }
    sh::ensure_debs(&["mmdebstrap", "debian-archive-keyring"])
}

pub fn mmdebstrap_version() -> String {
    sh::deb_version("mmdebstrap").unwrap_or_default()
}

/// The archive's state is not an input (a cache hit must not need the
/// network): delete the image directory, or bump the recipe, to refresh it.
pub fn add_inputs(hash: &mut InputHash) {
    hash.add("suite", SUITE.as_bytes())
        .add("variant", VARIANT.as_bytes())
        .add("include", INCLUDE.join(",").as_bytes())
        .add("sources", SOURCES.join("\n").as_bytes())
        .add("mmdebstrap", mmdebstrap_version().as_bytes())
        .add("resolv.conf", RESOLV_CONF.as_bytes())
        .add(
            "user",
            workspace::images::build::debian::USER_HOOK.as_bytes(),
        );
}

/// The mmdebstrap command line that creates `root`.
fn mmdebstrap_args(root: &Path) -> Vec<String> {
    let mut args = vec![
        "--mode=root".to_owned(),
        format!("--variant={VARIANT}"),
        "--skip=chroot/mount".to_owned(),
        "--skip=check/signed-by".to_owned(),
        format!("--include={}", INCLUDE.join(",")),
        workspace::images::build::debian::USER_HOOK.to_owned(),
        "--aptopt=Acquire::Retries \"3\"".to_owned(),
        SUITE.to_owned(),
        root.display().to_string(),
    ];
    args.extend(SOURCES.iter().map(|s| (*s).to_owned()));
    args
}

/// `dpkg-query` output (`name<TAB>version` lines) as pairs, sorted.
fn parse_packages(text: &str) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .filter(|(n, _)| !n.is_empty())
        .collect();
    list.sort();
    list
}

/// Builds the tree; returns the installed packages with versions and the
/// manifest's `debian` section.
pub fn populate(root: &Path) -> anyhow::Result<(Vec<(String, String)>, serde_json::Value)> {
    eprintln!(
        "xtask: mmdebstrap {SUITE} {VARIANT} + {}",
        INCLUDE.join(",")
    );
    sh::run(Command::new("mmdebstrap").args(mmdebstrap_args(root)))?;
    let out = Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            root.join("var/lib/dpkg").display()
        ))
        .args(["-W", "-f=${Package}\t${Version}\n"])
        .output()
        .context("running dpkg-query on the image's package database")?;
    if !out.status.success() {
        bail!("dpkg-query on the image's package database failed");
    }
    let packages = parse_packages(&String::from_utf8_lossy(&out.stdout));
    for want in INCLUDE {
        if !packages.iter().any(|(n, _)| n == want) {
            bail!("mmdebstrap succeeded but {want} is not installed in the tree");
        }
    }
    tree::write_file(root, "etc/resolv.conf", RESOLV_CONF.as_bytes(), 0o644)?;
    let section = serde_json::json!({
        "suite": SUITE,
        "variant": VARIANT,
        "include": INCLUDE,
        "sources": SOURCES,
        "tool": "mmdebstrap --mode=root --skip=chroot/mount",
    });
    Ok((packages, section))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line() {
        let args = mmdebstrap_args(Path::new("/c/tree"));
        assert!(args.contains(&"--skip=chroot/mount".to_owned()));
        assert!(args.contains(&"--mode=root".to_owned()));
        assert!(args
            .iter()
            .any(|a| a.starts_with("--include=python3,") && a.contains("ca-certificates")));
        let suite = args.iter().position(|a| a == "bookworm").unwrap();
        assert_eq!(args[suite + 1], "/c/tree");
        assert_eq!(args.len(), suite + 2 + SOURCES.len());
    }

    #[test]
    fn package_list_parsing() {
        let text = "python3\t3.11.2-1+b1\nbash\t5.2.15-2+b7\n\nbad line\n";
        assert_eq!(
            parse_packages(text),
            [
                ("bash".to_owned(), "5.2.15-2+b7".to_owned()),
                ("python3".to_owned(), "3.11.2-1+b1".to_owned())
            ]
        );
    }
}
