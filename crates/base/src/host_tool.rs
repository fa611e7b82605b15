//! The one runner for host tools (git, debugfs, mkfs.ext4, fakeroot)
//! that read what a guest, an image or a registry made. Such data is
//! hostile: it may be built to make the tool run a program (git hooks,
//! filters), eat the host's memory (a delta chain that inflates to
//! gigabytes) or disk, or never end. So every run here is a program
//! started without a shell, with a clean environment for the tool, under an
//! address-space and file-size limit, in a memory-capped cgroup where the
//! host gives one, and killed at a deadline; what it prints is read up to a
//! bound. Git gets every config key that names a program overridden
//! ([`HostTool::git`]). The tidy test `host_tools_run_through_one_runner`
//! fails on a `Command::new` of these tools anywhere else.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::host::cgroup;

/// The programs whose runs on untrusted data must go through here.
pub const CONFINED_TOOLS: &[&str] = &["git", "debugfs", "mkfs.ext4", "e2fsck", "fakeroot", "tar"];

/// Bounds of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolLimits {
    /// Address space (RLIMIT_AS), bytes; also the cgroup's memory cap.
    pub memory_bytes: u64,
    /// Largest file the tool may write (RLIMIT_FSIZE), bytes.
    pub file_bytes: u64,
    /// Wall-clock time before it is killed.
    pub deadline: Duration,
    /// Most bytes of stdout (and, apart, of stderr) kept.
    pub output_bytes: usize,
}

impl Default for ToolLimits {
    /// 4 GiB of address space (git maps pack windows; its heap stays far
    /// below), 4 GiB per file, 10 minutes, 64 MiB of output. A tool that
    /// writes a disk image is given that image's size
    /// ([`ToolLimits::writing`]).
    fn default() -> Self {
        Self {
            memory_bytes: 4 << 30,
            file_bytes: 4 << 30,
            deadline: Duration::from_secs(600),
            output_bytes: 64 << 20,
        }
    }
}

impl ToolLimits {
    /// The defaults, for a tool that writes a disk image of `bytes`.
    pub fn writing(bytes: u64) -> Self {
        Self {
            file_bytes: bytes,
            ..Self::default()
        }
    }
}

/// Largest single allocation git may make for one object
/// (`GIT_ALLOC_LIMIT`): a delta that inflates past it is refused before
/// memory is spent on it.
pub const GIT_ALLOC_LIMIT: &str = "256m";

/// Config keys that name a program, each set to something inert for every
/// git run on guest data, with the transports beyond local files off.
const GIT_OVERRIDES: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.sshCommand=false",
    "core.gitProxy=",
    "core.askPass=",
    "core.pager=cat",
    "core.editor=:",
    "sequence.editor=:",
    "credential.helper=",
    "diff.external=",
    "protocol.allow=never",
    "protocol.file.allow=always",
    "gc.auto=0",
    "maintenance.auto=false",
    "core.packedGitLimit=1g",
    "core.packedGitWindowSize=256m",
    "pack.threads=1",
    "index.threads=1",
    "submodule.recurse=false",
    // Signing would put the user's key on a guest's content.
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "gpg.program=false",
    "gpg.openpgp.program=false",
    "gpg.ssh.program=false",
    "gpg.x509.program=false",
    "gpg.ssh.defaultKeyCommand=false",
    "core.alternateRefsCommand=true",
    "merge.verifySignatures=false",
    "log.showSignature=false",
    // The user's global attributes are not read (the repository's own
    // are, and repos::incoming accounts for them).
    "core.attributesFile=/dev/null",
];

