//! The library's entry points against a hostile agent: a fake on the
//! workspace's vsock socket that answers every request with more than was
//! asked for, without end. Each entry point ends with an error, keeps no
//! more than its bound in memory, and leaves no partial file on the host.
//! (`run_code` and `run` collect their command's output through the same
//! `exec_collect` the exec case drives.) No KVM needed: the workspace's
//! record says it runs, with this test process as its VMM.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use guest_agent::frame::{self, FrameKind};
use guest_agent::protocol::{FileKind, FileStat, Response, MIN_PROTOCOL_VERSION};
use workspace::{ErrorCode, ExecInput, ExecRequest, StateDir, WorkspaceSpec, Workspaces};

/// How much an exec's fake sends before it stalls: far past the cap.
const EXEC_FLOOD: u64 = 1 << 30;

/// What the fake does with a request.
#[derive(Clone, Copy)]
enum Hostility {
    /// `stat` says a file; `read_file` claims 10 bytes and sends data
    /// without end.
    EndlessFile,
    /// `stat` says a directory; `tar_out` sends bytes without end.
    EndlessArchive,
    /// `stat` says a directory; `tar_out` sends a valid archive of many
    /// files.
    ManyEntries,
    /// `exec` starts, floods stdout past any cap, then says nothing more.
    FloodThenStall,
}

/// A state directory with a fake image and a workspace `dev` recorded as
/// running (its "VMM" is this process), its agent the hostile fake.
struct Home {
    root: PathBuf,
    ws: Workspaces,
}

impl Drop for Home {
    fn drop(&mut self) {
        // Never `delete`: it would halt the "VMM", this process.
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn home(test: &str, hostility: Hostility, limits: workspace::Limits) -> Option<Home> {
    if workspace::settings::host_tool("mkfs.ext4").is_none() {
        support::skip(
            test,
            "mkfs.ext4 is not installed (apt-get install e2fsprogs)",
        );
        return None;
    }
    let root = std::env::temp_dir().join(format!("ma-hostile-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    support::fake_image_files(&root.join("image"));
    let ws = Workspaces::builder()
        .state_dir(root.join("state"))
        .assets(None)
        .vmm_program("/nonexistent/vmm")
        .limits(limits)
        .build()
        .unwrap();
    ws.images().import_dir("fake", &root.join("image")).unwrap();
    let spec = WorkspaceSpec {
        image: "fake".into(),
        disk_mib: 64,
        ..WorkspaceSpec::default()
    };
    ws.create("dev", spec).unwrap();
    let dir = StateDir::at(root.join("state"))
        .unwrap()
        .workspace_dir("dev")
        .unwrap();
    pretend_running(&dir);
    let listener = UnixListener::bind(dir.join("vsock.sock")).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || serve(conn, hostility));
        }
    });
    Some(Home { root, ws })
}

/// Records the workspace as running with this process as its VMM.
fn pretend_running(dir: &Path) {
    let path = dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Field 22 (start time), counted after the command's closing paren.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let start: u64 = after.split(' ').nth(19).unwrap().parse().unwrap();
    meta["state"] = "running".into();
    meta["runtime"] = serde_json::json!({
        "pid": std::process::id(),
        "pid_start": start,
        "started_at_ms": 1,
    });
    std::fs::write(&path, serde_json::to_vec(&meta).unwrap()).unwrap();
}

/// One connection: the hybrid vsock handshake, the client's `hello` and
/// request, then the hostile answer until the client hangs up.
fn serve(conn: UnixStream, hostility: Hostility) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || !line.starts_with("CONNECT ") {
        return;
    }
    let _ = out.write_all(b"OK 1\n");
    let request = loop {
        let Ok(Some(f)) = frame::read_frame(&mut reader) else {
            return;
        };
        let msg: serde_json::Value = frame::decode_json(&f).unwrap();
        if msg["type"] != "hello" {
            break msg;
        }
    };
    let mut send = |r: &Response| out.write_all(&frame::encode_json(r).unwrap()).is_ok();
    send(&Response::Hello {
        version: MIN_PROTOCOL_VERSION,
        agent: "hostile".into(),
        capabilities: Vec::new(),
    });
    let kind = match hostility {
        Hostility::EndlessFile => FileKind::File,
        _ => FileKind::Dir,
    };
    match (request["type"].as_str().unwrap_or(""), hostility) {
        ("stat", _) => {
            send(&Response::Stat(FileStat {
                kind,
                size: 10,
                mode: 0o755,
                mtime_s: 0,
                uid: 0,
                gid: 0,
            }));
        }
        // The header, then data without end.
        ("read_file", _)
            if send(&Response::File {
                size: 10,
                mode: 0o644,
            }) =>
        {
            flood(&mut out, FrameKind::Data, u64::MAX)
        }
        ("tar_out", Hostility::ManyEntries) => {
            let mut tar = tar::Builder::new(Vec::new());
            for i in 0..100 {
                let mut header = tar::Header::new_gnu();
                header.set_size(0);
                header.set_mode(0o644);
                header.set_cksum();
                tar.append_data(&mut header, format!("f{i}"), &[][..])
                    .unwrap();
            }
            let tar = tar.into_inner().unwrap();
            for chunk in tar.chunks(60_000) {
                let _ = out.write_all(&frame::encode(FrameKind::Data, chunk).unwrap());
            }
            let _ = out.write_all(&frame::encode(FrameKind::Data, &[]).unwrap());
        }
        ("tar_out", _) => flood(&mut out, FrameKind::Data, u64::MAX),
        ("exec", _) => {
            let exec_id = request["id"].as_str().unwrap_or("e1").to_owned();
            if send(&Response::Started { exec_id, pid: 7 }) {
                flood(&mut out, FrameKind::Stdout, EXEC_FLOOD);
                // Then silence until the client gives up.
                let _ = reader.read(&mut [0u8; 1]);
            }
        }
        _ => {}
    }
}

