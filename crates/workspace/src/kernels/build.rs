//! Building the guest kernel from Debian's `linux-source-6.1`: our config
//! fragment merged over tinyconfig and, for the `compat` variant, our
//! patches for hosts that emulate guest kernel mode. The fragment and the
//! patches are compiled into this crate, so an installed binary builds the
//! same kernel as a checkout (and `cargo xtask guest-kernel` calls this).
//! Output: an uncompressed ELF vmlinux in the asset cache,
//! `<cache>/kernel/<variant>-<hash16>/{vmlinux,config}`, linked from
//! `<cache>/current/vmlinux-<variant>`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use vmm_core::KernelVariant;

use crate::host::assets::{self, AssetError, InputHash};

/// Bump when the recipe changes in a way the inputs do not show.
const RECIPE_VERSION: &str = "kernel-recipe-1";
/// The Debian package with the source.
pub const SOURCE_PACKAGE: &str = "linux-source-6.1";
const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.1.tar.xz";
/// Debian packages the build needs.
pub const BUILD_PACKAGES: &[&str] = &[
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
/// Roughly what a build takes on one core (measured: 3 min 49 s on two).
pub const CPU_SECONDS: u64 = 460;
/// Peak disk use of a build: the extracted source (~1.4 GB) and objects.
pub const BUILD_DISK_BYTES: u64 = 1_700 << 20;
/// Roughly how many objects `make vmlinux` compiles with our config, for
/// a progress fraction (the count shown is exact).
const EXPECTED_OBJECTS: u64 = 880;

/// The fragment, labelled as xtask labelled it (so cache keys match).
const FRAGMENT: (&str, &str) = (
    "guest/kernel/config.fragment",
    include_str!("../../../../guest/kernel/config.fragment"),
);
/// The compat patches, in order.
const COMPAT_PATCHES: &[(&str, &str)] = &[
    (
        "guest/kernel/patches/compat/0001-syscall-via-page-fault.patch",
        include_str!("../../../../guest/kernel/patches/compat/0001-syscall-via-page-fault.patch"),
    ),
    (
        "guest/kernel/patches/compat/0002-skip-int3-selftest.patch",
        include_str!("../../../../guest/kernel/patches/compat/0002-skip-int3-selftest.patch"),
    ),
    (
        "guest/kernel/patches/compat/0003-no-fwait-in-fpu-drop.patch",
        include_str!("../../../../guest/kernel/patches/compat/0003-no-fwait-in-fpu-drop.patch"),
    ),
    (
        "guest/kernel/patches/compat/0004-extended-fpu-state-through-the-vmm.patch",
        include_str!(
            "../../../../guest/kernel/patches/compat/0004-extended-fpu-state-through-the-vmm.patch"
        ),
    ),
];

/// Why the kernel was not built.
#[derive(Debug, thiserror::Error)]
pub enum KernelBuildError {
    /// A Debian package the build needs is not installed.
    #[error("Debian packages missing for the kernel build: {}", packages.join(" "))]
    MissingPackages {
        /// The packages.
        packages: Vec<String>,
    },
    /// The cache could not be written.
    #[error(transparent)]
    Asset(#[from] AssetError),
    /// A file of the build could not be read or written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A build command failed.
    #[error("{step} failed ({status}); the end of its output:\n{tail}")]
    Command {
        /// The step (`make vmlinux`).
        step: String,
        /// How it ended.
        status: String,
        /// Its last lines.
        tail: String,
    },
    /// The final .config lost options of our fragment (a dependency
    /// overrides them).
    #[error("the kernel config does not honour the config fragment: {}", unmet.join("; "))]
    ConfigUnmet {
        /// `CONFIG_X: wanted y, got unset` lines.
        unmet: Vec<String>,
    },
}

impl KernelBuildError {
    /// The stable code front ends report.
    pub fn code(&self) -> base::code::ErrorCode {
        match self {
            Self::MissingPackages { .. } => base::code::ErrorCode::HostUnsupported,
            _ => base::code::ErrorCode::Internal,
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> KernelBuildError {
    let path = path.to_owned();
    move |source| KernelBuildError::Io { what, path, source }
}

/// The patches of `variant`: (label, text).
pub fn patches(variant: KernelVariant) -> &'static [(&'static str, &'static str)] {
    match variant {
        KernelVariant::Standard => &[],
        KernelVariant::Compat => COMPAT_PATCHES,
    }
}

/// The build packages that are not installed.
pub fn missing_packages() -> Vec<String> {
    base::host::settings::missing_debs(BUILD_PACKAGES)
}

/// The cache key of `variant` built from source version `source`:
/// `<variant>-<hash16>`.
pub fn cache_key(variant: KernelVariant, source: &str) -> String {
    let mut hash = InputHash::default();
    hash.add("recipe", RECIPE_VERSION.as_bytes())
        .add("variant", variant.name().as_bytes())
        .add("source", source.as_bytes());
    hash.add(FRAGMENT.0, FRAGMENT.1.as_bytes());
    for (label, text) in patches(variant) {
        hash.add(label, text.as_bytes());
    }
    format!("{}-{}", variant.name(), hash.short())
}

/// Where the build of `key` lives in the cache.
pub fn cached_dir(root: &Path, key: &str) -> PathBuf {
    root.join("kernel").join(key)
}

/// Builds the kernel of `variant` into the cache (or finds it there),
/// links it as the current one and returns the vmlinux. `progress` hears
/// each step and, while compiling, the count of objects compiled.
pub fn build(
    variant: KernelVariant,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, KernelBuildError> {
    let missing = missing_packages();
    if !missing.is_empty() {
        return Err(KernelBuildError::MissingPackages { packages: missing });
    }
    let root = assets::cache_root()?;
    let source = base::host::settings::deb_version(SOURCE_PACKAGE).unwrap_or_default();
    let key = cache_key(variant, &source);
    let out_dir = cached_dir(&root, &key);
    let vmlinux = out_dir.join("vmlinux");
    if !vmlinux.is_file() {
        let build_dir = root
            .join("build")
            .join(format!("linux-{key}-{}", base::host::settings::unique_id()));
        let built = compile(variant, &build_dir, &out_dir, progress);
        let _ = std::fs::remove_dir_all(&build_dir);
        built?;
    }
    assets::link_current(&root, &variant.vmlinux_file(), &vmlinux)?;
    Ok(vmlinux)
}

fn compile(
    variant: KernelVariant,
    build_dir: &Path,
    out_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), KernelBuildError> {
    std::fs::create_dir_all(build_dir).map_err(io("creating", build_dir))?;
    progress("extracting the kernel source");
    run(
        "extracting the source",
        Command::new("tar")
            .args(["-xf", SOURCE_TARBALL, "--strip-components=1", "-C"])
            .arg(build_dir),
    )?;
    let inputs = build_dir.join(".microagent");
    std::fs::create_dir_all(&inputs).map_err(io("creating", &inputs))?;
    for (label, text) in patches(variant) {
        let name = label.rsplit('/').next().unwrap_or(label);
        progress(&format!("applying {name}"));
        let file = inputs.join(name);
        std::fs::write(&file, text).map_err(io("writing", &file))?;
        run(
            &format!("applying {name}"),
            Command::new("patch")
                .args(["-p1", "--forward", "--batch", "--quiet", "-i"])
                .arg(&file)
                .current_dir(build_dir),
        )?;
    }
    progress("configuring (tinyconfig and our fragment)");
    let fragment = inputs.join("config.fragment");
    std::fs::write(&fragment, FRAGMENT.1).map_err(io("writing", &fragment))?;
    run(
        "make tinyconfig",
        Command::new("make")
            .arg("tinyconfig")
            .current_dir(build_dir),
    )?;
    run(
        "merging the config fragment",
        Command::new("scripts/kconfig/merge_config.sh")
            .args(["-m", ".config"])
            .arg(&fragment)
            .current_dir(build_dir),
    )?;
    run(
        "make olddefconfig",
        Command::new("make")
            .arg("olddefconfig")
            .current_dir(build_dir),
    )?;
    let config_path = build_dir.join(".config");
    let config = std::fs::read_to_string(&config_path).map_err(io("reading", &config_path))?;
    let unmet = unmet_requirements(FRAGMENT.1, &config);
    if !unmet.is_empty() {
        return Err(KernelBuildError::ConfigUnmet { unmet });
    }
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    progress(&format!("compiling with {jobs} jobs"));
    make_vmlinux(build_dir, jobs, progress)?;
    progress("installing into the cache");
    let staging = out_dir.with_extension(format!("partial-{}", base::host::settings::unique_id()));
    std::fs::create_dir_all(&staging).map_err(io("creating", &staging))?;
    let installed = (|| {
        let vmlinux = build_dir.join("vmlinux");
        std::fs::copy(&vmlinux, staging.join("vmlinux")).map_err(io("copying", &vmlinux))?;
        std::fs::copy(&config_path, staging.join("config")).map_err(io("copying", &config_path))?;
        if let Some(parent) = out_dir.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        match std::fs::rename(&staging, out_dir) {
            Ok(()) => Ok(()),
            // Another build finished first with the same inputs.
            Err(_) if out_dir.join("vmlinux").is_file() => Ok(()),
            Err(e) => Err(io("installing", out_dir)(e)),
        }
    })();
    let _ = std::fs::remove_dir_all(&staging);
    installed
}

/// `make -jN vmlinux`, counting the objects it compiles for `progress`.
fn make_vmlinux(
    build_dir: &Path,
    jobs: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<(), KernelBuildError> {
    let log_path = build_dir.join(".microagent/make.log");
    let log = std::fs::File::create(&log_path).map_err(io("creating", &log_path))?;
    let mut child = Command::new("make")
        .args([format!("-j{jobs}"), "vmlinux".into()])
        .env("KBUILD_BUILD_USER", "microagent")
        .env("KBUILD_BUILD_HOST", "microagent")
        .current_dir(build_dir)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(io("running make in", build_dir))?;
    let mut compiled = 0u64;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.trim_start().starts_with("CC ") {
                compiled += 1;
                if compiled.is_multiple_of(50) {
                    let pct = (compiled * 100 / EXPECTED_OBJECTS).min(99);
                    progress(&format!("compiling: {compiled} objects (~{pct}%)"));
                }
            }
        }
    }
    let status = child.wait().map_err(io("waiting for make in", build_dir))?;
    if status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    Err(KernelBuildError::Command {
        step: "make vmlinux".into(),
        status: status.to_string(),
        tail: tail(&text, 20),
    })
}

/// Runs one build step, keeping its output for the error.
fn run(step: &str, cmd: &mut Command) -> Result<(), KernelBuildError> {
    let out = cmd.output().map_err(|e| KernelBuildError::Command {
        step: step.to_owned(),
        status: "not started".into(),
        tail: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Err(KernelBuildError::Command {
        step: step.to_owned(),
        status: out.status.to_string(),
        tail: tail(&text, 20),
    })
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
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
    let set: HashMap<&str, &str> = config
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
    fn the_fragment_asks_for_what_the_vmm_needs() {
        let reqs = fragment_requirements(FRAGMENT.1);
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
    }

    /// A patch added to the checkout but not compiled in would be built
    /// by nobody: the embedded list is the directory's.
    #[test]
    fn every_checked_in_patch_is_compiled_in() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/kernel/patches/compat");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".patch"))
            .collect();
        on_disk.sort();
        let embedded: Vec<&str> = COMPAT_PATCHES
            .iter()
            .map(|(label, _)| label.rsplit('/').next().unwrap())
            .collect();
        assert_eq!(on_disk, embedded);
        assert!(patches(KernelVariant::Standard).is_empty());
    }

    #[test]
    fn keys_depend_on_variant_and_source() {
        let a = cache_key(KernelVariant::Compat, "6.1.1");
        assert!(a.starts_with("compat-") && a.len() == "compat-".len() + 16);
        assert_ne!(a, cache_key(KernelVariant::Compat, "6.1.2"));
        assert_ne!(
            cache_key(KernelVariant::Standard, "6.1.1")[9..],
            a["compat-".len()..]
        );
    }

    #[test]
    fn tails_keep_the_last_lines() {
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
