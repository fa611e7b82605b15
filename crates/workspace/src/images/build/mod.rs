//! Image builds, preview-then-confirm ([`base::host::plan`]): a new image from
//! Debian packages (`debian:SUITE`, by mmdebstrap, as root or in the
//! caller's subordinate ids) or on top of a
//! registered image, by booting it in a throwaway workspace, copying files
//! in, running commands there, and saving its whole root filesystem (a tar
//! streamed out of the guest) as the new image. Both end as container
//! images do: our init and agent under `/.microagent/`, the `minimal`
//! image's kernel. Nothing is registered unless every step succeeded.

pub mod debian;
pub mod minimal;
mod run;
mod steps;

use std::path::{Path, PathBuf};

use serde::Serialize;

use base::host::plan::{Plan, Preview};
use base::images::registry::ImageInfo;

/// Why an image was not built.
#[derive(Debug, thiserror::Error)]
pub enum ImageBuildError {
    /// The request is not one we can build.
    #[error("{0}")]
    Request(String),
    /// A `--copy` source is not on the host.
    #[error("copy source {} does not exist on the host", path.display())]
    CopySource {
        /// The path.
        path: PathBuf,
    },
    /// A command of the build failed in the guest; nothing was registered.
    #[error("step {step} (`{command}`) failed ({how}): {stderr}")]
    StepFailed {
        /// 1-based step number.
        step: usize,
        /// The command.
        command: String,
        /// `exit code 2`, `signal 9`, `timed out`.
        how: String,
        /// The end of its stderr.
        stderr: String,
    },
    /// A build without root found no subordinate ids of the caller's.
    #[error("building a Debian image without root needs subordinate ids for {user}, and {file} has none")]
    NoSubordinateIds {
        /// The user.
        user: String,
        /// The file without a range for them.
        file: String,
        /// A range no user has (`FIRST-LAST`).
        free: String,
    },
    /// mmdebstrap failed.
    #[error("mmdebstrap failed ({status}); the end of its output:\n{tail}")]
    Bootstrap {
        /// How it ended.
        status: String,
        /// Its last lines.
        tail: String,
    },
    /// A host file of the build could not be written.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The saved root filesystem could not be converted.
    #[error("converting the saved root filesystem")]
    Convert(#[from] base::images::oci::OciError),
}

impl crate::error::ConcernError for ImageBuildError {
    fn code(&self) -> base::code::ErrorCode {
        match self {
            Self::Request(_) | Self::CopySource { .. } | Self::StepFailed { .. } => {
                base::code::ErrorCode::InvalidInput
            }
            Self::Convert(e) => e.code(),
            Self::NoSubordinateIds { .. } => base::code::ErrorCode::HostUnsupported,
            Self::Bootstrap { .. } | Self::Io { .. } => base::code::ErrorCode::Internal,
        }
    }

    fn remedy(&self) -> Option<base::remedy::Remedy> {
        match self {
            Self::NoSubordinateIds { user, free, .. } => {
                Some(base::remedy::Remedy::GrantSubordinateIds {
                    user: user.clone(),
                    free: free.clone(),
                })
            }
            _ => None,
        }
    }
}

impl From<ImageBuildError> for crate::error::Error {
    fn from(e: ImageBuildError) -> Self {
        crate::error::Error::ImageBuild(crate::error::ConcernFailure::new(e))
    }
}

/// What a build starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildBase {
    /// `debian:SUITE`: Debian packages, by mmdebstrap.
    Debian(String),
    /// A registered image.
    Image(String),
}

impl BuildBase {
    /// `debian:bookworm` or an image name.
    pub fn parse(from: &str) -> std::result::Result<Self, ImageBuildError> {
        if let Some(suite) = from.strip_prefix("debian:") {
            if !debian::valid_suite(suite) {
                return Err(ImageBuildError::Request(format!(
                    "`{suite}` is not a Debian suite name (bookworm, trixie)"
                )));
            }
            return Ok(Self::Debian(suite.to_owned()));
        }
        base::store::name::validate_name(from)
            .map_err(|e| ImageBuildError::Request(format!("--from {from}: {e}")))?;
        Ok(Self::Image(from.to_owned()))
    }
}

/// A host file or directory copied into the build workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct CopyStep {
    /// On the host.
    pub from: PathBuf,
    /// In the guest (absolute).
    pub to: String,
}