/// Sends `kind` frames of junk until `total` bytes or the peer hangs up.
fn flood(out: &mut UnixStream, kind: FrameKind, total: u64) {
    let chunk = frame::encode(kind, &[b'x'; 60_000]).unwrap();
    let mut sent = 0u64;
    while sent < total && out.write_all(&chunk).is_ok() {
        sent += 60_000;
    }
}

/// The most this process has had resident, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn read_file_and_copy_out_of_a_file_stop_at_their_bounds() {
    let Some(h) = home("file", Hostility::EndlessFile, workspace::LIMITS) else {
        return;
    };
    let rt = runtime();
    let read = rt
        .block_on(h.ws.read_file("dev", "/f", None, Some(1 << 20)))
        .unwrap_err();
    let chain = workspace::error_chain(&read);
    assert!(chain.contains("more than"), "{chain}");

    // The guest said 10 bytes: copy_out takes that plus the growth allowance.
    let dest = h.root.join("out");
    std::fs::create_dir_all(&dest).unwrap();
    let err = rt
        .block_on(h.ws.copy_out("dev", "/f", &dest.join("f")))
        .unwrap_err();
    let chain = workspace::error_chain(&err);
    let budget = 10 + workspace::host_write::COPY_OUT_GROWTH;
    assert!(
        chain.contains(&format!("over its budget of {budget} bytes")),
        "{chain}"
    );
    assert!(files_in(&dest).is_empty(), "left {:?}", files_in(&dest));
}

#[test]
fn copy_out_of_a_directory_stops_at_the_byte_budget() {
    let limits = workspace::Limits {
        max_copy_out_bytes: 8 << 20,
        ..workspace::LIMITS
    };
    let Some(h) = home("archive", Hostility::EndlessArchive, limits) else {
        return;
    };
    let dest = h.root.join("out");
    std::fs::create_dir_all(&dest).unwrap();
    let err = runtime()
        .block_on(h.ws.copy_out("dev", "/d", &dest.join("d")))
        .unwrap_err();
    let chain = workspace::error_chain(&err);
    assert!(
        chain.contains("over its budget of 8388608 bytes"),
        "{chain}"
    );
    // The directory is made first; nothing is in it, no temporary beside it.
    assert_eq!(files_in(&dest), ["d"]);
    assert!(files_in(&dest.join("d")).is_empty());
}

#[test]
fn copy_out_of_a_directory_stops_at_the_entry_budget() {
    let limits = workspace::Limits {
        max_copy_out_entries: 10,
        ..workspace::LIMITS
    };
    let Some(h) = home("entries", Hostility::ManyEntries, limits) else {
        return;
    };
    let dest = h.root.join("out");
    let err = runtime()
        .block_on(h.ws.copy_out("dev", "/d", &dest))
        .unwrap_err();
    let chain = workspace::error_chain(&err);
    assert!(chain.contains("entries"), "{chain}");
    assert!(files_in(&dest).len() <= 10, "{:?}", files_in(&dest));
}

#[test]
fn an_exec_that_floods_then_stalls_ends_with_its_deadline_and_bounded_memory() {
    let Some(h) = home("exec", Hostility::FloodThenStall, workspace::LIMITS) else {
        return;
    };
    let req = ExecRequest::argv(["yes"])
        .timeout(Duration::from_secs(1))
        .output_cap(1 << 20);
    let err = runtime()
        .block_on(h.ws.exec_collect("dev", req, ExecInput::None))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    // A gibibyte went by; what stayed was about the cap.
    let peak = peak_rss_kib();
    assert!(peak < 256 << 10, "peak resident {peak} KiB");
}
