//! Applying an image layer (a tar, maybe gzip- or zstd-compressed) to a directory
//! tree the way container runtimes do: entries replace what lower layers
//! left, `.wh.NAME` deletes NAME, `.wh..wh..opq` empties its directory of
//! what lower layers put there, and every path, even through a symlink a
//! lower layer made (`bin -> usr/bin`), resolves inside the tree, as if
//! the tree were `/`.
//!
//! The layer's uncompressed bytes are hashed while it is applied and must
//! match the image config's `diff_id`, so a layer is checked end to end
//! even when it came from a tarball with no compressed digest.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::layer_reader::{read_ahead, Handed, READ_AHEAD_CHUNKS};
use super::owners::{Owners, Recorded};
use super::tree::ImageTree;
use super::OciError;
use crate::host::dirfd;

/// The opaque-directory marker.
const OPAQUE: &str = ".wh..wh..opq";
/// The prefix of a whiteout.
const WHITEOUT: &str = ".wh.";

/// What an image's layers may still unpack: uncompressed bytes and
/// entries, counted across all its layers (a gzip bomb stops as it
/// crosses the bytes left, whatever its compressed size).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Uncompressed bytes left.
    pub bytes: u64,
    /// Entries left.
    pub entries: u64,
    limits: (u64, u64),
}

impl Budget {
    /// A budget of `bytes` and `entries`.
    pub fn new(bytes: u64, entries: u64) -> Self {
        Self {
            bytes,
            entries,
            limits: (bytes, entries),
        }
    }

    /// The budget `limits` give one image.
    pub fn of(limits: &crate::store::spec::Limits) -> Self {
        Self::new(limits.max_image_bytes, limits.max_image_entries)
    }

    fn over_bytes(&self) -> OciError {
        OciError::OverLimit {
            what: "uncompressed bytes",
            limit: self.limits.0,
        }
    }

    fn take_entry(&mut self) -> Result<(), OciError> {
        self.entries = self.entries.checked_sub(1).ok_or(OciError::OverLimit {
            what: "entries",
            limit: self.limits.1,
        })?;
        Ok(())
    }
}

/// The hex SHA-256 of a `sha256:` digest, checked for shape.
pub fn digest_hex(digest: &str) -> Result<&str, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ => Err(OciError::BadDigest(digest.to_owned())),
    }
}

/// Applies the layer read from `layer` (plain, gzip or zstd tar) to `tree`,
/// checking its uncompressed bytes against `diff_id`, within `budget`
/// (what it uses is taken off). Owners, modes and device nodes are set on
/// the tree, or recorded in `owners` when the caller is not root.
pub fn apply_layer(
    tree: &Path,
    layer: impl Read + Send,
    diff_id: &str,
    owners: &mut Owners,
    budget: &mut Budget,
) -> Result<(), OciError> {
    let expected = digest_hex(diff_id)?.to_owned();
    let image_tree = ImageTree::open(tree)?;
    let mut applier = Applier {
        tree: &image_tree,
        written: HashSet::new(),
        owners,
    };
    let left = budget.bytes;
    // Inflating and hashing on a thread of their own, beside the file
    // writes of the unpacking.
    let (read, applied) = std::thread::scope(|scope| {
        let (to, from) = std::sync::mpsc::sync_channel(READ_AHEAD_CHUNKS);
        let reader = scope.spawn(move || read_ahead(layer, left, to));
        let mut handed = Handed::from(from);
        let applied = (|| {
            let mut archive = tar::Archive::new(&mut handed);
            let entries = archive
                .entries()
                .map_err(|e| OciError::io("reading a layer", e))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| OciError::io("reading a layer", e))?;
                budget.take_entry()?;
                applier.apply(&mut entry)?;
            }
            // The tar ends with zero blocks the archive reader may not
            // consume: the digest is of every byte.
            io::copy(&mut handed, &mut io::sink())
                .map(drop)
                .map_err(|e| OciError::io("reading a layer", e))
        })();
        // A reader still going stops at its next chunk.
        drop(handed);
        let read = reader.join().unwrap_or_else(|_| {
            Err(OciError::io(
                "reading a layer",
                io::Error::other("the thread reading it panicked"),
            ))
        });
        (read, applied)
    });
    let read = read?;
    if read.over {
        return Err(budget.over_bytes());
    }
    applied?;
    budget.bytes = read.left;
    if read.digest != expected {
        return Err(OciError::DigestMismatch {
            what: "layer (uncompressed)".into(),
            expected: diff_id.to_owned(),
            actual: format!("sha256:{}", read.digest),
        });
    }
    Ok(())
}

