//! From an unpacked image tree to a bootable ext4 root image: our init and
//! agent go under `/.microagent/` (the image's `/sbin/init` and the rest
//! stay as they are; the kernel is told `init=/.microagent/init`), the
//! files the agent rewrites become regular files, and `mkfs.ext4 -d`
//! writes the tree into an image file (no mounts, no loop devices).

use std::path::{Path, PathBuf};

use super::config::ImageDefaults;
use super::layout::Resolved;
use super::owners::Owners;
use super::tree::ImageTree;
use super::unpack::Budget;
use super::{unpack, OciError, OciOrigin};
use crate::host_tool::{HostTool, ToolLimits};

/// Our directory in every converted image.
pub const GUEST_DIR: &str = ".microagent";
/// The kernel arguments of a converted image: our init, which finds the
/// agent and the writable layer's mount point beside itself.
pub const BOOT_ARGS: &str = "init=/.microagent/init";
/// Where the built images keep init and agent (the source of ours).
const BASE_INIT: &str = "/sbin/init";
const BASE_AGENT: &str = "/usr/bin/microagent-agent";

/// What a conversion made.
#[derive(Debug)]
pub struct Converted {
    /// The ext4 image.
    pub rootfs: PathBuf,
    /// The image config's defaults.
    pub defaults: ImageDefaults,
    /// What it was made from.
    pub origin: OciOrigin,
}

/// Progress of a conversion, for a front end to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConversionStep {
    /// Applying layer `index` (from 1) of `count`.
    Layer {
        /// This layer.
        index: usize,
        /// Of this many.
        count: usize,
    },
    /// Writing the ext4 image.
    Filesystem,
}

/// Where a conversion finds a layer.
#[derive(Debug)]
pub enum LayerArrival {
    /// In the file the image names (an image read from a directory).
    AtPath,
    /// Handed over open once it arrived and was checked (a pull's layers
    /// arrive while earlier ones are applied; another pull removing or
    /// replacing the cached file cannot change what is read).
    Open(std::fs::File),
    /// It never will (the pull failed or was dropped).
    Never,
}

/// How a conversion waits for layer `index` (from 0).
pub type LayerReady<'a> = &'a mut dyn FnMut(usize) -> LayerArrival;

/// Converts `image` in `work` (an empty scratch directory; the result is
/// `work/rootfs.ext4`), taking init and agent from `base_rootfs` (a built
/// image's ext4); each layer is applied once `ready` says it is there.
pub fn convert(
    image: &Resolved,
    work: &Path,
    base_rootfs: &Path,
    budget: Budget,
    progress: &mut dyn FnMut(ConversionStep),
    ready: LayerReady<'_>,
) -> Result<Converted, OciError> {
    convert_with(
        image,
        work,
        base_rootfs,
        Owners::for_this_process(),
        budget,
        progress,
        ready,
    )
}

/// [`convert`] with owners set on the tree or recorded for debugfs (what
/// a conversion without root does; tests force it as root).
pub fn convert_with(
    image: &Resolved,
    work: &Path,
    base_rootfs: &Path,
    mut owners: Owners,
    mut budget: Budget,
    progress: &mut dyn FnMut(ConversionStep),
    ready: LayerReady<'_>,
) -> Result<Converted, OciError> {
    let tree = work.join("tree");
    std::fs::create_dir_all(&tree).map_err(|e| OciError::io("creating the image tree", e))?;
    let count = image.layers.len();
    let mut layers = Vec::with_capacity(count);
    for (index, ((path, digest), diff_id)) in image
        .layers
        .iter()
        .zip(&image.config.rootfs.diff_ids)
        .enumerate()
    {
        let handed = match ready(index) {
            LayerArrival::Never => return Err(OciError::LayerNotFetched(index + 1)),
            LayerArrival::Open(file) => Some(file),
            LayerArrival::AtPath => None,
        };
        progress(ConversionStep::Layer {
            index: index + 1,
            count,
        });
        let file = match handed {
            Some(file) => file,
            None => {
                let file = open_layer(path)?;
                if digest != diff_id && !image.layers_verified {
                    // A compressed blob not checked as it was fetched: its
                    // own digest first (apply_layer checks the uncompressed
                    // one), read through the file that is then applied.
                    use std::os::fd::AsRawFd;
                    let this = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                    super::layout::verify_file(&this, digest, "layer")?;
                }
                file
            }
        };
        unpack::apply_layer(&tree, file, diff_id, &mut owners, &mut budget)?;
        layers.push(digest.clone());
    }
    if count != image.config.rootfs.diff_ids.len() {
        return Err(OciError::NotAnImage {
            path: work.to_owned(),
            problem: "its manifest and config list different numbers of layers".into(),
        });
    }
    let defaults =
        ImageDefaults::from_config(&image.config.config.clone().unwrap_or_default(), &tree)?;
    progress(ConversionStep::Filesystem);
    let rootfs = finish(work, base_rootfs, &owners, defaults.cwd.as_deref())?;
    Ok(Converted {
        rootfs,
        defaults,
        origin: OciOrigin {
            reference: image.reference.clone().unwrap_or_default(),
            manifest_digest: image.manifest_digest.clone(),
            config_digest: image.config_digest.clone(),
            layers,
            description: description_of(&image.config),
        },
    })
}

