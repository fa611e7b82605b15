//! The workspace's test binaries run side by side, one lane per core: most
//! of the long ones wait on a guest whose kernel code is emulated on one
//! host core, so running them one at a time leaves the other core idle for
//! most of an hour. Those whose guests keep every core busy on their own
//! (`ALONE`) run first, one at a time. The longest start first
//! (`EXPECTED_SECONDS`) so that the lanes end together; each binary's
//! standard output (libtest's report) is printed whole when it ends, so
//! the log reads as `cargo test`'s does; where a binary runs one test at a
//! time, each test's time is read from it as it comes, and the summary
//! names the slowest.

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context};

/// One test executable as cargo built it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// The target's name (`workspace_e2e`; a library's unit tests carry
    /// the library's name).
    pub target: String,
    /// Its source, relative to the repository (`crates/cli/tests/...`).
    pub source: String,
    pub exe: PathBuf,
    /// The package's directory, where cargo runs its tests.
    pub package_dir: PathBuf,
}

/// Seconds each long test binary took in a CI run (2026-12-02, two lanes
/// beside each other; the browser's alone): only their order matters, so
/// a stale figure costs balance, never a result. Binaries not named here
/// are short. `mcp_http`'s is 497 s and its code-session test's 1795 s
/// (alone, 2026-12-04).
const EXPECTED_SECONDS: &[(&str, u32)] = &[
    ("mcp_http", 2300),
    ("workspace_e2e", 1458),
    ("repos_e2e", 1086),
    ("browser_e2e", 1024),
    ("mcp_stdio", 539),
    ("image_e2e", 348),
    ("guest_e2e", 325),
    ("network_e2e", 302),
    ("containerd_e2e", 292),
    ("servers_e2e", 234),
    ("hostile_images", 173),
    ("cycles_e2e", 170),
    ("bundle_e2e", 137),
    ("devices_linux", 39),
    ("hostile_agent", 31),
    ("boot_linux", 30),
    ("kill9_e2e", 22),
];

/// Test binaries that run alone: their guests use every core of a
/// two-core host (the browser's has 2 vCPUs, and Chromium's start keeps
/// both busy), so beside another binary each took over three times as
/// long (CI 2026-12-02: `browser_e2e` 2836 s beside the others, 840 s
/// alone), holding up the lanes.
const ALONE: &[&str] = &["browser_e2e"];

/// Whether the test binary `target` runs alone (see [`ALONE`]).
pub fn runs_alone(target: &str) -> bool {
    ALONE.contains(&target)
}

fn expected_seconds(target: &str) -> u32 {
    EXPECTED_SECONDS
        .iter()
        .find(|(name, _)| *name == target)
        .map_or(0, |(_, s)| *s)
}

/// The test executables of one `cargo test --no-run` line of cargo's JSON
/// output (`None` for every other message).
fn test_binary_of(line: &str, root: &Path) -> Option<TestBinary> {
    let msg: serde_json::Value = serde_json::from_str(line).ok()?;
    if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
        return None;
    }
    let exe = PathBuf::from(msg["executable"].as_str()?);
    let manifest = Path::new(msg["manifest_path"].as_str()?);
    let source = Path::new(msg["target"]["src_path"].as_str()?);
    Some(TestBinary {
        target: msg["target"]["name"].as_str()?.to_owned(),
        source: source
            .strip_prefix(root)
            .unwrap_or(source)
            .display()
            .to_string(),
        exe,
        package_dir: manifest.parent()?.to_path_buf(),
    })
}

/// Builds every test binary of the workspace (`cargo test --no-run`) and
/// lists them, longest expected first.
pub fn build(cargo: &str, root: &Path, args: &[&str]) -> anyhow::Result<Vec<TestBinary>> {
    let mut child = Command::new(cargo)
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(args)
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start cargo test --no-run")?;
    let mut binaries = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in std::io::BufReader::new(out).lines() {
            binaries.extend(test_binary_of(&line?, root));
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("building the tests failed ({status})");
    }
    binaries.sort_by_key(|b| {
        (
            std::cmp::Reverse(expected_seconds(&b.target)),
            b.source.clone(),
        )
    });
    Ok(binaries)
}

/// What one binary printed and how it ended.
pub struct Finished {
    pub binary: TestBinary,
    pub stdout: String,
    pub success: bool,
    /// Each test's seconds, when the binary ran one test at a time (then
    /// a test's time is from the end of the one before to its own).
    pub test_seconds: Vec<(String, f64)>,
}

/// What a line of libtest's report says of a test: that it ended (`test
/// NAME ... ok`, or a bare `ok` after the line that said it was running
/// long, which one test at a time has end with the warning), or is still
/// running (`test NAME ... has been running for over 60 seconds`).
fn report_line(line: &str, running: &mut Option<String>) -> Option<String> {
    const RESULTS: [&str; 3] = ["ok", "FAILED", "ignored"];
    if RESULTS.contains(&line) {
        return running.take();
    }
    let (name, result) = line.strip_prefix("test ")?.rsplit_once(" ... ")?;
    if result.starts_with("has been running for over") {
        *running = Some(name.to_owned());
        return None;
    }
    RESULTS.contains(&result).then(|| name.to_owned())
}

/// What a binary printed, whether it passed, and when each test ended
/// (seconds from its start).
#[derive(Default)]
struct Ran {
    stdout: String,
    success: bool,
    ended: Vec<(String, f64)>,
}