struct Applier<'a> {
    tree: &'a ImageTree<'a>,
    /// Paths this layer wrote: an opaque marker keeps them.
    written: HashSet<PathBuf>,
    owners: &'a mut Owners,
}

impl Applier<'_> {
    fn apply(&mut self, entry: &mut tar::Entry<'_, impl Read>) -> Result<(), OciError> {
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let parts = clean_parts(Path::new(OsStr::from_bytes(&raw)))
            .ok_or_else(|| OciError::LayerPath(shown.clone()))?;
        let Some((name, dirs)) = parts.split_last() else {
            return Ok(()); // `./`: the root itself.
        };
        let parent = self.dir(dirs, &shown)?;
        let name_str = name.to_string_lossy();
        if name_str == OPAQUE {
            return self.make_opaque(&parent);
        }
        if let Some(hidden) = name_str.strip_prefix(WHITEOUT) {
            if !hidden.is_empty() && hidden != "." && hidden != ".." {
                let gone = parent.join(hidden);
                remove_any(&gone)?;
                self.owners.forget(&gone);
            }
            return Ok(());
        }
        let path = parent.join(name);
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let uid = header.uid().unwrap_or(0);
        let gid = header.gid().unwrap_or(0);
        let mtime = header.mtime().unwrap_or(0);
        // What a conversion without root sets in the image afterwards.
        let recorded = Recorded {
            uid: uid as u32,
            gid: gid as u32,
            mode,
            device: None,
        };
        let io_at = |what: &str| {
            let at = format!("{what} /{shown}");
            move |e| OciError::io(at, e)
        };
        if kind.is_dir() {
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    remove_any(&path)?;
                    std::fs::create_dir(&path).map_err(io_at("creating"))?;
                }
                Err(_) => std::fs::create_dir(&path).map_err(io_at("creating"))?,
            }
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            remove_any(&path)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(io_at("creating"))?;
            io::copy(entry, &mut file).map_err(io_at("writing"))?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| OciError::LayerPath(shown.clone()))?
                .into_owned();
            remove_any(&path)?;
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                .map_err(io_at("linking"))?;
        } else if kind.is_hard_link() {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| OciError::LayerPath(shown.clone()))?
                .into_owned();
            let target_shown = String::from_utf8_lossy(&target).into_owned();
            let target_parts = clean_parts(Path::new(OsStr::from_bytes(&target)))
                .ok_or_else(|| OciError::LayerPath(target_shown.clone()))?;
            let Some((target_name, target_dirs)) = target_parts.split_last() else {
                return Err(OciError::LayerPath(target_shown));
            };
            let from = self.dir(target_dirs, &target_shown)?.join(target_name);
            remove_any(&path)?;
            std::fs::hard_link(&from, &path).map_err(io_at("linking"))?;
            // A hard link shares its target's inode: mode and owner are its.
            self.owners.record_link(&path, &from);
            self.written.insert(path);
            return Ok(());
        } else if matches!(
            kind,
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo
        ) {
            let major = header.device_major().ok().flatten().unwrap_or(0);
            let minor = header.device_minor().ok().flatten().unwrap_or(0);
            // 0:0 character devices are overlayfs's own whiteouts: in the
            // guest's overlay they would hide the path; skip them.
            if kind == tar::EntryType::Char && major == 0 && minor == 0 {
                return Ok(());
            }
            let file_type = match kind {
                tar::EntryType::Char => libc::S_IFCHR,
                tar::EntryType::Block => libc::S_IFBLK,
                _ => libc::S_IFIFO,
            };
            remove_any(&path)?;
            if !self.owners.direct() {
                // Device nodes need root: made in the image afterwards.
                let device = Some((file_type, major, minor));
                self.owners.record(&path, Recorded { device, ..recorded });
                return Ok(());
            }
            mknod(
                &path,
                file_type | (mode & 0o7777),
                libc::makedev(major, minor),
            )
            .map_err(io_at("creating"))?;
        } else if kind == tar::EntryType::GNUSparse {
            // Its holes would not count against the image's byte limit,
            // and dropping it would lose a file: refused, saying so.
            return Err(OciError::Unsupported(format!(
                "layer entry {shown} is a GNU sparse file, which image layers do not use"
            )));
        } else {
            // PAX/GNU metadata entries are consumed by the tar reader; other
            // kinds (sockets) have no place in an image.
            return Ok(());
        }
        let direct = self.owners.direct();
        if direct {
            std::os::unix::fs::lchown(&path, Some(uid as u32), Some(gid as u32))
                .map_err(io_at("setting the owner of"))?;
        } else {
            self.owners.record(&path, recorded);
        }
        if !kind.is_symlink() {
            // chown cleared set-id bits: the mode goes after it. Without
            // root the tree's copy stays readable for mkfs (the image gets
            // the layer's mode).
            let mode = match (direct, kind.is_dir()) {
                (true, _) => mode,
                (false, true) => mode | 0o700,
                (false, false) => mode | 0o600,
            };
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(io_at("setting the mode of"))?;
        }
        set_mtime(&path, mtime).map_err(io_at("setting the time of"))?;
        self.written.insert(path);
        Ok(())
    }

    /// The real path of directory `dirs` (relative to the tree), following
    /// symlinks inside the tree and creating missing directories.
    fn dir(&mut self, dirs: &[&OsStr], shown: &str) -> Result<PathBuf, OciError> {
        let written = &mut self.written;
        self.tree.make_dirs(dirs, shown, &mut |made| {
            written.insert(made.to_owned());
        })
    }

    /// Empties `dir` of what this layer did not write.
    fn make_opaque(&mut self, dir: &Path) -> Result<(), OciError> {
        let entries = std::fs::read_dir(dir).map_err(|e| OciError::io("reading a directory", e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if !self.written.contains(&path) {
                remove_any(&path)?;
                self.owners.forget(&path);
            }
        }
        self.owners.forget_devices_in(dir, &self.written);
        Ok(())
    }
}

