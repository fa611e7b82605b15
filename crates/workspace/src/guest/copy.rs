//! Copies between the host and a guest. A copy is decided before a byte
//! moves: what is copied (a file or a directory), where, and what it does
//! to what is there (creates it, replaces a file, merges into a
//! directory). Every front end plans a copy here, so a preview says what
//! the copy will do and the same things are refused everywhere: a copy out
//! onto an existing host path only when the caller asks to overwrite it.
//! Then its bytes move: through the guest's agent, or for a workspace on
//! a server as one workspace call whose bytes follow it (in) or come as
//! frames (out); either way what arrives here is written only through
//! `host_write`'s checks.

use std::path::{Path, PathBuf};

use guest_agent::protocol::WriteMode;
use tokio::net::UnixStream;

use crate::error::{Error, Result};
use crate::guest::files::{check_guest_path, FileKind, FileStat, WorkspaceFiles};
use crate::host::host_write::{self, Budgeted, TempFile};
use crate::servers::{CallFrame, RemoteWorkspace, RunStreams, ServerError, WorkspaceCall};
use crate::workspaces::manager::Workspaces;

/// What a copy moved, and what it left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Copied {
    /// Bytes, or entries for a directory copied in (see
    /// [`CopyPlan::unit`]).
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

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyDirection {
    /// From the host into the guest.
    In,
    /// From the guest to the host.
    Out,
}

/// What a copy moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// One regular file.
    File,
    /// A directory and everything in it.
    Dir,
}

impl CopyKind {
    /// `file` or `dir`.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyKind::File => "file",
            CopyKind::Dir => "dir",
        }
    }
}

/// A copy, checked and described; [`CopyPlan::carry_out`] carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyPlan {
    /// The workspace.
    pub workspace: String,
    /// Which way.
    pub direction: CopyDirection,
    /// The host side.
    pub host_path: PathBuf,
    /// The guest side.
    pub guest_path: String,
    /// What is copied.
    pub kind: CopyKind,
    /// What it does, as a sentence without "would" or "did" ("copy host
    /// file ... to dev:/x, replacing ...").
    pub action: String,
    /// The guest side's metadata, read while planning a copy out (so the
    /// copy does not ask the agent again).
    guest_stat: Option<FileStat>,
    /// A copy out writes git metadata ([`CopyOptions::include_git_metadata`]).
    git_metadata: bool,
}

impl CopyPlan {
    /// What the count [`CopyPlan::carry_out`] returns is in: entries for a
    /// directory copied in, bytes otherwise (a directory copied out counts
    /// its archive's bytes).
    pub fn unit(&self) -> &'static str {
        match (self.direction, self.kind) {
            (CopyDirection::In, CopyKind::Dir) => "entries",
            _ => "bytes",
        }
    }
}

/// How a copy may treat what is already there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyOptions {
    /// A copy out may replace an existing host file or merge into an
    /// existing host directory (default: refused with CONFLICT).
    pub overwrite: bool,
    /// A copy out writes git metadata: paths through a `.git`, whose hooks
    /// and config run code at the host's next `git` command (default: left
    /// out of a directory, refused as a host path with FORBIDDEN).
    pub include_git_metadata: bool,
}

impl CopyOptions {
    /// Sets [`CopyOptions::overwrite`].
    pub fn overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }

    /// Sets [`CopyOptions::include_git_metadata`].
    pub fn include_git_metadata(mut self, include: bool) -> Self {
        self.include_git_metadata = include;
        self
    }
}

/// `n` bytes for people: `12 B`, `2.0 KiB`, `3.5 MiB`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `file`, `dir`, `symlink` or `other`.
pub fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

/// A guest path's metadata for people: `a 12 B file, mode 0644`.
pub fn describe_stat(stat: &FileStat) -> String {
    format!(
        "a {} {}, mode {:04o}",
        human_bytes(stat.size),
        kind_name(stat.kind),
        stat.mode
    )
}

/// Entries (the directory itself included, as a copy in counts them) and
/// file bytes of a host directory (symlinks not followed).
fn tree_size(dir: &Path) -> std::io::Result<(u64, u64)> {
    let (mut entries, mut total) = (1u64, 0u64);
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            entries += 1;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok((entries, total))
}

fn cannot_read(path: &Path, e: &std::io::Error) -> Error {
    Error::InvalidInput(format!("cannot read {}: {e}", path.display()))
}

