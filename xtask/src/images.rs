//! `cargo xtask rootfs [minimal|debian|all]`: the workspace root filesystem
//! images, ext4 made with `mkfs.ext4 -d` from a directory tree (no mounts,
//! no loop devices). Each is cached under
//! `<cache>/images/<name>-<hash16>/{rootfs.ext4,manifest.json}` by a hash of
//! its inputs and linked from `<cache>/current/rootfs-<name>.ext4`.
//!
//! A build happens in `<cache>/build/image-<name>-<hash16>/` (the tree) and
//! `<cache>/images/.<name>-<hash16>.partial/` (image and manifest), which is
//! renamed into place only when complete; both are removed on failure.

pub mod agent;
mod debian;
mod manifest;
mod minimal;
mod tree;

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::cache::{self, AddRepoFile, InputHash};
use crate::{nolibc, sh};

/// Bump when the recipe changes in a way the inputs do not show.
const RECIPE_VERSION: &str = "images-recipe-2";
/// Where the agent goes in every image, and what every image has (the
/// product's own lists).
pub use workspace::images::build::minimal::{AGENT_PATH, HOSTNAME, HOSTS, OVERLAY_DIRS};
/// The guest init's source; without it `/sbin/init` links to the agent.
const INIT_SOURCE: &str = "guest/init/init.c";
/// mkfs.ext4 options before `-d`. `-T default` keeps 4 KiB blocks and one
/// inode per 16 KiB below 512 MiB too (mke2fs would pick its `small` type:
/// 1 KiB blocks, four times the inode tables).
const MKFS_OPTIONS: &[&str] = &["-q", "-F", "-T", "default", "-E", "root_owner=0:0"];
/// Which image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Image {
    /// busybox, the agent and init: a few MiB.
    Minimal,
    /// Debian bookworm minbase with python3.
    Debian,
}

impl Image {
    pub const ALL: [Image; 2] = [Image::Minimal, Image::Debian];

    pub fn name(self) -> &'static str {
        match self {
            Image::Minimal => "minimal",
            Image::Debian => "debian",
        }
    }

    /// The images an argument selects.
    pub fn parse_selection(arg: Option<&str>) -> anyhow::Result<Vec<Image>> {
        match arg {
            None | Some("all") => Ok(Self::ALL.to_vec()),
            Some("minimal") => Ok(vec![Image::Minimal]),
            Some("debian") => Ok(vec![Image::Debian]),
            Some(other) => bail!("unknown image `{other}` (minimal, debian or all)"),
        }
    }

    /// Free space beyond the tree (sparse, so it costs no disk until used).
    fn headroom_mib(self) -> u64 {
        match self {
            Image::Minimal => 8,
            Image::Debian => 256,
        }
    }
}

/// `<name>-<hash16>`: an image's directory under `<cache>/images`.
fn dir_name(image: Image, hash: &str) -> String {
    format!("{}-{hash}", image.name())
}

/// The name of an image's link in `<cache>/current/`.
fn current_link_name(image: Image) -> String {
    format!("rootfs-{}.ext4", image.name())
}

/// Image size in MiB: the tree with 5% slack for ext4 metadata, the
/// journal's share aside, plus `headroom_mib` of free space.
fn image_size_mib(tree_bytes: u64, headroom_mib: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    (tree_bytes + tree_bytes / 20).div_ceil(MIB) + headroom_mib
}

/// What `/sbin/init` is.
enum Init {
    /// guest/init/init.c built against nolibc (compiled only on a cache miss).
    Nolibc {
        source: PathBuf,
        bytes: OnceCell<Vec<u8>>,
    },
    /// No init source in this checkout: a link to the agent, which acts as
    /// init when it is PID 1.
    AgentLink,
}

impl Init {
    fn find() -> Self {
        let source = cache::repo_root().join(INIT_SOURCE);
        if source.is_file() {
            Init::Nolibc {
                source,
                bytes: OnceCell::new(),
            }
        } else {
            Init::AgentLink
        }
    }

