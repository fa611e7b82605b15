//! File, tar, ping/info and hybrid vsock operations through the async client.

#![cfg(feature = "client")]

mod common;

use std::os::unix::fs::{symlink, FileTypeExt, PermissionsExt};
use std::path::Path;

use common::{random_bytes, read_to_end, Agent};
use guest_agent::{
    connect_hybrid_vsock, AgentErrorCode, ClientError, EntryKind, GuestAgentClient, WriteMode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> AgentErrorCode {
    let err = r.unwrap_err();
    err.code()
        .unwrap_or_else(|| panic!("not an agent error: {err}"))
}

fn mode(path: &str) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test]
async fn ping_hello_and_info() {
    let agent = Agent::start();
    let uptime = agent.client().await.ping().await.unwrap();
    assert!(uptime.as_secs() < 60);
    let hello = agent.client().await.hello().await.unwrap();
    // Asked in the oldest version, answered in it.
    assert_eq!(hello.version, guest_agent::protocol::MIN_PROTOCOL_VERSION);
    assert!(hello.capabilities.iter().any(|c| c == "tar_in"));
    assert!(hello.capabilities.iter().any(|c| c == "pty"));
    let info = agent.client().await.info().await.unwrap();
    assert!(info.kernel.starts_with("Linux "), "{}", info.kernel);
    assert!(info.kernel.contains(&info.hostname));
    assert!(info.mem_total_kib >= info.mem_available_kib && info.mem_total_kib > 0);
    assert!(info.load.iter().all(|l| *l >= 0.0));
    let root = info
        .disks
        .iter()
        .find(|d| d.mount == "/")
        .expect("no / in disks");
    assert!(root.total_bytes >= root.avail_bytes && root.total_bytes > 0);
    assert!(info.cpus > 0);
    let ticks = info.cpu_ticks.expect("cpu_ticks");
    assert!(ticks.busy <= ticks.total && ticks.total > 0, "{ticks:?}");
    assert!(info.net.is_some());
}

#[tokio::test]
async fn shutdown_is_refused_unless_the_agent_is_init() {
    // On a host the agent is never PID 1: it must not try to reboot anything.
    let agent = Agent::start();
    let err = agent.client().await.shutdown().await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(guest_agent::AgentErrorCode::PermissionDenied),
        "{err}"
    );
    assert!(agent.client().await.ping().await.is_ok(), "still serving");
}

