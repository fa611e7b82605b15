//! A hostile guest agent for the host side's tests (feature `fake`): it
//! serves a workspace's hybrid vsock socket (`CONNECT <port>`, then the
//! protocol) and answers requests with more than was asked for, without
//! end, so tests can check that every host entry point stops at its bound.
//! Never part of a product path.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use crate::frame::{self, FrameKind};
use crate::protocol::{EntryKind, ExecExit, Response, StatAnswer, MIN_PROTOCOL_VERSION};

/// How much a flooding exec sends before it stalls: far past any cap.
pub const EXEC_FLOOD: u64 = 1 << 30;

/// What the fake does with requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostility {
    /// `stat` says a file of 10 bytes; `read_file` sends data without end.
    EndlessFile,
    /// `stat` says a directory; `tar_out` sends bytes without end.
    EndlessArchive,
    /// `stat` says a directory; `tar_out` sends a valid archive of this
    /// many empty files.
    ManyEntries(usize),
    /// Not hostile: `stat` says a file of this many bytes; `read_file`
    /// sends that many and ends (for tests of the host's disk failing).
    WholeFile(u64),
    /// Every `exec` starts, floods stdout with [`EXEC_FLOOD`] bytes, then
    /// says nothing more.
    FloodThenStall,
    /// Short shell commands (`/bin/sh -c ...`, `rm`) succeed at once and
    /// `write_file` succeeds, as for a real interpreter's probe and script;
    /// any other exec floods then stalls (what `run_code` meets).
    FloodScriptsThenStall,
}

/// Serves `listener` on a thread of its own, each connection on another,
/// for the rest of the process.
pub fn serve(listener: UnixListener, hostility: Hostility) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || answer(conn, hostility));
        }
    });
}

/// One connection: the handshake, the client's `hello` and request, then
/// the hostile answer until the client hangs up.
fn answer(conn: UnixStream, hostility: Hostility) {
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut out = conn;
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || !line.starts_with("CONNECT ") {
        return;
    }
    if out.write_all(b"OK 1\n").is_err() {
        return;
    }
    let request = loop {
        let Ok(Some(f)) = frame::read_frame(&mut reader) else {
            return;
        };
        let Ok(msg) = frame::decode_json::<serde_json::Value>(&f) else {
            return;
        };
        if msg["type"] != "hello" {
            break msg;
        }
    };
    let hello = Response::Hello {
        version: MIN_PROTOCOL_VERSION,
        agent: "hostile".into(),
        capabilities: Vec::new(),
    };
    if !send(&mut out, &hello) {
        return;
    }
    match request["type"].as_str().unwrap_or("") {
        "stat" => {
            let kind = match hostility {
                Hostility::EndlessFile | Hostility::WholeFile(_) => EntryKind::File,
                _ => EntryKind::Dir,
            };
            send(&mut out, &Response::Stat(stat(kind)));
        }
        "read_file" => {
            let header = Response::File {
                size: 10,
                mode: 0o644,
            };
            if !send(&mut out, &header) {
                return;
            }
            match hostility {
                Hostility::WholeFile(n) => {
                    flood(&mut out, FrameKind::Data, n);
                    if let Ok(end) = frame::encode(FrameKind::Data, &[]) {
                        let _ = out.write_all(&end);
                    }
                }
                _ => flood(&mut out, FrameKind::Data, u64::MAX),
            }
        }
        "tar_out" => match hostility {
            Hostility::ManyEntries(n) => many_entries(&mut out, n),
            _ => flood(&mut out, FrameKind::Data, u64::MAX),
        },
        "write_file" => {
            // Takes the data to its end, then says it was written.
            let mut bytes = 0u64;
            while let Ok(Some(f)) = frame::read_frame(&mut reader) {
                if f.payload.is_empty() {
                    break;
                }
                bytes += f.payload.len() as u64;
            }
            send(
                &mut out,
                &Response::Ok {
                    bytes: Some(bytes),
                    entries: None,
                },
            );
        }
        "exec" => {
            let exec_id = request["id"].as_str().unwrap_or("e1").to_owned();
            let program = request["argv"][0].as_str().unwrap_or("");
            let short = hostility == Hostility::FloodScriptsThenStall
                && (program == "/bin/sh" || program == "rm");
            let started = Response::Started {
                exec_id: exec_id.clone(),
                pid: 7,
            };
            if !send(&mut out, &started) {
                return;
            }
            if short {
                send(&mut out, &Response::Exited(exited(exec_id)));
            } else {
                flood(&mut out, FrameKind::Stdout, EXEC_FLOOD);
                // Then silence until the client gives up.
                let _ = reader.read(&mut [0u8; 1]);
            }
        }
        _ => {}
    }
}

fn send(out: &mut UnixStream, response: &Response) -> bool {
    frame::encode_json(response)
        .ok()
        .is_some_and(|bytes| out.write_all(&bytes).is_ok())
}

fn stat(kind: EntryKind) -> StatAnswer {
    StatAnswer {
        kind,
        size: 10,
        mode: 0o755,
        mtime_s: 0,
        uid: 0,
        gid: 0,
    }
}

fn exited(exec_id: String) -> ExecExit {
    ExecExit {
        exec_id,
        code: Some(0),
        signal: None,
        timed_out: false,
        wall_ms: 1,
        stdout_bytes: 0,
        stderr_bytes: 0,
        stdout_dropped: 0,
        stderr_dropped: 0,
        stdout_head: None,
        stderr_head: None,
    }
}

/// Sends a valid tar archive of `n` empty files, then the end of the data.
fn many_entries(out: &mut UnixStream, n: usize) {
    let mut tar = tar::Builder::new(Vec::new());
    for i in 0..n {
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o644);
        header.set_cksum();
        if tar
            .append_data(&mut header, format!("f{i}"), &[][..])
            .is_err()
        {
            return;
        }
    }
    let Ok(tar) = tar.into_inner() else {
        return;
    };
    for chunk in tar.chunks(60_000) {
        if let Ok(bytes) = frame::encode(FrameKind::Data, chunk) {
            let _ = out.write_all(&bytes);
        }
    }
    if let Ok(end) = frame::encode(FrameKind::Data, &[]) {
        let _ = out.write_all(&end);
    }
}

/// Sends `kind` frames of junk, `total` bytes or until the peer hangs up.
fn flood(out: &mut UnixStream, kind: FrameKind, total: u64) {
    const CHUNK: u64 = 60_000;
    let Ok(chunk) = frame::encode(kind, &[b'x'; CHUNK as usize]) else {
        return;
    };
    let mut sent = 0u64;
    while total - sent >= CHUNK {
        if out.write_all(&chunk).is_err() {
            return;
        }
        sent += CHUNK;
    }
    if sent < total {
        if let Ok(last) = frame::encode(kind, &vec![b'x'; (total - sent) as usize]) {
            let _ = out.write_all(&last);
        }
    }
}
