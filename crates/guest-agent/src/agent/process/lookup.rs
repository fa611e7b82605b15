//! Finding a program in `PATH` the way `execvp` does, before spawning.
//!
//! The agent always gives a process its own `PATH`; the spawn
//! (agent/spawn.rs) runs a program by absolute path, so the search happens
//! here, against the process's `PATH`, not the agent's.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where `execvp` would find `program` with this `PATH`: `program` itself
/// when it holds a `/`; else the first regular file of that name with an
/// execute bit in a `PATH` directory. NotFound when there is none, or
/// PermissionDenied when only files without an execute bit were found (as
/// `execvp` reports EACCES then). With `root`, `PATH` names directories
/// inside it, and the path returned is as a process in it sees it.
pub fn find_program(program: &str, path: &str, root: Option<&Path>) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let mut denied = false;
    for dir in path.split(':') {
        // An empty entry is the working directory, as for execvp.
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = PathBuf::from(dir).join(program);
        let found = match root {
            Some(root) => metadata_in_root(root, &candidate),
            None => std::fs::metadata(&candidate),
        };
        match found {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => {
                return Ok(candidate);
            }
            Ok(meta) if meta.is_file() => denied = true,
            _ => {}
        }
    }
    Err(io::Error::from(if denied {
        io::ErrorKind::PermissionDenied
    } else {
        io::ErrorKind::NotFound
    }))
}

/// The metadata of `path` as a process whose root is `root` sees it: its
/// symlinks resolved inside `root` (an image's `/bin/sh -> /bin/busybox`
/// names the image's busybox, not the guest's), by openat2's
/// RESOLVE_IN_ROOT.
fn metadata_in_root(root: &Path, path: &Path) -> io::Result<std::fs::Metadata> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let dir = std::fs::File::open(root)?;
    let inside = path.strip_prefix("/").unwrap_or(path);
    let name = std::ffi::CString::new(inside.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is plain data; all zeroes is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT;
    // SAFETY: openat2 reads `name` and `how`, which outlive the call, and
    // returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 succeeded: `fd` is a new descriptor nobody owns.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    file.metadata()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn finds_programs_as_execvp_would() {
        let dir = std::env::temp_dir().join(format!("agent-lookup-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let write = |p: PathBuf, mode: u32| {
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(a.join("tool"), 0o644);
        write(b.join("tool"), 0o755);
        write(a.join("plain"), 0o600);
        std::fs::create_dir_all(a.join("adir")).unwrap();
        let path = format!("{}:{}", a.display(), b.display());
        assert_eq!(find_program("tool", &path, None).unwrap(), b.join("tool"));
        assert_eq!(
            find_program("plain", &path, None).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        assert_eq!(
            find_program("adir", &path, None).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            find_program("missing", &path, None).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            find_program("./rel/x", &path, None).unwrap(),
            PathBuf::from("./rel/x")
        );
        // Inside a root, PATH is the root's, the path is as seen inside,
        // and an absolute symlink resolves inside the root.
        std::fs::create_dir_all(dir.join("c")).unwrap();
        symlink("/b/tool", dir.join("c/linked")).unwrap();
        assert_eq!(
            find_program("linked", "/c", Some(&dir)).unwrap(),
            PathBuf::from("/c/linked")
        );
        assert_eq!(
            find_program("tool", "/b", Some(&dir)).unwrap(),
            PathBuf::from("/b/tool")
        );
        assert_eq!(
            find_program("tool", &path, Some(&dir)).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