/// Why running a host tool failed.
#[derive(Debug, thiserror::Error)]
pub enum HostToolError {
    /// The tool is not installed.
    #[error("{tool} is not installed on the host")]
    Missing {
        /// Its name.
        tool: String,
    },
    /// It could not be started.
    #[error("starting {tool}")]
    Spawn {
        /// Its name.
        tool: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for it or reading its output failed.
    #[error("waiting for {tool}")]
    Wait {
        /// Its name.
        tool: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// It ran past its deadline and was killed.
    #[error("{tool} ran longer than {} s and was stopped", after.as_secs())]
    TimedOut {
        /// Its name.
        tool: String,
        /// The deadline.
        after: Duration,
    },
    /// It ran and said it failed (its exit status, or, for debugfs, which
    /// exits 0 either way, a line on stderr).
    #[error("{tool} failed ({status}): {said}")]
    Failed {
        /// Its name.
        tool: String,
        /// How it ended.
        status: ExitStatus,
        /// What it said on stderr.
        said: String,
    },
    /// It printed more than the bound.
    #[error("{tool} printed more than {limit} bytes")]
    OutputTooLarge {
        /// Its name.
        tool: String,
        /// The bound.
        limit: usize,
    },
}

/// What a finished run left.
#[derive(Debug)]
pub struct ToolOutput {
    /// How it ended.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr (at most [`ToolLimits::output_bytes`]; the rest dropped).
    pub stderr: Vec<u8>,
}

/// One run of a host tool, being set up.
#[derive(Debug)]
pub struct HostTool {
    name: String,
    cmd: Command,
    limits: ToolLimits,
}

impl HostTool {
    /// `name` (found on the host's tool path), with stdin closed and the C
    /// locale.
    pub fn new(name: &str) -> Result<Self, HostToolError> {
        Ok(Self::at(name, find(name)?))
    }

    /// `name` run by `wrapper` (`fakeroot mkfs.ext4 ...`), both found on
    /// the host's tool path.
    pub fn under(wrapper: &str, name: &str) -> Result<Self, HostToolError> {
        Ok(Self::new(wrapper)?.arg(find(name)?))
    }

    /// The program at `program`, known as `name` in errors.
    pub fn at(name: &str, program: impl AsRef<OsStr>) -> Self {
        // Nothing of the caller's environment but PATH: variables such as
        // DEBUGFS_PAGER, E2FSPROGS_FAKE_TIME or GIT_DIR change what a tool
        // runs or reads.
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            )
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        Self {
            name: name.to_owned(),
            cmd,
            limits: ToolLimits::default(),
        }
    }

    /// `git -C repo` with every program-naming key overridden, the system
    /// config and git's own environment variables ignored, prompts off,
    /// and object allocations bounded.
    pub fn git(repo: &Path) -> Result<Self, HostToolError> {
        let mut tool = Self::new("git")?;
        let cmd = &mut tool.cmd;
        with_user_config(cmd);
        cmd.env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ALLOC_LIMIT", GIT_ALLOC_LIMIT)
            .env("GIT_PAGER", "cat")
            .env("GIT_EDITOR", ":");
        cmd.arg("-C").arg(repo);
        for kv in GIT_OVERRIDES {
            cmd.arg("-c").arg(kv);
        }
        for kv in git_driver_overrides(repo, &tool.name)? {
            tool.cmd.arg("-c").arg(kv);
        }
        Ok(tool)
    }

    /// Replaces the bounds.
    pub fn limits(mut self, limits: ToolLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The bounds in force.
    pub fn current_limits(&self) -> ToolLimits {
        self.limits
    }

    /// Its name (for errors).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The command, to add arguments, environment and a directory (stdio
    /// and the pre-exec steps are this runner's).
    pub fn command(&mut self) -> &mut Command {
        &mut self.cmd
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    /// Starts it with `stdin`, confined; its stdout and stderr are read
    /// (up to the bound) on threads of their own, so it never blocks on a
    /// full pipe whatever the caller does meanwhile.
    pub fn spawn(self, stdin: Stdio) -> Result<RunningTool, HostToolError> {
        self.start(stdin, false)
    }

    /// [`HostTool::spawn`], but its stdout is the caller's to read as a
    /// stream ([`RunningTool::stdout`]; the reader bounds what it keeps).
    pub fn spawn_streaming(self, stdin: Stdio) -> Result<RunningTool, HostToolError> {
        self.start(stdin, true)
    }

    fn start(mut self, stdin: Stdio, streaming: bool) -> Result<RunningTool, HostToolError> {
        let group = ToolGroup::make(self.limits.memory_bytes);
        let limits = self.limits;
        let join = group.as_ref().and_then(ToolGroup::join_fd);
        self.cmd
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the child between fork and exec and
        // makes only async-signal-safe calls (setrlimit, write on a
        // descriptor opened before the fork); it allocates nothing.
        unsafe {
            self.cmd.pre_exec(move || {
                confine_self(&limits, join)?;
                Ok(())
            });
        }
        let mut child = self.cmd.spawn().map_err(|source| HostToolError::Spawn {
            tool: self.name.clone(),
            source,
        })?;
        let watchdog = Some(Watchdog::start(child.id(), limits.deadline));
        let bound = limits.output_bytes;
        let stdout = match streaming {
            true => None,
            false => child.stdout.take().map(|s| read_bounded(s, bound)),
        };
        let stderr = child.stderr.take().map(|s| read_bounded(s, bound));
        Ok(RunningTool {
            name: self.name,
            child,
            limits,
            watchdog,
            stdout,
            stderr,
            _group: group,
        })
    }

    /// Runs it to the end with stdin closed.
    pub fn output(self) -> Result<ToolOutput, HostToolError> {
        self.spawn(Stdio::null())?.finish()
    }
}

/// What reads one of a run's pipes: its bytes, and whether it was cut.
type PipeReader = std::thread::JoinHandle<std::io::Result<(Vec<u8>, bool)>>;

/// A started run; a watchdog kills it at its deadline, whoever is reading
/// its output.
#[derive(Debug)]
pub struct RunningTool {
    name: String,
    child: Child,
    limits: ToolLimits,
    watchdog: Option<Watchdog>,
    stdout: Option<PipeReader>,
    stderr: Option<PipeReader>,
    _group: Option<ToolGroup>,
}

/// Kills a child at its deadline unless told it is done first.
#[derive(Debug)]
struct Watchdog {
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<bool>,
}

impl Watchdog {
    fn start(pid: u32, deadline: Duration) -> Self {
        let (done, told) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = told.recv_timeout(deadline) {
                // SAFETY: the child is reaped only after this thread is
                // joined, so `pid` is still the tool (running or a zombie).
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                return true;
            }
            false
        });
        Self { done, thread }
    }

    /// Whether it had to kill.
    fn stop(self) -> bool {
        let _ = self.done.send(());
        self.thread.join().unwrap_or(false)
    }
}

impl RunningTool {
    /// Its stdin, when it was started with a pipe there.
    pub fn stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// Its stdout, when it was started with [`HostTool::spawn_streaming`].
    pub fn stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// Waits for its end (it is killed at the deadline), with its output.
    pub fn finish(self) -> Result<ToolOutput, HostToolError> {
        self.end(false)
    }

