//! Layer application: whiteouts, opaque directories, links, escapes and
//! digests, on layers built here.

use super::*;
use std::os::unix::fs::MetadataExt;

/// A layer under construction.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(0);
        h
    }

    fn file(mut self, path: &str, data: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, 0o644);
        h.set_size(data.len() as u64);
        self.0.append_data(&mut h, path, data.as_bytes()).unwrap();
        self
    }

    fn file_owned(mut self, path: &str, mode: u32, uid: u64) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, mode);
        h.set_uid(uid);
        h.set_gid(uid);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    fn dir(mut self, path: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Directory, 0o755);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Self {
        let mut h = Self::header(kind, 0o777);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    fn device(mut self, path: &str, major: u32, minor: u32) -> Self {
        let mut h = Self::header(tar::EntryType::Char, 0o666);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    /// The layer's bytes and diff_id.
    fn finish(self) -> (Vec<u8>, String) {
        let bytes = self.0.into_inner().unwrap();
        let diff_id = format!("sha256:{:x}", Sha256::digest(&bytes));
        (bytes, diff_id)
    }

    /// Raw entry with a path the tar builder would refuse.
    fn raw_entry(mut self, path: &[u8]) -> Self {
        let mut h = Self::header(tar::EntryType::Regular, 0o644);
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path);
        h.set_cksum();
        self.0.append(&h, &[][..]).unwrap();
        self
    }
}

/// A scratch tree, removed (with an image file beside it) when dropped.
struct Tree(PathBuf);

impl std::ops::Deref for Tree {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(self.0.with_extension("ext4"));
    }
}