    fn add_to_hash(&self, hash: &mut InputHash) -> anyhow::Result<()> {
        match self {
            Init::Nolibc { source, .. } => {
                hash.add_file(source)?;
                let nolibc = sh::deb_version("linux-source-6.1").unwrap_or_default();
                hash.add("init-nolibc", nolibc.as_bytes());
            }
            Init::AgentLink => {
                hash.add("init", b"link to the agent");
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        match self {
            Init::Nolibc { .. } => format!("{INIT_SOURCE} built against nolibc"),
            Init::AgentLink => format!("symlink to /{AGENT_PATH}"),
        }
    }

    /// Puts `/sbin/init` into `tree` (following the tree's own `sbin` link).
    fn install(&self, tree: &Path) -> anyhow::Result<()> {
        match self {
            Init::Nolibc { source, bytes } => {
                let bytes = match bytes.get() {
                    Some(b) => b,
                    None => {
                        let work = cache::root()?.join("build").join("image-init");
                        std::fs::create_dir_all(&work)?;
                        let built = nolibc::build(&work, &[source]);
                        let _ = std::fs::remove_dir_all(&work);
                        let built = built?.remove(0);
                        bytes.get_or_init(|| built)
                    }
                };
                tree::write_file(tree, "sbin/init", bytes, 0o755)
            }
            Init::AgentLink => tree::symlink(tree, "sbin/init", &format!("/{AGENT_PATH}")),
        }
    }
}

/// Inputs every image shares, found once per run.
struct Common {
    agent: agent::AgentBinary,
    init: Init,
    e2fsprogs: String,
}

/// `cargo xtask rootfs [minimal|debian|all]`.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let images = match args {
        [] => Image::parse_selection(None)?,
        [one] => Image::parse_selection(Some(one))?,
        _ => bail!("usage: cargo xtask rootfs [minimal|debian|all]"),
    };
    sh::ensure_debs(&["e2fsprogs"])?;
    let common = Common {
        agent: agent::find()?,
        init: Init::find(),
        e2fsprogs: sh::deb_version("e2fsprogs").unwrap_or_default(),
    };
    for image in images {
        let path = build(image, &common)?;
        println!("{}", path.display());
    }
    Ok(())
}

/// Builds (or finds) the `minimal` image; its rootfs, `manifest.json`
/// beside it.
pub fn minimal_image() -> anyhow::Result<PathBuf> {
    sh::ensure_debs(&["e2fsprogs"])?;
    let common = Common {
        agent: agent::find()?,
        init: Init::find(),
        e2fsprogs: sh::deb_version("e2fsprogs").unwrap_or_default(),
    };
    build(Image::Minimal, &common)
}

/// Removes its paths when dropped (a failed build leaves nothing behind).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            if p.exists() {
                let _ = std::fs::remove_dir_all(p);
            }
        }
    }
}

