//! Messages from the agent.

use serde::{Deserialize, Serialize};

use super::process::{OutputAnswer, ProcessEntry};
use super::watch::{WatchBatch, WatchEntry};
use super::AgentErrorCode;

/// How an exec ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecExit {
    /// The exec.
    pub exec_id: String,
    /// Exit code, if the process exited.
    pub code: Option<i32>,
    /// Signal number, if a signal killed the process.
    pub signal: Option<i32>,
    /// The exec's timeout was exceeded and its process group killed.
    pub timed_out: bool,
    /// Milliseconds from spawn to the end.
    pub wall_ms: u64,
    /// Bytes the process wrote to stdout.
    pub stdout_bytes: u64,
    /// Bytes the process wrote to stderr.
    pub stderr_bytes: u64,
    /// Stdout bytes past the output cap (counted, not sent).
    pub stdout_dropped: u64,
    /// Stderr bytes past the output cap (counted, not sent).
    pub stderr_dropped: u64,
    /// Base64 of the first 64 KiB of stdout (in `result` answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_head: Option<String>,
    /// Base64 of the first 64 KiB of stderr (in `result` answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_head: Option<String>,
}

impl ExecExit {
    /// True when the process exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// The decoded `stdout_head`.
    pub fn stdout_head_bytes(&self) -> Option<Vec<u8>> {
        decode_head(self.stdout_head.as_deref())
    }

    /// The decoded `stderr_head`.
    pub fn stderr_head_bytes(&self) -> Option<Vec<u8>> {
        decode_head(self.stderr_head.as_deref())
    }
}

fn decode_head(head: Option<&str>) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(head?).ok()
}

/// Usage of one mounted filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// Mount point.
    pub mount: String,
    /// Size in bytes.
    pub total_bytes: u64,
    /// Bytes available to unprivileged users.
    pub avail_bytes: u64,
}

/// The `info` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemInfo {
    /// `uname -a` style: sysname, nodename, release, version, machine.
    pub kernel: String,
    /// Host name.
    pub hostname: String,
    /// Seconds since the guest booted.
    pub uptime_s: u64,
    /// MemTotal of /proc/meminfo.
    pub mem_total_kib: u64,
    /// MemAvailable of /proc/meminfo.
    pub mem_available_kib: u64,
    /// 1, 5 and 15 minute load averages.
    pub load: [f64; 3],
    /// `/` and other block-device, overlay, virtiofs and 9p mounts.
    pub disks: Vec<DiskUsage>,
    /// Online CPUs.
    #[serde(default)]
    pub cpus: u32,
    /// CPU time since boot over all CPUs, from /proc/stat (two answers a
    /// moment apart give the usage in between).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ticks: Option<CpuTicks>,
    /// Bytes and packets through the network interfaces (loopback not
    /// counted), from /proc/net/dev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetCounters>,
}

/// Cumulative CPU time in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuTicks {
    /// Ticks not idle and not waiting for I/O.
    pub busy: u64,
    /// All ticks.
    pub total: u64,
}

/// Cumulative network counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetCounters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Packets sent.
    pub tx_packets: u64,
}

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (device, fifo, socket).
    Other,
}

/// The `stat` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatAnswer {
    /// What the path is.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime_s: i64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// One `list_dir` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedEntry {
    /// File name (non-UTF-8 bytes replaced).
    pub name: String,
    /// What it is (symlinks are not followed).
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
}

/// What a `reclaim` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimAnswer {
    /// Whether the caches were dropped (false: not idle long enough, busy,
    /// or already dropped since the last request).
    pub dropped: bool,
    /// Seconds since the last request other than `reclaim`.
    pub idle_secs: u64,
    /// MemFree before, KiB.
    pub free_kib_before: u64,
    /// MemFree after, KiB (the same as before when nothing was dropped).
    pub free_kib_after: u64,
    /// Whether the guest is in use now: a process started through the
    /// agent running, a TCP connection open beyond its loopback, or its
    /// programs using the CPU since the last look (the host pauses only an
    /// idle guest; an agent before this field says nothing and is taken as
    /// busy). Connections from the host are the host's to count: it sees
    /// them close at once, where a slow guest notices late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy: Option<bool>,
    /// The first of those found, when busy (for the host's log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_because: Option<InUse>,
}

/// What keeps a guest in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InUse {
    /// A process started through the agent still runs.
    Process,
    /// A TCP connection beyond the guest's loopback is open.
    Network,
    /// The guest's programs used over 2% of a CPU since the last look.
    Cpu,
    /// A reason a newer agent gives.
    #[serde(other)]
    Other,
}

/// Messages from the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// Answer to the client's `hello`.
    Hello {
        /// The agent's protocol version.
        version: u32,
        /// Agent name and version, e.g. `microagent-agent 0.1.0`.
        agent: String,
        /// Operations supported.
        capabilities: Vec<String>,
    },
    /// Answer to `ping`.
    Pong {
        /// Milliseconds since the agent started.
        uptime_ms: u64,
    },
    /// Answer to `info`.
    Info(SystemInfo),
    /// Answer to `reclaim`.
    Reclaimed(ReclaimAnswer),
    /// Answer to `watch_start`.
    Watch(WatchEntry),
    /// Answer to `watch_events`.
    WatchEvents(WatchBatch),
    /// Answer to `watch_list`.
    Watches {
        /// Oldest first.
        watches: Vec<WatchEntry>,
    },
    /// The exec's process was spawned.
    Started {
        /// The exec.
        exec_id: String,
        /// Its process id (also its process group id).
        pid: u32,
    },
    /// The exec ended.
    Exited(ExecExit),
    /// Answer to `result` while the exec runs.
    Running {
        /// The exec.
        exec_id: String,
        /// Its process id.
        pid: u32,
    },
    /// Success.
    Ok {
        /// Bytes written (`write_file`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
        /// Entries extracted (`tar_in`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entries: Option<u64>,
    },
    /// Header of a `read_file` stream.
    File {
        /// The file's size.
        size: u64,
        /// Its permission bits.
        mode: u32,
    },
    /// Answer to `stat`.
    Stat(StatAnswer),
    /// Answer to `list_dir`.
    Entries {
        /// Sorted by name.
        entries: Vec<ListedEntry>,
        /// More than 10,000 entries existed.
        truncated: bool,
    },
    /// A background process (`process_start`, `process_wait`).
    Process(ProcessEntry),
    /// Answer to `process_list`.
    Processes {
        /// Oldest first.
        processes: Vec<ProcessEntry>,
    },
    /// Answer to `process_output`.
    ProcessOutput(OutputAnswer),
    /// The request failed.
    Error {
        /// Why.
        code: AgentErrorCode,
        /// Details for a person.
        message: String,
    },
}

impl Response {
    /// A plain `ok`.
    pub fn ok() -> Self {
        Self::Ok {
            bytes: None,
            entries: None,
        }
    }

    /// The `"type"` of this message.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "hello",
            Self::Pong { .. } => "pong",
            Self::Info(_) => "info",
            Self::Reclaimed(_) => "reclaimed",
            Self::Watch(_) => "watch",
            Self::WatchEvents(_) => "watch_events",
            Self::Watches { .. } => "watches",
            Self::Started { .. } => "started",
            Self::Exited(_) => "exited",
            Self::Running { .. } => "running",
            Self::Ok { .. } => "ok",
            Self::File { .. } => "file",
            Self::Stat(_) => "stat",
            Self::Entries { .. } => "entries",
            Self::Process(_) => "process",
            Self::Processes { .. } => "processes",
            Self::ProcessOutput(_) => "process_output",
            Self::Error { .. } => "error",
        }
    }
}
