//! Messages from the client.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where an exec's stdin comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdinMode {
    /// /dev/null.
    #[default]
    None,
    /// Kind-4 frames from the client; an empty one closes stdin.
    Stream,
}

/// How `write_file` treats an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// Fail with EXISTS if the path exists; otherwise write atomically.
    Create,
    /// Replace the file (or create it) atomically.
    Truncate,
    /// Append to the file, creating it if needed.
    Append,
}

/// A signal given by number (`9`) or name (`"KILL"`, `"SIGKILL"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SignalSpec {
    /// A signal number.
    Number(i32),
    /// A signal name, with or without the `SIG` prefix.
    Name(String),
}

impl From<i32> for SignalSpec {
    fn from(n: i32) -> Self {
        Self::Number(n)
    }
}

impl From<&str> for SignalSpec {
    fn from(name: &str) -> Self {
        Self::Name(name.to_owned())
    }
}

/// A volume for the guest to mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeToMount {
    /// The disk's serial (its virtio-blk GET_ID answer).
    pub serial: String,
    /// The absolute guest directory (made if missing).
    pub path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The `exec` request: what to run and how.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecCall {
    /// Program and arguments (exactly one of `argv` and `shell`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// A command line for `/bin/sh -c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Variables added to the default `PATH`/`HOME` environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// User id to run as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group id to run as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// A user to run as, resolved by the agent in the guest's /etc/passwd
    /// and /etc/group (`node`, `1000`, `node:staff`, `1000:50`; see
    /// [`crate::users`]); wins over `uid`/`gid`. Its home directory is
    /// `HOME` unless `env` sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Where stdin comes from.
    #[serde(default)]
    pub stdin: StdinMode,
    /// Kill the process group after this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Bytes per stream sent to the client (default 1 MiB, at most 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_cap: Option<u64>,
    /// A client-chosen exec id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Run on a new pseudo-terminal of this size (protocol 2): its own
    /// session with the terminal as controlling tty and as stdin, stdout and
    /// stderr. Output comes as stdout frames only; stdin is a stream, and
    /// `resize` messages may come between the stdin frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<WinSize>,
    /// Runs the process with this guest directory as its root (capability
    /// `exec.root`): in a mount namespace of its own, with the guest's
    /// /proc, /dev and /sys mounted inside it, then chrooted. The program,
    /// `cwd` and `user` are looked up inside it. The containerd shim runs
    /// each later container of a pod in its own root filesystem this way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WinSize {
    /// Rows (lines).
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for WinSize {
    /// 24 x 80, what a terminal that says nothing is taken to be.
    fn default() -> Self {
        Self { rows: 24, cols: 80 }
    }
}

impl ExecCall {
    /// Runs `argv[0]` (looked up in `PATH`) with the rest as arguments.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Self::default()
        }
    }

    /// Runs `command` with `/bin/sh -c`.
    pub fn shell(command: impl Into<String>) -> Self {
        Self {
            shell: Some(command.into()),
            ..Self::default()
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Runs with `dir` as the process's root directory.
    pub fn root(mut self, dir: impl Into<String>) -> Self {
        self.root = Some(dir.into());
        self
    }

    /// Runs as this user and group.
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.uid = Some(uid);
        self.gid = Some(gid);
        self
    }

    /// Runs as this user, named as /etc/passwd names it (or `uid[:gid]`).
    pub fn user_named(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Kills the process group when `timeout` is exceeded.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Bytes per stream sent back; the rest is only counted.
    pub fn output_cap(mut self, bytes: u64) -> Self {
        self.output_cap = Some(bytes);
        self
    }

    /// Chooses the exec id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Runs on a pseudo-terminal of this size.
    pub fn pty(mut self, size: WinSize) -> Self {
        self.pty = Some(size);
        self.stdin = StdinMode::Stream;
        self
    }
}

/// How far behind the host's wall clock (as a hello carries it) a guest's
/// clock may be before its agent sets it: a few snapshot pauses' worth.
pub const CLOCK_BEHIND_NS: u64 = 50_000_000;

/// What a restored guest takes to differ from the other copies of its
/// snapshot: its hostname, host randomness for its pool, and the clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewIdentity {
    /// The guest's new hostname.
    pub hostname: String,
    /// Host randomness, hex-encoded (16 to 512 bytes); also what tells a
    /// repeat from a new identity.
    pub entropy: String,
    /// The host's wall clock when the hello was sent, Unix nanoseconds.
    pub unix_time_ns: u64,
}

