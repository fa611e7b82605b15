//! `cargo xtask test`: formatting, lints, then every test, ending with one
//! "N passed, N failed, N skipped" line. Tests that cannot run here (no
//! /dev/kvm, no guest assets) record why in a skip log (see testkit); they
//! are counted as skipped, not passed.

use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::bail;

use crate::{cache, sh, test_lanes};

#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
}

/// What the test binaries reported, all together.
#[derive(Debug, Default)]
struct Tally {
    counts: Counts,
    /// How many "test result:" lines were seen.
    results: usize,
    /// Those that failed, even with no result line (a crash).
    failed_binaries: Vec<String>,
    /// Each test's seconds, where its binary ran one at a time.
    test_seconds: Vec<(String, f64)>,
}

/// How many of the slowest tests the summary names.
const SLOWEST_SHOWN: usize = 15;

impl Tally {
    fn add(&mut self, stdout: &str, success: bool, source: &str) {
        for line in stdout.lines() {
            if add_result_line(line, &mut self.counts) {
                self.results += 1;
            }
        }
        if !success {
            self.failed_binaries.push(source.to_owned());
        }
    }
}

/// Adds the counts of a libtest "test result:" line.
fn add_result_line(line: &str, counts: &mut Counts) -> bool {
    let Some(rest) = line.trim().strip_prefix("test result: ") else {
        return false;
    };
    for part in rest.split(['.', ';']) {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => counts.passed += n,
            "failed" => counts.failed += n,
            "ignored" => counts.ignored += n,
            _ => {}
        }
    }
    true
}

/// The features tests build with: the test hooks (pause points) the kill
/// -9 suite needs, which shipped builds never have.
const TEST_FEATURES: &str = "microagent/test-hooks,microagent-vmm/test-hooks";

/// How long `cargo xtask test` fuzzes the virtio queues.
const FUZZ_SECONDS: u64 = 20;

