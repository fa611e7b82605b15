//! File operations relative to a directory descriptor that never follow
//! a symlink they were not asked to: what `host_write` and the image
//! unpacker build on to write into a directory whose contents are not
//! trusted. Each takes the directory it works in as a descriptor, so a
//! name swapped for a link after it was checked is never written through.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// The normal components of a relative path (`.` dropped); `None` for an
/// absolute path or one with `..`.
pub fn clean_parts(path: &Path) -> Option<Vec<&OsStr>> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts)
}

/// Whether a relative symlink `target` in directory `dirs` (relative to the
/// destination) resolves lexically inside the destination.
pub fn stays_inside(dirs: &[&OsStr], target: &Path) -> bool {
    let mut depth = dirs.len();
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir if depth > 0 => depth -= 1,
            _ => return false,
        }
    }
    true
}

/// Opens (with `create`, creating missing ones, mode 0755) `dirs` below
/// `root`, never following a symlink: one in the way is ELOOP, a file
/// ENOTDIR.
pub fn open_dirs(root: &OwnedFd, dirs: &[&OsStr], create: bool) -> io::Result<OwnedFd> {
    let mut fd = dup(root)?;
    for dir in dirs {
        fd = match open_dir_at(Some(&fd), dir) {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                make_dir(&fd, dir, 0o755)?;
                open_dir_at(Some(&fd), dir)
            }
            other => other,
        }?;
    }
    Ok(fd)
}

/// openat2(2): opens `rel` below `dir` with `flags` (O_CLOEXEC added) and
/// the `resolve` rules (`RESOLVE_BENEATH`, `RESOLVE_IN_ROOT`, ...), which
/// the kernel enforces on every component, symlinks included.
pub fn openat2(dir: &OwnedFd, rel: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let c = cstr(rel.as_os_str())?;
    // SAFETY: open_how is plain integers; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: openat2 reads `c` (NUL-terminated) and `how` (its size
    // passed) and returns a new descriptor or -1; both outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor (it fits an i32: the kernel returns one).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `name` as a C string (EINVAL for an interior NUL).
pub fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A libc return value as a result (`-1`: the OS error).
pub(crate) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens directory `name` in `dir` (or the working directory), never
/// following a symlink.
pub fn open_dir_at(dir: Option<&OwnedFd>, name: &OsStr) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    let at = dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c` is NUL-terminated and outlives the call; the result is checked.
    let fd = check(unsafe { libc::openat(at, c.as_ptr(), flags) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A second descriptor of `fd` (close-on-exec).
pub(crate) fn dup(fd: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a live descriptor; the result is checked.
    let new = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// mkdirat; an existing directory is fine (a merge), anything else EEXIST.
pub fn make_dir(parent: &OwnedFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // The owner keeps write access while the copy fills it.
    // SAFETY: `c` is NUL-terminated; mkdirat only reads it.
    match check(unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), mode | 0o700) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            open_dir_at(Some(parent), name).map(drop).map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// Writes `data` to a new temporary file in `parent`, gives it `mode` (the
/// umask already applied), then renames it over `name` (an existing file is
/// replaced, never written through).
pub fn write_file(
    parent: &OwnedFd,
    name: &OsStr,
    mode: u32,
    data: &mut impl Read,
) -> io::Result<()> {
    let mut tmp_name = b".".to_vec();
    tmp_name.extend_from_slice(name.as_bytes());
    tmp_name.extend_from_slice(format!(".{}.microagent-part", random_hex()).as_bytes());
    let tmp = OsStr::from_bytes(&tmp_name);
    let c_tmp = cstr(tmp)?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c_tmp` is NUL-terminated; the result is checked.
    let fd = check(unsafe { libc::openat(parent.as_raw_fd(), c_tmp.as_ptr(), flags, 0o600) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let written = io::copy(data, &mut file)
        .and_then(|_| fchmod(&file, mode))
        .and_then(|()| rename_at(parent, tmp, name));
    if written.is_err() {
        // SAFETY: `c_tmp` is NUL-terminated; unlinkat only reads it.
        unsafe { libc::unlinkat(parent.as_raw_fd(), c_tmp.as_ptr(), 0) };
    }
    written
}

/// renameat within `parent`.
pub(crate) fn rename_at(parent: &OwnedFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both names are NUL-terminated and outlive the call.
    check(unsafe {
        libc::renameat(
            parent.as_raw_fd(),
            f.as_ptr(),
            parent.as_raw_fd(),
            t.as_ptr(),
        )
    })
    .map(drop)
}

/// Removes what is at `name` (not a directory), then `make`s it.
pub fn replace_with(
    parent: &OwnedFd,
    name: &OsStr,
    make: impl Fn(&OwnedFd, &OsStr) -> io::Result<()>,
) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: `c` is NUL-terminated; unlinkat removes a name, not a directory.
    if let Err(e) = check(unsafe { libc::unlinkat(parent.as_raw_fd(), c.as_ptr(), 0) }) {
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    make(parent, name)
}

/// Makes `name` in `parent` a symlink to `target`.
pub fn symlinkat(target: &Path, parent: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let (t, n) = (cstr(target.as_os_str())?, cstr(name)?);
    // SAFETY: both strings are NUL-terminated and outlive the call.
    check(unsafe { libc::symlinkat(t.as_ptr(), parent.as_raw_fd(), n.as_ptr()) }).map(drop)
}

/// Makes `name` in `parent` a hard link to `from_name` in `from`, not
/// following a symlink.
pub fn linkat(from: &OwnedFd, from_name: &OsStr, parent: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let (f, n) = (cstr(from_name)?, cstr(name)?);
    // SAFETY: both strings are NUL-terminated; flags 0: a symlink is not followed.
    check(unsafe {
        libc::linkat(
            from.as_raw_fd(),
            f.as_ptr(),
            parent.as_raw_fd(),
            n.as_ptr(),
            0,
        )
    })
    .map(drop)
}

/// Whether `name` in `parent` is a regular file (a symlink is not).
pub fn is_regular_file(parent: &OwnedFd, name: &OsStr) -> bool {
    let Ok(c) = cstr(name) else { return false };
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated, `st` is a live stat buffer.
    let ret = unsafe {
        libc::fstatat(
            parent.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    ret == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// fchmod(2).
pub fn fchmod(file: &File, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on a live descriptor.
    check(unsafe { libc::fchmod(file.as_raw_fd(), mode) }).map(drop)
}

/// syncfs(2): flushes the filesystem `fd` is on and reports a write that
/// failed there since `fd` was opened (EIO, ENOSPC at writeback).
pub fn sync_fs(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: syncfs on a live descriptor; no memory is passed.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// This process's umask, read without changing it (umask(2) would, for
/// every thread); 022 when /proc cannot tell.
pub fn umask() -> u32 {
    crate::host::settings::proc_self_status("Umask")
        .and_then(|v| u32::from_str_radix(&v, 8).ok())
        .unwrap_or(0o022)
}

/// 16 random hex digits for a temporary file's name.
pub fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Unpredictable enough for a name that is also created O_EXCL.
        return crate::host::settings::unique_id();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
