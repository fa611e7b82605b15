//! `cargo xtask dist --bundle`: the release tarball
//! `microagent-VERSION-x86_64-linux.tar.gz`, a tree to unpack (or
//! `install.sh --prefix DIR`) into a prefix:
//!
//! - `bin/`: `microagent`, `microagent-vmm`, containerd's shim;
//! - `libexec/microagent/`: the guest's agent and init (images are built
//!   from them);
//! - `share/microagent/`: the guest kernels and the `minimal` image, which
//!   the binary copies into the user's asset cache when it has none, so
//!   `microagent run` works with no setup and no Rust toolchain;
//! - completions (bash, zsh, fish), man pages, a hardened systemd unit
//!   for `serve mcp --http`, LICENSE, README.
//!
//! `--binaries DIR` bundles binaries built elsewhere (the tests bundle
//! their debug build rather than spend a release build); `--kernels host`
//! carries only this host's kernel variant.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::{cache, dist, kernel, sh};
use workspace::host::bundle::{LIBEXEC_DIR, SHARE_DIR};

/// What the bundle is made of.
struct Options {
    binaries: Option<PathBuf>,
    all_kernels: bool,
    out: PathBuf,
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        binaries: None,
        all_kernels: true,
        out: dist::dir(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--binaries" => o.binaries = Some(PathBuf::from(value()?)),
            "--kernels" => {
                o.all_kernels = match value()?.as_str() {
                    "all" => true,
                    "host" => false,
                    other => bail!("--kernels is host or all, not `{other}`"),
                }
            }
            "--out" => o.out = PathBuf::from(value()?),
            other => {
                bail!("unknown option `{other}` (--binaries DIR, --kernels host|all, --out DIR)")
            }
        }
    }
    Ok(o)
}

/// Builds the bundle; prints the tarball's path.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse(args)?;
    let binaries = match &options.binaries {
        Some(dir) => dir.clone(),
        None => dist::build_with_shim()?
            .parent()
            .context("dist's directory")?
            .to_path_buf(),
    };
    let tarball = make(&binaries, options.all_kernels, &options.out)?;
    println!("{}", tarball.display());
    Ok(())
}

/// Lays the bundle out in `out` and packs it; the tarball's path.
fn make(binaries: &Path, all_kernels: bool, out: &Path) -> anyhow::Result<PathBuf> {
    let cli = binaries.join(dist::BINARIES[0]);
    let version = version_of(&cli)?;
    let name = format!("microagent-{version}-x86_64-linux");
    let tree = out.join(&name);
    if tree.exists() {
        std::fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    eprintln!("xtask: laying out {}", tree.display());
    let bin = tree.join("bin");
    std::fs::create_dir_all(&bin)?;
    for binary in dist::BINARIES {
        copy(&binaries.join(binary), &bin.join(binary))?;
    }
    dist::guest_helpers(&tree.join(LIBEXEC_DIR))?;
    share_assets(&tree.join(SHARE_DIR), all_kernels)?;
    generated_docs(&tree)?;
    let repo = cache::repo_root();
    for (from, to) in [
        ("LICENSE", "LICENSE"),
        ("LICENSE", "share/doc/microagent/LICENSE"),
        ("README.md", "share/doc/microagent/README.md"),
        ("packaging/install.sh", "install.sh"),
        (
            "packaging/microagent-mcp.service",
            "lib/systemd/system/microagent-mcp.service",
        ),
    ] {
        copy(&repo.join(from), &tree.join(to))?;
    }
    let tarball = out.join(format!("{name}.tar.gz"));
    eprintln!("xtask: packing {}", tarball.display());
    sh::run(
        Command::new("tar")
            .args(["--sparse", "--owner=0", "--group=0", "--numeric-owner"])
            .args(["--sort=name", "-czf"])
            .arg(&tarball)
            .arg("-C")
            .arg(out)
            .arg(&name),
    )?;
    Ok(tarball)
}

/// `microagent --version` is `microagent X.Y.Z`.
fn version_of(cli: &Path) -> anyhow::Result<String> {
    let out = Command::new(cli)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", cli.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().collect::<Vec<_>>()[..] {
        ["microagent", version] => Ok(version.to_owned()),
        _ => bail!("{} --version said {text:?}", cli.display()),
    }
}

/// Copies `from` to `to` (parents made), holes kept, mode kept.
fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)?;
    }
    sh::run(
        Command::new("cp")
            .args(["--sparse=always", "--preserve=mode", "-L"])
            .arg(from)
            .arg(to),
    )
    .with_context(|| format!("copying {}", from.display()))
}

/// The kernels and the `minimal` image, named as in the cache's
/// `current/` (the image's rootfs a link into `images/minimal/`, its
/// manifest beside it, as the image registry reads a built image).
fn share_assets(share: &Path, all_kernels: bool) -> anyhow::Result<()> {
    let variants = if all_kernels {
        workspace::KernelVariant::ALL.to_vec()
    } else {
        vec![kernel::variant_for_host()?]
    };
    for variant in variants {
        let vmlinux = kernel::build(variant)?;
        copy(&vmlinux, &share.join(variant.vmlinux_file()))?;
    }
    let rootfs = crate::images::minimal_image()?;
    let image = share.join("images/minimal");
    copy(&rootfs, &image.join("rootfs.ext4"))?;
    let manifest = rootfs.with_file_name("manifest.json");
    copy(&manifest, &image.join("manifest.json"))?;
    std::os::unix::fs::symlink(
        "images/minimal/rootfs.ext4",
        share.join("rootfs-minimal.ext4"),
    )
    .context("linking rootfs-minimal.ext4")?;
    Ok(())
}

/// Completions and man pages, written by the bundled binary itself.
fn generated_docs(tree: &Path) -> anyhow::Result<()> {
    let cli = tree.join("bin").join(dist::BINARIES[0]);
    for (shell, path) in [
        ("bash", "share/bash-completion/completions/microagent"),
        ("zsh", "share/zsh/site-functions/_microagent"),
        ("fish", "share/fish/vendor_completions.d/microagent.fish"),
    ] {
        let out = Command::new(&cli)
            .args(["completion", shell])
            .output()
            .context("running microagent completion")?;
        if !out.status.success() || out.stdout.is_empty() {
            bail!(
                "microagent completion {shell} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let path = tree.join(path);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        std::fs::write(&path, &out.stdout)?;
    }
    let man = tree.join("share/man/man1");
    sh::run(Command::new(&cli).arg("man").arg("--out").arg(&man))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let o = parse(&[]).unwrap();
        assert!(o.all_kernels && o.binaries.is_none());
        let args: Vec<String> = ["--binaries", "/b", "--kernels", "host", "--out", "/o"]
            .map(String::from)
            .to_vec();
        let o = parse(&args).unwrap();
        assert_eq!(o.binaries.as_deref(), Some(Path::new("/b")));
        assert!(!o.all_kernels);
        assert_eq!(o.out, Path::new("/o"));
        assert!(parse(&["--kernels".into(), "some".into()]).is_err());
        assert!(parse(&["--binaries".into()]).is_err());
        assert!(parse(&["--other".into()]).is_err());
    }
}
