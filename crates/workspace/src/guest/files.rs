//! A workspace's files through its guest agent (read, write, list, stat,
//! copies in and out), and what it recorded: console logs and events.
//! Commands are in `exec`.

use std::path::Path;
use std::time::Duration;

use guest_agent::client::GuestAgentClient;
use guest_agent::protocol::{self as wire, WriteMode};
use tokio::net::UnixStream;

use crate::error::{Error, Result};
use crate::guest::exec::MAX_COLLECTED_BYTES;
use crate::host::host_write::{self, TempFile};
use crate::store::console_log;
use crate::store::events::Event;
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::Workspaces;

/// What a copy moved, and what it left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Copied {
    /// Bytes, or entries for a directory copied in (see
    /// [`crate::guest::copy_plan::CopyPlan::unit`]).
    pub count: u64,
    /// Git metadata a copy out did not write (the `.git` paths, relative to
    /// the destination, at most [`host_write::LEFT_OUT_SHOWN`]).
    pub left_out: Vec<String>,
    /// How many archive entries those paths held.
    pub left_out_entries: u64,
}

impl Copied {
    pub(crate) fn just(count: u64) -> Self {
        Self {
            count,
            ..Self::default()
        }
    }
}

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

impl Workspaces {
    pub(crate) async fn agent(&self, name: &str) -> Result<GuestAgentClient<UnixStream>> {
        let (ws, _) = self.running(name)?;
        ws.connect_agent().await.map_err(Error::agent("connect"))
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
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let mut data = Vec::new();
        let header = all
            .agent(name)
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
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let WriteOptions { append, perm } = options;
        let mode = if append {
            WriteMode::Append
        } else {
            WriteMode::Truncate
        };
        all.agent(name)
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
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let (entries, truncated) = all
            .agent(name)
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
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        all.agent(name)
            .await?
            .stat(path)
            .await
            .map(FileStat::from)
            .map_err(Error::agent("stat"))
    }

    /// Copies a host file or directory to `guest_path` (a directory is
    /// copied as `guest_path` itself, created if missing). Returns bytes
    /// (file) or entries (directory) copied.
    pub async fn copy_in(self, host_path: &Path, guest_path: &str) -> Result<u64> {
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let meta = std::fs::metadata(host_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::InvalidInput(format!(
                "{} does not exist on the host",
                host_path.display()
            )),
            _ => Error::HostIo {
                what: format!("reading {}", host_path.display()),
                source: e,
            },
        })?;
        check_guest_path(guest_path)?;
        if meta.is_dir() {
            let agent = all.agent(name).await?;
            stream_dir_in(host_path, guest_path, false, agent).await
        } else {
            let mut file = tokio::fs::File::open(host_path)
                .await
                .map_err(Error::host_io(format!("opening {}", host_path.display())))?;
            use std::os::unix::fs::PermissionsExt;
            let perm = meta.permissions().mode() & 0o7777;
            all.agent(name)
                .await?
                .write_file_from(guest_path, WriteMode::Truncate, Some(perm), &mut file)
                .await
                .map_err(Error::agent("write_file"))
        }
    }

    /// Copies the host directory `host_dir` to `guest_path` as
    /// [`Self::copy_in`] does, keeping every entry's owner and group (as
    /// `cp -a` does; `copy_in` makes them root's): for a tree that is a
    /// whole root filesystem. Returns the entries copied.
    pub async fn copy_in_archive(self, host_dir: &Path, guest_path: &str) -> Result<u64> {
        check_guest_path(guest_path)?;
        if !host_dir.is_dir() {
            return Err(Error::InvalidInput(format!(
                "{} is not a directory on the host",
                host_dir.display()
            )));
        }
        let agent = self.ws.all.agent(self.ws.name.as_str()).await?;
        stream_dir_in(host_dir, guest_path, true, agent).await
    }

    /// Copies a guest file or directory to `host_path` (a directory becomes
    /// `host_path` itself, merged into when it exists). Returns the bytes
    /// received. What the guest sends is checked and bounded
    /// ([`crate::host::host_write`]): nothing is written outside `host_path` or
    /// through a symlink, and a failed copy leaves no partial file. Git
    /// metadata is left out (see [`Copied::left_out`]); a planned copy
    /// ([`WorkspaceFiles::plan_copy_out`]) can ask for it.
    pub async fn copy_out(self, guest_path: &str, host_path: &Path) -> Result<Copied> {
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        check_guest_path(guest_path)?;
        let stat = self.stat(guest_path).await?;
        all.copy_out_of(name, guest_path, &stat, host_path, false)
            .await
    }
}