impl CopyStep {
    /// `SRC:DST` (DST absolute; SRC may hold colons).
    pub fn parse(spec: &str) -> std::result::Result<Self, ImageBuildError> {
        match spec.rsplit_once(":/") {
            Some((from, to)) if !from.is_empty() => Ok(Self {
                from: PathBuf::from(from),
                to: format!("/{to}"),
            }),
            _ => Err(ImageBuildError::Request(format!(
                "`{spec}` is not SRC:DST with DST an absolute guest path"
            ))),
        }
    }
}

/// What to build.
#[derive(Clone, Debug, Default)]
pub struct ImageBuildRequest {
    /// The new image's name.
    pub name: String,
    /// What it starts from (`None` is an error: every build names one).
    pub from: Option<BuildBase>,
    /// Debian packages to install.
    pub packages: Vec<String>,
    /// Commands to run in the guest, in order, as root.
    pub run: Vec<String>,
    /// Files to copy in, before the commands.
    pub copy: Vec<CopyStep>,
    /// What the image is, for `image search`.
    pub description: Option<String>,
    /// vCPUs a workspace of it gets when its create names none.
    pub vcpus: Option<u8>,
    /// Guest memory (MiB) a workspace of it gets when its create names
    /// none.
    pub mem_mib: Option<u64>,
    /// The least guest memory (MiB) its programs run in.
    pub min_mem_mib: Option<u64>,
}

impl ImageBuildRequest {
    /// The build of a library recipe's image `name`: Debian bookworm with
    /// `packages`, described as `description` (sizes left to the caller).
    pub fn debian_recipe(name: &str, packages: &[&str], description: &str) -> Self {
        Self {
            name: name.to_owned(),
            from: Some(BuildBase::Debian("bookworm".into())),
            packages: packages.iter().map(|p| (*p).to_owned()).collect(),
            run: Vec::new(),
            copy: Vec::new(),
            description: Some(description.to_owned()),
            vcpus: None,
            mem_mib: None,
            min_mem_mib: None,
        }
    }

    /// `defaults` (its base's) with the sizes this build asks.
    pub(crate) fn sized(
        &self,
        defaults: base::images::oci::config::ImageDefaults,
    ) -> base::images::oci::config::ImageDefaults {
        base::images::oci::config::ImageDefaults {
            vcpus: self.vcpus.or(defaults.vcpus),
            mem_mib: self.mem_mib.or(defaults.mem_mib),
            min_mem_mib: self.min_mem_mib.or(defaults.min_mem_mib),
            ..defaults
        }
    }
}

/// An image build: the plan, its token, and the image when applied.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct ImageBuild {
    /// The plan and its token.
    #[serde(flatten)]
    pub preview: Preview,
    /// It was applied (false: a preview).
    pub applied: bool,
    /// The new image, when applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageInfo>,
}

/// Seconds a cold boot takes here, for estimates.
const BOOT_SECONDS: u64 = 40;

/// The guest commands of a build on a booted image, in order: the package
/// install (an image base only), then the `run` commands.
pub(crate) fn guest_commands(req: &ImageBuildRequest) -> Vec<String> {
    let mut out = Vec::new();
    if matches!(req.from, Some(BuildBase::Image(_))) && !req.packages.is_empty() {
        out.push(format!(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {}",
            req.packages.join(" ")
        ));
    }
    out.extend(req.run.iter().cloned());
    out
}