/// The normal components of an entry path, relative to the image's root
/// (a leading `/` and `.` parts dropped); `None` when a `..` would climb
/// out.
fn clean_parts(path: &Path) -> Option<Vec<&OsStr>> {
    dirfd::clean_parts(path.strip_prefix("/").unwrap_or(path))
}

fn remove_any(path: &Path) -> Result<(), OciError> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.map_err(|e| OciError::io(format!("removing {}", path.display()), e))
}

fn mknod(path: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let c = dirfd::cstr(path.as_os_str())?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_mtime(path: &Path, mtime: u64) -> io::Result<()> {
    let c = dirfd::cstr(path.as_os_str())?;
    let time = libc::timespec {
        tv_sec: mtime.min(i64::MAX as u64) as libc::time_t,
        tv_nsec: 0,
    };
    let times = [time, time];
    // SAFETY: `c` is NUL-terminated; `times` holds two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    // Layer application: whiteouts, opaque directories, links, escapes and
    // digests, on layers built here.

    use super::*;
    use sha2::{Digest, Sha256};

    /// [`apply_layer`] with no budget to speak of.
    fn apply_unlimited(
        tree: &Path,
        layer: impl Read + Send,
        diff_id: &str,
        owners: &mut Owners,
    ) -> Result<(), OciError> {
        apply_layer(
            tree,
            layer,
            diff_id,
            owners,
            &mut Budget::new(u64::MAX, u64::MAX),
        )
    }
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
        apply_unlimited(tree, &bytes[..], &diff_id, &mut Owners::Direct)
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

    /// A GNU sparse entry (a tebibyte that takes a few bytes) is refused
    /// with its name, not dropped and not expanded past the byte limit.
    #[test]
    fn sparse_entries_are_refused_by_name() {
        let t = tree("sparse");
        let mut layer = Layer::new();
        let mut h = Layer::header(tar::EntryType::GNUSparse, 0o644);
        h.set_path("huge").unwrap();
        if let Some(gnu) = h.as_gnu_mut() {
            gnu.set_real_size(1 << 40);
            // One empty chunk at the end: all hole.
            gnu.sparse[0].set_offset(1 << 40);
            gnu.sparse[0].set_length(0);
        }
        h.set_cksum();
        layer.0.append(&h, &[][..]).unwrap();
        let err = apply(&t, layer).unwrap_err();
        assert!(
            err.to_string().contains("huge is a GNU sparse file"),
            "{err}"
        );
        assert!(!t.join("huge").exists());
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
        let err = apply_unlimited(&t, &bytes[..], &other, &mut Owners::Direct).unwrap_err();
        assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
        assert!(matches!(
            apply_unlimited(&t, &bytes[..], "md5:abc", &mut Owners::Direct),
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
        apply_unlimited(&t, &compressed[..], &diff_id, &mut Owners::Direct).unwrap();
        assert_eq!(read(&t, "z/file").as_deref(), Some("zipped"));
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_images_byte_limit() {
        let t = tree("bomb");
        // 64 MiB of zeros in one file: about 64 KiB compressed.
        let zeros = vec![0u8; 64 << 20];
        let (bytes, diff_id) = Layer::new()
            .file("big", &String::from_utf8(zeros).unwrap())
            .finish();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &bytes).unwrap();
        let compressed = gz.finish().unwrap();
        assert!(compressed.len() < 1 << 20, "{}", compressed.len());
        let mut budget = Budget::new(8 << 20, 100);
        let err = apply_layer(
            &t,
            &compressed[..],
            &diff_id,
            &mut Owners::Direct,
            &mut budget,
        )
        .unwrap_err();
        assert!(
            matches!(err, OciError::OverLimit { what: "uncompressed bytes", limit } if limit == 8 << 20),
            "{err}"
        );
        assert_eq!(err.code(), crate::code::ErrorCode::InvalidInput);
        // Entries are counted across layers.
        let (two, two_id) = Layer::new().file("a", "1").file("b", "2").finish();
        let mut budget = Budget::new(u64::MAX, 3);
        apply_layer(&t, &two[..], &two_id, &mut Owners::Direct, &mut budget).unwrap();
        assert_eq!(budget.entries, 1);
        let err = apply_layer(&t, &two[..], &two_id, &mut Owners::Direct, &mut budget).unwrap_err();
        assert!(
            matches!(
                err,
                OciError::OverLimit {
                    what: "entries",
                    ..
                }
            ),
            "{err}"
        );
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
        let (Some(mkfs), Some(_)) = (
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
            .file("system-systemd\\x2dcryptsetup.slice", "unit")
            .file_owned("usr/bin/chage", 0o2755, 1000)
            .link(tar::EntryType::Link, "usr/bin/a-link", "usr/bin/chage")
            .link(tar::EntryType::Link, "usr/bin/z-link", "usr/bin/chage")
            .finish();
        apply_unlimited(&t, &bytes[..], &diff_id, &mut owners).unwrap();
        let (bytes, diff_id) = Layer::new().file("dev/.wh.gone", "").finish();
        apply_unlimited(&t, &bytes[..], &diff_id, &mut owners).unwrap();
        let image = t.with_extension("ext4");
        let made = std::process::Command::new(mkfs)
            .args(["-q", "-F", "-d"])
            .arg(&*t)
            .arg(&image)
            .arg("16M")
            .status()
            .unwrap();
        assert!(made.success());
        owners.write_into(&t, &image).unwrap();
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
        let unit = ext4_stat(&image, "/system-systemd\\x2dcryptsetup.slice");
        assert!(unit.contains("User:     0"), "{unit}");
        // Hard links, whichever name the walk sets last: the target's.
        for name in ["/usr/bin/chage", "/usr/bin/a-link", "/usr/bin/z-link"] {
            let linked = ext4_stat(&image, name);
            assert!(linked.contains("User:  1000"), "{name}: {linked}");
            assert!(linked.contains("Mode:  02755"), "{name}: {linked}");
        }
        std::fs::remove_file(image).unwrap();
    }
}