/// What an image's config says it is (its description label), at most
/// [`MAX_DESCRIPTION`] characters.
pub fn description_of(config: &super::config::ImageConfig) -> Option<String> {
    config
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get(crate::images::oci::config::DESCRIPTION_KEY))
        .map(|d| d.chars().take(MAX_DESCRIPTION).collect())
}

/// Longest description kept, in characters.
pub const MAX_DESCRIPTION: usize = 1024;

/// The file in the work directory a conversion writes.
const OUTPUT: &str = "rootfs.ext4";

/// Makes `work/tree` bootable (our files, mount points, `cwd`) and writes
/// it into `work/rootfs.ext4` with the owners `owners` holds; the tree is
/// removed afterwards.
fn finish(
    work: &Path,
    base_rootfs: &Path,
    owners: &Owners,
    cwd: Option<&str>,
) -> Result<PathBuf, OciError> {
    let tree = work.join("tree");
    let image_tree = ImageTree::open(&tree)?;
    add_guest_files(&image_tree, base_rootfs, work)?;
    if let Some(cwd) = cwd {
        // As container runtimes do: a missing working directory is made
        // (inside the image, whatever links are on its way).
        image_tree.make_dir_path(cwd)?;
    }
    let rootfs = work.join(OUTPUT);
    mkfs(&tree, &rootfs)?;
    owners.write_into(&tree, &rootfs)?;
    let _ = std::fs::remove_dir_all(&tree);
    Ok(rootfs)
}

