//! `volume export` of hostile disks: ext4 images made on the host with
//! `mkfs.ext4 -d`, then patched as a guest with raw access to its volume
//! device could (directory entries renamed to `../…`, `..`, a name with
//! `/`, duplicate names with a symlink first, a directory entry pointing at
//! the root), exported through [`VolumeStore::export`]. Nothing may be
//! written outside the tar, and the export says what it left out.

use std::path::{Path, PathBuf};

use super::disk_read::parse_entry;
use super::*;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tools() -> Option<(PathBuf, PathBuf)> {
    let found = crate::host::settings::host_tool("mkfs.ext4")
        .zip(crate::host::settings::host_tool("debugfs"));
    if found.is_none() {
        eprintln!("skipped: mkfs.ext4 or debugfs missing (apt-get install e2fsprogs)");
    }
    found
}

/// A scratch directory, a store in it, and a unique tag for paths outside.
fn scratch() -> Option<(Scratch, VolumeStore, String)> {
    tools()?;
    let tag = unique_id();
    let dir = std::env::temp_dir().join(format!("ma-volexport-{tag}"));
    std::fs::create_dir_all(dir.join("staging")).unwrap();
    let state = StateDir::at(dir.join("state")).unwrap();
    let store = VolumeStore::new(&state);
    Some((Scratch(dir), store, tag))
}

/// A 16 MiB ext4 image of `staging`, without metadata checksums or
/// hashed directories so that patched directory entries stay readable.
fn mkfs(staging: &Path, img: &Path) -> Vec<u8> {
    let (mkfs, _) = tools().unwrap();
    std::fs::File::create(img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let out = std::process::Command::new(mkfs)
        .args(["-q", "-F", "-m", "0", "-T", "default", "-O"])
        .arg("^metadata_csum,^dir_index")
        .arg("-d")
        .arg(staging)
        .arg(img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(img).unwrap()
}

/// `debugfs ls -p` of `dir` on `img`, parsed.
fn listing(img: &Path, dir: &str) -> Vec<(Vec<u8>, u32)> {
    let (_, debugfs) = tools().unwrap();
    let out = std::process::Command::new(debugfs)
        .arg("-c")
        .arg("-R")
        .arg(format!("ls -p {dir}"))
        .arg(img)
        .output()
        .unwrap();
    out.stdout
        .split(|&b| b == b'\n')
        .filter_map(parse_entry)
        .map(|e| (e.name, e.ino))
        .collect()
}

/// Where the one directory entry named `name` keeps its name in the image
/// bytes (inode, rec_len, name_len and file type come before it).
fn dirent(bytes: &[u8], name: &str) -> usize {
    let n = name.len();
    let found: Vec<usize> = (8..bytes.len() - n)
        .filter(|&i| {
            let ino = u32::from_le_bytes(bytes[i - 8..i - 4].try_into().unwrap());
            let rec_len = u16::from_le_bytes([bytes[i - 4], bytes[i - 3]]) as usize;
            bytes[i - 2] as usize == n
                && (1..=7).contains(&bytes[i - 1])
                && (1..1 << 16).contains(&ino)
                && rec_len >= 8 + n
                && rec_len.is_multiple_of(4)
                && &bytes[i..i + n] == name.as_bytes()
        })
        .collect();
    assert_eq!(found.len(), 1, "exactly one directory entry named {name}");
    found[0]
}

/// Rewrites the one directory entry named `old` (its name, and its inode
/// and file type when given) in the image bytes.
fn patch(bytes: &mut [u8], old: &str, new: &[u8], ino: Option<(u32, u8)>) {
    let at = dirent(bytes, old);
    rewrite(bytes, at, new, ino);
}

fn rewrite(bytes: &mut [u8], at: usize, new: &[u8], ino: Option<(u32, u8)>) {
    assert_eq!(
        bytes[at - 2] as usize,
        new.len(),
        "a patched name keeps its length"
    );
    bytes[at..at + new.len()].copy_from_slice(new);
    if let Some((ino, file_type)) = ino {
        bytes[at - 8..at - 4].copy_from_slice(&ino.to_le_bytes());
        bytes[at - 1] = file_type;
    }
}

/// Makes volume `name` and puts `img` in as its disk (what the guest wrote).
fn volume_from(store: &VolumeStore, name: &str, img: &[u8]) {
    store
        .create(name, Some(16), &VolumeSource::Empty, None)
        .unwrap();
    std::fs::write(store.disk(name).unwrap(), img).unwrap();
}

/// The tar's entries: path, type, link target.
fn tar_entries(tar: &Path) -> Vec<(String, tar::EntryType, Option<String>)> {
    let mut archive = tar::Archive::new(std::fs::File::open(tar).unwrap());
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
            let link = e
                .link_name_bytes()
                .map(|l| String::from_utf8_lossy(&l).into_owned());
            (path, e.header().entry_type(), link)
        })
        .collect()
}

