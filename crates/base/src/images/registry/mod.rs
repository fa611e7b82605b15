//! The image registry: kernel + root filesystem pairs registered by name in
//! `<state>/images/<name>/` (`vmlinux`, `rootfs.ext4`, `image.json`).
//!
//! Importing hard-links the files when the source is on the same filesystem
//! (xtask never rewrites a built file in place, so a link is a stable copy)
//! and copies them otherwise. The images `cargo xtask setup` builds
//! (`minimal`, `debian`) are imported from the asset cache on first use;
//! pulled images are converted on first use (`pulled`).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::code::ErrorCode;
use crate::host::settings::now_ms;
use crate::images::oci::{ImageDefaults, OciOrigin};
use crate::remedy::Remedy;
use crate::store::name::{validate_name, NameError};
use crate::store::spec::WorkspaceSpec;
use crate::store::{read_json, write_json_atomic, StateDir, StoreError};
use vmm_core::KernelVariant;

mod pulled;
mod turns;
pub use pulled::PulledImage;
pub use turns::CONVERSIONS_AT_ONCE;

/// The record file inside an image directory.
pub const IMAGE_FILE: &str = "image.json";
/// The kernel's file name inside an image (and import) directory.
pub const KERNEL_FILE: &str = "vmlinux";
/// The root filesystem's file name inside an image (and import) directory.
pub const ROOTFS_FILE: &str = "rootfs.ext4";
/// The optional build manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Images `cargo xtask rootfs` builds.
pub const BUILTIN_IMAGES: [&str; 2] = ["minimal", "debian"];
/// Guest memory (MiB) a `debian` workspace gets unless asked otherwise:
/// Python and Node.js programs want more than `minimal`'s busybox.
pub const DEBIAN_MEM_MIB: u64 = 512;

/// A record as read, with the sizes of the built images (which records
/// imported before sizes existed lack).
fn with_built_sizes(mut info: ImageInfo) -> ImageInfo {
    if info.name == BUILTIN_IMAGES[1] && info.defaults.mem_mib.is_none() {
        info.defaults.mem_mib = Some(DEBIAN_MEM_MIB);
    }
    info
}

/// Why an image operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Bad image name.
    #[error("invalid image name")]
    Name(#[source] NameError),
    /// Not registered (and not a built image that could be imported).
    #[error("image `{0}` does not exist")]
    NotFound(String),
    /// The name is taken.
    #[error("image `{0}` already exists")]
    Exists(String),
    /// Its pull was cancelled while it was being converted.
    #[error("the pull of image `{0}` was cancelled; nothing was registered")]
    Abandoned(String),
    /// A reference that was to be used as pulled before was not.
    #[error("image `{reference}` has not been pulled (it would be registered as `{name}`)")]
    NotPulled {
        /// The OCI reference.
        reference: String,
        /// The name it would have.
        name: String,
    },
    /// Workspaces use it.
    #[error("image `{name}` is used by workspace(s) {}; delete them first", users.join(", "))]
    InUse {
        /// The image.
        name: String,
        /// The workspaces.
        users: Vec<String>,
    },
    /// The import directory lacks a file or has a bad one.
    #[error("{}: {problem}", path.display())]
    BadSource {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Copying or linking failed.
    #[error("cannot import {} into {}", from.display(), to.display())]
    Copy {
        /// Source.
        from: PathBuf,
        /// Destination.
        to: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Removing failed.
    #[error("cannot remove {}", path.display())]
    Remove {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The registry's files.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A container image could not be read or converted.
    #[error("cannot import the container image")]
    Oci(#[from] crate::images::oci::OciError),
    /// A reference named an image whose default name holds an image from
    /// elsewhere (`evil.example/x/python:3.12` and `python:3.12` are both
    /// `python-3-12`).
    #[error(
        "image `{name}` holds {}, not `{asked}`; pull `{asked}` under another name",
        held(holds)
    )]
    OtherReference {
        /// The name.
        name: String,
        /// What the image under it came from (empty: not a pull).
        holds: String,
        /// The reference asked for.
        asked: String,
    },
    /// Converting a container image needs a built image's kernel, init
    /// and agent.
    #[error("converting a container image needs the built `{0}` image (its kernel, init and agent), which is missing")]
    NoBase(String),
}

/// What an image holds, as [`ImageError::OtherReference`] says it.
fn held(reference: &str) -> String {
    if reference.is_empty() {
        "an image not pulled from a registry".to_owned()
    } else {
        format!("`{reference}`")
    }
}

impl ImageError {
    /// What resolves the failure, if the caller can do something.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            ImageError::NotFound(_) => Some(Remedy::ListImages),
            ImageError::Exists(image) => Some(Remedy::RemoveImage {
                image: image.clone(),
            }),
            ImageError::NotPulled { reference, .. } => Some(Remedy::PullImage {
                reference: reference.clone(),
            }),
            _ => None,
        }
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ImageError::Name(_) | ImageError::BadSource { .. } => ErrorCode::InvalidInput,
            ImageError::NotFound(_) | ImageError::NoBase(_) | ImageError::NotPulled { .. } => {
                ErrorCode::NotFound
            }
            ImageError::Oci(e) => e.code(),
            ImageError::Exists(_)
            | ImageError::InUse { .. }
            | ImageError::Abandoned(_)
            | ImageError::OtherReference { .. } => ErrorCode::Conflict,
            ImageError::Store(e) => e.code(),
            ImageError::Copy { .. } | ImageError::Remove { .. } => ErrorCode::Internal,
        }
    }
}