/// Builds (or finds) one image; returns the image's path.
fn build(image: Image, common: &Common) -> anyhow::Result<PathBuf> {
    let name = image.name();
    match image {
        Image::Minimal => minimal::ensure_debs()?,
        Image::Debian => debian::preflight()?,
    }
    let mut hash = InputHash::default();
    hash.add("recipe", RECIPE_VERSION.as_bytes())
        .add("image", name.as_bytes())
        .add("e2fsprogs", common.e2fsprogs.as_bytes())
        .add("mkfs", MKFS_OPTIONS.join(" ").as_bytes())
        .add("agent", &common.agent.bytes);
    common.init.add_to_hash(&mut hash)?;
    match image {
        Image::Minimal => minimal::add_inputs(&mut hash)?,
        Image::Debian => debian::add_inputs(&mut hash),
    }
    let key = hash.short();
    let images_dir = cache::root()?.join("images");
    let out_dir = images_dir.join(dir_name(image, &key));
    let rootfs = out_dir.join("rootfs.ext4");
    if rootfs.is_file() && out_dir.join("manifest.json").is_file() {
        let link = cache::link_current(&current_link_name(image), &rootfs)?;
        eprintln!("xtask: {name} image is cached: {}", link.display());
        return Ok(rootfs);
    }

    let started = Instant::now();
    let work = cache::root()?
        .join("build")
        .join(format!("image-{}", dir_name(image, &key)));
    let staging = images_dir.join(format!(".{}.partial", dir_name(image, &key)));
    for stale in [&work, &staging] {
        if stale.exists() {
            std::fs::remove_dir_all(stale)
                .with_context(|| format!("removing the stale {}", stale.display()))?;
        }
    }
    let _cleanup = Cleanup(vec![work.clone(), staging.clone()]);
    std::fs::create_dir_all(&work)?;
    std::fs::create_dir_all(&staging)?;
    eprintln!("xtask: building the {name} image in {}", work.display());
    let tree = work.join("tree");
    let (packages, extra) = match image {
        Image::Minimal => (minimal::populate(&tree)?, serde_json::Value::Null),
        Image::Debian => debian::populate(&tree)?,
    };
    finish_tree(&tree, common)?;

    let usage = tree::usage(&tree)?;
    let size_mib = image_size_mib(usage, image.headroom_mib());
    let partial_image = staging.join("rootfs.ext4");
    mkfs(name, &tree, &partial_image, size_mib)?;
    if image == Image::Minimal {
        workspace::images::build::minimal::own_user_home(&partial_image)?;
    }
    let manifest = manifest::Manifest {
        name: name.to_owned(),
        input_hash: key.clone(),
        image_size_bytes: size_mib << 20,
        image_sha256: sha256_file(&partial_image)?,
        tree_bytes: usage,
        top_level: tree::top_level(&tree)?,
        notable: tree::describe_paths(&tree, &notable_paths(image))?,
        agent_sha256: common.agent.sha256.clone(),
        agent_source: common.agent.source.clone(),
        init: common.init.describe(),
        packages,
        build_tools: build_tools(image, common),
        kernel: manifest::kernel_info(&cache::repo_root()),
        debian: extra,
        build_seconds: started.elapsed().as_secs_f64(),
    };
    sh::write_atomic(
        &staging.join("manifest.json"),
        manifest.to_json_string().as_bytes(),
    )?;
    if out_dir.exists() {
        // Only a hand-edited cache gets here (an image without its manifest).
        std::fs::remove_dir_all(&out_dir)?;
    }
    std::fs::rename(&staging, &out_dir)
        .with_context(|| format!("installing {}", out_dir.display()))?;
    let link = cache::link_current(&current_link_name(image), &rootfs)?;
    eprintln!(
        "xtask: {name} image built in {:.0} s: {} ({size_mib} MiB, tree {:.1} MiB)",
        started.elapsed().as_secs_f64(),
        link.display(),
        usage as f64 / f64::from(1 << 20)
    );
    Ok(rootfs)
}

/// What every image gets on top of its own content.
fn finish_tree(tree: &Path, common: &Common) -> anyhow::Result<()> {
    for dir in ["dev", "proc", "sys", "run", "mnt", "etc", "usr/bin", "sbin"] {
        tree::mkdir(tree, dir, 0o755)?;
    }
    tree::mkdir(tree, "root", 0o700)?;
    tree::mkdir(tree, "tmp", 0o1777)?;
    for dir in OVERLAY_DIRS {
        tree::mkdir(tree, dir, 0o755)?;
    }
    tree::write_file(tree, AGENT_PATH, &common.agent.bytes, 0o755)?;
    common.init.install(tree)?;
    tree::write_file(tree, "etc/hostname", HOSTNAME.as_bytes(), 0o644)?;
    tree::write_file(tree, "etc/hosts", HOSTS.as_bytes(), 0o644)?;
    Ok(())
}

/// Host packages that made the image (name, version).
fn build_tools(image: Image, common: &Common) -> Vec<(String, String)> {
    let mut list = vec![("e2fsprogs".to_owned(), common.e2fsprogs.clone())];
    if image == Image::Debian {
        list.push(("mmdebstrap".to_owned(), debian::mmdebstrap_version()));
    }
    if let Init::Nolibc { .. } = common.init {
        let version = sh::deb_version("linux-source-6.1").unwrap_or_default();
        list.push(("linux-source-6.1 (nolibc, for init)".to_owned(), version));
    }
    list
}

