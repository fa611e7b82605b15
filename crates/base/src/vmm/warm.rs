//! A warm snapshot's record (`warm.json`) and its promotion: the starting
//! client writes the record into a pending directory, the VMM process
//! writes the snapshot beside it and promotes it ([`promote`]).

use std::path::Path;

use crate::vmm::seal;
use serde::{Deserialize, Serialize};

/// A warm snapshot's record.
pub const WARM_RECORD: &str = "warm.json";
/// The prefix of a warm snapshot being written by a starting VMM.
pub const PENDING_PREFIX: &str = ".pending-";
/// What a warm snapshot was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmRecord {
    /// Its directory's name.
    pub key: String,
    /// Everything that must not have changed for it to be usable.
    pub fingerprint: String,
    /// The workspace whose first boot it is.
    pub from: String,
    /// Unix ms when it was kept.
    pub created_at_ms: u64,
    /// The memory file's digest, set when the snapshot is promoted.
    #[serde(default)]
    pub memory_sha256: Option<String>,
    /// The disk copy's digest, set when the snapshot is promoted.
    #[serde(default)]
    pub disk_sha256: Option<String>,
    /// The code-session kernels running in it, by language, made ahead
    /// for a fresh workspace's first sessions to take.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready_kernels: Vec<String>,
}

/// Seals the snapshot written into `pending`: its record gets the memory
/// file's and the disk copy's digests, and the tree is synced.
pub fn seal(pending: &Path) -> std::io::Result<WarmRecord> {
    let mut record: WarmRecord = crate::store::read_json(&pending.join(WARM_RECORD))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    record.memory_sha256 = Some(seal::Sealed::Memory.digest(pending)?);
    record.disk_sha256 = Some(seal::Sealed::Disk.digest(pending)?);
    crate::store::write_json_atomic(&pending.join(WARM_RECORD), &record)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    seal::sync_tree(pending)?;
    Ok(record)
}

/// Makes the record's directory the warm snapshot of its key (the VMM
/// process calls this once it has written the snapshot into `pending`); if
/// another start kept one first, `pending` is removed.
pub fn promote(pending: &Path) -> std::io::Result<()> {
    let record = seal(pending)?;
    let parent = pending.parent().unwrap_or(Path::new("."));
    if std::fs::rename(pending, parent.join(&record.key)).is_err() {
        std::fs::remove_dir_all(pending)?;
    }
    seal::sync_dir(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_without_ready_kernels_reads_as_having_none() {
        let old = r#"{"key":"k","fingerprint":"f","from":"w","created_at_ms":1}"#;
        let record: WarmRecord = serde_json::from_str(old).unwrap();
        assert!(record.ready_kernels.is_empty());
        let back = serde_json::to_value(&record).unwrap();
        assert!(back.get("ready_kernels").is_none(), "{back}");
        let ready = WarmRecord {
            ready_kernels: vec!["python".into()],
            ..record
        };
        let text = serde_json::to_string(&ready).unwrap();
        assert_eq!(serde_json::from_str::<WarmRecord>(&text).unwrap(), ready);
    }
}