/// A registered image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ImageInfo {
    /// Its name.
    pub name: String,
    /// The guest kernel.
    pub kernel: PathBuf,
    /// The root filesystem (attached read-only).
    pub rootfs: PathBuf,
    /// Kernel size in bytes.
    pub kernel_bytes: u64,
    /// Root filesystem size in bytes (apparent).
    pub rootfs_bytes: u64,
    /// Unix ms of the import.
    pub imported_at_ms: u64,
    /// Where it was imported from.
    pub source: PathBuf,
    /// The build manifest, when the source had one.
    #[serde(default)]
    pub manifest: Option<serde_json::Value>,
    /// Kernel arguments the image needs (a converted container image:
    /// `init=/.microagent/init`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
    /// What workspaces of it start with (a container image's config).
    #[serde(default)]
    pub defaults: ImageDefaults,
    /// The container image it was converted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<OciOrigin>,
    /// What it is (`image build --description`, or the container image's
    /// `org.opencontainers.image.description`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Pulled, and converted into a root filesystem at its first use (its
    /// files are not there yet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub awaiting_conversion: bool,
}

/// What a converted image adds to its record.
#[derive(Debug, Default)]
struct Extras {
    boot_args: Option<String>,
    defaults: ImageDefaults,
    origin: Option<OciOrigin>,
    source: Option<PathBuf>,
    description: Option<String>,
}

/// How a scratch directory's name starts: `.scratch-PID-N-KIND`.
const SCRATCH_PREFIX: &str = ".scratch-";

/// The registry in a state directory.
#[derive(Clone, Debug)]
pub struct ImageRegistry {
    dir: PathBuf,
    /// Where built images are looked for (the asset cache's `current/`).
    assets: Option<PathBuf>,
    /// The kernel variant of this host (`compat` or `standard`).
    kernel_variant: KernelVariant,
    /// What an imported or pulled image may take (its `max_image_*`).
    limits: crate::store::spec::Limits,
}

/// Checks that `path` is a kernel this VMM boots; its size.
pub fn check_kernel(path: &Path) -> Result<u64, ImageError> {
    let bad = |problem: String| ImageError::BadSource {
        path: path.to_owned(),
        problem,
    };
    let mut head = [0u8; 0x206];
    let mut f = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    f.read_exact(&mut head)
        .map_err(|_| bad("too short to be a kernel".into()))?;
    if &head[..4] == b"\x7fELF" || &head[0x202..0x206] == b"HdrS" {
        Ok(len)
    } else {
        Err(bad("not a kernel (neither ELF vmlinux nor bzImage)".into()))
    }
}