/// Unpacks `tar` with the host's GNU tar into a new directory `into`.
fn gnu_untar(tar: &Path, into: &Path) {
    std::fs::create_dir_all(into).unwrap();
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(tar)
        .arg("-C")
        .arg(into)
        .status();
    if let Ok(status) = status {
        assert!(status.success(), "tar -x of the export");
    }
}

fn assert_absent(path: &Path) {
    assert!(
        std::fs::symlink_metadata(path).is_err(),
        "{} was written",
        path.display()
    );
}

fn whys(export: &VolumeExport) -> Vec<(&str, &str)> {
    export
        .refused
        .iter()
        .map(|r| (r.path.as_str(), r.why))
        .collect()
}

#[test]
fn volume_export_refuses_dotdot_slash_and_dot_names_patched_into_the_disk() {
    let Some((s, store, tag)) = scratch() else {
        return;
    };
    let staging = s.0.join("staging");
    let uniq = format!("ma-volexport-escape-{tag}");
    let escape = format!("{}tmp/{uniq}", "../".repeat(10));
    let placeholder = "A".repeat(escape.len() - 1) + "x";
    std::fs::write(staging.join(&placeholder), "written outside").unwrap();
    std::fs::write(staging.join("QZ"), "named ..").unwrap();
    std::fs::write(staging.join("K"), "named .").unwrap();
    std::fs::write(staging.join("sub_escape"), "name with a slash").unwrap();
    std::fs::write(staging.join("keep.txt"), "kept").unwrap();
    std::fs::write(staging.join("nl_name"), "a name with a newline").unwrap();
    let img = s.0.join("disk.img");
    let mut bytes = mkfs(&staging, &img);
    patch(&mut bytes, &placeholder, escape.as_bytes(), None);
    patch(&mut bytes, "QZ", b"..", None);
    patch(&mut bytes, "K", b".", None);
    patch(&mut bytes, "sub_escape", b"sub/escape", None);
    patch(&mut bytes, "nl_name", b"nl\nname", None);
    std::fs::write(&img, &bytes).unwrap();
    let names: Vec<Vec<u8>> = listing(&img, "/").into_iter().map(|e| e.0).collect();
    assert!(
        names.contains(&escape.clone().into_bytes()),
        "the disk holds the hostile name"
    );
    volume_from(&store, "evil", &bytes);

    let tar = s.0.join("out/evil.tar");
    std::fs::create_dir_all(tar.parent().unwrap()).unwrap();
    let export = store.export("evil", &tar).unwrap();
    let landed = Path::new("/tmp").join(&uniq);
    assert_absent(&landed);
    let entries = tar_entries(&tar);
    let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(paths, ["keep.txt"], "{export:?}");
    assert_eq!(export.entries, 1);
    let refused = whys(&export);
    assert_eq!(export.refused_entries, 6, "{refused:?}");
    assert!(
        refused.contains(&(escape.as_str(), "a name holding `/`")),
        "{refused:?}"
    );
    assert!(
        refused.contains(&("sub/escape", "a name holding `/`")),
        "{refused:?}"
    );
    let dots = refused.iter().filter(|r| r.0 == "." || r.0 == "..").count();
    assert_eq!(dots, 2, "{refused:?}");
    let split = refused.iter().filter(|r| r.1.contains("newline")).count();
    assert_eq!(split, 2, "both halves of the name's line: {refused:?}");
    // Only the tar was written where it was asked for.
    let out: Vec<_> = std::fs::read_dir(tar.parent().unwrap()).unwrap().collect();
    assert_eq!(out.len(), 1);
    gnu_untar(&tar, &s.0.join("untar"));
    assert_absent(&landed);
}