/// Checks what can be checked before any work.
pub(crate) fn check(req: &ImageBuildRequest) -> std::result::Result<BuildBase, ImageBuildError> {
    let base = req.from.clone().ok_or_else(|| {
        ImageBuildError::Request("say what to build from: debian:SUITE or an image".into())
    })?;
    if let Some(d) = &req.description {
        let max = base::images::oci::rootfs::MAX_DESCRIPTION;
        if d.chars().count() > max || d.chars().any(char::is_control) {
            return Err(ImageBuildError::Request(format!(
                "the description must be one line of at most {max} characters"
            )));
        }
    }
    // The sizes a workspace of it gets are a create's: held to the same
    // limits, so no workspace of it is refused for them later.
    let limits = base::store::spec::LIMITS;
    if req.vcpus.is_some_and(|n| n == 0 || n > limits.max_vcpus) {
        return Err(ImageBuildError::Request(format!(
            "vcpus must be 1 to {}",
            limits.max_vcpus
        )));
    }
    let mem_range = limits.min_mem_mib..=limits.max_mem_mib;
    if [req.mem_mib, req.min_mem_mib]
        .iter()
        .flatten()
        .any(|m| !mem_range.contains(m))
        || req
            .mem_mib
            .zip(req.min_mem_mib)
            .is_some_and(|(m, least)| m < least)
    {
        return Err(ImageBuildError::Request(format!(
            "memory sizes must be {} to {} MiB, the least no more than the size",
            limits.min_mem_mib, limits.max_mem_mib
        )));
    }
    if let Some(bad) = req.packages.iter().find(|p| !debian::valid_package(p)) {
        return Err(ImageBuildError::Request(format!(
            "`{bad}` is not a Debian package name"
        )));
    }
    for copy in &req.copy {
        if std::fs::symlink_metadata(&copy.from).is_err() {
            return Err(ImageBuildError::CopySource {
                path: copy.from.clone(),
            });
        }
    }
    if matches!(base, BuildBase::Image(_)) && guest_commands(req).is_empty() && req.copy.is_empty()
    {
        return Err(ImageBuildError::Request(
            "nothing to build: give packages, commands to run or files to copy".into(),
        ));
    }
    Ok(base)
}

