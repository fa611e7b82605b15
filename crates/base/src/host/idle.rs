//! The idle settings: how long a running workspace may sit with nothing
//! to do before its vCPUs stop, and before it hibernates (its machine
//! written into its directory, its VMM gone; docs/snapshots.md, "Idle
//! workspaces"). A workspace's own `idle_pause_secs`/`idle_hibernate_secs`
//! win; else `config.json`'s `idle` object; else two minutes, and never.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The `config.json` key.
pub const CONFIG_KEY: &str = "idle";
/// Idle seconds before a workspace pauses, when nothing says otherwise.
pub const DEFAULT_PAUSE_SECS: u64 = 120;
/// Longest setting accepted (a week): beyond it, say 0 for never.
pub const MAX_PAUSE_SECS: u64 = 7 * 24 * 3600;
/// Shortest setting other than 0: the idle watcher looks every quarter of
/// it, and each ask of the guest's agent wakes the guest.
pub const MIN_PAUSE_SECS: u64 = 5;

/// Why a setting is unusable.
#[derive(Debug, thiserror::Error)]
pub enum IdleConfigError {
    /// `config.json` could not be read or its `idle` object parsed.
    #[error(transparent)]
    Config(#[from] crate::host::settings::ConfigError),
    /// The seconds are out of range.
    #[error(
        "idle {what} of {secs} s: use 0 (never) or {MIN_PAUSE_SECS} s to {MAX_PAUSE_SECS} s (a week)"
    )]
    OutOfRange {
        /// `pause` or `hibernate`.
        what: &'static str,
        /// The setting.
        secs: u64,
    },
}

fn check_secs(what: &'static str, secs: u64) -> Result<(), IdleConfigError> {
    if secs == 0 || (MIN_PAUSE_SECS..=MAX_PAUSE_SECS).contains(&secs) {
        Ok(())
    } else {
        Err(IdleConfigError::OutOfRange { what, secs })
    }
}

/// Checks an idle pause in seconds (0: never).
pub fn check_pause_secs(secs: u64) -> Result<(), IdleConfigError> {
    check_secs("pause", secs)
}

/// Checks an idle hibernation in seconds (0: never), in the same range.
pub fn check_hibernate_secs(secs: u64) -> Result<(), IdleConfigError> {
    check_secs("hibernate", secs)
}

/// `config.json`'s `idle` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleConfig {
    /// Seconds a workspace that names none sits idle before it pauses; 0
    /// never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_secs: Option<u64>,
    /// Seconds a workspace that names none sits idle before it hibernates;
    /// 0 (the default) never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernate_secs: Option<u64>,
}

impl IdleConfig {
    /// The setting of the state directory at `root` (defaults when the file
    /// or the object is missing).
    pub fn load(root: &Path) -> Result<Self, IdleConfigError> {
        let config: Self = crate::host::settings::config_section(root, CONFIG_KEY)?
            .map(|(c, _)| c)
            .unwrap_or_default();
        if let Some(secs) = config.pause_secs {
            check_pause_secs(secs)?;
        }
        if let Some(secs) = config.hibernate_secs {
            check_hibernate_secs(secs)?;
        }
        Ok(config)
    }

    /// How long a workspace whose spec says `own` (seconds, 0 never) may
    /// sit idle before it pauses (None: never).
    pub fn pause_after(&self, own: Option<u64>) -> Option<Duration> {
        match own.or(self.pause_secs).unwrap_or(DEFAULT_PAUSE_SECS) {
            0 => None,
            secs => Some(Duration::from_secs(secs)),
        }
    }

    /// How long a workspace whose spec says `own` (seconds, 0 never) may
    /// sit idle before it hibernates (None: never, the default).
    pub fn hibernate_after(&self, own: Option<u64>) -> Option<Duration> {
        match own.or(self.hibernate_secs).unwrap_or(0) {
            0 => None,
            secs => Some(Duration::from_secs(secs)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_then_the_host_then_two_minutes_say_when_it_pauses() {
        let host = IdleConfig {
            pause_secs: Some(30),
            hibernate_secs: None,
        };
        assert_eq!(host.pause_after(Some(10)), Some(Duration::from_secs(10)));
        assert_eq!(host.pause_after(Some(0)), None);
        assert_eq!(host.pause_after(None), Some(Duration::from_secs(30)));
        let default = IdleConfig::default();
        assert_eq!(default.pause_after(None), Some(Duration::from_secs(120)));
        assert_eq!(
            IdleConfig {
                pause_secs: Some(0),
                hibernate_secs: None,
            }
            .pause_after(None),
            None
        );
    }

    #[test]
    fn hibernation_is_off_unless_the_workspace_or_the_host_sets_it() {
        assert_eq!(IdleConfig::default().hibernate_after(None), None);
        let host = IdleConfig {
            pause_secs: None,
            hibernate_secs: Some(600),
        };
        assert_eq!(host.hibernate_after(None), Some(Duration::from_secs(600)));
        assert_eq!(host.hibernate_after(Some(0)), None);
        assert_eq!(
            host.hibernate_after(Some(60)),
            Some(Duration::from_secs(60))
        );
        let e = check_hibernate_secs(3).unwrap_err().to_string();
        assert!(e.contains("idle hibernate of 3 s"), "{e}");
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        for ok in [0, 5, 120, MAX_PAUSE_SECS] {
            check_pause_secs(ok).unwrap();
        }
        for bad in [1, 4, MAX_PAUSE_SECS + 1] {
            let e = check_pause_secs(bad).unwrap_err().to_string();
            assert!(e.contains("use 0 (never)"), "{e}");
        }
    }

    #[test]
    fn the_host_setting_is_read_from_config_json() {
        let root = std::env::temp_dir().join(format!(
            "ma-idle-{}-{}",
            std::process::id(),
            crate::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&root).unwrap();
        assert_eq!(IdleConfig::load(&root).unwrap(), IdleConfig::default());
        let file = root.join(crate::host::settings::CONFIG_FILE);
        std::fs::write(&file, r#"{"idle": {"pause_secs": 45}}"#).unwrap();
        assert_eq!(IdleConfig::load(&root).unwrap().pause_secs, Some(45));
        std::fs::write(&file, r#"{"idle": {"pause_secs": 2}}"#).unwrap();
        assert!(IdleConfig::load(&root).is_err());
        std::fs::write(&file, r#"{"idle": {"hibernate_secs": 600}}"#).unwrap();
        assert_eq!(IdleConfig::load(&root).unwrap().hibernate_secs, Some(600));
        std::fs::write(&file, r#"{"idle": {"hibernate_secs": 1}}"#).unwrap();
        assert!(IdleConfig::load(&root).is_err());
        // A misspelt key would silently mean the default.
        std::fs::write(&file, r#"{"idle": {"pause": 0}}"#).unwrap();
        assert!(IdleConfig::load(&root).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
