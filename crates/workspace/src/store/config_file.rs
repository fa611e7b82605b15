//! `config.json` in the state directory: the operator's settings, one
//! top-level key per concern (`price`, `task`, `search_registries`, ...).
//! Each concern reads its own key through [`section`]; an absent file or
//! key means its defaults.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// The settings file's name in the state directory.
pub const CONFIG_FILE: &str = "config.json";

/// Why a section could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON, or the key does not hold what it should.
    #[error("{} `{key}` is not valid", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The key (empty: the file as a whole).
        key: &'static str,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// The value of `key` in `root`'s config.json, and the file's path; `None`
/// when the file or the key is absent.
pub fn section<T: DeserializeOwned>(
    root: &Path,
    key: &'static str,
) -> Result<Option<(T, PathBuf)>, ConfigError> {
    let path = root.join(CONFIG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let parse = |key, path: &Path| {
        let path = path.to_owned();
        move |source| ConfigError::Parse { path, key, source }
    };
    let mut all: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).map_err(parse("", &path))?;
    match all.remove(key) {
        None => Ok(None),
        Some(value) => {
            let value = serde_json::from_value(value).map_err(parse(key, &path))?;
            Ok(Some((value, path)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_read_from_its_key_only() {
        let dir = std::env::temp_dir().join(format!("ma-config-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let none: Option<(u32, _)> = section(&dir, "n").unwrap();
        assert!(none.is_none(), "no file: defaults");
        std::fs::write(dir.join(CONFIG_FILE), r#"{"n": 3, "other": "x"}"#).unwrap();
        let (n, path) = section::<u32>(&dir, "n").unwrap().unwrap();
        assert_eq!((n, path), (3, dir.join(CONFIG_FILE)));
        assert!(section::<u32>(&dir, "absent").unwrap().is_none());
        assert!(matches!(
            section::<u32>(&dir, "other"),
            Err(ConfigError::Parse { key: "other", .. })
        ));
        std::fs::write(dir.join(CONFIG_FILE), "not json").unwrap();
        assert!(matches!(
            section::<u32>(&dir, "n"),
            Err(ConfigError::Parse { key: "", .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
