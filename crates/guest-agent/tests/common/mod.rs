//! The agent binary as a host process on a Unix socket in a fresh temporary
//! directory, removed (and the agent killed) on drop. `MICROAGENT_AGENT_BIN`
//! runs the tests against another build (e.g. the static release binary).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use guest_agent::frame::{self, Frame, FrameKind};
use guest_agent::protocol::{Request, Response, PROTOCOL_VERSION};

pub struct Agent {
    child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
}

impl Agent {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_ignoring(extra, &[])
    }

    /// An agent started with `signals` ignored, as a shell's background
    /// job (SIGINT, SIGQUIT) or `nohup` (SIGHUP) starts it.
    pub fn start_ignoring(extra: &[&str], signals: &'static [libc::c_int]) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ga-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("files")).unwrap();
        let socket = dir.join("agent.sock");
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let bin = std::env::var_os("MICROAGENT_AGENT_BIN").map_or_else(
            || env!("CARGO_BIN_EXE_microagent-agent").into(),
            PathBuf::from,
        );
        let mut command = Command::new(bin);
        // SAFETY: the closure runs in the child between fork and exec and
        // only calls signal(2), which is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                for &signal in signals {
                    libc::signal(signal, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let child = command
            .arg("--unix")
            .arg(&socket)
            .arg("--verbose")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let agent = Self { child, dir, socket };
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&agent.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the agent did not start listening"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        agent
    }

    /// A directory for file tests (absolute).
    pub fn files(&self) -> PathBuf {
        self.dir.join("files")
    }

    /// `files()/name` as a string.
    pub fn path(&self, name: &str) -> String {
        self.files().join(name).to_str().unwrap().to_owned()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    /// A raw connection with a read timeout.
    pub fn raw(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    #[cfg(feature = "client")]
    pub fn endpoint(&self) -> guest_agent::AgentEndpoint {
        guest_agent::AgentEndpoint::Unix(self.socket.clone())
    }

    #[cfg(feature = "client")]
    pub async fn client(&self) -> guest_agent::GuestAgentClient<tokio::net::UnixStream> {
        self.endpoint().connect().await.unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("agent log:\n{}", self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn hello_bytes(version: u32) -> Vec<u8> {
    frame::encode_json(&Request::Hello {
        version,
        identity: None,
        host_time_ns: None,
    })
    .unwrap()
}

/// Sends `bytes`, closes the write side, and returns every frame the
/// agent sent until it closed (or the frames up to a framing error).
pub fn exchange(agent: &Agent, bytes: &[u8]) -> Vec<Frame> {
    let mut s = agent.raw();
    // The agent may close early (it refused the request): that is fine.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    read_all(&mut s)
}

pub fn read_all(s: &mut UnixStream) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Ok(Some(f)) = frame::read_frame(s) {
        frames.push(f);
    }
    frames
}

pub fn responses(frames: &[Frame]) -> Vec<Response> {
    frames
        .iter()
        .filter(|f| f.kind == FrameKind::Json)
        .map(|f| frame::decode_json(f).unwrap())
        .collect()
}

/// Pings over a raw connection: the agent still serves.
pub fn ping(agent: &Agent) {
    let mut bytes = hello_bytes(PROTOCOL_VERSION);
    bytes.extend(frame::encode_json(&Request::Ping).unwrap());
    let got = responses(&exchange(agent, &bytes));
    assert!(
        matches!(
            got.as_slice(),
            [Response::Hello { .. }, Response::Pong { .. }]
        ),
        "{got:?}"
    );
}

/// Polls `f` until it is true or 10 s have passed.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn read_to_end(path: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut v)
        .unwrap();
    v
}

/// xorshift64*: deterministic test data.
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}
