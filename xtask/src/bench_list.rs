//! `cargo xtask bench list [--workspaces N] [--release]`: how long `list`
//! takes over N workspaces (default 1000) in one state directory, as a
//! user runs it (the whole `microagent list` process, table and `--json`),
//! median of several, beside `microagent --version` as the process's own
//! floor. The workspaces are made by `create` (stopped, each with its
//! record and sparse disk), one command each, as a user would.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::bench_workspace::{microagent, microagent_output, private_home};
use crate::{cache, images};

/// Listings timed of each kind.
const RUNS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Reads `[--workspaces N] [--release]`.
fn parse(args: &[String]) -> anyhow::Result<(usize, bool)> {
    let release = args.iter().any(|a| a == "--release");
    let rest: Vec<&String> = args.iter().filter(|a| *a != "--release").collect();
    let n = match rest.as_slice() {
        [] => 1000,
        [flag, n] if *flag == "--workspaces" => n.parse().context("--workspaces takes a number")?,
        _ => bail!("usage: cargo xtask bench list [--workspaces N] [--release]"),
    };
    if n == 0 {
        bail!("--workspaces must be at least 1");
    }
    Ok((n, release))
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let (n, release) = parse(args)?;
    images::run(&["minimal".to_string()])?;
    let bin = cache::build_microagent_as(release)?;
    let home = private_home("blist")?;
    let result = measure(&bin, &home, n);
    let _ = std::fs::remove_dir_all(&home);
    result
}

/// Milliseconds `microagent ARGS` takes, whole process, median of `RUNS`.
fn timed(bin: &Path, home: &Path, args: &[&str]) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        microagent_output(bin, home, args)?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(median(times))
}

fn measure(bin: &Path, home: &Path, n: usize) -> anyhow::Result<()> {
    let began = Instant::now();
    for i in 0..n {
        microagent(
            bin,
            home,
            &["create", &format!("w{i}"), "--image", "minimal", "--json"],
        )
        .with_context(|| format!("workspace {} of {n}", i + 1))?;
        if (i + 1) % 100 == 0 {
            eprintln!(
                "xtask: {} workspaces created ({:.0} s)",
                i + 1,
                began.elapsed().as_secs_f64()
            );
        }
    }
    let listed = microagent(bin, home, &["list", "--json"])?;
    let count = listed.as_array().map_or(0, Vec::len);
    if count != n {
        bail!("list shows {count} workspaces of {n}");
    }
    let json = timed(bin, home, &["list", "--json"])?;
    let table = timed(bin, home, &["list"])?;
    let floor = timed(bin, home, &["--version"])?;
    println!("list: {n} workspaces (stopped, as `create` makes them), whole `microagent` process:");
    println!("  list --json                     {json:>8.1} ms median of {RUNS}");
    println!("  list (table)                    {table:>8.1} ms median of {RUNS}");
    println!("  microagent --version (floor)    {floor:>8.1} ms median of {RUNS}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn workspaces_and_release_are_read_and_checked() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(parse(&args(&[])).unwrap(), (1000, false));
        assert_eq!(
            parse(&args(&["--release", "--workspaces", "50"])).unwrap(),
            (50, true)
        );
        assert!(parse(&args(&["--workspaces", "0"])).is_err());
        assert!(parse(&args(&["--runs", "3"])).is_err());
    }
}
