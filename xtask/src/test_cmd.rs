//! `cargo xtask test`: formatting, lints, then every test, ending with one
//! "N passed, N failed, N skipped" line. Tests that cannot run here (no
//! /dev/kvm, no guest assets) record why in a skip log (see testkit); they
//! are counted as skipped, not passed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::bail;

use crate::{cache, sh};

#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
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
    let mut child = Command::new(cargo)
        // Every test binary runs: one failure must not hide the others.
        .args([
            "test",
            "--workspace",
            "--no-fail-fast",
            "--features",
            TEST_FEATURES,
        ])
        .env("MICROAGENT_SKIP_LOG", &skip_log)
        .current_dir(&root)
        .stdout(Stdio::piped())
        .spawn()?;
    let mut counts = Counts::default();
    let mut results = 0;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            if add_result_line(&line, &mut counts) {
                results += 1;
            }
        }
    }
    let status = child.wait()?;
    let skips = std::fs::read_to_string(&skip_log).unwrap_or_default();
    let _ = std::fs::remove_file(&skip_log);
    let skipped = skips.lines().filter(|l| !l.trim().is_empty()).count() as u64;
    for line in skips.lines() {
        println!("skipped: {line}");
    }
    let passed = counts.passed.saturating_sub(skipped);
    println!(
        "summary: {passed} passed, {} failed, {skipped} skipped",
        counts.failed
    );
    if !status.success() || counts.failed > 0 {
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
}
