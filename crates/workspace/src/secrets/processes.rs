//! Which secrets a background process was started with, by name, so that
//! reads of its output (by any later caller) are masked. Kept in the
//! workspace's directory, one file per process (names only, never values).

use std::path::{Path, PathBuf};

use super::SecretError;
use base::store::{read_json, write_json_atomic, StoreError};

/// The directory of the records in a workspace's directory.
const DIR: &str = "process-secrets";

/// The record of process `id`: the id hex-encoded, since process ids may
/// be `.` or `..`.
fn record(ws: &Path, id: &str) -> PathBuf {
    let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    ws.join(DIR).join(format!("p-{hex}.json"))
}

/// Records that process `id` of the workspace in `ws` got `names`.
pub(crate) fn remember(ws: &Path, id: &str, names: &[String]) -> Result<(), SecretError> {
    if names.is_empty() {
        return Ok(());
    }
    base::store::make_private_dir(&ws.join(DIR))?;
    write_json_atomic(&record(ws, id), &names)?;
    Ok(())
}

/// The secrets process `id` got (none when it got none).
pub(crate) fn names(ws: &Path, id: &str) -> Result<Vec<String>, SecretError> {
    match read_json(&record(ws, id)) {
        Ok(names) => Ok(names),
        Err(StoreError::Missing { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Forgets process `id`'s record.
pub(crate) fn forget(ws: &Path, id: &str) {
    let _ = std::fs::remove_file(record(ws, id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_kept_per_process() {
        let ws = std::env::temp_dir().join(format!(
            "ma-proc-secrets-{}",
            base::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&ws).unwrap();
        let names = vec!["TOKEN".to_owned()];
        remember(&ws, "..", &names).unwrap();
        assert_eq!(super::names(&ws, "..").unwrap(), names);
        assert!(super::names(&ws, "proc-1").unwrap().is_empty());
        assert!(record(&ws, "..").starts_with(ws.join(DIR)));
        forget(&ws, "..");
        assert!(super::names(&ws, "..").unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&ws);
    }
}
