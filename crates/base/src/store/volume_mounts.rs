//! Where a workspace mounts named volumes (`NAME:/guest/path[:ro]`), and
//! the disk slots that carry them: every machine has [`VOLUME_SLOTS`]
//! virtio-blk devices after its two own disks, empty unless a volume fills
//! one, so a warm snapshot taken without volumes can take them at restore.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why a volume mount, or a workspace's set of them, is refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct VolumeMountError(String);

/// Most volumes one workspace mounts (the machine's volume slots).
pub const VOLUME_SLOTS: usize = 4;

/// Guest directories a volume may not cover: the system's own, and `/`.
const RESERVED: &[&str] = &[
    "/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys",
    "/usr", "/var",
];

/// Longest guest path accepted.
const MAX_PATH: usize = 1024;

/// A named volume mounted in a workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct VolumeMount {
    /// The volume's name.
    pub name: String,
    /// The absolute guest directory it is mounted on (made if missing).
    pub path: String,
    /// Mounted read-only: any number of workspaces may; read-write, one
    /// running workspace at a time.
    #[serde(default)]
    pub read_only: bool,
    /// This workspace holds its own copy of the volume (made by the
    /// snapshot it was forked from), not the named volume itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_copy: bool,
}

impl VolumeMount {
    /// Parses `NAME:/guest/path`, `NAME:/guest/path:ro` or `...:rw`.
    pub fn parse(text: &str) -> Result<Self, VolumeMountError> {
        let bad = || {
            VolumeMountError(format!(
                "volume {text:?}: use NAME:/guest/path or NAME:/guest/path:ro"
            ))
        };
        let (name, rest) = text.split_once(':').ok_or_else(bad)?;
        let (path, read_only) = match rest.rsplit_once(':') {
            Some((path, "ro")) => (path, true),
            Some((path, "rw")) => (path, false),
            Some(_) | None => (rest, false),
        };
        let mount = Self {
            name: name.to_owned(),
            path: path.to_owned(),
            read_only,
            own_copy: false,
        };
        mount.validate()?;
        Ok(mount)
    }

    /// Checks the name's form and the guest path.
    pub fn validate(&self) -> Result<(), VolumeMountError> {
        crate::store::name::validate_full_name(&self.name)
            .map_err(|e| VolumeMountError(format!("volume name `{}`: {e}", self.name)))?;
        let bad = |why: &str| {
            Err(VolumeMountError(format!(
                "volume `{}` guest path {:?}: {why}",
                self.name, self.path
            )))
        };
        let path = self.path.trim_end_matches('/');
        if !self.path.starts_with('/') {
            return bad("use an absolute path, e.g. /data");
        }
        if self.path.len() > MAX_PATH || self.path.contains('\0') {
            return bad("too long, or has a NUL byte");
        }
        if path.split('/').any(|c| c == ".." || c == ".") {
            return bad("`.` and `..` are not allowed");
        }
        if RESERVED.contains(&if path.is_empty() { "/" } else { path }) {
            return bad("the system's own directory; choose another, e.g. /data");
        }
        Ok(())
    }

    /// The guest path without a trailing `/`.
    pub fn guest_dir(&self) -> &str {
        self.path.trim_end_matches('/')
    }

    /// The GET_ID serial its disk answers with (20 bytes, from the name):
    /// the guest agent finds the disk by it, never by device order.
    pub fn serial(&self) -> String {
        let digest = Sha256::digest(self.name.as_bytes());
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("vol-{hex}")
    }
}

/// Checks a workspace's set: at most [`VOLUME_SLOTS`], each valid, no
/// volume or guest path twice, no path inside another.
pub fn validate(mounts: &[VolumeMount]) -> Result<(), VolumeMountError> {
    if mounts.len() > VOLUME_SLOTS {
        return Err(VolumeMountError(format!(
            "{} volumes; a workspace mounts at most {VOLUME_SLOTS}",
            mounts.len()
        )));
    }
    for (i, m) in mounts.iter().enumerate() {
        m.validate()?;
        for other in &mounts[..i] {
            if other.name == m.name {
                return Err(VolumeMountError(format!(
                    "volume `{}` is named twice; mount it once",
                    m.name
                )));
            }
            let (a, b) = (other.guest_dir(), m.guest_dir());
            let nested = |outer: &str, inner: &str| {
                inner == outer || inner.starts_with(&format!("{outer}/"))
            };
            if nested(a, b) || nested(b, a) {
                return Err(VolumeMountError(format!(
                    "volumes `{}` and `{}` are mounted on {a} and {b}; use separate directories",
                    other.name, m.name
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_path_and_mode() {
        let m = VolumeMount::parse("cache:/data").unwrap();
        assert_eq!(
            (m.name.as_str(), m.path.as_str(), m.read_only),
            ("cache", "/data", false)
        );
        assert!(VolumeMount::parse("cache:/data:ro").unwrap().read_only);
        assert!(!VolumeMount::parse("cache:/data:rw").unwrap().read_only);
        for bad in [
            "cache",
            "cache:data",
            "Cache:/data",
            "cache:/",
            "cache:/etc",
            "cache:/usr/",
            "cache:/a/../etc",
            ":/data",
        ] {
            assert!(VolumeMount::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_set_has_no_repeats_or_nesting_and_fits_the_slots() {
        let m = |t: &str| VolumeMount::parse(t).unwrap();
        assert!(validate(&[m("a:/a"), m("b:/b")]).is_ok());
        assert!(validate(&[m("a:/a"), m("a:/b")]).is_err());
        assert!(validate(&[m("a:/a"), m("b:/a/x")]).is_err());
        assert!(validate(&[m("a:/a/"), m("b:/a")]).is_err());
        assert!(validate(&[m("a:/ab"), m("b:/a")]).is_ok());
        let five: Vec<_> = (0..5).map(|i| m(&format!("v{i}:/v{i}"))).collect();
        assert!(validate(&five).is_err());
    }

    #[test]
    fn serials_fit_get_id_and_differ_by_name() {
        let a = VolumeMount::parse("a:/a").unwrap().serial();
        let b = VolumeMount::parse("b:/a").unwrap().serial();
        assert_eq!(a.len(), 20);
        assert_ne!(a, b);
    }
}
