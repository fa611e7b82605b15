//! The secret store on a real directory: modes, names, values, atomic
//! replacement, and listings without values.

use std::os::unix::fs::PermissionsExt;

use super::*;
use base::host::settings::unique_id;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> (Scratch, SecretStore) {
    let dir = std::env::temp_dir().join(format!("ma-secrets-{}", unique_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = StateDir::at(dir.join("state")).unwrap();
    (Scratch(dir), SecretStore::new(&state))
}

fn value(v: &str) -> SecretValue {
    SecretValue::new("S", v.as_bytes().to_vec()).unwrap()
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_secret_is_kept_private_and_read_back() {
    let (_s, store) = scratch();
    let info = store.set("API_TOKEN", &value("hunter2")).unwrap();
    assert_eq!(info.name, "API_TOKEN");
    assert!(info.updated_at_ms > 0);
    assert_eq!(mode(&store.root), 0o700);
    assert_eq!(mode(&store.root.join("API_TOKEN")), 0o600);
    assert_eq!(store.get("API_TOKEN").unwrap().expose(), "hunter2");
    let resolved = store.resolve(&["API_TOKEN".to_owned()]).unwrap();
    assert_eq!(resolved[0].1.expose(), "hunter2");
}

#[test]
fn setting_again_replaces_atomically() {
    let (_s, store) = scratch();
    store.set("K", &value("one")).unwrap();
    store.set("K", &value("two")).unwrap();
    assert_eq!(store.get("K").unwrap().expose(), "two");
    assert_eq!(mode(&store.root.join("K")), 0o600);
    let names: Vec<String> = std::fs::read_dir(&store.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["K"], "no temporary file is left");
}

#[test]
fn the_list_has_names_and_times_only() {
    let (_s, store) = scratch();
    assert!(store.list().unwrap().is_empty(), "no directory yet");
    store.set("B_TOKEN", &value("sekrit-b")).unwrap();
    store.set("A_TOKEN", &value("sekrit-a")).unwrap();
    let list = store.list().unwrap();
    let names: Vec<&str> = list.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["A_TOKEN", "B_TOKEN"]);
    let json = serde_json::to_string(&list).unwrap();
    assert!(!json.contains("sekrit"), "{json}");
}

#[test]
fn removing_forgets_and_unknown_names_are_not_found() {
    let (_s, store) = scratch();
    store.set("K", &value("v")).unwrap();
    assert_eq!(store.remove("K").unwrap().name, "K");
    for err in [
        store.remove("K").unwrap_err(),
        store.get("K").unwrap_err(),
        store.resolve(&["K".to_owned()]).unwrap_err(),
    ] {
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert_eq!(err.remedy(), Some(Remedy::SetSecret { secret: "K".into() }));
    }
    assert!(store.mask_for(&["K".to_owned()]).is_empty());
}

#[test]
fn names_are_environment_variables() {
    for good in ["A", "_x", "API_TOKEN_2", &"N".repeat(64)] {
        assert!(validate_secret_name(good).is_ok(), "{good}");
    }
    for bad in ["", "2X", "A-B", "A.B", "../x", "a b", "É", &"N".repeat(65)] {
        let err = validate_secret_name(bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput, "{bad}");
    }
    let (_s, store) = scratch();
    assert_eq!(
        store.set("../evil", &value("v")).unwrap_err().code(),
        ErrorCode::InvalidInput
    );
}

#[test]
fn values_are_checked_and_never_in_errors() {
    for (bytes, why) in [
        (Vec::new(), "empty"),
        (vec![b'a'; MAX_SECRET_VALUE + 1], "64 KiB"),
        (b"a\0b".to_vec(), "NUL"),
        (vec![0xff, 0xfe], "UTF-8"),
    ] {
        let err = SecretValue::new("K", bytes).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput);
        assert!(err.to_string().contains(why), "{err}");
    }
    assert!(SecretValue::new("K", vec![b'a'; MAX_SECRET_VALUE]).is_ok());
    let err = SecretValue::new("K", b"sekrit\0".to_vec()).unwrap_err();
    assert!(!format!("{err} {err:?}").contains("sekrit"));
}
