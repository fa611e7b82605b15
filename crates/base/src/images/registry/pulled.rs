//! Pulled images not converted yet. A pull downloads and checks the layers
//! into the blob store and records what to convert
//! (`<images>/.pulled/<name>.json`); the root filesystem is made when the
//! image is first used ([`ImageRegistry::get`]), or at once when asked
//! (`image pull --convert`). So a pull goes at the registry's speed, and
//! an image pulled but never run costs its layers only.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use super::{ImageError, ImageInfo, ImageRegistry, IMAGE_FILE, KERNEL_FILE, ROOTFS_FILE};
use crate::images::oci::config::ImageConfig;
use crate::images::oci::layout::Resolved;
use crate::images::oci::rootfs::{ConversionStep, LayerArrival};
use crate::images::oci::OciOrigin;
use crate::store::file_lock::FileLock;
use crate::store::{read_json, write_json_atomic, StoreError};

/// The directory of pulled images' records, inside the registry.
const PULLED_DIR: &str = ".pulled";

/// The directory of the names' locks, inside the registry.
const LOCKS_DIR: &str = ".locks";

/// Where pulled layers are kept by digest, inside the registry.
const BLOBS_DIR: &str = ".blobs/sha256";

/// What a pull recorded of an image it has not converted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PulledImage {
    /// The name it is registered under.
    pub name: String,
    /// The reference pulled.
    pub reference: String,
    /// The manifest's digest.
    pub manifest_digest: String,
    /// The config's digest.
    pub config_digest: String,
    /// The config as the registry sent it (parsed again, with the same
    /// checks, when the image is converted).
    pub config_json: String,
    /// The layers' digests, bottom first: files in the blob store.
    pub layers: Vec<String>,
    /// Unix ms of the pull.
    pub pulled_at_ms: u64,
}

impl PulledImage {
    /// The image as its conversion reads it, its layers in `blobs`. They
    /// are checked again as they are read: the store may have changed
    /// since the pull.
    fn resolved(&self, blobs: &Path) -> Result<Resolved, ImageError> {
        let config = ImageConfig::parse(self.config_json.as_bytes())?;
        let layers = self
            .layers
            .iter()
            .map(|digest| {
                let hex = crate::images::oci::unpack::digest_hex(digest)?;
                Ok((blobs.join(hex), digest.clone()))
            })
            .collect::<Result<Vec<_>, ImageError>>()?;
        Ok(Resolved {
            reference: Some(self.reference.clone()),
            manifest_digest: self.manifest_digest.clone(),
            config_digest: self.config_digest.clone(),
            config,
            layers,
            layers_verified: false,
        })
    }
}

impl ImageRegistry {
    /// Where pulled layers are kept, by digest.
    pub fn blobs_dir(&self) -> PathBuf {
        self.dir.join(BLOBS_DIR)
    }

    fn pulled_path(&self, name: &str) -> Result<PathBuf, ImageError> {
        // Validated: a name is a file name here.
        self.image_dir(name)?;
        Ok(self.dir.join(PULLED_DIR).join(format!("{name}.json")))
    }

    /// The lock on the name `name`, held by whatever records, converts,
    /// registers a container image under it or removes it, so none of
    /// them sees another half done. Its file is never removed: a lock on
    /// a removed file would be no lock for the next taker.
    pub(super) fn name_lock(&self, name: &str) -> Result<FileLock, ImageError> {
        self.image_dir(name)?;
        let dir = self.dir.join(LOCKS_DIR);
        let path = dir.join(format!("{name}.lock"));
        std::fs::create_dir_all(&dir)
            .map_err(|source| StoreError::CreateDir { path: dir, source })?;
        FileLock::exclusive(&path).map_err(|source| StoreError::Write { path, source }.into())
    }

    /// Records `image`, pulled, to be converted at its first use; what
    /// `list` and `get` show of it until then. The same image pulled
    /// again is recorded again; another under its name is refused.
    pub fn record_pulled(&self, image: &PulledImage) -> Result<ImageInfo, ImageError> {
        let name = &image.name;
        if super::BUILTIN_IMAGES.contains(&name.as_str()) {
            return Err(ImageError::Exists(name.clone()));
        }
        // Checked before the lock too, so a refusal leaves no lock file.
        let taken = || -> Result<bool, ImageError> {
            Ok(self.image_dir(name)?.join(IMAGE_FILE).exists()
                || self
                    .pulled(name)?
                    .is_some_and(|p| p.manifest_digest != image.manifest_digest))
        };
        if taken()? {
            return Err(ImageError::Exists(name.clone()));
        }
        let _name = self.name_lock(name)?;
        // Again under the lock: another may have taken it meanwhile.
        if taken()? {
            return Err(ImageError::Exists(name.clone()));
        }
        let dir = self.dir.join(PULLED_DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|source| StoreError::CreateDir { path: dir, source })?;
        write_json_atomic(&self.pulled_path(name)?, image)?;
        Ok(self.awaiting_conversion(image))
    }

