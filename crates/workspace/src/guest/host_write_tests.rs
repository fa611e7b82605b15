//! Tests of `host_write`: hostile archives, planted symlinks, budgets, modes.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// A scratch directory with `dest/` (the copy's destination) and
/// `outside/victim` (what a hostile archive would reach).
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ma-hostwrite-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("dest")).unwrap();
    std::fs::create_dir_all(dir.join("outside")).unwrap();
    std::fs::write(dir.join("outside/victim"), "untouched").unwrap();
    dir
}

/// One archive entry with raw path and link bytes (tar's own builder
/// refuses the hostile ones we need).
fn entry(
    out: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    path: &str,
    link: &str,
    mode: u32,
    data: &[u8],
) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    let gnu = h.as_gnu_mut().unwrap();
    gnu.name[..path.len()].copy_from_slice(path.as_bytes());
    gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_cksum();
    out.append(&h, data).unwrap();
}

fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    b.into_inner().unwrap()
}

fn unpack_into(dir: &Path, bytes: &[u8]) -> Result<u64, HostWriteError> {
    unpack(bytes, &dir.join("dest"), COPY_OUT_MAX_ENTRIES)
}

fn victim_untouched(dir: &Path) {
    assert_eq!(
        std::fs::read_to_string(dir.join("outside/victim")).unwrap(),
        "untouched"
    );
    let names: Vec<_> = std::fs::read_dir(dir.join("outside")).unwrap().collect();
    assert_eq!(names.len(), 1, "nothing new outside the destination");
}

#[test]
fn a_plain_tree_is_unpacked_with_safe_modes() {
    let dir = scratch("plain");
    let bytes = archive(|b| {
        use tar::EntryType as T;
        entry(b, T::Directory, "./", "", 0o755, b"");
        entry(b, T::Directory, "./src", "", 0o755, b"");
        entry(b, T::Regular, "./src/a.txt", "", 0o644, b"hello");
        entry(b, T::Regular, "./run.sh", "", 0o4777, b"#!/bin/sh");
        entry(b, T::Symlink, "./src/link", "a.txt", 0o777, b"");
        entry(b, T::Symlink, "./up", "src/../src/a.txt", 0o777, b"");
        entry(b, T::Link, "./src/hard", "src/a.txt", 0o644, b"");
    });
    assert_eq!(unpack_into(&dir, &bytes).unwrap(), 7);
    let dest = dir.join("dest");
    assert_eq!(
        std::fs::read_to_string(dest.join("src/a.txt")).unwrap(),
        "hello"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("src/link")).unwrap(),
        "hello"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("src/hard")).unwrap(),
        "hello"
    );
    let mode = std::fs::metadata(dest.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o7777,
        0o777 & !umask(),
        "set-id bits dropped, umask applied"
    );
    // A second copy merges: files are replaced, not written through.
    assert_eq!(unpack_into(&dir, &bytes).unwrap(), 7);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hostile_entries_are_refused_and_nothing_leaves_the_destination() {
    use tar::EntryType as T;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dotdot",
            archive(|b| entry(b, T::Regular, "../outside/victim", "", 0o644, b"pwned")),
        ),
        (
            "absolute",
            archive(|b| entry(b, T::Regular, "/tmp/pwned", "", 0o644, b"pwned")),
        ),
        (
            "abs-symlink",
            archive(|b| entry(b, T::Symlink, "./etc", "/etc", 0o777, b"")),
        ),
        (
            "rel-symlink-out",
            archive(|b| entry(b, T::Symlink, "./x", "../outside", 0o777, b"")),
        ),
        (
            "deep-symlink-out",
            archive(|b| entry(b, T::Symlink, "./a/x", "../../outside/victim", 0o777, b"")),
        ),
        (
            "hardlink-out",
            archive(|b| entry(b, T::Link, "./h", "../outside/victim", 0o644, b"")),
        ),
        (
            "hardlink-abs",
            archive(|b| entry(b, T::Link, "./h", "/etc/passwd", 0o644, b"")),
        ),
        (
            "char-device",
            archive(|b| entry(b, T::Char, "./null", "", 0o666, b"")),
        ),
        (
            "block-device",
            archive(|b| entry(b, T::Block, "./sda", "", 0o666, b"")),
        ),
        (
            "fifo",
            archive(|b| entry(b, T::Fifo, "./pipe", "", 0o666, b"")),
        ),
    ];
    for (name, bytes) in cases {
        let dir = scratch(name);
        let err = unpack_into(&dir, &bytes).unwrap_err();
        assert!(
            matches!(err, HostWriteError::Refused { .. }),
            "{name}: {err}"
        );
        victim_untouched(&dir);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn symlinks_already_in_the_destination_are_not_written_through() {
    let dir = scratch("planted");
    let dest = dir.join("dest");
    std::os::unix::fs::symlink(dir.join("outside"), dest.join("sub")).unwrap();
    std::os::unix::fs::symlink(dir.join("outside/victim"), dest.join("file")).unwrap();
    use tar::EntryType as T;
    let through_dir = archive(|b| entry(b, T::Regular, "./sub/victim", "", 0o644, b"pwned"));
    let err = unpack_into(&dir, &through_dir).unwrap_err();
    assert!(matches!(err, HostWriteError::Refused { .. }), "{err}");
    // A file over a planted symlink replaces the link, not its target.
    let over_link = archive(|b| entry(b, T::Regular, "./file", "", 0o644, b"new"));
    unpack_into(&dir, &over_link).unwrap();
    assert!(!std::fs::symlink_metadata(dest.join("file"))
        .unwrap()
        .is_symlink());
    assert_eq!(std::fs::read_to_string(dest.join("file")).unwrap(), "new");
    victim_untouched(&dir);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_archive_over_its_entry_budget_stops() {
    let dir = scratch("budget");
    let bytes = archive(|b| {
        for i in 0..5 {
            entry(
                b,
                tar::EntryType::Regular,
                &format!("./f{i}"),
                "",
                0o644,
                b"x",
            );
        }
    });
    let err = unpack(bytes.as_slice(), &dir.join("dest"), 3).unwrap_err();
    assert!(
        matches!(
            err,
            HostWriteError::OverBudget {
                what: "entries",
                limit: 3
            }
        ),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_temp_file_is_new_private_and_removed_unless_kept() {
    let dir = scratch("temp");
    let target = dir.join("dest/out.txt");
    // A planted symlink at the target: the rename replaces the link.
    std::os::unix::fs::symlink(dir.join("outside/victim"), &target).unwrap();
    let mut tmp = TempFile::beside(&target).unwrap();
    let tmp_path = tmp.path.clone().unwrap();
    assert_eq!(
        std::fs::metadata(&tmp_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::io::Write::write_all(tmp.file(), b"from the guest").unwrap();
    tmp.persist(0o6755, &target).unwrap();
    assert!(!tmp_path.exists());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "from the guest");
    let mode = std::fs::symlink_metadata(&target)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755 & !umask());
    victim_untouched(&dir);
    // Dropped without persist: gone.
    let tmp = TempFile::beside(&target).unwrap();
    let tmp_path = tmp.path.clone().unwrap();
    drop(tmp);
    assert!(!tmp_path.exists());
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_budgeted_writer_refuses_what_is_over() {
    use tokio::io::AsyncWriteExt;
    let mut w = Budgeted::new(Vec::new(), 10);
    w.write_all(b"12345").await.unwrap();
    assert!(!w.exhausted());
    assert!(w.write_all(b"123456").await.is_err());
    assert!(w.exhausted());
    assert_eq!(w.inner, b"12345");
}