#[tokio::test]
async fn write_modes_read_ranges_and_permissions() {
    let agent = Agent::start();
    let path = agent.path("a.txt");
    let c = || agent.client();
    let n = c()
        .await
        .write_file(&path, WriteMode::Create, Some(0o640), b"hello world")
        .await;
    assert_eq!(n.unwrap(), 11);
    assert_eq!(mode(&path), 0o640);
    assert_eq!(c().await.read_file(&path).await.unwrap(), b"hello world");
    // create refuses to replace, and leaves the file alone.
    assert_eq!(
        code(
            c().await
                .write_file(&path, WriteMode::Create, None, b"x")
                .await
        ),
        AgentErrorCode::Exists
    );
    // append keeps, truncate replaces (keeping the mode unless given).
    c().await
        .write_file(&path, WriteMode::Append, None, b"!!")
        .await
        .unwrap();
    assert_eq!(read_to_end(Path::new(&path)), b"hello world!!");
    c().await
        .write_file(&path, WriteMode::Truncate, None, b"new")
        .await
        .unwrap();
    assert_eq!(
        (read_to_end(Path::new(&path)), mode(&path)),
        (b"new".to_vec(), 0o640)
    );
    c().await
        .write_file(&path, WriteMode::Truncate, Some(0o755), b"0123456789")
        .await
        .unwrap();
    assert_eq!(mode(&path), 0o755);

    let mut range = Vec::new();
    let header = c()
        .await
        .read_file_to(&path, Some(2), Some(3), &mut range)
        .await
        .unwrap();
    assert_eq!(range, b"234");
    assert_eq!(
        (header.size, header.mode, header.transferred),
        (10, 0o755, 3)
    );
    let mut tail = Vec::new();
    c().await
        .read_file_to(&path, Some(8), None, &mut tail)
        .await
        .unwrap();
    assert_eq!(tail, b"89");

    // A few MiB both ways, byte-exact.
    let big = random_bytes(3, (3 << 20) + 17);
    let big_path = agent.path("big.bin");
    let n = c()
        .await
        .write_file(&big_path, WriteMode::Truncate, None, &big)
        .await
        .unwrap();
    assert_eq!(n, big.len() as u64);
    assert_eq!(c().await.read_file(&big_path).await.unwrap(), big);
    assert_eq!(mode(&big_path), 0o644);
    let proc_status = c().await.read_file("/proc/self/status").await.unwrap();
    assert!(String::from_utf8_lossy(&proc_status).contains("Pid:"));

    // The longest name a file can have still goes through a temporary file.
    let long = agent.path(&"l".repeat(255));
    c().await
        .write_file(&long, WriteMode::Create, None, b"long")
        .await
        .unwrap();
    assert_eq!(read_to_end(Path::new(&long)), b"long");

    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(agent.files())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");

    assert_eq!(
        code(c().await.read_file(&agent.path("missing")).await),
        AgentErrorCode::NotFound
    );
    assert_eq!(
        code(c().await.read_file("relative/path").await),
        AgentErrorCode::InvalidInput
    );
    assert_eq!(
        code(c().await.read_file(agent.files().to_str().unwrap()).await),
        AgentErrorCode::InvalidInput
    );
    // A fifo is refused, never opened to block (it is opened without
    // blocking and checked again, for one swapped in after the check);
    // a character device still reads.
    let fifo = agent.path("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        assert_eq!(
            code(c().await.read_file(&fifo).await),
            AgentErrorCode::InvalidInput
        );
    }
    assert_eq!(c().await.read_file("/dev/null").await.unwrap(), b"");
    assert_eq!(
        code(
            c().await
                .write_file(&agent.path("no/dir/f"), WriteMode::Create, None, b"")
                .await
        ),
        AgentErrorCode::NotFound
    );
}

#[tokio::test]
async fn stat_list_mkdir_remove_rename() {
    let agent = Agent::start();
    let c = || agent.client();
    let dir = agent.path("d/e/f");
    c().await.mkdir(&dir).await.unwrap();
    c().await.mkdir(&dir).await.unwrap();
    std::fs::write(agent.path("d/file"), b"12345").unwrap();
    symlink("file", agent.path("d/link")).unwrap();

    let st = c().await.stat(&agent.path("d/file")).await.unwrap();
    assert_eq!((st.kind, st.size), (EntryKind::File, 5));
    assert!(st.mtime_s > 1_600_000_000);
    assert_eq!(
        c().await.stat(&agent.path("d/link")).await.unwrap().kind,
        EntryKind::Symlink
    );
    assert_eq!(
        c().await.stat(&agent.path("d/e")).await.unwrap().kind,
        EntryKind::Dir
    );
    assert_eq!(
        code(c().await.stat(&agent.path("nope")).await),
        AgentErrorCode::NotFound
    );

    let (entries, truncated) = c().await.list_dir(&agent.path("d")).await.unwrap();
    assert!(!truncated);
    let got: Vec<(&str, EntryKind, u64)> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size))
        .collect();
    assert_eq!(got[0].0, "e");
    assert_eq!(
        got[1..],
        [
            ("file", EntryKind::File, 5),
            ("link", EntryKind::Symlink, 4)
        ]
    );
    assert_eq!(
        code(c().await.mkdir(&agent.path("d/file")).await),
        AgentErrorCode::Exists
    );

    c().await
        .rename(&agent.path("d/file"), &agent.path("d/moved"))
        .await
        .unwrap();
    assert!(Path::new(&agent.path("d/moved")).exists());
    assert_eq!(
        code(
            c().await
                .rename(&agent.path("d/file"), &agent.path("d/x"))
                .await
        ),
        AgentErrorCode::NotFound
    );

    assert_eq!(
        code(c().await.remove(&agent.path("d/e"), false).await),
        AgentErrorCode::InvalidInput
    );
    c().await
        .remove(&agent.path("d/moved"), false)
        .await
        .unwrap();
    c().await.remove(&agent.path("d"), true).await.unwrap();
    assert!(!Path::new(&agent.path("d")).exists());
    assert_eq!(
        code(c().await.remove(&agent.path("d"), true).await),
        AgentErrorCode::NotFound
    );
    assert_eq!(
        code(c().await.remove("/", true).await),
        AgentErrorCode::InvalidInput
    );
    assert_eq!(
        code(c().await.remove("/tmp/..", true).await),
        AgentErrorCode::InvalidInput
    );
}