impl WorkspaceFiles<'_> {
    /// What is at a guest path of a running workspace, if anything.
    pub async fn stat_if_exists(self, path: &str) -> Result<Option<FileStat>> {
        match self.stat(path).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.code() == base::code::ErrorCode::NotFound => {
                // NOT_FOUND is also what a missing workspace gives.
                self.ws.get()?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Plans copying the host file or directory `host_path` to
    /// `guest_path` in this running workspace: a file replaces a guest
    /// file, a directory becomes (or merges into) the guest directory;
    /// anything else there is refused.
    pub async fn plan_copy_in(self, host_path: &Path, guest_path: &str) -> Result<CopyPlan> {
        let name = self.ws.name.as_str();
        let meta = std::fs::metadata(host_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::InvalidInput(format!(
                "{} does not exist on the host",
                host_path.display()
            )),
            _ => cannot_read(host_path, &e),
        })?;
        check_guest_path(guest_path)?;
        let kind = if meta.is_dir() {
            CopyKind::Dir
        } else {
            CopyKind::File
        };
        let target = self.stat_if_exists(guest_path).await?;
        let source = match kind {
            CopyKind::Dir => {
                let (entries, total) =
                    tree_size(host_path).map_err(|e| cannot_read(host_path, &e))?;
                format!(
                    "host directory {} ({entries} entries, {} of files)",
                    host_path.display(),
                    human_bytes(total)
                )
            }
            CopyKind::File => format!(
                "host file {} ({})",
                host_path.display(),
                human_bytes(meta.len())
            ),
        };
        let effect = match (&target, kind) {
            (None, _) => "creating it".to_owned(),
            (Some(s), CopyKind::Dir) if s.kind == FileKind::Dir => {
                "merging into the existing directory".into()
            }
            (Some(s), CopyKind::File) if s.kind == FileKind::File => {
                format!("replacing {}", describe_stat(s))
            }
            (Some(s), _) => {
                return Err(Error::InvalidInput(format!(
                    "guest path {guest_path} is {}; a {} cannot be copied over it",
                    describe_stat(s),
                    kind.as_str()
                )))
            }
        };
        Ok(CopyPlan {
            action: format!("copy {source} to {name}:{guest_path}, {effect}"),
            workspace: name.to_owned(),
            direction: CopyDirection::In,
            host_path: host_path.to_owned(),
            guest_path: guest_path.to_owned(),
            kind,
            guest_stat: None,
            git_metadata: false,
        })
    }

    /// Plans copying the guest file or directory `guest_path` of the
    /// running workspace to `host_path`: an existing host path is
    /// refused (CONFLICT) unless `options` allow overwriting it, and then
    /// only a file over a file or a directory into a directory.
    pub async fn plan_copy_out(
        self,
        guest_path: &str,
        host_path: &Path,
        options: CopyOptions,
    ) -> Result<CopyPlan> {
        let name = self.ws.name.as_str();
        check_guest_path(guest_path)?;
        check_git_host_path(host_path, options.include_git_metadata)?;
        let stat = self.stat(guest_path).await?;
        let kind = match stat.kind {
            FileKind::File => CopyKind::File,
            FileKind::Dir => CopyKind::Dir,
            other => {
                return Err(Error::InvalidInput(format!(
                    "{guest_path} is a {}; only files and directories can be copied",
                    kind_name(other)
                )))
            }
        };
        match host_path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() && !parent.is_dir() => {
                return Err(Error::InvalidInput(format!(
                    "host directory {} does not exist",
                    parent.display()
                )))
            }
            _ => {}
        }
        let effect = match std::fs::symlink_metadata(host_path).ok() {
            None => "creating it".to_owned(),
            Some(_) if !options.overwrite => {
                return Err(Error::HostPathExists {
                    path: host_path.to_owned(),
                })
            }
            Some(m) if m.is_dir() && kind == CopyKind::Dir => {
                "merging into the existing directory".into()
            }
            Some(m) if m.is_file() && kind == CopyKind::File => {
                format!("replacing a host file of {}", human_bytes(m.len()))
            }
            Some(_) => {
                return Err(Error::InvalidInput(format!(
                    "host path {} exists and is not a {}; name another path",
                    host_path.display(),
                    kind.as_str()
                )))
            }
        };
        let git = match kind {
            CopyKind::Dir if !options.include_git_metadata => ", leaving out git metadata",
            _ => "",
        };
        Ok(CopyPlan {
            action: format!(
                "copy guest {} {name}:{guest_path} ({}) to host {}, {effect}{git}",
                kind.as_str(),
                human_bytes(stat.size),
                host_path.display()
            ),
            workspace: name.to_owned(),
            direction: CopyDirection::Out,
            host_path: host_path.to_owned(),
            guest_path: guest_path.to_owned(),
            kind,
            guest_stat: Some(stat),
            git_metadata: options.include_git_metadata,
        })
    }
}

