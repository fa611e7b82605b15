//! A workspace's files through its guest agent (read, write, list, stat,
//! copies in and out), and what it recorded: console logs and events.
//! Commands are in `exec`.

use std::time::Duration;

use guest_agent::client::GuestAgentClient;
use guest_agent::protocol::{self as wire, WriteMode};
use tokio::net::UnixStream;

use crate::error::{Error, Result};
use crate::guest::request::MAX_COLLECTED_BYTES;
use crate::workspaces::handle::Workspace;

use base::store::console_log;
use base::store::events::Event;

/// Longest `events --wait` the library accepts.
pub const MAX_EVENT_WAIT: Duration = Duration::from_secs(600);

/// What [`WorkspaceFiles::read_file`] read.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct FileRead {
    /// The bytes read.
    #[serde(with = "crate::wire_bytes")]
    pub data: Vec<u8>,
    /// The whole file's size.
    pub size: u64,
}

/// How [`WorkspaceFiles::write_file`] writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriteOptions {
    /// Append instead of replacing the file.
    pub append: bool,
    /// Permission bits of a file it creates (default 0644).
    pub perm: Option<u32>,
}

/// What a guest path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (device, fifo, socket).
    Other,
}

impl From<wire::EntryKind> for FileKind {
    fn from(kind: wire::EntryKind) -> Self {
        match kind {
            wire::EntryKind::File => Self::File,
            wire::EntryKind::Dir => Self::Dir,
            wire::EntryKind::Symlink => Self::Symlink,
            wire::EntryKind::Other => Self::Other,
        }
    }
}

/// What [`WorkspaceFiles::stat`] found (symlinks are not followed).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStat {
    /// What the path is.
    pub kind: FileKind,
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

impl From<wire::StatAnswer> for FileStat {
    fn from(s: wire::StatAnswer) -> Self {
        Self {
            kind: s.kind.into(),
            size: s.size,
            mode: s.mode,
            mtime_s: s.mtime_s,
            uid: s.uid,
            gid: s.gid,
        }
    }
}

/// One entry of a guest directory.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirEntry {
    /// File name (non-UTF-8 bytes replaced).
    pub name: String,
    /// What it is (symlinks are not followed).
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
}

impl From<wire::ListedEntry> for DirEntry {
    fn from(e: wire::ListedEntry) -> Self {
        Self {
            name: e.name,
            kind: e.kind.into(),
            size: e.size,
        }
    }
}

/// A guest directory's entries.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DirListing {
    /// The entries.
    pub entries: Vec<DirEntry>,
    /// Whether the list was cut short (too many entries).
    pub truncated: bool,
}

/// New console bytes and where to read next.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct ConsoleChunk {
    /// The bytes (base64 in JSON).
    #[serde(with = "crate::wire_bytes")]
    pub data: Vec<u8>,
    /// The offset to pass next time.
    pub next_offset: u64,
}

impl Workspace<'_> {
    /// A connection to its guest's agent; NOT_RUNNING unless it runs.
    pub(crate) async fn agent(self) -> Result<GuestAgentClient<UnixStream>> {
        let (ws, _) = self.all.awake(self.name.as_str()).await?;
        crate::guest::connect_awake(self.all, self.name.as_str(), &ws).await
    }
}

/// A workspace's files (`dev.files()`): reads, writes, listings, copies
/// in and out and the edits of its guest's files, through its agent.
/// `Copy`; its calls take it by value, as the handle's do.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceFiles<'a> {
    pub(crate) ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's files.
    pub fn files(self) -> WorkspaceFiles<'a> {
        WorkspaceFiles { ws: self }
    }
}

