//! The `minimal` image: Debian's static busybox with links for the common
//! applets, minimal /etc files (the product's lists,
//! `workspace::images::build::minimal`); the agent and init come from
//! `finish_tree`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use super::tree;
use crate::cache::{AddRepoFile, InputHash};
use crate::sh;

use workspace::images::build::minimal::{
    missing_applets, APPLETS, BUSYBOX, BUSYBOX_PACKAGE as PACKAGE, GROUP, NSSWITCH, PASSWD,
    USER_HOME,
};

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
    // Owned by the user once the image is written (own_user_home).
    tree::mkdir(root, USER_HOME, 0o755)?;
    tree::write_file(root, "etc/passwd", PASSWD.as_bytes(), 0o644)?;
    tree::write_file(root, "etc/group", GROUP.as_bytes(), 0o644)?;
    tree::write_file(root, "etc/nsswitch.conf", NSSWITCH.as_bytes(), 0o644)?;
    Ok(vec![(PACKAGE.to_owned(), busybox_version())])
}
