//! The idle reclaim setting: `config.json`'s `memory` object. A running
//! workspace whose guest has been idle this long is asked to drop its
//! caches, and the balloon gives the freed memory back to the host
//! (docs/snapshots.md, "Memory given back").

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `config.json` key.
pub const CONFIG_KEY: &str = "memory";
/// Idle minutes before the caches go, when the setting is absent.
pub const DEFAULT_RECLAIM_IDLE_MINUTES: u64 = 10;
/// Longest setting accepted (a week): beyond it, say 0 for never.
pub const MAX_RECLAIM_IDLE_MINUTES: u64 = 7 * 24 * 60;

/// Why the setting is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimConfigError {
    /// `config.json` could not be read or its `memory` object parsed.
    #[error(transparent)]
    Config(#[from] crate::host::settings::ConfigError),
    /// The minutes are out of range.
    #[error(
        "memory.reclaim_idle_minutes is {0}; it must be 0 (never) to {MAX_RECLAIM_IDLE_MINUTES}"
    )]
    OutOfRange(u64),
}

/// `config.json`'s `memory` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryConfig {
    /// Minutes a guest sits idle before it drops its caches; 0 never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_idle_minutes: Option<u64>,
}

impl MemoryConfig {
    /// The setting of the state directory at `root` (defaults when the file
    /// or the object is missing).
    pub fn load(root: &Path) -> Result<Self, ReclaimConfigError> {
        let config: Self = crate::host::settings::config_section(root, CONFIG_KEY)?
            .map(|(c, _)| c)
            .unwrap_or_default();
        match config.reclaim_idle_minutes {
            Some(m) if m > MAX_RECLAIM_IDLE_MINUTES => Err(ReclaimConfigError::OutOfRange(m)),
            _ => Ok(config),
        }
    }

    /// How long a guest may be idle before it drops its caches (None: never).
    pub fn reclaim_after(&self) -> Option<Duration> {
        match self
            .reclaim_idle_minutes
            .unwrap_or(DEFAULT_RECLAIM_IDLE_MINUTES)
        {
            0 => None,
            m => Some(Duration::from_secs(m * 60)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(config: Option<&str>) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "ma-reclaim-{}-{}",
            std::process::id(),
            crate::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&root).unwrap();
        if let Some(text) = config {
            std::fs::write(root.join(crate::host::settings::CONFIG_FILE), text).unwrap();
        }
        root
    }

    #[test]
    fn defaults_to_ten_minutes_and_zero_is_never() {
        let root = root_with(None);
        let c = MemoryConfig::load(&root).unwrap();
        assert_eq!(c.reclaim_after(), Some(Duration::from_secs(600)));
        let root = root_with(Some(r#"{"memory": {"reclaim_idle_minutes": 0}}"#));
        assert_eq!(MemoryConfig::load(&root).unwrap().reclaim_after(), None);
        let root = root_with(Some(r#"{"memory": {"reclaim_idle_minutes": 3}}"#));
        assert_eq!(
            MemoryConfig::load(&root).unwrap().reclaim_after(),
            Some(Duration::from_secs(180))
        );
    }

    #[test]
    fn out_of_range_and_malformed_settings_are_refused() {
        let root = root_with(Some(r#"{"memory": {"reclaim_idle_minutes": 99999999}}"#));
        assert!(matches!(
            MemoryConfig::load(&root),
            Err(ReclaimConfigError::OutOfRange(_))
        ));
        let root = root_with(Some(r#"{"memory": {"reclaim_idle_minutes": "x"}}"#));
        assert!(matches!(
            MemoryConfig::load(&root),
            Err(ReclaimConfigError::Config(_))
        ));
    }
}