#[test]
fn volume_export_never_writes_through_a_symlink_of_a_duplicate_name() {
    let Some((s, store, tag)) = scratch() else {
        return;
    };
    let staging = s.0.join("staging");
    let target = std::env::temp_dir().join(format!("ma-volexport-victim-{tag}"));
    let target_dir = std::env::temp_dir().join(format!("ma-volexport-victimdir-{tag}"));
    std::os::unix::fs::symlink(&target, staging.join("dup_entry_1")).unwrap();
    std::fs::write(staging.join("dup_entry_2"), "through the link").unwrap();
    std::os::unix::fs::symlink(&target_dir, staging.join("dupdir_1")).unwrap();
    std::fs::create_dir(staging.join("dupdir_2")).unwrap();
    std::fs::write(staging.join("dupdir_2/inner"), "into the linked dir").unwrap();
    let img = s.0.join("disk.img");
    let mut bytes = mkfs(&staging, &img);
    // Whatever order mkfs wrote them in: the first entry of each pair
    // becomes the symlink, the second the file (or directory), one name.
    let before = listing(&img, "/");
    let ino = |name: &str| {
        before
            .iter()
            .find(|e| e.0 == name.as_bytes())
            .map(|e| e.1)
            .unwrap()
    };
    let at = |name: &str| before.iter().position(|e| e.0 == name.as_bytes()).unwrap();
    for (link, other, kind) in [
        ("dup_entry_1", "dup_entry_2", 1u8),
        ("dupdir_1", "dupdir_2", 2),
    ] {
        let (link_ino, other_ino) = (ino(link), ino(other));
        let (first, second) = if at(link) < at(other) {
            (link, other)
        } else {
            (other, link)
        };
        let (first, second) = (dirent(&bytes, first), dirent(&bytes, second));
        rewrite(&mut bytes, first, link.as_bytes(), Some((link_ino, 7)));
        rewrite(&mut bytes, second, link.as_bytes(), Some((other_ino, kind)));
    }
    std::fs::write(&img, &bytes).unwrap();
    let after = listing(&img, "/");
    let twice = after.iter().filter(|e| e.0 == b"dup_entry_1").count();
    assert_eq!(twice, 2, "the disk holds the name twice: {after:?}");
    volume_from(&store, "dups", &bytes);

    let tar = s.0.join("dups.tar");
    let export = store.export("dups", &tar).unwrap();
    assert_absent(&target);
    assert_absent(&target_dir);
    let entries = tar_entries(&tar);
    let named = |p: &str| entries.iter().filter(|e| e.0 == p).collect::<Vec<_>>();
    let file = named("dup_entry_1");
    assert_eq!(file.len(), 1, "{entries:?}");
    assert_eq!(file[0].1, tar::EntryType::Symlink, "the first entry wins");
    assert_eq!(named("dupdir_1").len(), 1, "{entries:?}");
    assert!(
        entries.iter().all(|e| !e.0.starts_with("dupdir_1/")),
        "nothing beneath a symlink: {entries:?}"
    );
    let refused = whys(&export);
    let second = "a second entry of this name in its directory (the first is kept)";
    assert!(refused.contains(&("dup_entry_1", second)), "{refused:?}");
    assert!(refused.contains(&("dupdir_1", second)), "{refused:?}");
    gnu_untar(&tar, &s.0.join("untar"));
    assert_absent(&target);
    assert_absent(&target_dir);
}