fn tree(tag: &str) -> Tree {
    let dir = std::env::temp_dir().join(format!("ma-unpack-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Tree(dir)
}

fn apply(tree: &Path, layer: Layer) -> Result<(), OciError> {
    let (bytes, diff_id) = layer.finish();
    apply_layer(tree, &bytes[..], &diff_id, &mut Owners::Direct)
}

fn read(tree: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(tree.join(path)).ok()
}

#[test]
fn whiteouts_and_opaque_directories_hide_lower_layers() {
    let t = tree("wh");
    apply(
        &t,
        Layer::new()
            .file("etc/keep", "keep")
            .file("etc/gone", "gone")
            .file("var/cache/a", "a")
            .file("var/cache/b", "b")
            .dir("var/lib/dir")
            .file("var/lib/dir/inner", "x"),
    )
    .unwrap();
    apply(
        &t,
        Layer::new()
            .file("etc/.wh.gone", "")
            .file("var/cache/new", "new")
            .file("var/cache/.wh..wh..opq", "")
            .file("var/lib/.wh.dir", ""),
    )
    .unwrap();
    assert_eq!(read(&t, "etc/keep").as_deref(), Some("keep"));
    assert!(!t.join("etc/gone").exists());
    assert!(!t.join("etc/.wh.gone").exists(), "markers are not written");
    assert_eq!(read(&t, "var/cache/new").as_deref(), Some("new"));
    assert!(!t.join("var/cache/a").exists() && !t.join("var/cache/b").exists());
    assert!(!t.join("var/cache/.wh..wh..opq").exists());
    assert!(!t.join("var/lib/dir").exists());
}

#[test]
fn links_resolve_inside_the_tree_and_types_replace_each_other() {
    let t = tree("links");
    apply(
        &t,
        Layer::new()
            .file("usr/bin/tool", "tool")
            .link(tar::EntryType::Symlink, "bin", "/usr/bin")
            .link(tar::EntryType::Symlink, "escape", "/../../..")
            .file("swap", "was a file"),
    )
    .unwrap();
    apply(
        &t,
        Layer::new()
            // Through the absolute `bin -> /usr/bin`: lands in usr/bin.
            .file("bin/other", "other")
            // Through a link climbing out: stays in the tree's root.
            .file("escape/inside", "inside")
            .link(tar::EntryType::Link, "usr/bin/hard", "usr/bin/tool")
            .dir("swap")
            .file("swap/child", "now a dir"),
    )
    .unwrap();
    assert_eq!(read(&t, "usr/bin/other").as_deref(), Some("other"));
    assert_eq!(read(&t, "inside").as_deref(), Some("inside"));
    let tool = std::fs::metadata(t.join("usr/bin/tool")).unwrap();
    let hard = std::fs::metadata(t.join("usr/bin/hard")).unwrap();
    assert_eq!(tool.ino(), hard.ino());
    assert_eq!(read(&t, "swap/child").as_deref(), Some("now a dir"));
}

#[test]
fn owners_modes_and_times_come_from_the_layer() {
    let t = tree("owners");
    apply(
        &t,
        Layer::new().file_owned("home/user/secret", 0o4750, 1000),
    )
    .unwrap();
    let m = std::fs::metadata(t.join("home/user/secret")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o4750);
    assert_eq!((m.uid(), m.gid()), (1000, 1000));
    assert_eq!(m.mtime(), 1_700_000_000);
}

#[test]
fn a_path_climbing_out_is_refused() {
    let t = tree("escape");
    let err = apply(&t, Layer::new().raw_entry(b"../outside")).unwrap_err();
    assert!(matches!(err, OciError::LayerPath(_)), "{err}");
    assert_eq!(err.code(), crate::code::ErrorCode::InvalidInput);
    assert!(!t.parent().unwrap().join("outside").exists());
    let err = apply(
        &t,
        Layer::new().link(tar::EntryType::Link, "x", "../../etc/passwd"),
    )
    .unwrap_err();
    assert!(matches!(err, OciError::LayerPath(_)), "{err}");
}

#[test]
fn a_layer_whose_bytes_differ_from_its_diff_id_is_refused() {
    let t = tree("digest");
    let (bytes, _) = Layer::new().file("a", "a").finish();
    let other = format!("sha256:{}", "0".repeat(64));
    let err = apply_layer(&t, &bytes[..], &other, &mut Owners::Direct).unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    assert!(matches!(
        apply_layer(&t, &bytes[..], "md5:abc", &mut Owners::Direct),
        Err(OciError::BadDigest(_))
    ));
}

#[test]
fn gzip_layers_are_read_and_hashed_uncompressed() {
    let t = tree("gzip");
    let (bytes, diff_id) = Layer::new().file("z/file", "zipped").finish();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &bytes).unwrap();
    let compressed = gz.finish().unwrap();
    apply_layer(&t, &compressed[..], &diff_id, &mut Owners::Direct).unwrap();
    assert_eq!(read(&t, "z/file").as_deref(), Some("zipped"));
}

/// What debugfs says of `path` in `image`.
fn ext4_stat(image: &Path, path: &str) -> String {
    let out = std::process::Command::new(crate::host::settings::host_tool("debugfs").unwrap())
        .args(["-R", &format!("stat \"{path}\"")])
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn without_root_owners_modes_and_devices_reach_the_image_through_debugfs() {
    let (Some(mkfs), Some(debugfs)) = (
        crate::host::settings::host_tool("mkfs.ext4"),
        crate::host::settings::host_tool("debugfs"),
    ) else {
        eprintln!("skipped: mkfs.ext4 or debugfs missing");
        return;
    };
    let t = tree("recorded");
    let mut owners = Owners::Recorded(Default::default());
    let (bytes, diff_id) = Layer::new()
        .file_owned("home/user/secret", 0o4750, 1000)
        .device("dev/null", 1, 3)
        .device("dev/gone", 1, 5)
        .dir("dev/sub")
        .file("a file with spaces", "x")
        .finish();
    apply_layer(&t, &bytes[..], &diff_id, &mut owners).unwrap();
    let (bytes, diff_id) = Layer::new().file("dev/.wh.gone", "").finish();
    apply_layer(&t, &bytes[..], &diff_id, &mut owners).unwrap();
    let image = t.with_extension("ext4");
    let made = std::process::Command::new(mkfs)
        .args(["-q", "-F", "-d"])
        .arg(&*t)
        .arg(&image)
        .arg("16M")
        .status()
        .unwrap();
    assert!(made.success());
    owners.write_into(&t, &image, &debugfs).unwrap();
    let secret = ext4_stat(&image, "/home/user/secret");
    assert!(
        secret.contains("User:  1000") && secret.contains("Group:  1000"),
        "{secret}"
    );
    assert!(secret.contains("Mode:  04750"), "{secret}");
    let null = ext4_stat(&image, "/dev/null");
    assert!(null.contains("character special"), "{null}");
    assert!(null.contains("Device major/minor number: 01:03"), "{null}");
    assert!(
        !ext4_stat(&image, "/dev/gone").contains("Inode:"),
        "whited out"
    );
    let spaced = ext4_stat(&image, "/a file with spaces");
    assert!(spaced.contains("User:     0"), "{spaced}");
    std::fs::remove_file(image).unwrap();
}
