//! `cargo xtask soak`: the guest stress check of docs/host-compat.md with a
//! fixed, larger count: the real-guest agent test (`guest_e2e`) run for
//! several rounds, each a fresh boot that starts `--processes` short-lived
//! processes after heavy file I/O. It stops at the first round that fails;
//! the test prints the guest console's fault lines and tail. `--cmdline`
//! adds guest kernel options, so a host that shows faults can measure
//! whether an option (e.g. `nofsgsbase`) makes them go away.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::cache;

/// Processes per round unless `--processes` says otherwise.
const DEFAULT_PROCESSES: u32 = 1000;
/// Rounds unless `--rounds` says otherwise.
const DEFAULT_ROUNDS: u32 = 3;

#[derive(Debug, PartialEq, Eq)]
struct SoakArgs {
    processes: u32,
    rounds: u32,
    /// Extra guest kernel options (e.g. `nofsgsbase`), to measure whether
    /// one makes faults go away on a host that shows them.
    cmdline: String,
}

fn parse(args: &[String]) -> anyhow::Result<SoakArgs> {
    let mut parsed = SoakArgs {
        processes: DEFAULT_PROCESSES,
        rounds: DEFAULT_ROUNDS,
        cmdline: String::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = |it: &mut std::slice::Iter<'_, String>| -> anyhow::Result<u32> {
            let v = it
                .next()
                .with_context(|| format!("{flag} needs a number"))?;
            match v.parse::<u32>() {
                Ok(n) if n > 0 => Ok(n),
                _ => bail!("{flag} takes a whole number above 0, not `{v}`"),
            }
        };
        match flag.as_str() {
            "--processes" => parsed.processes = value(&mut it)?,
            "--rounds" => parsed.rounds = value(&mut it)?,
            "--cmdline" => {
                parsed.cmdline = it
                    .next()
                    .context("--cmdline needs the guest kernel options")?
                    .clone()
            }
            other => bail!(
                "unknown option `{other}`; usage: cargo xtask soak [--processes N] [--rounds N] [--cmdline OPTIONS]"
            ),
        }
    }
    Ok(parsed)
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let args = parse(args)?;
    let root = cache::repo_root();
    let cargo = env!("CARGO");
    for round in 1..=args.rounds {
        eprintln!(
            "xtask: soak round {round}/{}: {} processes in one booted guest{}",
            args.rounds,
            args.processes,
            if args.cmdline.is_empty() {
                String::new()
            } else {
                format!(" (guest kernel options: {})", args.cmdline)
            }
        );
        let began = Instant::now();
        let status = Command::new(cargo)
            .args([
                "test",
                "-p",
                "guest-agent",
                "--test",
                "guest_e2e",
                "--",
                "--nocapture",
            ])
            .env("MICROAGENT_STRESS_PROCESSES", args.processes.to_string())
            .env("MICROAGENT_SOAK_CMDLINE", &args.cmdline)
            .current_dir(&root)
            .status()
            .context("could not run cargo test")?;
        if !status.success() {
            bail!(
                "soak round {round} failed after {:.0} s (the test output above has the guest console)",
                began.elapsed().as_secs_f64()
            );
        }
        eprintln!(
            "xtask: soak round {round} passed in {:.0} s",
            began.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "xtask: soak passed: {} rounds of {} processes, no guest process faulted",
        args.rounds, args.processes
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_counts_and_refuses_bad_ones() {
        assert_eq!(
            parse(&[]).unwrap(),
            SoakArgs {
                processes: DEFAULT_PROCESSES,
                rounds: DEFAULT_ROUNDS,
                cmdline: String::new()
            }
        );
        assert_eq!(
            parse(&strings(&[
                "--processes",
                "50",
                "--rounds",
                "2",
                "--cmdline",
                "nofsgsbase"
            ]))
            .unwrap(),
            SoakArgs {
                processes: 50,
                rounds: 2,
                cmdline: "nofsgsbase".into()
            }
        );
        for bad in [
            &["--processes"][..],
            &["--processes", "0"],
            &["--rounds", "x"],
            &["--fast"],
            &["--cmdline"],
        ] {
            assert!(parse(&strings(bad)).is_err(), "{bad:?}");
        }
    }
}
