//! The VMM's Landlock policy (`vmm_host::file_access`), in a child process
//! of this test binary: beneath what it keeps it reads and writes, nothing
//! else of the host's files opens, no TCP socket binds or connects, and an
//! abstract Unix socket made outside it does not answer.

use std::io::Write;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use base::host::jail::Keep;

/// The variable that makes the child run: the directory it keeps.
const KEPT: &str = "MICROAGENT_FILE_ACCESS_KEPT";
/// The abstract socket the parent listens on.
const ABSTRACT: &str = "MICROAGENT_FILE_ACCESS_ABSTRACT";

fn abstract_addr(name: &str) -> SocketAddr {
    <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes()).unwrap()
}

/// Run in a child process by the test below.
#[test]
#[ignore = "run in a child process by the Landlock test"]
fn confined_child() {
    let Some(kept) = std::env::var_os(KEPT) else {
        return;
    };
    let kept = std::path::PathBuf::from(kept);
    let abstract_name = std::env::var(ABSTRACT).unwrap();
    // Before: all of it works.
    assert!(std::fs::read("/etc/hostname").is_ok() || std::fs::read("/etc/passwd").is_ok());
    // Beneath `groups` it may only remove directories (its cgroups).
    let groups = kept.with_extension("groups");
    std::fs::create_dir_all(groups.join("mine")).unwrap();
    let holder = std::fs::File::open(&groups).unwrap();
    let protection =
        vmm_host::file_access::confine(&[Keep::Dir(kept.clone())], vec![holder.into()]).unwrap();
    assert!(std::fs::File::create(groups.join("file")).is_err());
    std::fs::remove_dir(groups.join("mine")).unwrap();
    assert!(protection.starts_with("landlock"), "{protection}");
    // Its own directory: written and read back.
    std::fs::File::create(kept.join("written"))
        .and_then(|mut f| f.write_all(b"ok"))
        .unwrap();
    assert_eq!(std::fs::read(kept.join("written")).unwrap(), b"ok");
    // Its own /proc entry reads.
    assert!(std::fs::read_to_string("/proc/self/status").is_ok());
    // Nothing else.
    for path in ["/etc/passwd", "/usr/bin/env", "/root"] {
        let err = std::fs::read(path).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{path}");
    }
    assert!(std::fs::File::create("/tmp/ma-landlock-escape").is_err());
    // No TCP bind or connect.
    let bind = std::net::TcpListener::bind("127.0.0.1:0").unwrap_err();
    assert_eq!(bind.kind(), std::io::ErrorKind::PermissionDenied, "{bind}");
    // The parent's abstract socket is outside: refused.
    assert!(UnixStream::connect_addr(&abstract_addr(&abstract_name)).is_err());
}

#[test]
fn the_vmm_reaches_only_what_it_keeps() {
    let test = "the_vmm_reaches_only_what_it_keeps";
    let abi = base::host::settings::landlock_abi().unwrap_or(0);
    let enough = if abi >= 6 {
        Ok(())
    } else {
        Err(format!(
            "this kernel's Landlock ABI is {abi}; the policy needs 6 (scoped sockets)"
        ))
    };
    if testkit::require(test, enough).is_none() {
        return;
    }
    let kept = std::env::temp_dir().join(format!("ma-landlock-{}", std::process::id()));
    std::fs::create_dir_all(&kept).unwrap();
    let name = format!("ma-landlock-{}", std::process::id());
    let outside = UnixListener::bind_addr(&abstract_addr(&name)).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "confined_child", "--nocapture"])
        .env(KEPT, &kept)
        .env(ABSTRACT, &name)
        .output()
        .unwrap();
    drop(outside);
    let _ = std::fs::remove_dir_all(&kept);
    let _ = std::fs::remove_dir_all(kept.with_extension("groups"));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