#[test]
fn volume_export_refuses_a_directory_loop_and_special_files_and_keeps_hard_links() {
    let Some((s, store, _)) = scratch() else {
        return;
    };
    let staging = s.0.join("staging");
    std::fs::create_dir_all(staging.join("loopdir_x/deeper")).unwrap();
    std::fs::write(staging.join("hard_a"), "one inode").unwrap();
    std::fs::hard_link(staging.join("hard_a"), staging.join("hard_b")).unwrap();
    // A target held in the inode with a newline, quotes and a fake
    // debugfs prompt in it, and one held in a block.
    let odd = "a\n\"debugfs: stat <99>\"\nb";
    let long = "l".repeat(100);
    std::os::unix::fs::symlink(odd, staging.join("odd_link")).unwrap();
    std::os::unix::fs::symlink(&long, staging.join("long_link")).unwrap();
    let fifo =
        std::ffi::CString::new(staging.join("pipe").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: `fifo` is a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let img = s.0.join("disk.img");
    let mut bytes = mkfs(&staging, &img);
    // `loopdir_x` now names the root directory: a loop.
    patch(&mut bytes, "loopdir_x", b"loopdir_x", Some((2, 2)));
    volume_from(&store, "loops", &bytes);

    let tar = s.0.join("loops.tar");
    let export = store.export("loops", &tar).unwrap();
    let entries = tar_entries(&tar);
    let mut paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["hard_a", "hard_b", "long_link", "odd_link"],
        "{entries:?}"
    );
    let target = |p: &str| entries.iter().find(|e| e.0 == p).unwrap().2.clone();
    assert_eq!(target("odd_link").as_deref(), Some(odd));
    assert_eq!(target("long_link"), Some(long));
    let link = entries.iter().find(|e| e.0 == "hard_b").unwrap();
    assert_eq!(
        (link.1, link.2.as_deref()),
        (tar::EntryType::Link, Some("hard_a"))
    );
    let refused = whys(&export);
    assert!(refused.contains(&(
        "loopdir_x",
        "a directory already exported (a hard-linked directory or a loop)"
    )));
    assert!(refused.contains(&("pipe", "a device node, FIFO or socket (not exported)")));
    assert_eq!(export.refused_entries, 2, "{refused:?}");
}

#[test]
fn volume_export_over_its_limits_fails_and_leaves_no_tar() {
    let Some((s, store, _)) = scratch() else {
        return;
    };
    let staging = s.0.join("staging");
    std::fs::create_dir_all(staging.join("a/b/c")).unwrap();
    std::fs::write(staging.join("a/b/c/f"), "deep").unwrap();
    // 64 MiB that take no room on a 16 MiB disk: the tar would hold them.
    std::fs::File::create(staging.join("sparse"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let img = s.0.join("disk.img");
    let bytes = mkfs(&staging, &img);
    volume_from(&store, "big", &bytes);
    let tar = s.0.join("big.tar");

    let err = store.export("big", &tar).unwrap_err();
    assert!(
        matches!(err, VolumeError::ExportOverLimit { limit, .. } if limit == 16 << 20),
        "{err}"
    );
    assert_eq!(err.code(), ErrorCode::InvalidInput);
    assert_absent(&tar);

    let roomy = ExportLimits::for_disk(1 << 30);
    for (limits, what) in [
        (
            ExportLimits {
                max_depth: 2,
                ..roomy
            },
            "directory levels",
        ),
        (
            ExportLimits {
                max_entries: 3,
                ..roomy
            },
            "entries",
        ),
    ] {
        let err = store.export_within("big", &tar, limits).unwrap_err();
        assert!(
            matches!(&err, VolumeError::ExportOverLimit { what: w, .. } if *w == what),
            "{err}"
        );
        assert_absent(&tar);
    }
    let done = store.export_within("big", &tar, roomy).unwrap();
    assert_eq!(done.entries, 5, "{done:?}");
    assert!(done.bytes > 64 << 20);
}