/// How many test binaries run at once: `MICROAGENT_TEST_LANES`, or one
/// per core.
fn lanes() -> anyhow::Result<usize> {
    match std::env::var("MICROAGENT_TEST_LANES") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("MICROAGENT_TEST_LANES must be a whole number of at least 1, not {v:?}"),
        },
        Err(_) => Ok(cores()),
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `binaries`: those that run alone first, one at a time, then the
/// rest in `lanes` lanes, with as many tests at once in all as there are
/// cores (the long tests are bound by their guests' emulated kernel code,
/// so more at once only stretches each toward its deadlines); what they
/// report added to `tally`. `threads_set`: the developer's own
/// `RUST_TEST_THREADS`, passed through.
fn run_binaries(
    binaries: Vec<test_lanes::TestBinary>,
    lanes: usize,
    threads_set: Option<String>,
    skip_log: &std::path::Path,
    tally: Tally,
) -> Tally {
    let (alone, shared): (Vec<_>, Vec<_>) = binaries
        .into_iter()
        .partition(|b| test_lanes::runs_alone(&b.target));
    let tally = Mutex::new(tally);
    let done = |finished: test_lanes::Finished| {
        let mut tally = tally.lock().unwrap_or_else(|p| p.into_inner());
        tally.add(&finished.stdout, finished.success, &finished.binary.source);
        let target = &finished.binary.target;
        tally.test_seconds.extend(
            finished
                .test_seconds
                .into_iter()
                .map(|(test, s)| (format!("{target}: {test}"), s)),
        );
    };
    for (binaries, lanes) in [(alone, 1), (shared, lanes)] {
        if binaries.is_empty() {
            continue;
        }
        let threads = threads_set
            .clone()
            .unwrap_or_else(|| (cores() / lanes).max(1).to_string());
        eprintln!(
            "xtask: {} test binaries in {lanes} lane(s), {threads} test(s) at once in each",
            binaries.len()
        );
        let env = [
            ("MICROAGENT_SKIP_LOG", skip_log.as_os_str()),
            ("RUST_TEST_THREADS", std::ffi::OsStr::new(&threads)),
        ];
        test_lanes::run(binaries, lanes, &env, done);
    }
    tally.into_inner().unwrap_or_else(|p| p.into_inner())
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let root = cache::repo_root();
    let cargo = env!("CARGO");
    let quick = args.iter().any(|a| a == "--no-lint");
    if !quick {
        eprintln!("xtask: cargo fmt --check");
        sh::run(
            Command::new(cargo)
                .args(["fmt", "--all", "--", "--check"])
                .current_dir(&root),
        )?;
        // The workspace with the test features; then the VMM package
        // alone, the base crate as the shipped VMM process builds it
        // (the workspace-wide run unifies features and would not see an
        // item that needs one).
        let vmm_alone: &[&str] = &["-p", "microagent-vmm"];
        let workspace = ["--workspace", "--all-targets", "--features", TEST_FEATURES];
        for selection in [&workspace[..], vmm_alone] {
            eprintln!("xtask: cargo clippy {}", selection.join(" "));
            sh::run(
                Command::new(cargo)
                    .arg("clippy")
                    .args(selection)
                    .args(["--quiet", "--", "-D", "warnings"])
                    .current_dir(&root),
            )?;
        }
        // The virtio queue fuzzers on the stable toolchain, for a bounded
        // time (`cargo xtask fuzz` runs them longer); a panic fails the run.
        eprintln!("xtask: fuzz ({FUZZ_SECONDS} s)");
        crate::fuzz::run(&["--seconds".to_owned(), FUZZ_SECONDS.to_string()])?;
    }
    let skip_log =
        std::env::temp_dir().join(format!("microagent-skips-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&skip_log);
    // Every test binary runs: one failure must not hide the others.
    let selection = ["--workspace", "--features", TEST_FEATURES];
    let mut binaries = test_lanes::build(cargo, &root, &selection)?;
    // `--only a,b`: just those test binaries (by target name), no doc tests.
    let only: Option<Vec<&str>> = args.iter().position(|a| a == "--only").map(|i| {
        args.get(i + 1)
            .map_or("", |v| v.as_str())
            .split(',')
            .collect()
    });
    if let Some(only) = &only {
        binaries.retain(|b| only.contains(&b.target.as_str()));
        if binaries.is_empty() {
            bail!(
                "--only names no test binary (their names: the files under tests/, or a crate's)"
            );
        }
    }
    let mut tally = Tally::default();
    if only.is_none() {
        // The documentation's examples first (rustdoc builds each; short).
        let doc = Command::new(cargo)
            .args(["test", "--doc"])
            .args(selection)
            .current_dir(&root)
            .stdout(Stdio::piped())
            .output()?;
        let doc_out = String::from_utf8_lossy(&doc.stdout);
        print!("{doc_out}");
        tally.add(&doc_out, doc.status.success(), "doc tests");
    }
    let threads_set = std::env::var("RUST_TEST_THREADS").ok();
    let tally = run_binaries(binaries, lanes()?, threads_set, &skip_log, tally);
    let Tally {
        counts,
        results,
        failed_binaries,
        mut test_seconds,
    } = tally;
    let skips = std::fs::read_to_string(&skip_log).unwrap_or_default();
    let _ = std::fs::remove_file(&skip_log);
    let skipped = skips.lines().filter(|l| !l.trim().is_empty()).count() as u64;
    for line in skips.lines() {
        println!("skipped: {line}");
    }
    let passed = counts.passed.saturating_sub(skipped);
    // Where the run's time went, for whoever shortens it next.
    test_seconds.sort_by(|a, b| b.1.total_cmp(&a.1));
    if !test_seconds.is_empty() {
        println!("slowest tests (those run one at a time):");
    }
    for (test, s) in test_seconds.iter().take(SLOWEST_SHOWN) {
        println!("  {s:>6.0} s  {test}");
    }
    println!(
        "summary: {passed} passed, {} failed, {skipped} skipped",
        counts.failed
    );
    for source in &failed_binaries {
        println!("failed: {source}");
    }
    if !failed_binaries.is_empty() || counts.failed > 0 {
        bail!("tests failed");
    }
    if results == 0 {
        bail!("no test results were seen");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libtest_summaries() {
        let mut c = Counts::default();
        assert!(add_result_line("test result: ok. 47 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.13s", &mut c));
        assert!(add_result_line(
            "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            &mut c
        ));
        assert!(!add_result_line("running 3 tests", &mut c));
        assert_eq!(
            c,
            Counts {
                passed: 50,
                failed: 1,
                ignored: 2
            }
        );
    }

    #[test]
    fn a_binary_that_fails_without_a_result_line_is_still_a_failure() {
        let mut t = Tally::default();
        t.add(
            "running 2 tests\ntest result: ok. 2 passed; 0 failed; 0 ignored\n",
            true,
            "a",
        );
        t.add("thread 'main' panicked\n", false, "crates/x/tests/b.rs");
        assert_eq!(t.counts.passed, 2);
        assert_eq!(t.results, 1);
        assert_eq!(t.failed_binaries, ["crates/x/tests/b.rs"]);
    }

    #[test]
    fn binaries_that_run_alone_come_first_with_every_core_then_the_rest_in_lanes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("xtask-lanes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let binary = |target: &str, status: u8| {
            let exe = dir.join(target);
            std::fs::write(
                &exe,
                format!(
                    "#!/bin/sh\necho \"{target} $RUST_TEST_THREADS $MICROAGENT_SKIP_LOG\" >> {}\n\
                     echo 'test result: ok. 1 passed; 0 failed; 0 ignored'\nexit {status}\n",
                    log.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
            test_lanes::TestBinary {
                target: target.into(),
                source: format!("tests/{target}.rs"),
                exe,
                package_dir: dir.clone(),
            }
        };
        let binaries = vec![
            binary("workspace_e2e", 0),
            binary("browser_e2e", 0),
            binary("network_e2e", 1),
        ];
        let skips = dir.join("skips");
        let tally = run_binaries(binaries, 2, None, &skips, Tally::default());
        let ran = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = ran.lines().collect();
        let all = cores().to_string();
        let shared = (cores() / 2).max(1).to_string();
        let skips = skips.display().to_string();
        assert_eq!(lines.len(), 3, "{ran}");
        assert_eq!(lines[0], format!("browser_e2e {all} {skips}"), "{ran}");
        for target in ["workspace_e2e", "network_e2e"] {
            assert!(
                lines[1..].contains(&format!("{target} {shared} {skips}").as_str()),
                "{ran}"
            );
        }
        assert_eq!(tally.counts.passed, 3);
        assert_eq!(tally.results, 3);
        assert_eq!(tally.failed_binaries, ["tests/network_e2e.rs"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