/// Every path under `root`, with its kind, mode and content or link target.
fn snapshot(root: &Path) -> Vec<(String, String, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            let perm = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_socket() {
                continue;
            } else if meta.is_dir() {
                stack.push(path.clone());
                out.push((rel, "dir".into(), perm, Vec::new()));
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.push((rel, "link".into(), 0, target.to_str().unwrap().into()));
            } else {
                out.push((rel, "file".into(), perm, read_to_end(&path)));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn tar_round_trip_is_byte_exact() {
    let agent = Agent::start();
    let src = agent.files().join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    std::fs::write(src.join("big.bin"), random_bytes(11, 700_001)).unwrap();
    std::fs::write(src.join("empty.txt"), b"").unwrap();
    std::fs::write(src.join("sub/deeper/x.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(
        src.join("sub/deeper/x.sh"),
        PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(src.join(format!("{}.txt", "n".repeat(150))), b"long name").unwrap();
    symlink("sub/deeper/x.sh", src.join("link")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(src.join("skipped.sock")).unwrap();

    let tar = agent
        .client()
        .await
        .tar_out(src.to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(tar.len() % 512, 0);
    let dst = agent.files().join("dst");
    let entries = agent
        .client()
        .await
        .tar_in(dst.to_str().unwrap(), &tar)
        .await
        .unwrap();
    let expected = snapshot(&src);
    assert_eq!(entries, expected.len() as u64);
    assert_eq!(snapshot(&dst), expected);

    // Streaming variants.
    let mut streamed = Vec::new();
    let n = agent
        .client()
        .await
        .tar_out_to(src.to_str().unwrap(), &mut streamed)
        .await
        .unwrap();
    assert_eq!((n, streamed.len()), (tar.len() as u64, tar.len()));
    let mut reader = &tar[..];
    let dst2 = agent.files().join("dst2");
    agent
        .client()
        .await
        .tar_in_from(dst2.to_str().unwrap(), &mut reader)
        .await
        .unwrap();
    assert_eq!(snapshot(&dst2), expected);

    let file = src.join("empty.txt");
    assert_eq!(
        code(agent.client().await.tar_out(file.to_str().unwrap()).await),
        AgentErrorCode::InvalidInput
    );
}

#[tokio::test]
async fn tar_in_keeps_owners_only_when_asked() {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        testkit::skip(
            "tar_in_keeps_owners_only_when_asked",
            "needs root (chown to another user)",
        );
        return;
    }
    let agent = Agent::start();
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(3);
    header.set_mode(0o640);
    header.set_uid(4321);
    header.set_gid(4322);
    header.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut header, "owned", &b"abc"[..])
        .unwrap();
    let tar = builder.into_inner().unwrap();
    for (owners, want) in [(true, (4321, 4322)), (false, (0, 0))] {
        let dst = agent.files().join(format!("owners-{owners}"));
        let mut reader = &tar[..];
        agent
            .client()
            .await
            .tar_in_with(dst.to_str().unwrap(), owners, &mut reader)
            .await
            .unwrap();
        let meta = std::fs::metadata(dst.join("owned")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), want, "owners: {owners}");
    }
}

fn raw_tar_entry(name: &str, data: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

#[tokio::test]
async fn tar_in_refuses_entries_that_escape() {
    let agent = Agent::start();
    let target = agent.files().join("t");
    for evil in ["../evil.txt", "a/../../evil.txt", "/abs-evil.txt"] {
        let mut tar = raw_tar_entry("ok.txt", b"fine");
        tar.extend(raw_tar_entry(evil, b"gotcha"));
        tar.extend([0u8; 1024]);
        let err = agent
            .client()
            .await
            .tar_in(target.to_str().unwrap(), &tar)
            .await;
        assert_eq!(code(err), AgentErrorCode::InvalidInput, "{evil}");
        assert!(!agent.files().join("evil.txt").exists());
        assert!(!Path::new("/abs-evil.txt").exists());
        assert_eq!(read_to_end(&target.join("ok.txt")), b"fine");
    }
    let garbage = random_bytes(5, 4096);
    assert!(agent
        .client()
        .await
        .tar_in(target.to_str().unwrap(), &garbage)
        .await
        .is_err());
    agent.client().await.ping().await.unwrap();
}

#[tokio::test]
async fn hybrid_vsock_handshake() {
    let agent = Agent::start();
    let vmm = agent.dir.join("vmm.sock");
    let listener = tokio::net::UnixListener::bind(&vmm).unwrap();
    let agent_socket = agent.socket.clone();
    // A stand-in for the VMM's hybrid vsock socket: port 1024 reaches the
    // agent, any other port is closed at once.
    tokio::spawn(async move {
        loop {
            let (mut host, _) = listener.accept().await.unwrap();
            let agent_socket = agent_socket.clone();
            tokio::spawn(async move {
                let mut line = Vec::new();
                let mut b = [0u8];
                while host.read_exact(&mut b).await.is_ok() && b[0] != b'\n' {
                    line.push(b[0]);
                }
                if line == b"CONNECT 1024" {
                    let mut guest = tokio::net::UnixStream::connect(agent_socket).await.unwrap();
                    host.write_all(b"OK 1073741824\n").await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut host, &mut guest).await;
                }
            });
        }
    });
    let stream = connect_hybrid_vsock(&vmm, 1024).await.unwrap();
    GuestAgentClient::new(stream).ping().await.unwrap();
    let endpoint = guest_agent::AgentEndpoint::HybridVsock {
        uds: vmm.clone(),
        port: 1024,
    };
    let out = endpoint
        .connect()
        .await
        .unwrap()
        .exec_collect(
            guest_agent::ExecCall::argv(["echo", "via vsock"]),
            guest_agent::ExecStdin::None,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout, b"via vsock\n");
    let err = connect_hybrid_vsock(&vmm, 5).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Handshake { port: 5, .. }),
        "{err}"
    );
    // The blocking client of the VMM process, the same way (off the
    // runtime thread, which serves the stand-in).
    let (uptime, refused) = tokio::task::spawn_blocking(move || {
        use guest_agent::client::blocking::BlockingClient;
        let timeout = std::time::Duration::from_secs(5);
        let uptime = BlockingClient::connect_hybrid_vsock(&vmm, 1024, timeout)
            .and_then(BlockingClient::ping);
        let refused = BlockingClient::connect_hybrid_vsock(&vmm, 5, timeout).unwrap_err();
        (uptime, refused)
    })
    .await
    .unwrap();
    uptime.unwrap();
    assert!(
        matches!(refused, ClientError::Handshake { port: 5, .. }),
        "{refused}"
    );
}

/// A reader that gives some bytes, then fails (a connection cut mid-copy).
struct CutReader(Option<Vec<u8>>);

impl tokio::io::AsyncRead for CutReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(match self.0.take() {
            Some(first) => {
                buf.put_slice(&first);
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        })
    }
}

#[tokio::test]
async fn a_write_whose_input_is_cut_leaves_the_file_as_it_was() {
    let agent = Agent::start();
    let path = agent.path("kept.txt");
    let c = || agent.client();
    c().await
        .write_file(&path, WriteMode::Create, None, b"whole")
        .await
        .unwrap();
    let mut cut = CutReader(Some(b"half".to_vec()));
    let got = c()
        .await
        .write_file_from(&path, WriteMode::Truncate, None, &mut cut)
        .await;
    assert!(matches!(got, Err(ClientError::Local(_))), "{got:?}");
    // The client gives up before the agent may have even made its
    // temporary: wait for the agent to fail the request (its log says so
    // after the temporary is dropped, whether the cut found it reading the
    // upload or answering), then look.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !agent.log().contains("request failed") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(agent.log().contains("request failed"), "{}", agent.log());
    // The agent saw no end: its temporary is gone, the file untouched.
    let names: Vec<_> = std::fs::read_dir(Path::new(&path).parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        1,
        "a temporary was left beside the file: {names:?}"
    );
    assert_eq!(read_to_end(Path::new(&path)), b"whole");
}