/// The layer file at `path`, open: a regular file, never a link followed
/// nor a FIFO waited on.
fn open_layer(path: &Path) -> Result<std::fs::File, OciError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| OciError::io(format!("opening {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| OciError::io(format!("reading {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(OciError::Unsupported(format!(
            "layer {} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// Makes the tree already in `work/tree` (made as root, with its real
/// owners: a Debian bootstrap) bootable and writes `work/rootfs.ext4`.
pub fn convert_tree(work: &Path, base_rootfs: &Path) -> Result<PathBuf, OciError> {
    finish(work, base_rootfs, &Owners::for_this_process(), None)
}

/// Converts one uncompressed tar of a whole root filesystem (what an image
/// build saves of a workspace; `diff_id` is its sha256) in `work`, as
/// [`convert`] does a container image; returns `work/rootfs.ext4`.
pub fn convert_archive(
    archive: &Path,
    diff_id: &str,
    work: &Path,
    base_rootfs: &Path,
    cwd: Option<&str>,
    mut budget: Budget,
) -> Result<PathBuf, OciError> {
    let tree = work.join("tree");
    std::fs::create_dir_all(&tree).map_err(|e| OciError::io("creating the image tree", e))?;
    let mut owners = Owners::for_this_process();
    let file = std::fs::File::open(archive)
        .map_err(|e| OciError::io(format!("opening {}", archive.display()), e))?;
    unpack::apply_layer(&tree, file, diff_id, &mut owners, &mut budget)?;
    finish(work, base_rootfs, &owners, cwd)
}

/// `name` through the host-tool runner (the image tree it reads is the
/// image's: bounded memory, file sizes and time).
fn tool(name: &str) -> Result<HostTool, OciError> {
    HostTool::new(name).map_err(|e| OciError::Tool {
        tool: name.into(),
        detail: crate::error_chain::error_chain(&e),
    })
}

/// Runs a tool; gives back what it said on stderr.
fn run(tool: HostTool) -> Result<String, OciError> {
    let name = tool.name().to_owned();
    let out = tool.output().map_err(|e| OciError::Tool {
        tool: name.clone(),
        detail: crate::error_chain::error_chain(&e),
    })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Err(OciError::Tool {
        tool: name,
        detail: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// Puts init and agent (read out of `base_rootfs` with debugfs) under
/// `/.microagent/`, makes the writable layer's mount point there, and makes
/// the files the agent writes at boot regular files.
fn add_guest_files(image: &ImageTree, base_rootfs: &Path, work: &Path) -> Result<(), OciError> {
    let tree = image.path();
    // Top-level names are replaced, never followed: removing a symlink
    // removes the link.
    let ours = tree.join(GUEST_DIR);
    let _ = std::fs::remove_dir_all(&ours);
    std::fs::create_dir_all(ours.join("overlay"))
        .map_err(|e| OciError::io("creating /.microagent", e))?;
    for (from, to) in [(BASE_INIT, "init"), (BASE_AGENT, "agent")] {
        let out = work.join(to);
        let _ = std::fs::remove_file(&out);
        let said = run(tool("debugfs")?
            .arg("-R")
            .arg(format!("dump -p {from} {}", out.display()))
            .arg(base_rootfs))?;
        // debugfs reports a missing file or a failed read on stderr but
        // exits 0; its banner is the first line.
        let len = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        if len == 0 {
            let said = said.lines().skip(1).collect::<Vec<_>>().join("; ");
            return Err(OciError::Tool {
                tool: "debugfs".into(),
                detail: format!(
                    "{from} could not be read from {}: {said}",
                    base_rootfs.display()
                ),
            });
        }
        std::fs::rename(&out, ours.join(to))
            .map_err(|e| OciError::io(format!("adding /.microagent/{to}"), e))?;
        std::fs::set_permissions(
            ours.join(to),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .map_err(|e| OciError::io(format!("adding /.microagent/{to}"), e))?;
    }
    make_boot_files(image)
}

/// Makes init's mount points directories and the files the agent writes
/// at boot regular files, in the image's root and its `/etc`.
fn make_boot_files(image: &ImageTree) -> Result<(), OciError> {
    let tree = image.path();
    // The kernel mounts devtmpfs on /dev before init runs (init needs the
    // writable layer's disk there); the rest are init's mount points.
    for (dir, mode) in [
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("run", 0o755),
        ("tmp", 0o1777),
    ] {
        let path = tree.join(dir);
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            let _ = std::fs::remove_file(&path);
            std::fs::create_dir(&path).map_err(|e| OciError::io(format!("creating /{dir}"), e))?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(|e| OciError::io(format!("creating /{dir}"), e))?;
        }
    }
    // /etc as the image resolves it (a link to /etc stays in the image);
    // its files' own names are replaced, never followed.
    let etc = image.make_dirs(&[std::ffi::OsStr::new("etc")], "etc", &mut |_| {})?;
    for (name, default) in [
        ("resolv.conf", ""),
        ("hosts", "127.0.0.1\tlocalhost\n"),
        ("hostname", "microagent\n"),
    ] {
        let path = etc.join(name);
        let regular = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if !regular {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_dir_all(&path);
            std::fs::write(&path, default)
                .map_err(|e| OciError::io(format!("writing /etc/{name}"), e))?;
        }
    }
    Ok(())
}

/// Bytes and inodes the tree needs.
pub(crate) fn usage(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(m) = entry.metadata() else { continue };
            inodes += 1;
            // Whole 4 KiB blocks, plus a block per directory.
            bytes += m.len().div_ceil(4096) * 4096;
            if m.is_dir() {
                bytes += 4096;
                stack.push(entry.path());
            }
        }
    }
    (bytes, inodes)
}

/// `mkfs.ext4 -d tree`: sized to the tree with room for the journal and
/// metadata (the image is attached read-only; writes go to the layer).
fn mkfs(tree: &Path, out: &Path) -> Result<(), OciError> {
    mkfs_with(tool("mkfs.ext4")?, tree, out)
}

/// [`mkfs`] with every file owned by root: as root directly, otherwise
/// under `fakeroot` (a tree made by an unprivileged user for a system
/// image, such as `minimal`).
pub fn mkfs_root_owned(tree: &Path, out: &Path) -> Result<(), OciError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let tool = if unsafe { libc::geteuid() } == 0 {
        tool("mkfs.ext4")?
    } else {
        HostTool::under("fakeroot", "mkfs.ext4").map_err(|e| OciError::Tool {
            tool: "fakeroot".into(),
            detail: crate::error_chain::error_chain(&e),
        })?
    };
    mkfs_with(tool, tree, out)
}

fn mkfs_with(tool: HostTool, tree: &Path, out: &Path) -> Result<(), OciError> {
    let (bytes, inodes) = usage(tree);
    let size_mib = (bytes + bytes / 5) / (1 << 20) + 64;
    let inodes = inodes + inodes / 4 + 1024;
    run(tool
        .args(["-q", "-F", "-T", "default", "-E", "root_owner=0:0"])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-d")
        .arg(tree)
        .arg(out)
        .arg(format!("{size_mib}M"))
        .limits(ToolLimits::writing(size_mib << 20)))
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_is_read_only_from_a_regular_file_never_through_a_link_or_a_fifo() {
        let dir = std::env::temp_dir().join(format!("ma-open-layer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("plain");
        std::fs::write(&plain, b"layer").unwrap();
        assert!(open_layer(&plain).is_ok());
        let link = dir.join("link");
        std::os::unix::fs::symlink(&plain, &link).unwrap();
        assert!(open_layer(&link).is_err());
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Refused at once, not waited on for a writer.
        let err = open_layer(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(open_layer(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A conversion waits for each layer; one that never comes (its pull
    /// failed) stops it before anything is unpacked.
    #[test]
    fn a_layer_that_never_arrives_stops_the_conversion() {
        let dir =
            std::env::temp_dir().join(format!("ma-convert-{}", crate::host::settings::unique_id()));
        let digest = format!("sha256:{}", "ab".repeat(32));
        let config = crate::images::oci::config::ImageConfig::parse(
            format!(
                r#"{{"os":"linux","architecture":"amd64","rootfs":{{"type":"layers","diff_ids":["{digest}"]}}}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        let image = Resolved {
            reference: None,
            manifest_digest: digest.clone(),
            config_digest: digest.clone(),
            config,
            layers: vec![(dir.join("never-written"), digest)],
            layers_verified: true,
        };
        let mut asked = Vec::new();
        let mut steps = Vec::new();
        let failed = convert(
            &image,
            &dir,
            &dir.join("no-base"),
            Budget::new(1 << 20, 100),
            &mut |step| steps.push(step),
            &mut |index| {
                asked.push(index);
                LayerArrival::Never
            },
        );
        assert!(
            matches!(failed, Err(OciError::LayerNotFetched(1))),
            "{failed:?}"
        );
        assert_eq!(asked, [0]);
        assert!(steps.is_empty(), "nothing applied: {steps:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A hostile image's links to the host (`etc -> outside`, a mount
    /// point and our own directory as links) change nothing outside the
    /// tree: an absolute link resolves inside it, top-level names are
    /// replaced, and a working directory above the root is refused.
    #[test]
    fn boot_files_and_the_working_directory_stay_in_the_tree() {
        let dir =
            std::env::temp_dir().join(format!("ma-rootfs-{}", crate::host::settings::unique_id()));
        let (tree, outside) = (dir.join("tree"), dir.join("outside"));
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::create_dir_all(outside.join("etc")).unwrap();
        std::fs::write(outside.join("etc/hosts"), "host's own").unwrap();
        std::os::unix::fs::symlink("hosts", outside.join("etc/resolv.conf")).unwrap();
        std::os::unix::fs::symlink(outside.join("etc"), tree.join("etc")).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("tmp")).unwrap();
        let image = ImageTree::open(&tree).unwrap();
        // `etc` names the host's directory by an absolute path, which
        // inside the image names nothing: the conversion stops.
        assert!(make_boot_files(&image).is_err());
        std::fs::remove_file(tree.join("etc")).unwrap();
        std::os::unix::fs::symlink("/private/etc", tree.join("etc")).unwrap();
        std::fs::create_dir_all(tree.join("private/etc")).unwrap();
        make_boot_files(&image).unwrap();
        assert!(std::fs::symlink_metadata(tree.join("tmp"))
            .unwrap()
            .is_dir());
        assert_eq!(
            std::fs::read_to_string(tree.join("private/etc/hosts")).unwrap(),
            "127.0.0.1\tlocalhost\n"
        );
        assert!(image.make_dir_path("/../../x").is_err());
        let made = image.make_dir_path("/etc/../app/data").unwrap();
        assert_eq!(made, tree.join("app/data"));
        assert_eq!(
            std::fs::read_to_string(outside.join("etc/hosts")).unwrap(),
            "host's own"
        );
        assert_eq!(
            std::fs::read_link(outside.join("etc/resolv.conf")).unwrap(),
            Path::new("hosts")
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
