//! Finding a program in `PATH` the way `execvp` does, before spawning.
//!
//! The agent always gives a process its own `PATH`; the spawn
//! (agent/spawn.rs) runs a program by absolute path, so the search happens
//! here, against the process's `PATH`, not the agent's.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// Where `execvp` would find `program` with this `PATH`: `program` itself
/// when it holds a `/`; else the first regular file of that name with an
/// execute bit in a `PATH` directory. NotFound when there is none, or
/// PermissionDenied when only files without an execute bit were found (as
/// `execvp` reports EACCES then).
pub fn find_program(program: &str, path: &str) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let mut denied = false;
    for dir in path.split(':') {
        // An empty entry is the working directory, as for execvp.
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = PathBuf::from(dir).join(program);
        match std::fs::metadata(&candidate) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(find_program("tool", &path).unwrap(), b.join("tool"));
        assert_eq!(
            find_program("plain", &path).unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        assert_eq!(
            find_program("adir", &path).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            find_program("missing", &path).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            find_program("./rel/x", &path).unwrap(),
            PathBuf::from("./rel/x")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