/// Paths whose presence the manifest records.
fn notable_paths(image: Image) -> Vec<&'static str> {
    let mut list = vec![AGENT_PATH, "sbin/init"];
    match image {
        Image::Minimal => list.extend(["bin/busybox", "bin/sh"]),
        Image::Debian => list.extend([
            "usr/bin/python3",
            "usr/bin/node",
            "usr/bin/bash",
            "usr/bin/git",
            "usr/bin/ssh",
            "usr/bin/ps",
            "usr/bin/apt-get",
            "etc/ssl/certs/ca-certificates.crt",
            "etc/debian_version",
        ]),
    }
    list
}

/// `mkfs.ext4 -d`: root-owned files need no root when run under fakeroot.
fn mkfs(label: &str, tree: &Path, image: &Path, size_mib: u64) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        Command::new("mkfs.ext4")
    } else {
        sh::ensure_debs(&["fakeroot"])?;
        let mut c = Command::new("fakeroot");
        c.arg("mkfs.ext4");
        c
    };
    cmd.args(MKFS_OPTIONS)
        .args(["-L", label, "-d"])
        .arg(tree)
        .arg(image)
        .arg(format!("{size_mib}M"))
        .stdout(std::process::Stdio::null());
    sh::run(&mut cmd)
}

/// The sha256 of a file, by `sha256sum` (hundreds of MB/s even when xtask
/// is a debug build).
fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .context("running sha256sum")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(h) if out.status.success() && h.len() == 64 => Ok(h.to_owned()),
        _ => bail!("sha256sum {} failed", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_parsing() {
        assert_eq!(
            Image::parse_selection(None).unwrap(),
            [Image::Minimal, Image::Debian]
        );
        assert_eq!(Image::parse_selection(Some("all")).unwrap().len(), 2);
        assert_eq!(
            Image::parse_selection(Some("debian")).unwrap(),
            [Image::Debian]
        );
        assert!(Image::parse_selection(Some("alpine")).is_err());
    }

    #[test]
    fn names_and_sizes() {
        assert_eq!(
            dir_name(Image::Minimal, "0123456789abcdef"),
            "minimal-0123456789abcdef"
        );
        assert_eq!(current_link_name(Image::Debian), "rootfs-debian.ext4");
        assert_eq!(image_size_mib(0, 8), 8);
        assert_eq!(image_size_mib(1, 8), 9);
        // 200 MiB of tree: 10 MiB slack, then the headroom.
        assert_eq!(image_size_mib(200 << 20, 256), 466);
    }

    #[test]
    fn finish_tree_lays_out_the_common_parts() {
        let dir = std::env::temp_dir().join(format!("images-finish-{}", std::process::id()));
        let _cleanup = Cleanup(vec![dir.clone()]);
        std::fs::create_dir_all(dir.join("usr/sbin")).unwrap();
        std::os::unix::fs::symlink("usr/sbin", dir.join("sbin")).unwrap();
        let common = Common {
            agent: agent::AgentBinary {
                bytes: b"agent".to_vec(),
                sha256: String::new(),
                source: String::new(),
            },
            init: Init::AgentLink,
            e2fsprogs: String::new(),
        };
        finish_tree(&dir, &common).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &str| {
            std::fs::symlink_metadata(dir.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("tmp"), 0o1777);
        assert_eq!(mode("root"), 0o700);
        assert_eq!(mode(AGENT_PATH), 0o755);
        assert_eq!(std::fs::read(dir.join(AGENT_PATH)).unwrap(), b"agent");
        // /sbin/init went through the tree's own sbin link.
        assert_eq!(
            std::fs::read_link(dir.join("usr/sbin/init")).unwrap(),
            Path::new("/usr/bin/microagent-agent")
        );
        assert!(dir.join("overlay/upper").is_dir());
        assert_eq!(
            std::fs::read_to_string(dir.join("etc/hostname")).unwrap(),
            "microagent\n"
        );
    }
}