/// The plan of `req`; `base_bytes` is the base image's root filesystem
/// size (none for a Debian build), `image_dir` where it is registered.
pub(crate) fn build_plan(
    req: &ImageBuildRequest,
    base: &BuildBase,
    base_bytes: u64,
    missing_host_packages: &[String],
    image_dir: &Path,
) -> Plan {
    let mut plan = Plan::new("image build");
    let boots = !req.run.is_empty() || !req.copy.is_empty();
    match base {
        BuildBase::Debian(suite) => {
            plan.install_packages(missing_host_packages);
            plan.needs_root |= !missing_host_packages.is_empty();
            plan.notes.push(format!(
                "mmdebstrap {suite} minbase {} with {} (downloads from deb.debian.org)",
                debian::Mode::for_this_process().describe(),
                debian::include(&req.packages).join(",")
            ));
            plan.disk_bytes = debian::DISK_BYTES * 2;
            plan.estimate_seconds = debian::SECONDS;
        }
        BuildBase::Image(image) => {
            plan.notes.push(format!(
                "boots `{image}` in a throwaway workspace (its network: user)"
            ));
            plan.disk_bytes = base_bytes * 3;
        }
    }
    if boots || matches!(base, BuildBase::Image(_)) {
        if matches!(base, BuildBase::Debian(_)) {
            plan.notes
                .push("boots the result in a throwaway workspace for the steps below".into());
        }
        for copy in &req.copy {
            plan.notes.push(format!(
                "copies {} to {} in the guest",
                copy.from.display(),
                copy.to
            ));
        }
        for command in guest_commands(req) {
            plan.notes
                .push(format!("runs `{command}` in the guest, as root"));
        }
        plan.notes.push(
            "saves the guest's root filesystem (without /proc, /sys, /dev, /run, /tmp)".into(),
        );
        plan.estimate_seconds += BOOT_SECONDS
            + 15 * (guest_commands(req).len() + req.copy.len()) as u64
            + base_bytes / (20 << 20);
    }
    plan.notes.push(format!(
        "registers it as `{}` with the `minimal` image's kernel; nothing is registered if a step fails",
        req.name
    ));
    // In the plan, so its token covers them.
    if req.vcpus.is_some() || req.mem_mib.is_some() || req.min_mem_mib.is_some() {
        let shown = |v: Option<u64>| v.map_or("the default".to_owned(), |v| v.to_string());
        plan.notes.push(format!(
            "a workspace of it made without sizes gets {} vCPUs and {} MiB (at least {} MiB)",
            shown(req.vcpus.map(u64::from)),
            shown(req.mem_mib),
            shown(req.min_mem_mib)
        ));
    }
    plan.writes.push(image_dir.display().to_string());
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(from: &str) -> ImageBuildRequest {
        ImageBuildRequest {
            name: "tools".into(),
            from: Some(BuildBase::parse(from).unwrap()),
            ..ImageBuildRequest::default()
        }
    }

    #[test]
    fn bases_and_copies_parse() {
        assert_eq!(
            BuildBase::parse("debian:bookworm").unwrap(),
            BuildBase::Debian("bookworm".into())
        );
        assert_eq!(
            BuildBase::parse("python-3-12").unwrap(),
            BuildBase::Image("python-3-12".into())
        );
        assert!(BuildBase::parse("debian:Bad;").is_err());
        assert!(BuildBase::parse("../x").is_err());
        assert_eq!(
            CopyStep::parse("a:b/c:/opt/x").unwrap(),
            CopyStep {
                from: "a:b/c".into(),
                to: "/opt/x".into()
            }
        );
        for bad in ["a", "a:b", ":/x", "/x"] {
            assert!(CopyStep::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_are_checked_before_any_work() {
        let mut r = req("minimal");
        assert!(check(&r).is_err(), "nothing to build");
        r.run.push("true".into());
        assert!(check(&r).is_ok());
        r.packages.push("Bad Name".into());
        assert!(check(&r).is_err());
        let mut r = req("minimal");
        r.copy.push(CopyStep {
            from: "/nonexistent/file".into(),
            to: "/x".into(),
        });
        assert!(matches!(check(&r), Err(ImageBuildError::CopySource { .. })));
        // Sizes are a create's, held to its limits.
        let sized = |vcpus, mem_mib, min_mem_mib| {
            let mut r = req("debian:bookworm");
            (r.vcpus, r.mem_mib, r.min_mem_mib) = (vcpus, mem_mib, min_mem_mib);
            check(&r).is_ok()
        };
        assert!(sized(Some(2), Some(2048), Some(1024)));
        assert!(!sized(Some(0), None, None));
        assert!(!sized(Some(9), None, None));
        assert!(!sized(None, Some(16 << 20), None));
        assert!(!sized(None, Some(512), Some(1024)));
        // And in the plan, so a preview's token covers them.
        let plan = |mem_mib| {
            let mut r = req("debian:bookworm");
            r.mem_mib = mem_mib;
            build_plan(&r, &r.from.clone().unwrap(), 0, &[], Path::new("/x")).digest()
        };
        assert_ne!(plan(Some(512)), plan(Some(16384)));
        // A Debian build with nothing else is a build.
        assert!(check(&req("debian:bookworm")).is_ok());
        let none = ImageBuildRequest::default();
        assert!(check(&none).is_err());
    }

    #[test]
    fn an_image_plan_lists_its_guest_steps_and_writes_only_the_image() {
        let mut r = req("debian");
        r.packages = vec!["git".into()];
        r.run = vec!["echo hi > /etc/motd".into()];
        r.copy = vec![CopyStep {
            from: env!("CARGO_MANIFEST_DIR").into(),
            to: "/opt/src".into(),
        }];
        let base = check(&r).unwrap();
        let plan = build_plan(&r, &base, 100 << 20, &[], Path::new("/s/images/tools"));
        assert!(plan.steps.is_empty() && !plan.needs_root, "{plan:?}");
        assert_eq!(plan.writes, ["/s/images/tools"]);
        let notes = plan.notes.join("\n");
        assert!(
            notes.contains("apt-get install -y -qq --no-install-recommends git"),
            "{notes}"
        );
        let copies = format!("copies {} to /opt/src", env!("CARGO_MANIFEST_DIR"));
        assert!(notes.contains(&copies), "{notes}");
        assert!(notes.contains("runs `echo hi > /etc/motd`"), "{notes}");
        assert!(plan.estimate_seconds >= BOOT_SECONDS + 45);
        assert_eq!(plan.disk_bytes, 300 << 20);
    }

    #[test]
    fn a_debian_plan_needs_root_and_installs_mmdebstrap_when_missing() {
        let mut r = req("debian:bookworm");
        r.packages = vec!["git".into()];
        let base = check(&r).unwrap();
        let plan = build_plan(
            &r,
            &base,
            0,
            &["mmdebstrap".into()],
            Path::new("/s/images/tools"),
        );
        assert!(plan.needs_root);
        assert_eq!(plan.packages, ["mmdebstrap"]);
        assert_eq!(plan.steps.len(), 2);
        assert!(plan.notes[0].contains("bookworm minbase") && plan.notes[0].contains(",git"));
        // Packages go in by mmdebstrap, not by a guest command.
        assert!(
            !plan.notes.join("\n").contains("apt-get install"),
            "{plan:?}"
        );
        // With its packages there nothing needs root: a user builds in
        // their subordinate ids.
        let ready = build_plan(&r, &base, 0, &[], Path::new("/s/images/tools"));
        assert!(ready.steps.is_empty() && !ready.needs_root);
    }
}