    /// Ends it now (its output is no longer wanted) and collects what it
    /// said; its status is then that of the kill unless it had ended.
    pub fn stop(self) -> Result<ToolOutput, HostToolError> {
        self.end(true)
    }

    fn end(mut self, kill: bool) -> Result<ToolOutput, HostToolError> {
        if kill {
            let _ = self.child.kill();
        }
        // Wait without reaping, so the watchdog can never signal a pid
        // reused by another process; then stop it; then reap.
        let pid = self.child.id() as libc::id_t;
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: waitid writes only `info`; WNOWAIT leaves the child
            // for `wait` below.
            let rc =
                unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if rc == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
            {
                break;
            }
        }
        let killed = self.watchdog.take().is_some_and(Watchdog::stop);
        let status = self.child.wait().map_err(|source| HostToolError::Wait {
            tool: self.name.clone(),
            source,
        })?;
        if killed {
            return Err(HostToolError::TimedOut {
                tool: self.name.clone(),
                after: self.limits.deadline,
            });
        }
        let wait_err = |source| HostToolError::Wait {
            tool: self.name.clone(),
            source,
        };
        let (stdout, stdout_cut) = join_reader(self.stdout.take()).map_err(wait_err)?;
        let (stderr, _) = join_reader(self.stderr.take()).map_err(wait_err)?;
        if stdout_cut {
            return Err(HostToolError::OutputTooLarge {
                tool: self.name.clone(),
                limit: self.limits.output_bytes,
            });
        }
        Ok(ToolOutput {
            status,
            stdout,
            stderr,
        })
    }
}

impl Drop for RunningTool {
    /// A run dropped unfinished (its reader failed) is killed and reaped.
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            // Killed but not reaped, its pid stays its own until the
            // watchdog is gone.
            let _ = self.child.kill();
            watchdog.stop();
            let _ = self.child.wait();
        }
    }
}