/// A name a guest's programs reach a host-side service by: the agent
/// listens on `addr:port` and carries each connection to the host's vsock
/// port `vsock_port`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Forward {
    /// What /etc/hosts calls `addr`: `[a-z][a-z0-9-]*`, at most 63 bytes.
    pub name: String,
    /// A guest loopback address in 127.0.1.2 to 127.0.1.254.
    pub addr: std::net::Ipv4Addr,
    /// The port listened on there (not 0).
    pub port: u16,
    /// The host's vsock port a connection is carried to (not 0).
    pub vsock_port: u32,
}

/// Messages from the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// First message of every connection.
    Hello {
        /// The client's protocol version.
        version: u32,
        /// A restored guest's new identity, taken before the request is
        /// served (once: a repeat of the one taken is ignored). A claimed
        /// pool member gets it with its first request instead of on a
        /// connection of its own. Only honoured by the guest's PID 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        identity: Option<NewIdentity>,
        /// The host's wall clock as the hello was sent, Unix nanoseconds.
        /// The guest's PID 1 sets its clock to it when it is behind by
        /// more than [`CLOCK_BEHIND_NS`] (a pause stopped its clock),
        /// never back; older agents ignore it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_time_ns: Option<u64>,
    },
    /// Liveness check.
    Ping,
    /// Syncs filesystems and restarts the guest, which ends the VM. Only
    /// honoured when the agent is the guest's PID 1 (never on a host).
    Shutdown,
    /// System information.
    Info,
    /// Runs a process.
    Exec(ExecCall),
    /// Signals a running exec's process group.
    Signal {
        /// The exec.
        exec_id: String,
        /// The signal.
        signal: SignalSpec,
    },
    /// Fetches an exec's result.
    Result {
        /// The exec.
        exec_id: String,
    },
    /// Reads a file, or a byte range of it.
    ReadFile {
        /// Absolute path.
        path: String,
        /// First byte (default 0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
        /// Most bytes to read (default: to the end).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        length: Option<u64>,
    },
    /// Writes a file from the kind-5 frames that follow.
    WriteFile {
        /// Absolute path.
        path: String,
        /// What to do with an existing file.
        mode: WriteMode,
        /// Permission bits for a new file (default 0o644, or those of the file replaced).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        perm: Option<u32>,
    },
    /// Metadata of a path (symlinks are not followed).
    Stat {
        /// Absolute path.
        path: String,
    },
    /// Lists a directory.
    ListDir {
        /// Absolute path.
        path: String,
    },
    /// Creates a directory and its parents.
    Mkdir {
        /// Absolute path.
        path: String,
    },
    /// Removes a file, symlink or directory.
    Remove {
        /// Absolute path.
        path: String,
        /// Remove a directory with its contents.
        #[serde(default)]
        recursive: bool,
    },
    /// Renames a path.
    Rename {
        /// Absolute path.
        from: String,
        /// Absolute path.
        to: String,
    },
    /// Streams a directory as a tar archive.
    TarOut {
        /// Absolute path of a directory.
        path: String,
        /// Stays on the directory's filesystem: the directories other
        /// filesystems are mounted on are archived empty (`/proc`, `/sys`,
        /// `/dev`, `/tmp` when archiving `/`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        one_file_system: bool,
    },
    /// Extracts the tar archive in the kind-5 frames that follow.
    TarIn {
        /// Absolute path of the directory to extract into (created if missing).
        path: String,
        /// Keeps each entry's owner and group as the archive gives them
        /// (as `cp -a` does); else what is extracted belongs to root.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        owners: bool,
    },
    /// Connects to 127.0.0.1:`port` in the guest; after the `ok` answer the
    /// connection carries the TCP stream's bytes both ways, unframed.
    TcpConnect {
        /// The guest port.
        port: u16,
    },
    /// Listens on the guest loopback for each forward and carries each
    /// connection to the host's vsock port of it; the set replaces the one
    /// before (an empty one ends them all; one already listening keeps its
    /// connections), and /etc/hosts names the addresses. Only honoured by
    /// the guest's PID 1 (or an agent on a Unix socket, for tests).
    Forward {
        /// At most [`crate::protocol::MAX_FORWARDS`].
        forwards: Vec<Forward>,
    },
    /// The VM was just restored from a snapshot, possibly as one of several
    /// copies: take `hostname`, mix `entropy` into the kernel's random pool
    /// and reseed it, and set the wall clock. Only honoured by the guest's
    /// PID 1.
    Restored {
        /// The guest's new hostname.
        hostname: String,
        /// Host randomness, hex-encoded (16 to 512 bytes).
        entropy: String,
        /// The host's wall clock, Unix nanoseconds.
        unix_time_ns: u64,
        /// The guest's network now, as `microagent_net=` has it
        /// (`ADDR/PREFIX,GATEWAY,DNS`): a copy may be on another network,
        /// or beside its original on the same one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
        /// The network interface's MAC address now (`02:4d:..`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mac: Option<String>,
    },
    /// Mounts the workspace's named volumes, each the disk whose serial is
    /// given; one already mounted where asked is left alone. Only honoured
    /// by the guest's PID 1.
    MountVolumes {
        /// The volumes, in order.
        volumes: Vec<VolumeToMount>,
    },
    /// Starts a background process (`stdin: "stream"` keeps its stdin a
    /// pipe for `process_stdin`; `output_cap` is the ring size per stream);
    /// answered with `process` at once.
    ProcessStart(ExecCall),
    /// Lists the background processes, oldest first.
    ProcessList,
    /// Output of a background process from byte cursors, waiting up to
    /// `wait_ms` for some when there is none yet.
    ProcessOutput {
        /// The process.
        id: String,
        /// First stdout byte wanted (0: from the start).
        #[serde(default)]
        stdout_cursor: u64,
        /// First stderr byte wanted.
        #[serde(default)]
        stderr_cursor: u64,
        /// Most bytes per stream (default and limit 4 MiB).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_bytes: Option<u64>,
        /// How long to wait for output or the exit (default 0, at most 600 s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// Writes to a background process's stdin, and/or closes it.
    ProcessStdin {
        /// The process.
        id: String,
        /// Base64 of the bytes to write (at most 32 KiB decoded).
        #[serde(default)]
        data: String,
        /// Close stdin after writing.
        #[serde(default)]
        close: bool,
    },
    /// Signals a background process's process group.
    ProcessSignal {
        /// The process.
        id: String,
        /// The signal.
        signal: SignalSpec,
    },
    /// Waits up to `timeout_ms` for a background process to exit; answered
    /// with `process` either way.
    ProcessWait {
        /// The process.
        id: String,
        /// How long to wait (default 0, at most 600 s).
        #[serde(default)]
        timeout_ms: u64,
    },
    /// Forgets a finished background process and its output.
    ProcessRemove {
        /// The process.
        id: String,
    },
    /// Only between the stdin frames of an exec on a pty: the client's
    /// terminal changed size (the process gets SIGWINCH).
    Resize(WinSize),
    /// If the guest has been idle for at least `idle_secs` (no request but
    /// `reclaim` served, no other connection open, no background process
    /// running) and has not been since the last reclaim, drop its page
    /// cache and reclaimable slab, so the memory is freed (and reported to
    /// the host by the balloon). Answered with `reclaimed`.
    Reclaim {
        /// Idle seconds the guest needs first.
        idle_secs: u64,
    },
    /// Starts following changes under `path` (a directory, or a file);
    /// answered with `watch`.
    WatchStart {
        /// The absolute path.
        path: String,
        /// Follow subdirectories too, those made later included.
        #[serde(default)]
        recursive: bool,
    },
    /// A watch's events from `since` on, waiting up to `wait_ms` for one
    /// when there is none yet; answered with `watch_events`.
    WatchEvents {
        /// The watch.
        id: String,
        /// The first event number wanted (0: from the start).
        #[serde(default)]
        since: u64,
        /// How long to wait (default 0, at most 600 s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    /// Ends a watch and forgets its events.
    WatchStop {
        /// The watch.
        id: String,
    },
    /// Lists the watches, oldest first; answered with `watches`.
    WatchList,
}

impl Request {
    /// The `"type"` of this message.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "hello",
            Self::Ping => "ping",
            Self::Shutdown => "shutdown",
            Self::Info => "info",
            Self::Exec(_) => "exec",
            Self::Signal { .. } => "signal",
            Self::Result { .. } => "result",
            Self::ReadFile { .. } => "read_file",
            Self::WriteFile { .. } => "write_file",
            Self::Stat { .. } => "stat",
            Self::ListDir { .. } => "list_dir",
            Self::Mkdir { .. } => "mkdir",
            Self::Remove { .. } => "remove",
            Self::Rename { .. } => "rename",
            Self::TarOut { .. } => "tar_out",
            Self::TarIn { .. } => "tar_in",
            Self::TcpConnect { .. } => "tcp_connect",
            Self::Forward { .. } => "forward",
            Self::Restored { .. } => "restored",
            Self::MountVolumes { .. } => "mount_volumes",
            Self::ProcessStart(_) => "process_start",
            Self::ProcessList => "process_list",
            Self::ProcessOutput { .. } => "process_output",
            Self::ProcessStdin { .. } => "process_stdin",
            Self::ProcessSignal { .. } => "process_signal",
            Self::ProcessWait { .. } => "process_wait",
            Self::ProcessRemove { .. } => "process_remove",
            Self::Resize(_) => "resize",
            Self::Reclaim { .. } => "reclaim",
            Self::WatchStart { .. } => "watch_start",
            Self::WatchEvents { .. } => "watch_events",
            Self::WatchStop { .. } => "watch_stop",
            Self::WatchList => "watch_list",
        }
    }
}
