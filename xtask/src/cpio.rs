//! A writer for the "newc" cpio format the kernel unpacks as an initramfs.
//! Written by hand so the archive is byte-for-byte reproducible and needs no
//! root (device nodes are just header fields).

/// One archive member.
pub enum Entry<'a> {
    /// A directory.
    Dir { path: &'a str, mode: u32 },
    /// A regular file.
    File {
        path: &'a str,
        mode: u32,
        data: &'a [u8],
    },
    /// A symbolic link.
    Symlink { path: &'a str, target: &'a str },
    /// A character device node.
    CharDev {
        path: &'a str,
        mode: u32,
        major: u32,
        minor: u32,
    },
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn member(out: &mut Vec<u8>, ino: u32, path: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
    let name_size = path.len() as u32 + 1;
    let fields = [
        ino,
        mode,
        0,
        0,
        1,
        0,
        data.len() as u32,
        0,
        0,
        rdev.0,
        rdev.1,
        name_size,
        0,
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(path.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

/// The archive holding `entries`, in order, followed by the trailer.
pub fn archive(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let ino = i as u32 + 1;
        match e {
            Entry::Dir { path, mode } => member(&mut out, ino, path, S_IFDIR | mode, (0, 0), &[]),
            Entry::File { path, mode, data } => {
                member(&mut out, ino, path, S_IFREG | mode, (0, 0), data)
            }
            Entry::Symlink { path, target } => member(
                &mut out,
                ino,
                path,
                S_IFLNK | 0o777,
                (0, 0),
                target.as_bytes(),
            ),
            Entry::CharDev {
                path,
                mode,
                major,
                minor,
            } => member(&mut out, ino, path, S_IFCHR | mode, (*major, *minor), &[]),
        }
    }
    member(&mut out, 0, "TRAILER!!!", 0, (0, 0), &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(header: &[u8], index: usize) -> u32 {
        let start = 6 + index * 8;
        u32::from_str_radix(std::str::from_utf8(&header[start..start + 8]).unwrap(), 16).unwrap()
    }

    #[test]
    fn newc_layout() {
        let a = archive(&[
            Entry::CharDev {
                path: "dev/console",
                mode: 0o600,
                major: 5,
                minor: 1,
            },
            Entry::File {
                path: "init",
                mode: 0o755,
                data: b"hello",
            },
        ]);
        assert_eq!(&a[..6], b"070701");
        assert_eq!(field(&a, 1), S_IFCHR | 0o600);
        assert_eq!((field(&a, 9), field(&a, 10)), (5, 1));
        assert_eq!(field(&a, 11), 12, "name size includes the NUL");
        // Header (110) + "dev/console\0" (12) = 122, padded to 124.
        let second = &a[124..];
        assert_eq!(&second[..6], b"070701");
        assert_eq!(field(second, 6), 5);
        assert_eq!(&second[110..115], b"init\0");
        assert_eq!(&second[116..121], b"hello");
        assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
        assert_eq!(a.len() % 4, 0);
    }
}
