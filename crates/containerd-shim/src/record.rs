//! The shim's record in the bundle directory: which workspace the
//! container runs in and in which state directory, so the `delete` that
//! containerd runs after a shim died (a new process, with only the
//! bundle) can stop and remove what the dead shim started.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::ShimError;

/// Its file in the bundle.
pub const RECORD_FILE: &str = "microagent.json";

/// What the shim keeps about a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The workspace it runs in.
    pub workspace: String,
    /// Whether the workspace is this container's (deleted with it), not
    /// its pod's sandbox's.
    pub owns_workspace: bool,
    /// The microagent state directory the workspace is in.
    pub state_dir: PathBuf,
}

/// The workspace of sandbox `sandbox` in containerd namespace
/// `namespace`: container ids are longer than workspace names and may
/// hold characters they may not, so it is a digest of both.
pub fn workspace_name(namespace: &str, sandbox: &str) -> String {
    let digest = format!("{:x}", Sha256::digest(format!("{namespace}/{sandbox}")));
    format!("ctr-{}", &digest[..20])
}

/// Writes the record of the container whose bundle is `bundle` (the
/// library's atomic JSON write: a crash leaves the old record or the new).
pub fn write(bundle: &Path, record: &Record) -> Result<(), ShimError> {
    workspace::store::write_json_atomic(&bundle.join(RECORD_FILE), record).map_err(ShimError::Write)
}

/// Reads it; None when there is none (the container never got as far as
/// a workspace).
pub fn read(bundle: &Path) -> Result<Option<Record>, ShimError> {
    let path = bundle.join(RECORD_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ShimError::Record {
                what: "read",
                path,
                source: e.into(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ShimError::Record {
            what: "read",
            path,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_workspace_names_and_apart_per_namespace() {
        let a = workspace_name("default", "0123456789abcdef0123456789abcdef01234567");
        let b = workspace_name("k8s.io", "0123456789abcdef0123456789abcdef01234567");
        assert_ne!(a, b);
        workspace::store::name::validate_name(&a).unwrap();
    }

    #[test]
    fn a_record_round_trips_and_a_missing_one_is_none() {
        let dir = std::env::temp_dir().join(format!("ma-shim-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read(&dir).unwrap(), None);
        let record = Record {
            workspace: "ctr-1".into(),
            owns_workspace: true,
            state_dir: "/var/lib/microagent".into(),
        };
        write(&dir, &record).unwrap();
        assert_eq!(read(&dir).unwrap(), Some(record));
        std::fs::write(dir.join(RECORD_FILE), b"{").unwrap();
        assert!(read(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
