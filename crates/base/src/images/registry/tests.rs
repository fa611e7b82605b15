//! The registry's unit tests: imports, built images, pulled images awaiting
//! their conversion.

use super::*;

fn fake_image(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut kernel = vec![0u8; 4096];
    kernel[..4].copy_from_slice(b"\x7fELF");
    std::fs::write(dir.join(KERNEL_FILE), kernel).unwrap();
    let mut rootfs = vec![0u8; 8192];
    rootfs[1080..1082].copy_from_slice(&[0x53, 0xef]);
    std::fs::write(dir.join(ROOTFS_FILE), rootfs).unwrap();
}

fn registry(test: &str) -> (ImageRegistry, PathBuf) {
    let root = std::env::temp_dir().join(format!("microagent-img-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let state = StateDir::at(root.join("state")).unwrap();
    let assets = root.join("assets");
    std::fs::create_dir_all(&assets).unwrap();
    (
        ImageRegistry::new(&state, Some(assets), KernelVariant::Compat),
        root,
    )
}

#[test]
fn import_list_get_remove() {
    let (reg, root) = registry("cycle");
    let src = root.join("src");
    fake_image(&src);
    let info = reg.import_dir("mine", &src).unwrap();
    assert_eq!(info.kernel_bytes, 4096);
    assert_eq!(reg.get("mine").unwrap(), info);
    assert_eq!(reg.list().unwrap(), vec![info.clone()]);
    let again = reg.import_dir("mine", &src).unwrap_err();
    assert_eq!(again.code(), ErrorCode::Conflict);
    let in_use = reg.remove("mine", vec!["dev".into()]).unwrap_err();
    assert_eq!(in_use.code(), ErrorCode::Conflict);
    assert!(in_use.to_string().contains("dev"));
    assert!(reg.get("mine").is_ok(), "a refused rm changes nothing");
    reg.remove("mine", Vec::new()).unwrap();
    assert_eq!(reg.get("mine").unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(
        reg.remove("mine", Vec::new()).unwrap_err().code(),
        ErrorCode::NotFound
    );
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn bad_sources_are_refused_and_leave_nothing() {
    let (reg, root) = registry("bad");
    let src = root.join("src");
    fake_image(&src);
    std::fs::write(src.join(ROOTFS_FILE), vec![0u8; 4096]).unwrap();
    let err = reg.import_dir("mine", &src).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidInput);
    assert!(err.to_string().contains("ext4"));
    std::fs::remove_file(src.join(KERNEL_FILE)).unwrap();
    assert_eq!(
        reg.import_dir("mine", &src).unwrap_err().code(),
        ErrorCode::InvalidInput
    );
    assert_eq!(
        reg.import_dir("Bad Name", &src).unwrap_err().code(),
        ErrorCode::InvalidInput
    );
    assert!(reg.list().unwrap().is_empty());
    assert_eq!(std::fs::read_dir(&reg.dir).unwrap().count(), 0);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn scratch_directories_are_apart_within_one_process() {
    let (reg, root) = registry("scratch");
    let (a, b) = (
        reg.scratch_dir("convert").unwrap(),
        reg.scratch_dir("convert").unwrap(),
    );
    assert_ne!(a, b, "two conversions at once must not share one");
    assert!(a.is_dir() && b.is_dir());
    // A dead process's scratch goes with the next; a live one's stays.
    let dead = reg
        .dir
        .join(format!("{SCRATCH_PREFIX}{}-0-convert", u32::MAX));
    std::fs::create_dir(&dead).unwrap();
    let c = reg.scratch_dir("unpack").unwrap();
    assert!(!dead.exists(), "a dead process's scratch stayed");
    assert!(a.is_dir() && b.is_dir() && c.is_dir());
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn built_images_are_imported_on_first_use() {
    let (reg, root) = registry("built");
    let assets = root.join("assets");
    let src = root.join("src");
    fake_image(&src);
    std::fs::copy(src.join(KERNEL_FILE), assets.join("vmlinux-compat")).unwrap();
    std::fs::copy(src.join(ROOTFS_FILE), assets.join("rootfs-minimal.ext4")).unwrap();
    assert_eq!(reg.get("debian").unwrap_err().code(), ErrorCode::NotFound);
    let info = reg.get("minimal").unwrap();
    assert_eq!(info.name, "minimal");
    assert!(info.rootfs.exists());
    assert_eq!(reg.list().unwrap().len(), 1);
    std::fs::remove_dir_all(root).unwrap();
}

fn pulled(name: &str) -> PulledImage {
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {crate::images::oci::config::DESCRIPTION_KEY: "a tool"}},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", "b".repeat(64))]},
    });
    PulledImage {
        name: name.into(),
        reference: "127.0.0.1:5000/team/tool:1".into(),
        manifest_digest: format!("sha256:{}", "c".repeat(64)),
        config_digest: format!("sha256:{}", "d".repeat(64)),
        config_json: config.to_string(),
        layers: vec![format!("sha256:{}", "a".repeat(64))],
        pulled_at_ms: 7,
    }
}

#[test]
fn a_pulled_image_is_listed_found_and_removed_before_its_conversion() {
    let (reg, root) = registry("pulled");
    let shown = reg.record_pulled(&pulled("tool-1")).unwrap();
    assert!(shown.awaiting_conversion);
    assert_eq!(shown.description.as_deref(), Some("a tool"));
    assert_eq!(reg.list().unwrap(), vec![shown.clone()]);
    assert_eq!(reg.find("tool-1").unwrap(), Some(shown.clone()));
    assert_eq!(reg.find("other").unwrap(), None);
    // The same image pulled again is recorded again; another under its
    // name is refused, and the name is taken for imports too.
    assert_eq!(reg.record_pulled(&pulled("tool-1")).unwrap(), shown);
    let other = PulledImage {
        manifest_digest: format!("sha256:{}", "e".repeat(64)),
        ..pulled("tool-1")
    };
    assert_eq!(
        reg.record_pulled(&other).unwrap_err().code(),
        ErrorCode::Conflict
    );
    assert_eq!(
        reg.check_free("tool-1").unwrap_err().code(),
        ErrorCode::Conflict
    );
    let resolved = crate::images::oci::layout::Resolved {
        reference: None,
        manifest_digest: other.manifest_digest.clone(),
        config_digest: other.config_digest.clone(),
        config: crate::images::oci::config::ImageConfig::parse(other.config_json.as_bytes())
            .unwrap(),
        layers: Vec::new(),
        layers_verified: true,
    };
    let imported = reg.import_image(
        "tool-1",
        &resolved,
        Path::new("elsewhere"),
        &mut |_| {},
        &mut |_| crate::images::oci::rootfs::LayerArrival::Never,
        &std::sync::atomic::AtomicBool::new(false),
    );
    assert_eq!(imported.unwrap_err().code(), ErrorCode::Conflict);
    // A built image's name is not a pull's to take.
    assert_eq!(
        reg.record_pulled(&pulled("minimal")).unwrap_err().code(),
        ErrorCode::Conflict
    );
    // Its first use converts it, which needs the built `minimal`: refused,
    // and the pull stays as it was.
    let err = reg.get("tool-1").unwrap_err();
    assert!(matches!(err, ImageError::NoBase(_)), "{err:?}");
    assert_eq!(reg.find("tool-1").unwrap(), Some(shown));
    // In use: kept; else removed (its layers are the blob store's).
    assert_eq!(
        reg.remove("tool-1", vec!["dev".into()]).unwrap_err().code(),
        ErrorCode::Conflict
    );
    reg.remove("tool-1", Vec::new()).unwrap();
    assert_eq!(reg.find("tool-1").unwrap(), None);
    assert!(reg.list().unwrap().is_empty());
    assert_eq!(
        reg.remove("tool-1", Vec::new()).unwrap_err().code(),
        ErrorCode::NotFound
    );
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn a_damaged_record_hides_nothing_else_and_can_be_removed() {
    let (reg, root) = registry("pulled-damaged");
    let good = reg.record_pulled(&pulled("tool-1")).unwrap();
    reg.record_pulled(&pulled("tool-2")).unwrap();
    let record = reg.dir.join(".pulled/tool-2.json");
    std::fs::write(&record, b"{ not json").unwrap();
    assert_eq!(reg.list().unwrap(), vec![good.clone()]);
    assert!(reg.find("tool-2").is_err());
    // A record naming another image is damaged too.
    let moved = serde_json::to_string(&pulled("tool-1")).unwrap();
    std::fs::write(reg.dir.join(".pulled/tool-3.json"), moved).unwrap();
    assert_eq!(
        reg.find("tool-3").unwrap_err().code(),
        ErrorCode::InvalidInput
    );
    assert_eq!(reg.list().unwrap(), vec![good]);
    reg.remove("tool-2", Vec::new()).unwrap();
    reg.remove("tool-3", Vec::new()).unwrap();
    assert!(!record.exists());
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn a_conversion_that_ended_before_its_record_went_is_the_image() {
    let (reg, root) = registry("pulled-crash");
    reg.record_pulled(&pulled("tool-1")).unwrap();
    // Registered by a conversion that died before removing the record.
    let src = root.join("src");
    fake_image(&src);
    let converted = reg.import_dir("tool-1", &src).unwrap();
    assert_eq!(reg.list().unwrap(), vec![converted.clone()]);
    assert_eq!(reg.get("tool-1").unwrap(), converted);
    // The next conversion finds it and drops the record.
    assert_eq!(
        reg.convert_pulled("tool-1", &mut |_| {}).unwrap(),
        converted
    );
    assert_eq!(reg.pulled("tool-1").unwrap(), None);
    std::fs::remove_dir_all(root).unwrap();
}