impl WorkspaceFiles<'_> {
    /// Reads `length` bytes from `offset` of a guest file (default: to its
    /// end, at most [`MAX_COLLECTED_BYTES`]; `copy_out` streams larger ones).
    pub async fn read_file(
        self,
        path: &str,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<FileRead> {
        // Into memory: never more than a collector keeps (copy_out streams).
        let asked = length
            .unwrap_or(MAX_COLLECTED_BYTES)
            .min(MAX_COLLECTED_BYTES);
        let length = Some(asked);
        if let Some(remote) = self.ws.remote()? {
            let read: FileRead = remote
                .call(crate::servers::WorkspaceCall::ReadFile {
                    path: path.to_owned(),
                    offset,
                    length,
                })
                .await?;
            // A server's answer is held to what was asked, as an agent's is.
            let (server, got) = (remote.server(), read.data.len());
            crate::servers::check_answer_bytes(server, "read_file", got, asked)?;
            return Ok(read);
        }
        let mut data = Vec::new();
        let header = self
            .ws
            .agent()
            .await?
            .read_file_to(path, offset, length, &mut data)
            .await
            .map_err(Error::agent("read_file"))?;
        Ok(FileRead {
            data,
            size: header.size,
        })
    }

    /// Writes a guest file (replacing it, or appending); bytes written.
    pub async fn write_file(self, path: &str, data: &[u8], options: WriteOptions) -> Result<u64> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::WriteFile {
                    path: path.to_owned(),
                    data: data.to_vec(),
                    append: options.append,
                    perm: options.perm,
                })
                .await?);
        }
        let WriteOptions { append, perm } = options;
        let mode = if append {
            WriteMode::Append
        } else {
            WriteMode::Truncate
        };
        self.ws
            .agent()
            .await?
            .write_file(path, mode, perm, data)
            .await
            .map_err(Error::agent("write_file"))
    }

    /// A guest directory's entries.
    pub async fn list_dir(self, path: &str) -> Result<DirListing> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::ListDir {
                    path: path.to_owned(),
                })
                .await?);
        }
        let (entries, truncated) = self
            .ws
            .agent()
            .await?
            .list_dir(path)
            .await
            .map_err(Error::agent("list_dir"))?;
        Ok(DirListing {
            entries: entries.into_iter().map(DirEntry::from).collect(),
            truncated,
        })
    }

    /// Metadata of a guest path.
    pub async fn stat(self, path: &str) -> Result<FileStat> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::Stat {
                    path: path.to_owned(),
                })
                .await?);
        }
        self.ws
            .agent()
            .await?
            .stat(path)
            .await
            .map(FileStat::from)
            .map_err(Error::agent("stat"))
    }
}

impl Workspace<'_> {
    /// The last `lines` console lines (all when `None`).
    pub fn logs(self, lines: Option<usize>) -> Result<Vec<String>> {
        if let Some(remote) = self.remote()? {
            return Ok(remote.call_blocking(crate::servers::WorkspaceCall::Logs { lines })?);
        }
        let (all, name) = (self.all, self.name.as_str());
        self.get_here()?;
        let ws = all.dir(name)?;
        Ok(console_log::tail_lines(
            ws.path(),
            lines.unwrap_or(usize::MAX),
        )?)
    }

    /// New console bytes from `offset` of the current console file, and the
    /// next offset (for following).
    pub fn logs_from(self, offset: u64) -> Result<ConsoleChunk> {
        if let Some(remote) = self.remote()? {
            let chunk: ConsoleChunk =
                remote.call_blocking(crate::servers::WorkspaceCall::LogsFrom { offset })?;
            // A console file there rotates at the same cap as here.
            let (got, cap) = (chunk.data.len(), console_log::CONSOLE_LOG_CAP);
            crate::servers::check_answer_bytes(remote.server(), "logs_from", got, cap)?;
            return Ok(chunk);
        }
        let (all, name) = (self.all, self.name.as_str());
        let ws = all.dir(name)?;
        ws.read_meta()?;
        let (data, next_offset) = console_log::read_from(ws.path(), offset)?;
        Ok(ConsoleChunk { data, next_offset })
    }

    /// Events after `after`, waiting up to `wait` for one when none are there.
    pub async fn events(self, after: u64, wait: Duration) -> Result<Vec<Event>> {
        if let Some(remote) = self.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::Events {
                    after,
                    wait_ms: crate::servers::millis(wait),
                })
                .await?);
        }
        let (all, name) = (self.all, self.name.as_str());
        if wait > MAX_EVENT_WAIT {
            return Err(Error::InvalidInput(format!(
                "wait is {} s; at most {} s",
                wait.as_secs(),
                MAX_EVENT_WAIT.as_secs()
            )));
        }
        let ws = all.dir(name)?;
        let log = ws.events();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // A VMM that died is recorded (and its event logged) as it is noticed.
            self.get_here()?;
            let events = log.read_after(after)?;
            if !events.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(events);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub(crate) fn check_guest_path(path: &str) -> Result<()> {
    if !path.starts_with('/') {
        return Err(Error::InvalidInput(format!(
            "guest path {path:?} is not absolute; guest paths start with /"
        )));
    }
    Ok(())
}
