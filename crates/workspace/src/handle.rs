//! [`Workspace`]: one workspace of a [`Workspaces`], its name checked once:
//! everything about one workspace (life cycle, exec, files, processes,
//! snapshots of it, forks, ports, TTL) is a call on it, and the collection
//! keeps the collection's calls (create, list, images, networks, host).
//! It is `Copy`, and its calls take it by value, so a future it returns
//! does not borrow a temporary.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use crate::error::Result;
use crate::guest::code::{CodeScript, Language};
use crate::guest::copy_plan::{CopyOptions, CopyPlan};
use crate::guest::exec::{ExecEnd, ExecRequest, ExecResult, Exited};
use crate::guest::files::{ConsoleChunk, DirListing, FileRead, WriteOptions};
use crate::guest::processes::{ProcessInfo, ProcessOptions, ProcessOutput};
use crate::guest::{ExecEvent, FileStat};
use crate::snapshots::SnapshotInfo;
use crate::store::events::Event;
use crate::store::name::validate_name;
use crate::store::ports::PortMapping;
use crate::store::spec::{DeleteOptions, Meta};
use crate::workspaces::lifecycle::StartProgress;
use crate::workspaces::manager::{WorkspaceInfo, Workspaces};
use crate::ExecInput;

/// One workspace, by a name that passed the name rules. It may not exist
/// (yet): each call reports `NOT_FOUND` then, as the `Workspaces` call does.
#[derive(Clone, Copy, Debug)]
pub struct Workspace<'a> {
    all: &'a Workspaces,
    name: &'a str,
}

impl Workspaces {
    /// The workspace called `name`, after checking the name rules (not
    /// whether it exists).
    ///
    /// ```no_run
    /// # async fn demo() -> workspace::Result<()> {
    /// let all = workspace::Workspaces::from_env()?;
    /// let dev = all.workspace("dev")?;
    /// let out = dev
    ///     .exec_collect(workspace::ExecRequest::argv(["uname", "-a"]), workspace::ExecInput::None)
    ///     .await?;
    /// print!("{}", out.stdout);
    /// # Ok(())
    /// # }
    /// ```
    pub fn workspace<'a>(&'a self, name: &'a str) -> Result<Workspace<'a>> {
        validate_name(name).map_err(crate::store::StoreError::Name)?;
        Ok(Workspace { all: self, name })
    }
}

