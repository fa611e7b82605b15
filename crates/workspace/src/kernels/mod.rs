//! Kernel install, preview-then-confirm ([`base::host::plan`]): build the
//! kernel variant this host needs from Debian's source
//! ([`build`]), or install a kernel file after checking that
//! it boots the `minimal` image. Without a token nothing changes and the
//! exact plan comes back (packages, disk, time, files written); with the
//! plan's token it is applied.

pub mod build;
pub mod install;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use vmm_core::KernelVariant;

use crate::host::assets;
use crate::kernels::build as kernel_build;
use base::host::plan::{Plan, Preview};

/// The image a kernel file is checked with.
pub const CHECK_IMAGE: &str = "minimal";
/// How long the check boot may take (a cold boot is ~30 s on a host that
/// emulates guest kernel mode).
pub(crate) const CHECK_BOOT_TIMEOUT: Duration = Duration::from_secs(240);
/// What a check boot costs here beyond the boot, roughly.
const CHECK_SECONDS: u64 = 45;

/// Where the kernel comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// Built from Debian's `linux-source-6.1` with our config and patches.
    FromSource,
    /// A kernel file (ELF vmlinux or bzImage), checked by booting it.
    File(PathBuf),
}

/// Why a kernel was not installed.
#[derive(Debug, thiserror::Error)]
pub enum KernelInstallError {
    /// The file is not a kernel.
    #[error("{} is not a kernel: {problem}", path.display())]
    NotAKernel {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The kernel did not boot the check image to a working agent.
    #[error("{} did not boot the `{CHECK_IMAGE}` image: {reason}", path.display())]
    BootCheck {
        /// The file.
        path: PathBuf,
        /// What happened.
        reason: String,
    },
    /// The build failed.
    #[error(transparent)]
    Build(#[from] kernel_build::KernelBuildError),
    /// The cache could not be written.
    #[error(transparent)]
    Asset(#[from] assets::AssetError),
}

impl crate::error::ConcernError for KernelInstallError {
    fn code(&self) -> base::code::ErrorCode {
        match self {
            Self::NotAKernel { .. } | Self::BootCheck { .. } => base::code::ErrorCode::InvalidInput,
            Self::Build(e) => e.code(),
            Self::Asset(_) => base::code::ErrorCode::Internal,
        }
    }
}

impl From<KernelInstallError> for crate::error::Error {
    fn from(e: KernelInstallError) -> Self {
        crate::error::Error::KernelInstall(crate::error::ConcernFailure::new(e))
    }
}

/// A kernel install: the plan, its token, and what was installed.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct KernelInstall {
    /// The plan and its token (no token when applied or nothing to do).
    #[serde(flatten)]
    pub preview: Preview,
    /// It was applied (false: a preview).
    pub applied: bool,
    /// The installed kernel file, when applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<PathBuf>,
    /// Its version banner, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// What a source build depends on in this host's packages.
#[derive(Clone, Debug, Default)]
pub(crate) struct SourceHost {
    /// The installed `linux-source-6.1` version.
    pub(crate) source: Option<String>,
    /// Build packages not installed.
    pub(crate) missing: Vec<String>,
    /// Parallel jobs.
    pub(crate) jobs: u64,
}

impl SourceHost {
    pub(crate) fn probe() -> Self {
        Self {
            source: base::host::settings::deb_version(kernel_build::SOURCE_PACKAGE),
            missing: kernel_build::missing_packages(),
            jobs: std::thread::available_parallelism().map_or(2, |n| n.get()) as u64,
        }
    }
}

/// The plan that makes `variant` from source current.
pub(crate) fn source_plan(root: &Path, variant: KernelVariant, host: &SourceHost) -> Plan {
    let mut plan = Plan::new("kernel install");
    let link = root.join("current").join(variant.vmlinux_file());
    let built = host
        .source
        .as_deref()
        .map(|s| {
            kernel_build::cached_dir(root, &kernel_build::cache_key(variant, s)).join("vmlinux")
        })
        .filter(|v| v.is_file());
    if let Some(built) = built {
        if std::fs::canonicalize(&link).ok() == std::fs::canonicalize(&built).ok() {
            plan.notes.push(format!(
                "the {variant} kernel is built and current: {}",
                built.display()
            ));
        } else {
            plan.writes.push(link.display().to_string());
            plan.notes.push(format!(
                "links the built {variant} kernel {}",
                built.display()
            ));
        }
        return plan;
    }
    let missing = &host.missing;
    plan.install_packages(missing);
    let out = match &host.source {
        Some(source) => {
            let dir = kernel_build::cached_dir(root, &kernel_build::cache_key(variant, source));
            plan.notes.push(format!(
                "builds Linux from {} {source}: tinyconfig, our config fragment{}",
                kernel_build::SOURCE_PACKAGE,
                match kernel_build::patches(variant).len() {
                    0 => String::new(),
                    n => format!(" and {n} patches for hosts that emulate guest kernel mode"),
                }
            ));
            dir.display().to_string()
        }
        None => format!(
            "{}/{}-<hash of the source version, known once it is installed>",
            root.join("kernel").display(),
            variant.name()
        ),
    };
    plan.writes.push(format!("{out}/vmlinux"));
    plan.writes.push(format!("{out}/config"));
    plan.writes.push(link.display().to_string());
    plan.notes.push(format!(
        "compiles in {} (removed afterwards)",
        root.join("build").display()
    ));
    plan.disk_bytes = kernel_build::BUILD_DISK_BYTES;
    let installs = if missing.is_empty() { 0 } else { 60 };
    plan.estimate_seconds = kernel_build::CPU_SECONDS / host.jobs.max(1) + installs;
    plan
}

/// The plan that installs the kernel file `file` as `variant`'s.
pub(crate) fn file_plan(
    root: &Path,
    variant: KernelVariant,
    file: &Path,
    sha: &str,
    bytes: u64,
) -> Plan {
    let mut plan = Plan::new("kernel install");
    let vmlinux = file_dir(root, sha).join("vmlinux");
    let link = root.join("current").join(variant.vmlinux_file());
    if vmlinux.is_file()
        && std::fs::canonicalize(&link).ok() == std::fs::canonicalize(&vmlinux).ok()
    {
        plan.notes.push(format!(
            "{} is installed and current: {}",
            file.display(),
            vmlinux.display()
        ));
        return plan;
    }
    plan.writes.push(vmlinux.display().to_string());
    plan.writes.push(link.display().to_string());
    plan.notes.push(format!(
        "boots {} with the `{CHECK_IMAGE}` image and runs `uname -r` in it before installing (sha256 {sha})",
        file.display()
    ));
    plan.disk_bytes = bytes;
    plan.estimate_seconds = CHECK_SECONDS;
    plan
}

pub(crate) fn file_dir(root: &Path, sha: &str) -> PathBuf {
    root.join("kernel")
        .join(format!("file-{}", &sha[..16.min(sha.len())]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_plan_writes_the_kernel_and_the_link_only() {
        let root = Path::new("/c");
        let plan = file_plan(
            root,
            KernelVariant::Compat,
            Path::new("/k/vmlinux"),
            &"ab".repeat(32),
            4096,
        );
        assert_eq!(
            plan.writes,
            [
                "/c/kernel/file-abababababababab/vmlinux",
                "/c/current/vmlinux-compat"
            ]
        );
        assert!(plan.steps.is_empty() && !plan.needs_root);
        assert_eq!(plan.disk_bytes, 4096);
        assert!(plan.notes[0].contains("uname -r"), "{:?}", plan.notes);
    }

    #[test]
    fn a_source_plan_installs_missing_packages_then_builds() {
        let root = Path::new("/c");
        let bare = SourceHost {
            source: None,
            missing: vec!["flex".into(), "linux-source-6.1".into()],
            jobs: 2,
        };
        let plan = source_plan(root, KernelVariant::Compat, &bare);
        assert_eq!(plan.action, "kernel install");
        assert_eq!(plan.steps.len(), 2, "apt-get update, then install");
        assert_eq!(plan.packages, ["flex", "linux-source-6.1"]);
        assert!(plan.needs_root);
        // The key needs the source version, not installed yet.
        assert!(
            plan.writes[0].starts_with("/c/kernel/compat-<hash"),
            "{:?}",
            plan.writes
        );
        assert_eq!(plan.writes[2], "/c/current/vmlinux-compat");
        assert!(plan.disk_bytes >= 1 << 30);
        assert_eq!(plan.estimate_seconds, kernel_build::CPU_SECONDS / 2 + 60);

        let ready = SourceHost {
            source: Some("6.1.1".into()),
            missing: vec![],
            jobs: 2,
        };
        let plan = source_plan(root, KernelVariant::Compat, &ready);
        let key = kernel_build::cache_key(KernelVariant::Compat, "6.1.1");
        assert_eq!(plan.writes[0], format!("/c/kernel/{key}/vmlinux"));
        assert!(plan.steps.is_empty() && !plan.needs_root);
        assert!(plan.notes[0].contains("4 patches"), "{:?}", plan.notes);
    }

    #[test]
    fn a_built_kernel_is_only_linked_and_then_needs_nothing() {
        let root =
            std::env::temp_dir().join(format!("ma-kplan-{}", base::host::settings::unique_id()));
        let host = SourceHost {
            source: Some("6.1.1".into()),
            missing: vec![],
            jobs: 2,
        };
        let key = kernel_build::cache_key(KernelVariant::Standard, "6.1.1");
        let dir = kernel_build::cached_dir(&root, &key);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vmlinux"), b"\x7fELF").unwrap();
        let plan = source_plan(&root, KernelVariant::Standard, &host);
        assert_eq!(plan.writes.len(), 1, "only the link: {:?}", plan.writes);
        assert!(!plan.is_empty());
        assets::link_current(&root, "vmlinux-standard", &dir.join("vmlinux")).unwrap();
        let plan = source_plan(&root, KernelVariant::Standard, &host);
        assert!(plan.is_empty(), "{plan:?}");
        let _ = std::fs::remove_dir_all(root);
    }
}