/// What a copy out sent: its bytes, and a file's permission bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct CopySent {
    /// Bytes sent: a file's, or a directory's archive's.
    pub bytes: u64,
    /// A file's permission bits (0 for a directory).
    pub mode: u32,
}

impl CopyPlan {
    /// Carries it out on the workspaces `all` sees: the count
    /// [`CopyPlan::unit`] names, and what was left out.
    pub async fn carry_out(&self, all: &Workspaces) -> Result<Copied> {
        let plan = self;
        // Access is checked again: a plan is the caller's to change.
        let ws = all.workspace(&plan.workspace)?;
        match (plan.direction, &plan.guest_stat) {
            (CopyDirection::In, _) => ws
                .files()
                .copy_in(&plan.host_path, &plan.guest_path)
                .await
                .map(Copied::just),
            (CopyDirection::Out, Some(stat)) => {
                ws.files()
                    .copy_out_of(&plan.guest_path, stat, &plan.host_path, plan.git_metadata)
                    .await
            }
            (CopyDirection::Out, None) => {
                ws.files().copy_out(&plan.guest_path, &plan.host_path).await
            }
        }
    }
}

impl WorkspaceFiles<'_> {
    /// Copies a host file or directory to `guest_path` (a directory is
    /// copied as `guest_path` itself, created if missing). Returns bytes
    /// (file) or entries (directory) copied.
    pub async fn copy_in(self, host_path: &Path, guest_path: &str) -> Result<u64> {
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
            return self.stream_dir_in(host_path, guest_path, false).await;
        }
        let file = tokio::fs::File::open(host_path)
            .await
            .map_err(Error::host_io(format!("opening {}", host_path.display())))?;
        use std::os::unix::fs::PermissionsExt;
        use tokio::io::AsyncReadExt;
        let perm = meta.permissions().mode() & 0o7777;
        let into = CopyInto {
            guest_path,
            dir: false,
            perm: Some(perm),
            owners: false,
            bytes: Some(meta.len()),
        };
        // As long as it was: a server tells a cut from the end by it.
        self.copy_in_from(into, file.take(meta.len())).await
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
        self.stream_dir_in(host_dir, guest_path, true).await
    }

    /// Copies a guest file or directory to `host_path` (a directory becomes
    /// `host_path` itself, merged into when it exists). Returns the bytes
    /// received. What the guest sends is checked and bounded
    /// ([`crate::host::host_write`]): nothing is written outside `host_path` or
    /// through a symlink, and a failed copy leaves no partial file. Git
    /// metadata is left out (see [`Copied::left_out`]); a planned copy
    /// ([`WorkspaceFiles::plan_copy_out`]) can ask for it.
    pub async fn copy_out(self, guest_path: &str, host_path: &Path) -> Result<Copied> {
        check_guest_path(guest_path)?;
        let stat = self.stat(guest_path).await?;
        self.copy_out_of(guest_path, &stat, host_path, false).await
    }

    /// The bytes of a copy in (a file's, or a directory's tar archive)
    /// from `reader` into the guest: here through its agent, or on the
    /// workspace's server. Returns what the agent counted.
    async fn copy_in_from<R>(self, into: CopyInto<'_>, mut reader: R) -> Result<u64>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
    {
        if let Some(remote) = self.ws.remote()? {
            let call = WorkspaceCall::CopyIn {
                guest_path: into.guest_path.to_owned(),
                dir: into.dir,
                perm: into.perm,
                owners: into.owners,
                bytes: into.bytes,
            };
            let streams = RunStreams {
                then_input: Some(Box::new(reader)),
                ..Default::default()
            };
            return Ok(remote.call_streaming(call, streams).await?);
        }
        self.receive(into, &mut reader).await
    }

    /// The server's side of a copy in ([`WorkspaceCall::CopyIn`]): what
    /// follows the call, into this guest.
    pub(crate) async fn receive<R>(self, into: CopyInto<'_>, reader: &mut R) -> Result<u64>
    where
        R: tokio::io::AsyncRead + Unpin + ?Sized,
    {
        check_guest_path(into.guest_path)?;
        let agent = self.ws.agent().await?;
        match into.dir {
            true => agent
                .tar_in_with(into.guest_path, into.owners, reader)
                .await
                .map_err(Error::agent("tar_in")),
            false => agent
                .write_file_from(into.guest_path, WriteMode::Truncate, into.perm, reader)
                .await
                .map_err(Error::agent("write_file")),
        }
    }

    /// [`Self::copy_out`] of a guest path whose `stat` the caller already
    /// has (a planned copy does not ask again), writing git metadata only
    /// when `git_metadata`.
    pub(crate) async fn copy_out_of(
        self,
        guest_path: &str,
        stat: &FileStat,
        host_path: &Path,
        git_metadata: bool,
    ) -> Result<Copied> {
        check_git_host_path(host_path, git_metadata)?;
        let limits = self.ws.all.limits();
        let budget = match stat.kind {
            FileKind::Dir => {
                if std::fs::symlink_metadata(host_path).is_ok_and(|m| !m.is_dir()) {
                    return Err(Error::InvalidInput(format!(
                        "{} exists and is not a directory",
                        host_path.display()
                    )));
                }
                std::fs::create_dir_all(host_path)
                    .map_err(Error::host_io(format!("creating {}", host_path.display())))?;
                limits.max_copy_out_bytes
            }
            FileKind::File => file_budget(stat.size, limits),
            other => {
                return Err(Error::InvalidInput(format!(
                    "{guest_path} is a {other:?}; only files and directories can be copied"
                )))
            }
        };
        let dir = stat.kind == FileKind::Dir;
        // Streamed to a file beside the target, not to memory: a failed
        // copy never leaves a partial file under the name.
        let mut tmp = TempFile::beside(host_path)?;
        let sent = match self.ws.remote()? {
            Some(remote) => fetch(&remote, guest_path, dir, budget, tmp.file()).await?,
            None => {
                let mut writer = tmp.budgeted_writer(budget)?;
                self.send(guest_path, dir, &mut writer).await?
            }
        };
        if !dir {
            tmp.persist(sent.mode, host_path)?;
            return Ok(Copied::just(sent.bytes));
        }
        tmp.unlink()?;
        let archive = tmp.file();
        std::io::Seek::rewind(archive)
            .map_err(Error::host_io("rewinding the archive".to_owned()))?;
        let reader = std::io::BufReader::new(&*archive);
        let rules = host_write::UnpackRules {
            max_entries: limits.max_copy_out_entries,
            git_metadata,
        };
        let unpacked = host_write::unpack(reader, host_path, rules)?;
        Ok(Copied {
            count: sent.bytes,
            left_out: unpacked.left_out,
            left_out_entries: unpacked.left_out_entries,
        })
    }

    /// A guest file's bytes, or with `dir` a directory's tar archive, from
    /// this guest's agent into `out` (which bounds them): a copy out here,
    /// and the server's side of one ([`WorkspaceCall::CopyOut`]).
    pub(crate) async fn send<W>(
        self,
        guest_path: &str,
        dir: bool,
        out: &mut Budgeted<W>,
    ) -> Result<CopySent>
    where
        W: tokio::io::AsyncWrite + Unpin,
    {
        check_guest_path(guest_path)?;
        let agent = self.ws.agent().await?;
        let got = match dir {
            true => agent
                .tar_out_to(guest_path, out)
                .await
                .map(|bytes| CopySent { bytes, mode: 0 }),
            false => agent
                .read_file_to(guest_path, None, None, out)
                .await
                .map(|h| CopySent {
                    bytes: h.transferred,
                    mode: h.mode,
                }),
        };
        match got {
            Ok(sent) => Ok(sent),
            Err(_) if out.exhausted() => Err(out.over().into()),
            Err(e) => Err(Error::agent(if dir { "tar_out" } else { "read_file" })(e)),
        }
    }

    /// Sends the host directory `dir` into the guest as a tar archive
    /// streamed while it is made (a thread writes it into a socket pair the
    /// upload reads), so a large tree never sits in memory. A host-side
    /// failure is reported before the guest's.
    async fn stream_dir_in(self, dir: &Path, guest_path: &str, owners: bool) -> Result<u64> {
        let pair = || -> std::io::Result<_> {
            let (writer, reader) = std::os::unix::net::UnixStream::pair()?;
            reader.set_nonblocking(true)?;
            Ok((writer, UnixStream::from_std(reader)?))
        };
        let (writer, reader) = pair().map_err(Error::host_io(
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
        let into = CopyInto {
            guest_path,
            dir: true,
            perm: None,
            owners,
            bytes: None,
        };
        // The reader goes with the call: when the guest stops reading, the
        // archiver sees a closed socket.
        let sent = self.copy_in_from(into, reader).await;
        let archived = archiving
            .await
            .map_err(|e| Error::BlockingStep(e.to_string()))?;
        archived.map_err(Error::host_io(format!("archiving {}", dir.display())))?;
        sent
    }
}

/// Where a copy in goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyInto<'a> {
    /// The guest path.
    pub guest_path: &'a str,
    /// A directory's tar archive, not a file's bytes.
    pub dir: bool,
    /// A file's permission bits.
    pub perm: Option<u32>,
    /// A directory's entries keep their archived owners.
    pub owners: bool,
    /// A file's length: its bytes end there, and an input that ends
    /// before is cut (the guest file stays as it was).
    pub bytes: Option<u64>,
}

/// Most bytes a copy out of a guest file takes: the size the guest
/// reported, with room for a file that grows while it is copied, within
/// `limits`' copy-out bound.
pub(super) fn file_budget(reported: u64, limits: &base::store::spec::Limits) -> u64 {
    reported
        .saturating_add(host_write::COPY_OUT_GROWTH)
        .min(limits.max_copy_out_bytes)
}

/// A copy out of a workspace on a server: its frames into `file`, at most
/// `budget` bytes, whatever the server sends (more, or other frames, end
/// the call).
pub(super) async fn fetch(
    remote: &RemoteWorkspace,
    guest_path: &str,
    dir: bool,
    budget: u64,
    file: &mut std::fs::File,
) -> Result<CopySent> {
    use std::io::Write;
    let (mut written, mut over, mut failed) = (0u64, false, None);
    let mut on_frame = |frame: CallFrame| {
        // An empty frame moves nothing: a server sending them could hold
        // the call to its deadline without a byte, so it ends the call.
        let CallFrame::Copy { data } = frame else {
            return false;
        };
        if data.is_empty() {
            return false;
        }
        let total = written.saturating_add(data.len() as u64);
        if total > budget {
            over = true;
            return false;
        }
        if let Err(e) = file.write_all(&data) {
            failed = Some(e);
            return false;
        }
        written = total;
        true
    };
    let call = WorkspaceCall::CopyOut {
        guest_path: guest_path.to_owned(),
        dir,
        max_bytes: budget,
    };
    let streams = RunStreams {
        on_frame: Some(&mut on_frame),
        ..Default::default()
    };
    let answer = remote.call_streaming::<CopySent>(call, streams).await;
    if over {
        return Err(host_write::HostWriteError::OverBudget {
            what: "bytes",
            limit: budget,
        }
        .into());
    }
    if let Some(e) = failed {
        return Err(Error::host_io("writing the copy".to_owned())(e));
    }
    let sent = answer?;
    if sent.bytes != written {
        return Err(ServerError::Garbled {
            server: remote.server().to_owned(),
            detail: format!("its copy out says {} bytes; {written} came", sent.bytes),
        }
        .into());
    }
    Ok(sent)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(2048), "2.0 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn a_directory_copied_in_counts_entries() {
        let plan = |direction, kind| CopyPlan {
            workspace: "dev".into(),
            direction,
            host_path: "/tmp/x".into(),
            guest_path: "/x".into(),
            kind,
            action: String::new(),
            guest_stat: None,
            git_metadata: false,
        };
        assert_eq!(plan(CopyDirection::In, CopyKind::Dir).unit(), "entries");
        assert_eq!(plan(CopyDirection::In, CopyKind::File).unit(), "bytes");
        assert_eq!(plan(CopyDirection::Out, CopyKind::Dir).unit(), "bytes");
    }

    #[test]
    fn a_host_directory_counts_its_entries_and_file_bytes() {
        let dir =
            std::env::temp_dir().join(format!("ma-tree-{}", base::host::settings::unique_id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a"), b"12345").unwrap();
        std::fs::write(dir.join("sub/b"), b"123").unwrap();
        // The directory itself, a, sub, sub/b.
        assert_eq!(tree_size(&dir).unwrap(), (4, 8));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