    /// The pulled image `name` awaiting its conversion, if there is one.
    pub fn pulled(&self, name: &str) -> Result<Option<PulledImage>, ImageError> {
        let path = self.pulled_path(name)?;
        match read_json::<PulledImage>(&path) {
            Ok(image) if image.name == name => Ok(Some(image)),
            Ok(image) => Err(ImageError::BadSource {
                path,
                problem: format!("it records the image `{}`", image.name),
            }),
            Err(StoreError::Missing { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether a pull of `name` is recorded (readable or not).
    pub(super) fn is_pulled(&self, name: &str) -> Result<bool, ImageError> {
        Ok(self.pulled_path(name)?.exists())
    }

    /// Every pulled image awaiting its conversion.
    pub(super) fn all_pulled(&self) -> Result<Vec<PulledImage>, ImageError> {
        let dir = self.dir.join(PULLED_DIR);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(StoreError::Read { path: dir, source }.into()),
        };
        let mut out = Vec::new();
        for entry in entries.filter_map(|e| e.ok()) {
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".json")) else {
                continue;
            };
            // A conversion that ended between its registration and the
            // record's removal: the converted image is the one.
            if self.dir.join(name).join(IMAGE_FILE).exists() {
                continue;
            }
            // A damaged record does not hide the rest (`find`, `get` and
            // `image rm` of its name say what is wrong with it).
            if let Ok(Some(image)) = self.pulled(name) {
                out.push(image);
            }
        }
        Ok(out)
    }

    /// What a pulled image looks like before its conversion: its files
    /// where they will be, of no size yet.
    pub(super) fn awaiting_conversion(&self, image: &PulledImage) -> ImageInfo {
        let dir = self.dir.join(&image.name);
        let description = ImageConfig::parse(image.config_json.as_bytes())
            .ok()
            .and_then(|c| crate::images::oci::rootfs::description_of(&c));
        ImageInfo {
            name: image.name.clone(),
            kernel: dir.join(KERNEL_FILE),
            rootfs: dir.join(ROOTFS_FILE),
            kernel_bytes: 0,
            rootfs_bytes: 0,
            imported_at_ms: image.pulled_at_ms,
            source: PathBuf::from(&image.reference),
            manifest: None,
            boot_args: Some(crate::images::oci::rootfs::BOOT_ARGS.into()),
            defaults: Default::default(),
            origin: Some(OciOrigin {
                reference: image.reference.clone(),
                manifest_digest: image.manifest_digest.clone(),
                config_digest: image.config_digest.clone(),
                layers: image.layers.clone(),
                description: description.clone(),
            }),
            description,
            awaiting_conversion: true,
        }
    }

    /// Converts the pulled image `name` and registers it; `progress` hears
    /// each step. Two processes asking at once convert it once: the second
    /// waits and finds it registered.
    pub fn convert_pulled(
        &self,
        name: &str,
        progress: &mut dyn FnMut(ConversionStep),
    ) -> Result<ImageInfo, ImageError> {
        let record = self.pulled_path(name)?;
        let _name = self.name_lock(name)?;
        let registered = self.image_dir(name)?.join(IMAGE_FILE);
        if registered.exists() {
            let _ = std::fs::remove_file(&record);
            return Ok(read_json(&registered)?);
        }
        let pulled = self
            .pulled(name)?
            .ok_or_else(|| ImageError::NotFound(name.to_owned()))?;
        let resolved = pulled.resolved(&self.blobs_dir())?;
        let info = self.convert_into(
            name,
            &resolved,
            Path::new(&pulled.reference),
            progress,
            &mut |_| LayerArrival::AtPath,
            &AtomicBool::new(false),
        )?;
        // Registered first: a crash between the two leaves the record,
        // which the converted image then hides.
        let _ = std::fs::remove_file(&record);
        Ok(info)
    }

    /// Forgets the pulled image `name` (its layers stay in the blob
    /// store); whether there was one. The caller holds its name's lock.
    pub(super) fn forget_pulled(&self, name: &str) -> Result<bool, ImageError> {
        let record = self.pulled_path(name)?;
        match std::fs::remove_file(&record) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(ImageError::Remove {
                path: record,
                source,
            }),
        }
    }
}
