//! What the benches of many idle forks share (`bench density`, `bench
//! idle`): their arguments, a running `minimal` workspace's snapshot `s1`
//! to fork, the forks `f0`, `f1`, ..., the processes serving their private
//! state directory, and the clean-up.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::bench_workspace::microagent;
use crate::{cache, images, kernel};

/// A bench's `[--forks N] [--release]`.
#[derive(Debug)]
pub(crate) struct ForkArgs {
    pub(crate) forks: usize,
    pub(crate) release: bool,
}

impl ForkArgs {
    /// Reads `args`: N defaults to `default` and must be at least `least`.
    pub(crate) fn parse(
        args: &[String],
        bench: &str,
        default: usize,
        least: usize,
    ) -> anyhow::Result<Self> {
        let release = args.iter().any(|a| a == "--release");
        let args: Vec<&String> = args.iter().filter(|a| *a != "--release").collect();
        let forks: usize = match args.as_slice() {
            [] => default,
            [flag, n] if *flag == "--forks" => n.parse().context("--forks takes a number")?,
            _ => bail!("usage: cargo xtask bench {bench} [--forks N] [--release]"),
        };
        if forks < least {
            bail!("--forks must be at least {least}");
        }
        Ok(Self { forks, release })
    }
}

/// The guest kernel and the `minimal` image built, the front end built
/// (release: the VMM users run; the debug one's heap, relocations and
/// text are larger), and a fresh private state directory.
pub(crate) fn prepare(release: bool, tag: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = cache::build_microagent_as(release)?;
    let home = crate::bench_workspace::private_home(tag)?;
    Ok((bin, home))
}

/// Creates `src` from `minimal` (with `create_args` more), runs a command
/// in it, snapshots it running as `s1` and stops it.
pub(crate) fn snapshot_source(bin: &Path, home: &Path, create_args: &[&str]) -> anyhow::Result<()> {
    let mut create = vec!["create", "src", "--image", "minimal", "--json"];
    create.extend_from_slice(create_args);
    microagent(bin, home, &create)?;
    microagent(bin, home, &["start", "src", "--json"])?;
    microagent(bin, home, &["exec", "src", "--json", "--", "true"])?;
    std::thread::sleep(Duration::from_secs(5));
    microagent(bin, home, &["snapshot", "take", "src", "s1", "--json"])?;
    microagent(bin, home, &["stop", "src", "--json"])?;
    Ok(())
}

/// Forks `s1` as `f{i}`.
pub(crate) fn fork(bin: &Path, home: &Path, i: usize) -> anyhow::Result<()> {
    let name = format!("f{i}");
    microagent(
        bin,
        home,
        &["fork", "src", &name, "--snapshot", "s1", "--json"],
    )?;
    Ok(())
}

/// Whether fork `name` is recorded as paused because it was idle.
pub(crate) fn idle_paused(bin: &Path, home: &Path, name: &str) -> bool {
    microagent(bin, home, &["inspect", name, "--json"])
        .is_ok_and(|v| v["runtime"]["paused"] == "idle")
}

/// Forks at most this many at a time before waiting for them to pause:
/// in its first minutes a restored idle guest costs its VMM a few % of a
/// CPU on a host that emulates guest kernel mode, and about 120 of them
/// at once filled this 2-CPU host until forks timed out.
pub(crate) const FORK_BATCH: usize = 25;

/// Waits until every fork of `0..to` from `from` on is idle-paused (their
/// source made with `--idle-pause`), or fails after `deadline`.
pub(crate) fn wait_paused(
    bin: &Path,
    home: &Path,
    from: usize,
    to: usize,
    deadline: Duration,
) -> anyhow::Result<()> {
    let began = std::time::Instant::now();
    let mut running: Vec<usize> = (from..to).collect();
    loop {
        running.retain(|i| !idle_paused(bin, home, &format!("f{i}")));
        if running.is_empty() {
            return Ok(());
        }
        if began.elapsed() > deadline {
            bail!(
                "{} forks (f{} among them) did not pause within {deadline:?}",
                running.len(),
                running[0]
            );
        }
        std::thread::sleep(Duration::from_secs(5));
    }
}

/// Forks `f{from}` .. `f{to - 1}`, [`FORK_BATCH`] at a time, each batch
/// left to pause idle before the next, so the forks made so far stay
/// idle, paused, at once.
pub(crate) fn fork_paced(bin: &Path, home: &Path, from: usize, to: usize) -> anyhow::Result<()> {
    let mut made = from;
    while made < to {
        let batch_end = (made + FORK_BATCH).min(to);
        for i in made..batch_end {
            fork(bin, home, i).with_context(|| format!("fork {} of {to}", i + 1))?;
        }
        wait_paused(bin, home, made, batch_end, Duration::from_secs(600))?;
        eprintln!("xtask: {batch_end} forks made, every one idle-paused");
        made = batch_end;
    }
    Ok(())
}

/// Halts `f0` .. `f{forks - 1}` and `src`, and removes the directory.
pub(crate) fn clean_up(bin: &Path, home: &Path, forks: usize) {
    for i in 0..forks {
        let _ = microagent(bin, home, &["halt", &format!("f{i}")]);
    }
    let _ = microagent(bin, home, &["halt", "src"]);
    let _ = std::fs::remove_dir_all(home);
}

/// The processes serving `home` (VMMs and passt name it on their command
/// line), with their command lines.
pub(crate) fn processes_of(home: &Path) -> Vec<(u32, String)> {
    let needle = home.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(&needle).then_some((pid, cmdline))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::ForkArgs;

    fn parse(args: &[&str]) -> anyhow::Result<ForkArgs> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        ForkArgs::parse(&args, "idle", 10, 7)
    }

    #[test]
    fn forks_and_release_are_read_and_checked() {
        let plain = parse(&[]).unwrap();
        assert_eq!((plain.forks, plain.release), (10, false));
        let given = parse(&["--release", "--forks", "20"]).unwrap();
        assert_eq!((given.forks, given.release), (20, true));
        assert!(parse(&["--forks", "3"]).is_err());
        assert!(parse(&["--forks", "many"]).is_err());
        let e = parse(&["--runs", "3"]).unwrap_err().to_string();
        assert!(e.contains("bench idle [--forks N]"), "{e}");
    }
}