fn join_reader(reader: Option<PipeReader>) -> std::io::Result<(Vec<u8>, bool)> {
    reader
        .map(|h| h.join().unwrap_or_else(|_| Ok((Vec::new(), false))))
        .unwrap_or_else(|| Ok((Vec::new(), false)))
}

/// Reads `from` on a thread of its own, keeping `bound` bytes and draining
/// the rest (so the tool never blocks on a full pipe); true when cut.
fn read_bounded(mut from: impl Read + Send + 'static, bound: usize) -> PipeReader {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut cut = false;
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let room = bound.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
            cut |= n > room;
        }
        Ok((kept, cut))
    })
}

/// In the forked child: the rlimits, then the cgroup.
fn confine_self(limits: &ToolLimits, join: Option<i32>) -> std::io::Result<()> {
    for (resource, value) in [
        (libc::RLIMIT_AS, limits.memory_bytes),
        (libc::RLIMIT_FSIZE, limits.file_bytes),
        (libc::RLIMIT_CORE, 0),
    ] {
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: setrlimit reads the struct we pass and nothing else.
        if unsafe { libc::setrlimit(resource, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if let Some(fd) = join {
        // Writing 0 to a v1 `tasks` or v2 `cgroup.procs` file moves the
        // writer: this child, still single-threaded. A group that refuses
        // leaves the rlimits as the bound.
        // SAFETY: `fd` is an open descriptor inherited from the parent and
        // the buffer is a static byte string.
        unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    }
    Ok(())
}

/// A memory-capped cgroup for one run, removed when dropped.
#[derive(Debug)]
struct ToolGroup {
    dir: PathBuf,
    join: std::fs::File,
}

impl ToolGroup {
    /// A fresh group with `memory_bytes`, where the host gives one (as the
    /// VMM's, [`cgroup::memory_group`]).
    fn make(memory_bytes: u64) -> Option<Self> {
        let id = format!(
            "tool-{}-{}",
            std::process::id(),
            NEXT_GROUP.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let (dir, join_file) =
            cgroup::memory_group(Path::new(cgroup::CGROUP_ROOT), &id, memory_bytes)?;
        let join = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(join_file))
            .ok()?;
        Some(Self { dir, join })
    }

    fn join_fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        Some(self.join.as_raw_fd())
    }
}

static NEXT_GROUP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Drop for ToolGroup {
    fn drop(&mut self) {
        // The tool has ended: its group is empty and can go.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Where tool `name` is on the host's tool path.
fn find(name: &str) -> Result<PathBuf, HostToolError> {
    crate::host::settings::host_tool(name).ok_or_else(|| HostToolError::Missing {
        tool: name.to_owned(),
    })
}

/// Lets git find the user's own config (identity, safe.directory) in
/// their home; every key there that names a program is overridden.
fn with_user_config(cmd: &mut Command) {
    for key in ["HOME", "XDG_CONFIG_HOME"] {
        if let Some(value) = std::env::var_os(key) {
            cmd.env(key, value);
        }
    }
}

/// Runs a `debugfs -w` script (request lines only: the caller quotes every
/// name in it) on the ext4 `image`. debugfs exits 0 even when a request
/// fails and says so on stderr, so any line there but its banner fails.
pub fn debugfs_write(image: &Path, script: &str) -> Result<(), HostToolError> {
    use std::io::Write;
    let size = std::fs::metadata(image).map(|m| m.len()).unwrap_or(0);
    let mut run = HostTool::new("debugfs")?
        .args(["-w", "-f", "-"])
        .arg(image)
        .limits(ToolLimits::writing(size))
        .spawn(Stdio::piped())?;
    if let Some(mut stdin) = run.stdin() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|source| HostToolError::Wait {
                tool: "debugfs".into(),
                source,
            })?;
    }
    let out = run.finish()?;
    let said = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = said
        .lines()
        .filter(|l| !l.starts_with("debugfs ") && !l.trim().is_empty())
        .collect();
    if !out.status.success() || !errors.is_empty() {
        return Err(HostToolError::Failed {
            tool: "debugfs".into(),
            status: out.status,
            said: errors.join("; "),
        });
    }
    Ok(())
}

/// `-c` overrides for the filter, merge and diff drivers `repo`'s config
/// (the user's) defines: an attribute in guest-made `.gitattributes` may
/// name any of them, and none may run on guest data. Filters become `cat`
/// (content as stored), merges fail to a conflict, diff programs go.
fn git_driver_overrides(repo: &Path, name: &str) -> Result<Vec<String>, HostToolError> {
    let regexp =
        r"^(filter|merge|diff)\..*\.(smudge|clean|process|required|driver|command|textconv)$";
    let mut list = HostTool::new(name)?;
    let cmd = list.command();
    // The same config the run reads: the user's own (HOME) included.
    with_user_config(cmd);
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .arg("-C")
        .arg(repo)
        .args(["config", "--name-only", "--get-regexp", regexp]);
    let out = list.output()?;
    // 0: keys listed; 1: none. Anything else (a config git cannot read)
    // leaves no run: its drivers could not be made inert.
    match out.status.code() {
        Some(0) => Ok(driver_overrides(&String::from_utf8_lossy(&out.stdout))),
        Some(1) => Ok(Vec::new()),
        _ => Err(HostToolError::Failed {
            tool: format!("{name} config"),
            status: out.status,
            said: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }),
    }
}

/// The overrides for the keys `git config --name-only` listed.
fn driver_overrides(keys: &str) -> Vec<String> {
    let mut overrides = Vec::new();
    for key in keys.lines().map(str::trim).filter(|k| !k.is_empty()) {
        let Some((head, field)) = key.rsplit_once('.') else {
            continue;
        };
        let value = match (head.split('.').next(), field) {
            (Some("filter"), "smudge" | "clean") => "cat",
            (Some("filter"), "process") => "",
            (Some("filter"), "required") => "false",
            (Some("merge"), "driver") => "false",
            (Some("diff"), "command" | "textconv") => "",
            _ => continue,
        };
        overrides.push(format!("{key}={value}"));
    }
    overrides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_a_driver_names_is_made_inert() {
        let keys = "filter.lfs.smudge\nfilter.lfs.clean\nfilter.lfs.process\nfilter.lfs.required\n\
                    merge.ours.driver\ndiff.pdf.textconv\ndiff.x.command\nmerge.ours.name\n";
        assert_eq!(
            driver_overrides(keys),
            [
                "filter.lfs.smudge=cat",
                "filter.lfs.clean=cat",
                "filter.lfs.process=",
                "filter.lfs.required=false",
                "merge.ours.driver=false",
                "diff.pdf.textconv=",
                "diff.x.command=",
            ]
        );
    }

    #[test]
    fn a_run_past_its_deadline_is_killed() {
        let tool = HostTool::at("sleep", "sleep").arg("30").limits(ToolLimits {
            deadline: Duration::from_millis(200),
            ..ToolLimits::default()
        });
        let started = std::time::Instant::now();
        let err = tool.output().unwrap_err();
        assert!(matches!(err, HostToolError::TimedOut { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn output_past_its_bound_is_an_error_and_the_tool_is_not_blocked() {
        let tool = HostTool::at("head", "head")
            .args(["-c", "1000000", "/dev/zero"])
            .limits(ToolLimits {
                output_bytes: 1000,
                ..ToolLimits::default()
            });
        let err = tool.output().unwrap_err();
        assert!(
            matches!(err, HostToolError::OutputTooLarge { limit: 1000, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_file_size_limit_holds() {
        let dir = std::env::temp_dir().join(format!("ma-tool-fsize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("big");
        let tool = HostTool::at("head", "sh")
            .arg("-c")
            .arg(format!("head -c 1048576 /dev/zero > {}", file.display()))
            .limits(ToolLimits {
                file_bytes: 4096,
                ..ToolLimits::default()
            });
        let out = tool.output().unwrap();
        assert!(!out.status.success());
        assert!(std::fs::metadata(&file).unwrap().len() <= 4096);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_address_space_limit_holds() {
        // python3 asking for 512 MiB under a 256 MiB limit fails.
        if crate::host::settings::host_tool("python3").is_none() {
            crate::test_support::skip("the_address_space_limit_holds", "python3 is not installed");
            return;
        }
        let tool = HostTool::at("python3", "python3")
            .args(["-c", "b = bytearray(512 << 20); print(len(b))"])
            .limits(ToolLimits {
                memory_bytes: 256 << 20,
                ..ToolLimits::default()
            });
        let out = tool.output().unwrap();
        assert!(
            !out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
