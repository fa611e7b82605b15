//! Driving the `microagent` binary from tests: a private state directory
//! per test, commands with their output and exit status, JSON parsing, and
//! cleanup that leaves no VMM process behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::guest_faults;

/// A `microagent` binary with its own `MICROAGENT_HOME`, removed on drop
/// (after killing any VMM process still serving it).
#[derive(Debug)]
pub struct CliHome {
    bin: PathBuf,
    home: PathBuf,
    /// Run every command in this network namespace (`ip netns exec`).
    netns: Option<String>,
    /// More environment for every command.
    env: Vec<(String, std::ffi::OsString)>,
}

/// What one command did.
#[derive(Debug)]
pub struct CliRun {
    /// Exit status (`-1` when killed by a signal).
    pub status: i32,
    /// Stdout, lossily decoded.
    pub stdout: String,
    /// Stderr, lossily decoded.
    pub stderr: String,
}

impl CliRun {
    /// Stdout as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// The error code of a `--json` failure.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code in {}", self.stdout))
            .to_owned()
    }
}

impl From<Output> for CliRun {
    fn from(out: Output) -> Self {
        Self {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl CliHome {
    /// A fresh state directory for `test` under /tmp (short, because the
    /// workspace sockets live in it and Unix socket paths are limited).
    pub fn new(bin: impl Into<PathBuf>, test: &str) -> Self {
        let short: String = test
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(12)
            .collect();
        let home = PathBuf::from(format!("/tmp/ma-{short}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        // Private, as the library demands of a state directory.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&home)
            .expect("creating the test state directory");
        let bin = bin.into();
        vmm_program_beside(&bin);
        Self {
            bin,
            home,
            netns: None,
            env: Vec::new(),
        }
    }

    /// The same, with `key=value` in every command's environment.
    pub fn with_env(mut self, key: &str, value: impl Into<std::ffi::OsString>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// The same, with every command run in the network namespace `ns`
    /// (its VMM processes, and the resolvers a network setup starts, too).
    pub fn in_netns(mut self, ns: &str) -> Self {
        self.netns = Some(ns.to_owned());
        self
    }

    /// The state directory.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// A command with `MICROAGENT_HOME` set (and `MICROAGENT_WARM_DIR`, so
    /// the suites' fresh workspaces share warm snapshots), ready to run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.args(args).env("MICROAGENT_HOME", &self.home);
        if let Some(warm) = crate::shared_warm_dir() {
            cmd.env("MICROAGENT_WARM_DIR", warm);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs `microagent ARGS` and returns what it did. Fails the test with
    /// the guest console's tail when any workspace's guest logged a process
    /// fault, or an `exec`/`run` ended by a fault signal (exit 128+N).
    pub fn run(&self, args: &[&str]) -> CliRun {
        let out = self
            .command(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("running microagent");
        let run = CliRun::from(out);
        self.check_guests(args, &run);
        run
    }

    fn check_guests(&self, args: &[&str], run: &CliRun) {
        guest_faults::assert_no_faults_in(&self.home);
        let execs = matches!(args.first(), Some(&"exec") | Some(&"run"));
        if execs && run.status > 128 {
            let console = guest_faults::workspace_consoles(&self.home)
                .into_iter()
                .find(|(name, _)| args.get(1) == Some(&name.as_str()))
                .map(|(_, c)| c)
                .unwrap_or_default();
            guest_faults::assert_not_faulted(
                &format!("microagent {args:?}"),
                Some(run.status - 128),
                &console,
            );
        }
    }

    /// Runs a command that must succeed (exit 0); on failure shows its
    /// output and the tail of each workspace's console.
    pub fn ok(&self, args: &[&str]) -> CliRun {
        let run = self.run(args);
        if run.status != 0 {
            let consoles: Vec<String> = guest_faults::workspace_consoles(&self.home)
                .into_iter()
                .map(|(name, c)| {
                    format!(
                        "--- {name}: last {} console lines ---\n{}",
                        guest_faults::TAIL_LINES,
                        guest_faults::tail(&c, guest_faults::TAIL_LINES)
                    )
                })
                .collect();
            panic!(
                "microagent {args:?} exited {}:\nstdout: {}\nstderr: {}\n{}",
                run.status,
                run.stdout,
                run.stderr,
                consoles.join("\n")
            );
        }
        run
    }

    /// Runs a command that must succeed; returns its stdout as JSON.
    pub fn ok_json(&self, args: &[&str]) -> serde_json::Value {
        let run = self.run(args);
        assert_eq!(
            run.status, 0,
            "microagent {args:?} failed:\nstdout: {}\nstderr: {}",
            run.stdout, run.stderr
        );
        run.json()
    }

    /// Polls `inspect` until workspace `name` is in `state` (at most
    /// `timeout`); returns the record then.
    pub fn wait_state(&self, name: &str, state: &str, timeout: Duration) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        loop {
            let info = self.ok_json(&["inspect", name, "--json"]);
            if info["state"] == state {
                return info;
            }
            assert!(
                Instant::now() < deadline,
                "{name} never became {state}: {info}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Pids of live VMM processes serving this state directory.
    pub fn vmm_pids(&self) -> Vec<u32> {
        let needle = self.home.to_string_lossy().into_owned();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                is_live(*pid)
                    && (cmdline.contains("serve-workspace") || cmdline.contains("vmm standby"))
                    && cmdline.contains(&needle)
            })
            .collect()
    }

    /// Every path under the state directory with its size (a snapshot to
    /// compare before and after an operation that must change nothing).
    pub fn snapshot(&self) -> Vec<(String, u64, Vec<u8>)> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, u64, Vec<u8>)>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.filter_map(|e| e.ok()) {
                let path = e.path();
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                let meta = match std::fs::symlink_metadata(&path) {
                    Ok(m) => m,
                    Err(_) => continue,
                };
                if meta.is_dir() {
                    out.push((rel + "/", 0, Vec::new()));
                    walk(&path, root, out);
                } else {
                    // Small files are compared by content, big ones by size.
                    let content = if meta.len() <= 65536 {
                        std::fs::read(&path).unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    out.push((rel, meta.len(), content));
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.home, &self.home, &mut out);
        out.sort();
        out
    }
}

/// True while `pid` runs (a zombie has ended).
fn is_live(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|state| !matches!(state.trim_start().chars().next(), Some('Z' | 'X')))
}

impl Drop for CliHome {
    fn drop(&mut self) {
        // A test that failed half way may leave VMMs running: halt them
        // through the library, as `microagent halt` would.
        if let Some(all) = crate::open_state_dir(&self.home) {
            for meta in all
                .list(&workspace::ListFilter::default())
                .unwrap_or_default()
            {
                let _ = all.workspace(&meta.name).and_then(|w| w.halt());
            }
        }
        // Pool members are in no listing.
        for pid in self.vmm_pids() {
            // SAFETY: kill takes two integers.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // Kept for a look when asked (`MICROAGENT_KEEP_FAILED_HOME=1`).
        if std::thread::panicking() && std::env::var_os("MICROAGENT_KEEP_FAILED_HOME").is_some() {
            eprintln!(
                "kept the failed test's state directory {}",
                self.home.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// The VMM program `microagent` runs, beside it: built by the
/// `microagent-vmm` package, which `cargo test -p microagent` alone does not
/// build (`cargo xtask test` and `cargo test --workspace` do).
pub fn vmm_program_beside(bin: &Path) -> PathBuf {
    let vmm = bin.with_file_name("microagent-vmm");
    assert!(
        vmm.exists(),
        "{} is missing: build it first with `cargo build -p microagent-vmm` (add `--features test-hooks` for the kill -9 suite), or run the tests with `cargo xtask test`",
        vmm.display()
    );
    vmm
}
