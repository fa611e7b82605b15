//! The record store on a real directory: missing records, refused names,
//! atomic writes, listings that pass over junk, and hostile files.

use std::os::unix::fs::PermissionsExt;

use super::*;

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Note {
    text: String,
}

fn note(text: &str) -> Note {
    Note { text: text.into() }
}

fn lowercase(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(layout: RecordLayout) -> (Scratch, RecordStore<Note>) {
    let dir =
        std::env::temp_dir().join(format!("ma-records-{}", crate::host::settings::unique_id()));
    let store = RecordStore::new(dir.join("notes"), layout, lowercase);
    (Scratch(dir), store)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_missing_record_is_none_and_removing_it_is_fine() {
    for layout in [
        RecordLayout::File(".json"),
        RecordLayout::Folder("note.json"),
    ] {
        let (_s, store) = scratch(layout);
        assert!(store.get("absent").unwrap().is_none(), "no directory yet");
        assert!(store.names().unwrap().is_empty());
        assert!(!store.remove("absent").unwrap());
        assert!(store
            .update("absent", |n| n.text.clear())
            .unwrap()
            .is_none());
        store.put("here", &note("x")).unwrap();
        assert!(store.get("absent").unwrap().is_none());
        assert!(store.remove("here").unwrap());
        assert!(store.get("here").unwrap().is_none());
        assert!(!store.remove("here").unwrap());
    }
}

#[test]
fn bad_names_are_refused_before_any_path_is_made() {
    let (_s, store) = scratch(RecordLayout::File(".json"));
    for bad in ["", "../etc", "a/b", ".", "..", ".hidden", "UPPER", "a.b"] {
        for err in [
            store.get(bad).unwrap_err(),
            store.put(bad, &note("x")).unwrap_err(),
            store.remove(bad).unwrap_err(),
        ] {
            assert!(matches!(err, RecordError::Name { .. }), "{bad}: {err}");
            assert_eq!(err.code(), ErrorCode::InvalidInput, "{bad}");
        }
    }
    let long = "x".repeat(10_000);
    let err = store.get(&format!("{long}/")).unwrap_err();
    assert!(err.to_string().len() < 200, "the name is cut: {err}");
    assert!(!store.dir().exists(), "nothing was written");
}

#[test]
fn a_put_is_atomic_private_and_leaves_no_temporary() {
    let (_s, store) = scratch(RecordLayout::File(".json"));
    store.put("one", &note("first")).unwrap();
    store.put("one", &note("second")).unwrap();
    assert_eq!(store.get("one").unwrap(), Some(note("second")));
    assert_eq!(entries(store.dir()), ["one.json"]);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(store.dir()), 0o700);
    assert_eq!(mode(&store.dir().join("one.json")), 0o600);
    // The format is write_json_atomic's: pretty JSON and a newline.
    let text = std::fs::read_to_string(store.dir().join("one.json")).unwrap();
    assert_eq!(text, "{\n  \"text\": \"second\"\n}\n");
}

#[test]
fn create_adds_once_and_update_changes_under_a_lock() {
    let (_s, store) = scratch(RecordLayout::Folder("note.json"));
    assert!(store.create("one", &note("a")).unwrap());
    assert!(
        !store.create("one", &note("b")).unwrap(),
        "the name is taken"
    );
    assert_eq!(store.get("one").unwrap(), Some(note("a")));
    let changed = store.update("one", |n| n.text.push('!')).unwrap();
    assert_eq!(changed, Some(note("a!")));
    assert_eq!(store.get("one").unwrap(), Some(note("a!")));
    assert_eq!(
        entries(&store.dir().join("one")),
        ["note.json", "note.lock"],
        "no temporary is left"
    );
}

#[test]
fn the_listing_is_sorted_and_passes_over_junk() {
    let (_s, store) = scratch(RecordLayout::File(".json"));
    store.put("beta", &note("b")).unwrap();
    store.put("alpha", &note("a")).unwrap();
    let dir = store.dir();
    for junk in [
        ".alpha.json.tmp123",
        ".new-x-1",
        "Upper.json",
        "gamma.txt",
        "a.b.json",
    ] {
        std::fs::write(dir.join(junk), b"{}").unwrap();
    }
    std::fs::create_dir(dir.join("folder.json")).unwrap();
    std::os::unix::fs::symlink(dir.join("alpha.json"), dir.join("linked.json")).unwrap();
    assert_eq!(store.names().unwrap(), ["alpha", "beta"]);

    let (_s, folders) = scratch(RecordLayout::Folder("note.json"));
    folders.put("one", &note("1")).unwrap();
    std::fs::write(folders.dir().join("two"), b"a file, not a folder").unwrap();
    std::fs::create_dir(folders.dir().join(".gone-three-1")).unwrap();
    assert_eq!(folders.names().unwrap(), ["one"]);
    assert!(folders.get("two").unwrap().is_none(), "a file is no record");
}

#[test]
fn an_oversize_record_is_refused_unread() {
    let (_s, store) = scratch(RecordLayout::File(".json"));
    store.put("big", &note("x")).unwrap();
    let path = store.dir().join("big.json");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Sparse: the bound is checked before a byte is read.
    file.set_len(64 << 30).unwrap();
    let err = store.get("big").unwrap_err();
    assert!(matches!(err, RecordError::TooLarge { limit, .. } if limit == MAX_RECORD_BYTES));
    assert_eq!(err.code(), ErrorCode::Internal);
    // A store may bound its records lower.
    let small = RecordFiles::new(store.dir(), RecordLayout::File(".json"), lowercase).max_bytes(4);
    std::fs::write(store.dir().join("five.json"), b"12345").unwrap();
    assert!(matches!(
        small.read("five"),
        Err(RecordError::TooLarge { limit: 4, .. })
    ));
    std::fs::write(store.dir().join("four.json"), b"1234").unwrap();
    assert_eq!(small.read("four").unwrap().unwrap(), b"1234");
}

#[test]
fn corrupt_links_and_fifos_are_errors_naming_the_file() {
    let (_s, store) = scratch(RecordLayout::File(".json"));
    store.put("good", &note("x")).unwrap();
    let dir = store.dir();
    std::fs::write(dir.join("bad.json"), b"{\"text\": 3").unwrap();
    let err = store.get("bad").unwrap_err();
    assert!(matches!(err, RecordError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("bad.json"), "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the parser's cause is kept"
    );

    std::os::unix::fs::symlink("/etc/passwd", dir.join("link.json")).unwrap();
    let err = store.get("link").unwrap_err();
    assert!(err.to_string().contains("link.json"), "{err}");

    let fifo = std::ffi::CString::new(dir.join("fifo.json").into_os_string().into_encoded_bytes())
        .unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path only.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let err = store.get("fifo").unwrap_err();
    assert!(matches!(err, RecordError::NotAFile { .. }), "{err}");
    assert!(err.to_string().contains("fifo.json"), "{err}");
    assert_eq!(store.names().unwrap(), ["bad", "good"]);
}
