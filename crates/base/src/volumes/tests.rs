//! Volumes made for real with mkfs.ext4 and debugfs: empty, from a
//! directory, from a tar, exported, refused while mounted.

use std::os::unix::fs::PermissionsExt;

use super::*;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> Option<(Scratch, VolumeStore)> {
    if host_tool_missing() {
        eprintln!("skipped: mkfs.ext4 or debugfs missing (apt-get install e2fsprogs)");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("ma-volumes-{}", unique_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = StateDir::at(dir.join("state")).unwrap();
    let store = VolumeStore::new(&state);
    Some((Scratch(dir), store))
}

fn host_tool_missing() -> bool {
    ["mkfs.ext4", "debugfs"]
        .iter()
        .any(|t| crate::host::settings::host_tool(t).is_none())
}

/// `debugfs -R "stat PATH"` of the volume's disk.
fn stat(store: &VolumeStore, name: &str, path: &str) -> String {
    let out = std::process::Command::new(crate::host::settings::host_tool("debugfs").unwrap())
        .arg("-R")
        .arg(format!("stat {path}"))
        .arg(store.disk(name).unwrap())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_empty_volume_is_sparse_and_owned_by_the_guest_user() {
    let Some((_s, store)) = scratch() else { return };
    let v = store
        .create("cache", None, &VolumeSource::Empty, None)
        .unwrap();
    assert_eq!(v.size_mib, DEFAULT_SIZE_MIB);
    assert!(v.used_bytes < 64 << 20, "not sparse: {v:?}");
    assert!(stat(&store, "cache", "/").contains("User:  1000   Group:  1000"));
    assert_eq!(store.list().unwrap().len(), 1);
    // The name is taken; a bad name or size changes nothing.
    let again = store
        .create("cache", None, &VolumeSource::Empty, None)
        .unwrap_err();
    assert_eq!(again.code(), ErrorCode::Conflict);
    let bad = store
        .create("Cache", None, &VolumeSource::Empty, None)
        .unwrap_err();
    assert_eq!(bad.code(), ErrorCode::InvalidInput);
    let small = store
        .create("tiny", Some(1), &VolumeSource::Empty, None)
        .unwrap_err();
    assert_eq!(small.code(), ErrorCode::InvalidInput);
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn a_directory_becomes_the_guest_users_files_with_their_modes() {
    let Some((s, store)) = scratch() else { return };
    let src = s.0.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("run.sh"), "echo hi\n").unwrap();
    std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::write(src.join("sub/data"), vec![7u8; 10_000]).unwrap();
    std::os::unix::fs::symlink("run.sh", src.join("link")).unwrap();
    let v = store
        .create("data", Some(32), &VolumeSource::Dir(src.clone()), None)
        .unwrap();
    assert_eq!(
        v.source.as_deref(),
        Some(format!("dir {}", src.display()).as_str())
    );
    let run = stat(&store, "data", "/run.sh");
    assert!(run.contains("User:  1000   Group:  1000"), "{run}");
    assert!(run.contains("Mode:  0750"), "{run}");
    assert!(stat(&store, "data", "/link").contains("Type: symlink"));

    // Exported and read back: the same files.
    let tar_path = s.0.join("data.tar");
    let export = store.export("data", &tar_path).unwrap();
    assert_eq!(export.entries, 4, "{export:?}");
    let again = store.export("data", &tar_path).unwrap_err();
    assert_eq!(
        again.code(),
        ErrorCode::InvalidInput,
        "an existing file is kept"
    );
    let copy = store
        .create("copy", None, &VolumeSource::Tar(tar_path), None)
        .unwrap();
    assert_eq!(copy.source.map(|s| s.starts_with("tar ")), Some(true));
    assert!(stat(&store, "copy", "/sub/data").contains("Size: 10000"));
    assert!(stat(&store, "copy", "/link").contains("Fast link dest: \"run.sh\""));
    assert!(stat(&store, "copy", "/run.sh").contains("Mode:  0750"));

    // A source that is too big for the size asked, or not a directory.
    let err = store
        .create(
            "small",
            Some(16),
            &VolumeSource::Dir(s.0.join("nothing")),
            None,
        )
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidInput);
    std::fs::write(src.join("big"), vec![1u8; 20 << 20]).unwrap();
    let err = store
        .create("small", Some(16), &VolumeSource::Dir(src), None)
        .unwrap_err();
    assert!(err.to_string().contains("give a larger size"), "{err}");
    assert!(matches!(store.get("small"), Err(VolumeError::NotFound(_))));
}

#[test]
fn a_mounted_volume_is_not_removed() {
    let Some((_s, store)) = scratch() else { return };
    store
        .create("keep", Some(16), &VolumeSource::Empty, None)
        .unwrap();
    let err = store.remove("keep", vec!["ws".into()]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert!(matches!(
        err.remedy(),
        Some(Remedy::DeleteWorkspacesFirst { .. })
    ));
    assert!(store.get("keep").is_ok());
    store.remove("keep", Vec::new()).unwrap();
    assert_eq!(store.get("keep").unwrap_err().code(), ErrorCode::NotFound);
    assert!(store.list().unwrap().is_empty(), "no leftovers listed");
}