/// Refuses a host path through a `.git` unless git metadata was asked for.
pub(crate) fn check_git_host_path(host_path: &Path, git_metadata: bool) -> Result<()> {
    if !git_metadata && host_path.iter().any(host_write::is_git_metadata) {
        return Err(Error::GitMetadataRefused {
            path: host_path.to_owned(),
        });
    }
    Ok(())
}

impl Workspaces {
    /// [`WorkspaceFiles::copy_out`] of a guest path whose `stat` the caller
    /// already has (a planned copy does not ask the agent twice), writing
    /// git metadata only when `git_metadata`.
    pub(crate) async fn copy_out_of(
        &self,
        name: &str,
        guest_path: &str,
        stat: &FileStat,
        host_path: &Path,
        git_metadata: bool,
    ) -> Result<Copied> {
        check_git_host_path(host_path, git_metadata)?;
        match stat.kind {
            FileKind::Dir => {
                if std::fs::symlink_metadata(host_path).is_ok_and(|m| !m.is_dir()) {
                    return Err(Error::InvalidInput(format!(
                        "{} exists and is not a directory",
                        host_path.display()
                    )));
                }
                std::fs::create_dir_all(host_path)
                    .map_err(Error::host_io(format!("creating {}", host_path.display())))?;
                // Streamed to disk, not memory, within the byte budget.
                let mut tmp = TempFile::beside(host_path)?;
                let mut budgeted = tmp.budgeted_writer(self.limits().max_copy_out_bytes)?;
                let got = self
                    .agent(name)
                    .await?
                    .tar_out_to(guest_path, &mut budgeted)
                    .await;
                let size = match got {
                    Ok(size) => size,
                    Err(_) if budgeted.exhausted() => return Err(budgeted.over().into()),
                    Err(e) => return Err(Error::agent("tar_out")(e)),
                };
                tmp.unlink()?;
                let archive = tmp.file();
                std::io::Seek::rewind(archive)
                    .map_err(Error::host_io("rewinding the archive".to_owned()))?;
                let reader = std::io::BufReader::new(&*archive);
                let rules = host_write::UnpackRules {
                    max_entries: self.limits().max_copy_out_entries,
                    git_metadata,
                };
                let unpacked = host_write::unpack(reader, host_path, rules)?;
                Ok(Copied {
                    count: size,
                    left_out: unpacked.left_out,
                    left_out_entries: unpacked.left_out_entries,
                })
            }
            FileKind::File => {
                // Written beside the target and renamed, so a failed copy
                // never leaves a partial file under the name.
                let tmp = TempFile::beside(host_path)?;
                // The size the guest reported, with room for a file that
                // grows while it is copied.
                let budget = stat
                    .size
                    .saturating_add(host_write::COPY_OUT_GROWTH)
                    .min(self.limits().max_copy_out_bytes);
                let mut budgeted = tmp.budgeted_writer(budget)?;
                let got = self
                    .agent(name)
                    .await?
                    .read_file_to(guest_path, None, None, &mut budgeted)
                    .await;
                let header = match got {
                    Ok(h) => h,
                    Err(_) if budgeted.exhausted() => return Err(budgeted.over().into()),
                    Err(e) => return Err(Error::agent("read_file")(e)),
                };
                tmp.persist(header.mode, host_path)?;
                Ok(Copied::just(header.transferred))
            }
            other => Err(Error::InvalidInput(format!(
                "{guest_path} is a {other:?}; only files and directories can be copied"
            ))),
        }
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

/// Sends the host directory `dir` to the agent as a tar archive streamed
/// while it is made (a thread writes it into a socket pair the upload
/// reads), so a large tree never sits in memory. A host-side failure is
/// reported before the agent's.
async fn stream_dir_in(
    dir: &Path,
    guest_path: &str,
    owners: bool,
    agent: GuestAgentClient<UnixStream>,
) -> Result<u64> {
    let pair = || -> std::io::Result<_> {
        let (writer, reader) = std::os::unix::net::UnixStream::pair()?;
        reader.set_nonblocking(true)?;
        Ok((writer, UnixStream::from_std(reader)?))
    };
    let (writer, mut reader) = pair().map_err(Error::host_io(
        "making the archive's socket pair".to_owned(),
    ))?;
    let source = dir.to_owned();
    let archiving = tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(std::io::BufWriter::new(writer));
        builder.follow_symlinks(false);
        builder
            .append_dir_all(".", &source)
            .and_then(|()| builder.into_inner())
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .map(drop)
    });
    let sent = agent.tar_in_with(guest_path, owners, &mut reader).await;
    // The archiver sees a closed socket if the agent stopped reading.
    drop(reader);
    let archived = archiving
        .await
        .map_err(|e| Error::BlockingStep(e.to_string()))?;
    archived.map_err(Error::host_io(format!("archiving {}", dir.display())))?;
    sent.map_err(Error::agent("tar_in"))
}
