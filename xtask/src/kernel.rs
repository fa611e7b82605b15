//! `cargo xtask guest-kernel`: Debian's linux-source-6.1, our config fragment
//! merged over tinyconfig, and for the `compat` variant our patches for hosts
//! that emulate guest kernel mode. Output: an uncompressed ELF vmlinux.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::cache::{self, InputHash};
use crate::sh;

/// Bump when the recipe below changes in a way the inputs do not show.
const RECIPE_VERSION: &str = "kernel-recipe-1";
const SOURCE_PACKAGE: &str = "linux-source-6.1";
const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.1.tar.xz";
const BUILD_PACKAGES: &[&str] = &[
    "linux-source-6.1",
    "build-essential",
    "flex",
    "bison",
    "bc",
    "libelf-dev",
    "libssl-dev",
    "xz-utils",
    "patch",
];

/// Which kernel: the VMM's own type, so xtask builds what the VMM boots.
pub type Variant = vmm_core::KernelVariant;

/// Parses `host`, `standard` or `compat`.
pub fn parse_variant(s: &str) -> anyhow::Result<Variant> {
    match s {
        "host" => variant_for_host(),
        other => Variant::from_name(other).with_context(|| {
            format!("unknown kernel variant `{other}` (host, standard or compat)")
        }),
    }
}

/// The variant this host needs, from the VMM's own probe.
pub fn variant_for_host() -> anyhow::Result<Variant> {
    let profile = vmm_core::host::probe()
        .context("probing KVM to pick the kernel variant (is /dev/kvm usable?)")?;
    eprintln!(
        "xtask: KVM here is {} ({:.1} ns per ring-0 loop iteration): {} kernel",
        profile.mode.name(),
        profile.ring0_ns_per_iteration,
        profile.kernel_variant()
    );
    Ok(profile.kernel_variant())
}

fn guest_dir() -> PathBuf {
    cache::repo_root().join("guest/kernel")
}

fn patches(variant: Variant) -> anyhow::Result<Vec<PathBuf>> {
    if variant == Variant::Standard {
        return Ok(Vec::new());
    }
    let dir = guest_dir().join("patches/compat");
    let mut list: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    list.sort();
    Ok(list)
}

/// Config lines of the fragment: `CONFIG_X=v` or `# CONFIG_X is not set`.
fn fragment_requirements(fragment: &str) -> Vec<(String, Option<String>)> {
    fragment
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            if let Some(rest) = l
                .strip_prefix("# ")
                .and_then(|r| r.strip_suffix(" is not set"))
            {
                Some((rest.to_owned(), None))
            } else if l.starts_with("CONFIG_") {
                let (k, v) = l.split_once('=')?;
                Some((k.to_owned(), Some(v.to_owned())))
            } else {
                None
            }
        })
        .collect()
}

/// Options of the fragment that the final .config does not honour.
fn unmet_requirements(fragment: &str, config: &str) -> Vec<String> {
    let set: std::collections::HashMap<&str, &str> = config
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.starts_with("CONFIG_"))
        .collect();
    fragment_requirements(fragment)
        .into_iter()
        .filter_map(|(key, want)| match (&want, set.get(key.as_str())) {
            (Some(v), Some(have)) if v == have => None,
            (None, None) => None,
            (None, Some(n)) if *n == "n" => None,
            (_, have) => Some(format!(
                "{key}: wanted {}, got {}",
                want.as_deref().unwrap_or("unset"),
                have.unwrap_or(&"unset")
            )),
        })
        .collect()
}