fn check_rootfs(path: &Path) -> Result<u64, ImageError> {
    let bad = |problem: String| ImageError::BadSource {
        path: path.to_owned(),
        problem,
    };
    let mut sb = [0u8; 1082];
    let mut f = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    f.read_exact(&mut sb)
        .map_err(|_| bad("too short to be an ext4 image".into()))?;
    // The ext2/3/4 superblock magic 0xEF53 sits at byte 1024 + 56.
    if sb[1080..1082] != [0x53, 0xef] {
        return Err(bad("not an ext4 filesystem image".into()));
    }
    if len % 512 != 0 {
        return Err(bad("size is not a multiple of 512 bytes".into()));
    }
    Ok(len)
}

/// Hard-links `from` to `to`, or copies it (keeping holes) across filesystems.
fn link_or_copy(from: &Path, to: &Path) -> Result<(), ImageError> {
    let err = |source| ImageError::Copy {
        from: from.to_owned(),
        to: to.to_owned(),
        source,
    };
    let from = std::fs::canonicalize(from).map_err(err)?;
    if std::fs::hard_link(&from, to).is_ok() {
        return Ok(());
    }
    let status = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&from)
        .arg(to)
        .status()
        .map_err(err)?;
    if status.success() {
        Ok(())
    } else {
        Err(err(std::io::Error::other(format!(
            "cp exited with {status}"
        ))))
    }
}

// Applying an image to a spec is the registry's knowledge of images, so
// it lives here, below the spec's other rules in `store`.
impl WorkspaceSpec {
    /// The spec of a workspace of `image`: its registered name, and its
    /// defaults (environment under the spec's own, working directory,
    /// user) recorded, so the workspace keeps them if the image goes.
    pub fn with_image(self, image: ImageInfo) -> Self {
        let defaults = image.defaults;
        let mut env = defaults.env;
        env.extend(self.env);
        let user = match (defaults.uid, defaults.gid) {
            (Some(uid), gid) => Some((uid, gid.unwrap_or(0))),
            _ => None,
        };
        Self {
            image: image.name,
            env,
            cwd: self.cwd.or(defaults.cwd),
            user: self.user.or(user),
            ..self
        }
    }
}

impl ImageRegistry {
    /// The registry of `state`; built images are found in `assets` (the
    /// asset cache's `current/`), with the kernel of `kernel_variant`.
    pub fn new(state: &StateDir, assets: Option<PathBuf>, kernel_variant: KernelVariant) -> Self {
        Self {
            dir: state.root().join("images"),
            assets,
            kernel_variant,
            limits: crate::store::spec::LIMITS,
        }
    }