impl<'a> Workspace<'a> {
    /// Its name.
    pub fn name(self) -> &'a str {
        self.name
    }

    /// Writes `code` to a private script in this running workspace
    /// once its image is found to have `language`'s interpreter (else
    /// [`Error::InterpreterMissing`]). Run it with [`CodeScript::request`],
    /// then [`Workspaces::remove_code_script`].
    pub async fn write_code_script(self, language: Language, code: &str) -> Result<CodeScript> {
        self.all.write_code_script(self.name, language, code).await
    }

    /// Plans copying the host file or directory `host_path` to
    /// `guest_path` in this running workspace: a file replaces a guest
    /// file, a directory becomes (or merges into) the guest directory;
    /// anything else there is refused.
    pub async fn plan_copy_in(self, host_path: &Path, guest_path: &str) -> Result<CopyPlan> {
        self.all
            .plan_copy_in(self.name, host_path, guest_path)
            .await
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
        self.all
            .plan_copy_out(self.name, guest_path, host_path, options)
            .await
    }

    /// What is at a guest path of a running workspace, if anything.
    pub async fn stat_if_exists(self, path: &str) -> Result<Option<FileStat>> {
        self.all.stat_if_exists(self.name, path).await
    }

    /// Runs a command, streaming its output to `on_event`; the workspace's
    /// env is added under the request's own. Logs exec started/finished.
    pub async fn exec<F>(self, req: ExecRequest, input: ExecInput, on_event: F) -> Result<Exited>
    where
        F: FnMut(ExecEvent) + Send,
    {
        self.all.exec(self.name, req, input, on_event).await
    }

    /// Like [`Workspace::exec`], but when `cancel` completes first the
    /// command's process group is killed (SIGKILL): the agent keeps a
    /// process running when its client goes away, so dropping the exec
    /// alone would leave it behind. [`ExecEnd`] says whether the kill was
    /// confirmed; only then is `exec_finished` (signal 9) logged.
    pub async fn exec_cancellable<F, C>(
        self,
        req: ExecRequest,
        input: ExecInput,
        on_event: F,
        cancel: C,
    ) -> Result<ExecEnd>
    where
        F: FnMut(ExecEvent) + Send,
        C: std::future::Future<Output = ()>,
    {
        self.all
            .exec_cancellable(self.name, req, input, on_event, cancel)
            .await
    }

    /// Runs a command to its end and collects its output (up to the
    /// request's output cap).
    pub async fn exec_collect(self, req: ExecRequest, input: ExecInput) -> Result<ExecResult> {
        self.all.exec_collect(self.name, req, input).await
    }

    /// Sends a signal to a running exec's process group.
    pub async fn signal_exec(self, exec_id: &str, signal: i32) -> Result<()> {
        self.all.signal_exec(self.name, exec_id, signal).await
    }

    /// Copies a host file or directory to `guest_path` (a directory is
    /// copied as `guest_path` itself, created if missing). Returns bytes
    /// (file) or entries (directory) copied.
    pub async fn copy_in(self, host_path: &Path, guest_path: &str) -> Result<u64> {
        self.all.copy_in(self.name, host_path, guest_path).await
    }

    /// Copies a guest file or directory to `host_path` (a directory becomes
    /// `host_path` itself, merged into when it exists). Returns the bytes
    /// received. What the guest sends is checked and bounded
    /// ([`crate::host::host_write`]): nothing is written outside `host_path` or
    /// through a symlink, and a failed copy leaves no partial file.
    pub async fn copy_out(self, guest_path: &str, host_path: &Path) -> Result<u64> {
        self.all.copy_out(self.name, guest_path, host_path).await
    }

    /// Events after `after`, waiting up to `wait` for one when none are there.
    pub async fn events(self, after: u64, wait: Duration) -> Result<Vec<Event>> {
        self.all.events(self.name, after, wait).await
    }

    /// A guest directory's entries.
    pub async fn list_dir(self, path: &str) -> Result<DirListing> {
        self.all.list_dir(self.name, path).await
    }

    /// The last `lines` console lines (all when `None`).
    pub fn logs(self, lines: Option<usize>) -> Result<Vec<String>> {
        self.all.logs(self.name, lines)
    }

    /// New console bytes from `offset` of the current console file, and the
    /// next offset (for following).
    pub fn logs_from(self, offset: u64) -> Result<ConsoleChunk> {
        self.all.logs_from(self.name, offset)
    }

    /// Reads `length` bytes from `offset` of a guest file (default: to its
    /// end, at most [`MAX_COLLECTED_BYTES`]; `copy_out` streams larger ones).
    pub async fn read_file(
        self,
        path: &str,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<FileRead> {
        self.all.read_file(self.name, path, offset, length).await
    }

    /// Metadata of a guest path.
    pub async fn stat(self, path: &str) -> Result<FileStat> {
        self.all.stat(self.name, path).await
    }

    /// Writes a guest file (replacing it, or appending); bytes written.
    pub async fn write_file(self, path: &str, data: &[u8], options: WriteOptions) -> Result<u64> {
        self.all.write_file(self.name, path, data, options).await
    }

    /// Its background processes, oldest first
    /// (finished ones until removed or pushed out by newer ones).
    pub async fn process_list(self) -> Result<Vec<ProcessInfo>> {
        self.all.process_list(self.name).await
    }

    /// Output of process `id` from `cursors` (stdout, stderr byte offsets;
    /// 0 for the start), at most `max_bytes` per stream (default and limit
    /// 4 MiB), waiting up to `wait` (at most 10 min) for some when there
    /// is none yet.
    pub async fn process_output(
        self,
        id: &str,
        cursors: [u64; 2],
        max_bytes: Option<u64>,
        wait: Duration,
    ) -> Result<ProcessOutput> {
        self.all
            .process_output(self.name, id, cursors, max_bytes, wait)
            .await
    }

    /// Forgets finished process `id` and its output.
    pub async fn process_remove(self, id: &str) -> Result<()> {
        self.all.process_remove(self.name, id).await
    }

    /// Sends `signal` (a number, or a name such as `TERM` or `SIGKILL`) to
    /// process `id`'s process group.
    pub async fn process_signal(self, id: &str, signal: &str) -> Result<()> {
        self.all.process_signal(self.name, id, signal).await
    }

    /// Starts `req` as a background process in this running workspace
    /// and returns at once; the workspace's env is added under the
    /// request's own, and its timeout (if any) kills it.
    pub async fn process_start(
        self,
        req: ExecRequest,
        options: ProcessOptions,
    ) -> Result<ProcessInfo> {
        self.all.process_start(self.name, req, options).await
    }

    /// Waits up to `timeout` for process `id` to exit; returns it either
    /// way (check [`ProcessInfo::running`]).
    pub async fn process_wait(self, id: &str, timeout: Duration) -> Result<ProcessInfo> {
        self.all.process_wait(self.name, id, timeout).await
    }

    /// Writes `data` to process `id`'s stdin, then closes it when `close`;
    /// returns the bytes written.
    pub async fn process_write_stdin(self, id: &str, data: &[u8], close: bool) -> Result<u64> {
        self.all
            .process_write_stdin(self.name, id, data, close)
            .await
    }

    /// Creates workspace `new_name` as a fork and starts it: from the
    /// snapshot `snapshot` if given, else from this workspace as it is now (a
    /// snapshot of its running machine, kept in the fork's directory). A
    /// snapshot with memory resumes where it was taken; a disk-only one
    /// boots from its disk. The fork has its own disk copy and sockets.
    pub async fn fork(
        self,
        new_name: &str,
        snapshot: Option<&str>,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.all
            .fork(self.name, new_name, snapshot, timeout, progress)
            .await
    }

    /// Takes a snapshot of it named `name` (by default
    /// `<workspace>-<time>`): its whole machine while it runs (the guest
    /// pauses meanwhile), its disk while it is stopped.
    pub fn snapshot_take(self, name: Option<&str>) -> Result<SnapshotInfo> {
        self.all.snapshot_take(self.name, name)
    }

    /// Deletes it and everything it has. A running one is refused
    /// unless `options.force`, which halts it first.
    pub fn delete(self, options: DeleteOptions) -> Result<Meta> {
        self.all.delete(self.name, options)
    }

    /// Extends the TTL by `by_secs`: a running workspace's deadline moves
    /// that much later, and the TTL of later starts grows by as much (a
    /// workspace without a TTL gets one of `by_secs`, from now if it runs).
    pub fn extend_ttl(self, by_secs: u64) -> Result<Meta> {
        self.all.extend_ttl(self.name, by_secs)
    }

    /// Tears the VM down at once (SIGKILL to its VMM). Guest writes not yet
    /// on the disk are lost.
    pub fn halt(self) -> Result<Meta> {
        self.all.halt(self.name)
    }

    /// Sets the TTL (seconds from each start; from now if it is running),
    /// or removes it.
    pub fn set_ttl(self, ttl_secs: Option<u64>) -> Result<Meta> {
        self.all.set_ttl(self.name, ttl_secs)
    }

    /// Starts the workspace's VMM and waits (at most `timeout`) for the
    /// agent, reporting progress about once a second. A workspace never
    /// started before resumes its image's warm snapshot when there is a
    /// usable one (no boot), and otherwise boots and keeps one.
    pub async fn start(
        self,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.all.start(self.name, timeout, progress).await
    }

    /// [`Workspace::start`] that always boots the kernel (no warm snapshot
    /// is used or kept).
    pub async fn start_cold(
        self,
        timeout: Duration,
        progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        self.all.start_cold(self.name, timeout, progress).await
    }

    /// Stops the workspace: the agent shuts the guest down; after `timeout`
    /// the VM is torn down. Stopping a stopped or crashed workspace does
    /// nothing.
    pub async fn stop(self, timeout: Duration) -> Result<Meta> {
        self.all.stop(self.name, timeout).await
    }

    /// Reads a workspace, first recording a crash if its VMM died.
    pub fn get(self) -> Result<Meta> {
        self.all.get(self.name)
    }

    /// The record plus ages and disk use.
    pub fn inspect(self) -> Result<WorkspaceInfo> {
        self.all.inspect(self.name)
    }

    /// Publishes `mapping` on it: at once when it is running
    /// (its VMM process listens before this returns), and at every start.
    /// A host address in use, or already published, changes nothing.
    pub fn publish_port(self, mapping: PortMapping) -> Result<Meta> {
        self.all.publish_port(self.name, mapping)
    }

    /// Stops publishing the host address `host_ip`:`host_port` of it (open connections run on). NOT_FOUND when it is not published.
    pub fn unpublish_port(self, host_ip: IpAddr, host_port: u16) -> Result<Meta> {
        self.all.unpublish_port(self.name, host_ip, host_port)
    }
}