/// Builds (or finds in the cache) the kernel; returns the vmlinux path.
pub fn build(variant: Variant) -> anyhow::Result<PathBuf> {
    sh::ensure_debs(BUILD_PACKAGES)?;
    let source_version =
        sh::deb_version(SOURCE_PACKAGE).context("linux-source-6.1 is not installed")?;
    let fragment_path = guest_dir().join("config.fragment");
    let mut hash = InputHash::default();
    hash.add("recipe", RECIPE_VERSION.as_bytes())
        .add("variant", variant.name().as_bytes())
        .add("source", source_version.as_bytes());
    hash.add_file(&fragment_path)?;
    let patch_list = patches(variant)?;
    for p in &patch_list {
        hash.add_file(p)?;
    }
    let key = format!("{}-{}", variant.name(), hash.short());
    let out_dir = cache::root()?.join("kernel").join(&key);
    let vmlinux = out_dir.join("vmlinux");
    if vmlinux.is_file() {
        let link = cache::link_current(&variant.vmlinux_file(), &vmlinux)?;
        eprintln!(
            "xtask: {} kernel is cached: {}",
            variant.name(),
            link.display()
        );
        println!("{}", vmlinux.display());
        return Ok(vmlinux);
    }

    let build_dir = cache::root()?.join("build").join(format!("linux-{key}"));
    if build_dir.exists() {
        std::fs::remove_dir_all(&build_dir)?;
    }
    std::fs::create_dir_all(&build_dir)?;
    eprintln!(
        "xtask: building the {} kernel in {} (several minutes)",
        variant.name(),
        build_dir.display()
    );
    sh::run(
        Command::new("tar")
            .args(["-xf", SOURCE_TARBALL, "--strip-components=1", "-C"])
            .arg(&build_dir),
    )?;
    for p in &patch_list {
        eprintln!(
            "xtask: applying {}",
            p.file_name().unwrap_or_default().to_string_lossy()
        );
        sh::run(
            Command::new("patch")
                .args(["-p1", "--forward", "--batch", "--quiet", "-i"])
                .arg(p)
                .current_dir(&build_dir),
        )?;
    }
    let make = |args: &[&str]| -> anyhow::Result<()> {
        sh::run(
            Command::new("make")
                .args(args)
                .current_dir(&build_dir)
                .stdout(std::process::Stdio::null()),
        )
    };
    make(&["tinyconfig"])?;
    sh::run(
        Command::new("scripts/kconfig/merge_config.sh")
            .args(["-m", ".config"])
            .arg(&fragment_path)
            .current_dir(&build_dir)
            .stdout(std::process::Stdio::null()),
    )?;
    make(&["olddefconfig"])?;
    let fragment = std::fs::read_to_string(&fragment_path)?;
    let config = std::fs::read_to_string(build_dir.join(".config"))?;
    let unmet = unmet_requirements(&fragment, &config);
    if !unmet.is_empty() {
        bail!("the kernel config does not honour guest/kernel/config.fragment (a dependency overrides it):\n  {}", unmet.join("\n  "));
    }
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    sh::run(
        Command::new("make")
            .args([format!("-j{jobs}"), "vmlinux".into()])
            .env("KBUILD_BUILD_USER", "microagent")
            .env("KBUILD_BUILD_HOST", "xtask")
            .current_dir(&build_dir),
    )?;
    install(&build_dir, &out_dir)?;
    std::fs::remove_dir_all(&build_dir)?;
    let link = cache::link_current(&variant.vmlinux_file(), &vmlinux)?;
    eprintln!("xtask: {} kernel built: {}", variant.name(), link.display());
    println!("{}", vmlinux.display());
    Ok(vmlinux)
}

fn install(build_dir: &Path, out_dir: &Path) -> anyhow::Result<()> {
    let staging = out_dir.with_extension("partial");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    std::fs::create_dir_all(&staging)?;
    std::fs::copy(build_dir.join("vmlinux"), staging.join("vmlinux"))?;
    std::fs::copy(build_dir.join(".config"), staging.join("config"))?;
    std::fs::rename(&staging, out_dir)
        .with_context(|| format!("installing into {}", out_dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_parsing_and_checking() {
        let fragment = "# comment\nCONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=32\n";
        assert_eq!(fragment_requirements(fragment).len(), 3);
        assert!(
            unmet_requirements(fragment, "CONFIG_A=y\nCONFIG_C=32\n# CONFIG_B is not set\n")
                .is_empty()
        );
        let unmet = unmet_requirements(fragment, "CONFIG_A=y\nCONFIG_B=y\n");
        assert_eq!(unmet.len(), 2, "{unmet:?}");
    }

    #[test]
    fn checked_in_fragment_and_patches_exist() {
        let fragment = std::fs::read_to_string(guest_dir().join("config.fragment")).unwrap();
        let reqs = fragment_requirements(&fragment);
        for key in [
            "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES",
            "CONFIG_DEVTMPFS",
            "CONFIG_EXT4_FS",
            "CONFIG_VIRTIO_VSOCKETS",
        ] {
            assert!(
                reqs.iter()
                    .any(|(k, v)| k == key && v.as_deref() == Some("y")),
                "{key}"
            );
        }
        for key in ["CONFIG_LEGACY_PTYS", "CONFIG_IPV6"] {
            assert!(reqs.iter().any(|(k, v)| k == key && v.is_none()), "{key}");
        }
        assert_eq!(patches(Variant::Compat).unwrap().len(), 4);
        assert!(patches(Variant::Standard).unwrap().is_empty());
    }
}