    /// The same registry, holding images to `limits`.
    pub fn with_limits(mut self, limits: crate::store::spec::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// What one image's layers may unpack to.
    pub fn budget(&self) -> crate::images::oci::unpack::Budget {
        crate::images::oci::unpack::Budget::of(&self.limits)
    }

    /// The limits images are held to.
    pub fn limits(&self) -> &crate::store::spec::Limits {
        &self.limits
    }

    /// Where built images and kernels are looked for.
    pub fn assets(&self) -> Option<&Path> {
        self.assets.as_deref()
    }

    /// The registry's directory.
    pub fn root(&self) -> &Path {
        &self.dir
    }

    /// The kernel variant images are imported with.
    pub fn kernel_variant(&self) -> KernelVariant {
        self.kernel_variant
    }

    fn image_dir(&self, name: &str) -> Result<PathBuf, ImageError> {
        validate_name(name).map_err(ImageError::Name)?;
        Ok(self.dir.join(name))
    }

    /// The built image `name` in the asset cache: kernel, rootfs, manifest.
    fn built(&self, name: &str) -> Option<(PathBuf, PathBuf, Option<PathBuf>)> {
        if !BUILTIN_IMAGES.contains(&name) {
            return None;
        }
        let assets = self.assets.as_ref()?;
        let kernel = assets.join(self.kernel_variant.vmlinux_file());
        let rootfs = assets.join(format!("rootfs-{name}.ext4"));
        if !kernel.exists() || !rootfs.exists() {
            return None;
        }
        let manifest = std::fs::canonicalize(&rootfs)
            .ok()
            .and_then(|p| p.parent().map(|d| d.join(MANIFEST_FILE)))
            .filter(|p| p.exists());
        Some((kernel, rootfs, manifest))
    }

    /// Imports the built images not registered yet.
    pub fn import_built(&self) -> Result<(), ImageError> {
        for name in BUILTIN_IMAGES {
            if self.dir.join(name).join(IMAGE_FILE).exists() {
                continue;
            }
            if let Some((kernel, rootfs, manifest)) = self.built(name) {
                match self.import_files(name, &kernel, &rootfs, manifest.as_deref()) {
                    // Another process imported it first.
                    Ok(_) | Err(ImageError::Exists(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Every registered image (built images are imported first), by name.
    pub fn list(&self) -> Result<Vec<ImageInfo>, ImageError> {
        self.import_built()?;
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(source) => {
                return Err(StoreError::Read {
                    path: self.dir.clone(),
                    source,
                }
                .into())
            }
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let record = entry.path().join(IMAGE_FILE);
            if record.is_file() {
                out.push(with_built_sizes(read_json(&record)?));
            }
        }
        for pulled in self.all_pulled()? {
            out.push(self.awaiting_conversion(&pulled));
        }
        out.sort_by(|a: &ImageInfo, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// One image, ready for a workspace: a built image is imported, and
    /// a pulled one converted, on first use.
    pub fn get(&self, name: &str) -> Result<ImageInfo, ImageError> {
        match self.find(name)? {
            Some(info) if info.awaiting_conversion => self.convert_pulled(name, &mut |_| {}),
            Some(info) => Ok(info),
            None => Err(ImageError::NotFound(name.to_owned())),
        }
    }

    /// The image `name` as it stands: registered (a built image is
    /// imported), or pulled and awaiting its conversion (not converted by
    /// this); `None` if there is neither.
    pub fn find(&self, name: &str) -> Result<Option<ImageInfo>, ImageError> {
        let record = self.image_dir(name)?.join(IMAGE_FILE);
        if !record.exists() && self.built(name).is_some() {
            self.import_built()?;
        }
        match read_json(&record) {
            Ok(info) => Ok(Some(with_built_sizes(info))),
            Err(StoreError::Missing { .. }) => {
                Ok(self.pulled(name)?.map(|p| self.awaiting_conversion(&p)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Imports `vmlinux` and `rootfs.ext4` (and `manifest.json` if present)
    /// from `source_dir` as `name`.
    pub fn import_dir(&self, name: &str, source_dir: &Path) -> Result<ImageInfo, ImageError> {
        let manifest = source_dir.join(MANIFEST_FILE);
        self.import_files(
            name,
            &source_dir.join(KERNEL_FILE),
            &source_dir.join(ROOTFS_FILE),
            manifest.exists().then_some(manifest.as_path()),
        )
    }

    /// Imports a kernel and root filesystem as `name`. Checked first; on
    /// any failure nothing is left behind.
    pub fn import_files(
        &self,
        name: &str,
        kernel: &Path,
        rootfs: &Path,
        manifest: Option<&Path>,
    ) -> Result<ImageInfo, ImageError> {
        self.import_with(name, kernel, rootfs, manifest, Extras::default())
    }

    fn import_with(
        &self,
        name: &str,
        kernel: &Path,
        rootfs: &Path,
        manifest: Option<&Path>,
        extras: Extras,
    ) -> Result<ImageInfo, ImageError> {
        let dir = self.image_dir(name)?;
        let kernel_bytes = check_kernel(kernel)?;
        let rootfs_bytes = check_rootfs(rootfs)?;
        let manifest = match manifest {
            Some(path) => Some(read_json::<serde_json::Value>(path)?),
            None => None,
        };
        std::fs::create_dir_all(&self.dir).map_err(|source| StoreError::CreateDir {
            path: self.dir.clone(),
            source,
        })?;
        // Built in a staging directory and renamed into place, so a crash or
        // a concurrent import never leaves a half image under the name.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let staging = self
            .dir
            .join(format!(".import-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let result = (|| {
            std::fs::create_dir(&staging).map_err(|source| StoreError::CreateDir {
                path: staging.clone(),
                source,
            })?;
            link_or_copy(kernel, &staging.join(KERNEL_FILE))?;
            link_or_copy(rootfs, &staging.join(ROOTFS_FILE))?;
            let info = ImageInfo {
                name: name.to_owned(),
                kernel: dir.join(KERNEL_FILE),
                rootfs: dir.join(ROOTFS_FILE),
                kernel_bytes,
                rootfs_bytes,
                imported_at_ms: now_ms(),
                source: extras
                    .source
                    .unwrap_or_else(|| rootfs.parent().map(Path::to_path_buf).unwrap_or_default()),
                manifest,
                boot_args: extras.boot_args,
                defaults: extras.defaults,
                origin: extras.origin,
                description: extras.description,
                awaiting_conversion: false,
            };
            write_json_atomic(&staging.join(IMAGE_FILE), &info)?;
            // rename(2) onto an existing non-empty directory fails: the name is taken.
            std::fs::rename(&staging, &dir).map_err(|_| ImageError::Exists(name.to_owned()))?;
            Ok(info)
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    }

    /// Imports what is at `path`: a directory with `vmlinux` and
    /// `rootfs.ext4` (`name` required), or a container image (an OCI image
    /// layout directory, a tar of one, or a `docker save` tarball; `name`
    /// defaults to the image's tag), converted with the `minimal` image's
    /// kernel, init and agent. On any failure nothing is left behind.
    pub fn import_path(
        &self,
        name: Option<&str>,
        path: &Path,
        progress: &mut dyn FnMut(crate::images::oci::rootfs::ConversionStep),
    ) -> Result<ImageInfo, ImageError> {
        if path.join(KERNEL_FILE).exists() || path.join(ROOTFS_FILE).exists() {
            let name = name.ok_or_else(|| ImageError::BadSource {
                path: path.to_owned(),
                problem: "a kernel and root filesystem directory needs a name for the image".into(),
            })?;
            return self.import_dir(name, path);
        }
        if let Some(name) = name {
            self.check_free(name)?;
        }
        // A tarball is unpacked into a scratch directory and read there.
        let unpacked = if path.is_dir() {
            None
        } else {
            let scratch = self.scratch_dir("unpack")?;
            if let Err(e) = crate::images::oci::layout::unpack_archive(path, &scratch) {
                let _ = std::fs::remove_dir_all(&scratch);
                return Err(e.into());
            }
            Some(scratch)
        };
        let result = (|| {
            let image = crate::images::oci::layout::read_dir(
                unpacked.as_deref().unwrap_or(path),
                None,
                self.limits.max_image_metadata_bytes,
            )?;
            let name = match name {
                Some(name) => name.to_owned(),
                None => {
                    let name = crate::images::oci::image_name(image.reference.as_deref())
                        .ok_or_else(|| ImageError::BadSource {
                            path: path.to_owned(),
                            problem: "the image has no tag to name it by; give a name".into(),
                        })?;
                    self.check_free(&name)?;
                    name
                }
            };
            let kept = std::sync::atomic::AtomicBool::new(false);
            let mut at_path = |_| crate::images::oci::rootfs::LayerArrival::AtPath;
            self.import_image(&name, &image, path, progress, &mut at_path, &kept)
        })();
        if let Some(scratch) = unpacked {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        result
    }

    /// Converts a read container image (in a scratch directory removed
    /// afterwards) and registers it as `name`; each layer is applied once
    /// `ready` says its file is there (a pull's come as they download). A
    /// name a pull has recorded is taken.
    pub fn import_image(
        &self,
        name: &str,
        image: &crate::images::oci::layout::Resolved,
        source: &Path,
        progress: &mut dyn FnMut(crate::images::oci::rootfs::ConversionStep),
        ready: crate::images::oci::rootfs::LayerReady<'_>,
        abandoned: &std::sync::atomic::AtomicBool,
    ) -> Result<ImageInfo, ImageError> {
        // A taken name is refused before its lock is: no trace left.
        self.check_free(name)?;
        let _name = self.name_lock(name)?;
        if self.is_pulled(name)? {
            return Err(ImageError::Exists(name.to_owned()));
        }
        self.convert_into(name, image, source, progress, ready, abandoned)
    }

    /// [`Self::import_image`] by one holding `name`'s lock, in its turn.
    fn convert_into(
        &self,
        name: &str,
        image: &crate::images::oci::layout::Resolved,
        source: &Path,
        progress: &mut dyn FnMut(crate::images::oci::rootfs::ConversionStep),
        ready: crate::images::oci::rootfs::LayerReady<'_>,
        abandoned: &std::sync::atomic::AtomicBool,
    ) -> Result<ImageInfo, ImageError> {
        let _turn = turns::Turn::take();
        let base = self
            .get(BUILTIN_IMAGES[0])
            .map_err(|_| ImageError::NoBase(BUILTIN_IMAGES[0].into()))?;
        let build = self.scratch_dir("convert")?;
        let result = (|| {
            let converted = crate::images::oci::rootfs::convert(
                image,
                &build,
                &base.rootfs,
                self.budget(),
                progress,
                ready,
            )?;
            let extras = Extras {
                boot_args: Some(crate::images::oci::rootfs::BOOT_ARGS.into()),
                defaults: converted.defaults,
                description: converted.origin.description.clone(),
                origin: Some(converted.origin),
                source: Some(source.to_owned()),
            };
            if abandoned.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ImageError::Abandoned(name.to_owned()));
            }
            self.import_with(name, &base.kernel, &converted.rootfs, None, extras)
        })();
        let _ = std::fs::remove_dir_all(&build);
        result
    }

    /// Registers `rootfs` (a converted root filesystem: our init under
    /// `/.microagent/`) with `kernel` as `name`, workspaces of it starting
    /// with `defaults`.
    pub fn register_converted(
        &self,
        name: &str,
        kernel: &Path,
        rootfs: &Path,
        defaults: ImageDefaults,
        source: PathBuf,
        description: Option<String>,
    ) -> Result<ImageInfo, ImageError> {
        let extras = Extras {
            boot_args: Some(crate::images::oci::rootfs::BOOT_ARGS.into()),
            defaults,
            origin: None,
            source: Some(source),
            description,
        };
        self.import_with(name, kernel, rootfs, None, extras)
    }

    /// A new empty directory in the registry for `kind` of work
    /// (`.<kind>-<pid>-<n>`): unique per call, since one process (the MCP
    /// server) may convert several images at once.
    pub fn scratch_dir(&self, kind: &str) -> Result<PathBuf, ImageError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.sweep_scratch();
        let dir = self
            .dir
            .join(format!("{SCRATCH_PREFIX}{}-{n}-{kind}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        Ok(dir)
    }

    /// Removes the scratch directories of processes that are gone (killed,
    /// or failed on a disk that would not let them clean up).
    fn sweep_scratch(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// Refuses a bad or taken name before any work.
    pub fn check_free(&self, name: &str) -> Result<(), ImageError> {
        if self.image_dir(name)?.join(IMAGE_FILE).exists() || self.is_pulled(name)? {
            return Err(ImageError::Exists(name.to_owned()));
        }
        Ok(())
    }

    /// Removes an image unless a workspace in `users` uses it.
    pub fn remove(&self, name: &str, users: Vec<String>) -> Result<(), ImageError> {
        let dir = self.image_dir(name)?;
        // Refused before the name's lock is taken: a refusal leaves no
        // trace (not even a lock file).
        if !dir.join(IMAGE_FILE).exists() && !self.is_pulled(name)? {
            return Err(ImageError::NotFound(name.to_owned()));
        }
        if !users.is_empty() {
            return Err(ImageError::InUse {
                name: name.to_owned(),
                users,
            });
        }
        let _name = self.name_lock(name)?;
        let registered = dir.join(IMAGE_FILE).exists();
        let forgotten = self.forget_pulled(name)?;
        if !registered && !forgotten {
            return Err(ImageError::NotFound(name.to_owned()));
        }
        if registered {
            std::fs::remove_dir_all(&dir)
                .map_err(|source| ImageError::Remove { path: dir, source })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