/// Runs `binary` with `env`.
fn run_one(binary: &TestBinary, env: &[(&str, &std::ffi::OsStr)]) -> std::io::Result<Ran> {
    let started = Instant::now();
    let mut child = Command::new(&binary.exe)
        .current_dir(&binary.package_dir)
        .env("CARGO_MANIFEST_DIR", &binary.package_dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Left as it is: a process a test leaves behind may hold it open
        // (libtest captures what tests print anyway).
        .stderr(Stdio::inherit())
        .spawn()?;
    let (mut stdout, mut ended, mut running) = (String::new(), Vec::new(), None);
    if let Some(out) = child.stdout.take() {
        let mut reader = std::io::BufReader::new(out);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line)? > 0 {
            let text = String::from_utf8_lossy(&line);
            if let Some(name) = report_line(text.trim_end(), &mut running) {
                ended.push((name, started.elapsed().as_secs_f64()));
            }
            stdout.push_str(&text);
            line.clear();
        }
    }
    Ok(Ran {
        stdout,
        success: child.wait()?.success(),
        ended,
    })
}

/// Each test's own seconds from when each ended, one test at a time.
fn durations(ended: Vec<(String, f64)>) -> Vec<(String, f64)> {
    let mut before = 0.0;
    ended
        .into_iter()
        .map(|(name, at)| {
            let took = at - before;
            before = at;
            (name, took)
        })
        .collect()
}

/// Runs `binaries` in `lanes` lanes, each with `env` set, calling `done`
/// (one at a time) as each ends.
pub fn run(
    binaries: Vec<TestBinary>,
    lanes: usize,
    env: &[(&str, &std::ffi::OsStr)],
    done: impl Fn(Finished) + Sync,
) {
    let queue = Mutex::new(VecDeque::from(binaries));
    let printing = Mutex::new(());
    std::thread::scope(|s| {
        for _ in 0..lanes.max(1) {
            s.spawn(|| loop {
                let Some(binary) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
                else {
                    return;
                };
                eprintln!("xtask: running {}", binary.source);
                let started = Instant::now();
                let Ran {
                    stdout,
                    success,
                    ended,
                } = run_one(&binary, env).unwrap_or_else(|e| {
                    eprintln!("xtask: could not run {}: {e}", binary.exe.display());
                    Ran::default()
                });
                let one_at_a_time = env
                    .iter()
                    .any(|(k, v)| *k == "RUST_TEST_THREADS" && *v == "1");
                let test_seconds = if one_at_a_time {
                    durations(ended)
                } else {
                    Vec::new()
                };
                let _turn = printing.lock().unwrap_or_else(|p| p.into_inner());
                println!(
                    "\n     Running {} ({})",
                    binary.source,
                    binary.exe.display()
                );
                print!("{stdout}");
                eprintln!(
                    "xtask: {} ended in {:.0} s",
                    binary.source,
                    started.elapsed().as_secs_f64()
                );
                done(Finished {
                    binary,
                    stdout,
                    success,
                    test_seconds,
                });
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tests_time_is_read_from_the_report_one_test_at_a_time() {
        let report = [
            "running 3 tests",
            "test a ... ok",
            "test slow ... has been running for over 60 seconds",
            "ok",
            "test broken ... FAILED",
            "test result: FAILED. 2 passed; 1 failed",
        ];
        let (mut running, mut ended) = (None, Vec::new());
        for (at, line) in report.iter().enumerate() {
            if let Some(name) = report_line(line, &mut running) {
                ended.push((name, at as f64 * 10.0));
            }
        }
        assert_eq!(
            durations(ended),
            vec![
                ("a".to_owned(), 10.0),
                ("slow".to_owned(), 20.0),
                ("broken".to_owned(), 10.0)
            ]
        );
    }

    #[test]
    fn test_executables_are_read_from_cargos_messages() {
        let root = Path::new("/r");
        let test = r#"{"reason":"compiler-artifact","package_id":"path+file:///r/crates/cli#microagent@0.1.0","manifest_path":"/r/crates/cli/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"workspace_e2e","src_path":"/r/crates/cli/tests/workspace_e2e/main.rs","edition":"2021","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/r/target/debug/deps/workspace_e2e-1"],"executable":"/r/target/debug/deps/workspace_e2e-1","fresh":true}"#;
        assert_eq!(
            test_binary_of(test, root),
            Some(TestBinary {
                target: "workspace_e2e".into(),
                source: "crates/cli/tests/workspace_e2e/main.rs".into(),
                exe: "/r/target/debug/deps/workspace_e2e-1".into(),
                package_dir: "/r/crates/cli".into(),
            })
        );
        // The binary itself as a dependency of the tests: not a test.
        let bin = test
            .replace(r#""test":true},"features""#, r#""test":false},"features""#)
            .replace(r#""kind":["test"]"#, r#""kind":["bin"]"#);
        assert_eq!(test_binary_of(&bin, root), None);
        assert_eq!(
            test_binary_of(r#"{"reason":"build-finished","success":true}"#, root),
            None
        );
        assert_eq!(test_binary_of("not json", root), None);
    }

    #[test]
    fn the_longest_binaries_come_first_and_the_unknown_last() {
        assert!(expected_seconds("workspace_e2e") > expected_seconds("repos_e2e"));
        assert_eq!(expected_seconds("a_new_unit_test_binary"), 0);
        assert!(runs_alone("browser_e2e") && !runs_alone("workspace_e2e"));
    }
}
