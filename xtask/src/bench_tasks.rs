//! `cargo xtask bench tasks`: a task's way to its command, and what tasks
//! cost the host. In one run, on the `debian` image: a cold boot (the
//! reference), a warm start, a warm start with a repository cloned in;
//! then `task run` to its command running (from the task's timings), and
//! the host memory (PSS) of 4 tasks running at once (every process of
//! theirs: VMMs and supervisors).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench_workspace::microagent;
use crate::{cache, images, kernel, sh};

/// Tasks measured at once.
const AT_ONCE: usize = 4;
/// The task command: long enough for all of them to run together.
const COMMAND: &str = "sleep 120; git commit -q --allow-empty -m bench";

fn timed<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, f64)> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64()))
}

fn git(repo: &Path, args: &[&str]) -> anyhow::Result<()> {
    sh::run(
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .env("GIT_AUTHOR_NAME", "bench")
            .env("GIT_AUTHOR_EMAIL", "bench@localhost")
            .env("GIT_COMMITTER_NAME", "bench")
            .env("GIT_COMMITTER_EMAIL", "bench@localhost"),
    )
}

/// PSS of `pid` in KiB, from /proc/PID/smaps_rollup.
fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Every process whose command line mentions `needle`.
fn pids_with(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .collect()
}

pub fn run() -> anyhow::Result<()> {
    sh::ensure_debs(&["git"])?;
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["debian".to_string()])?;
    let bin = cache::build_microagent()?;
    let home = crate::bench_workspace::private_home("btask")?;
    let result = (|| {
        let repo = home.join("proj");
        std::fs::create_dir_all(&repo)?;
        git(&repo, &["init", "-q", "-b", "main"])?;
        std::fs::write(repo.join("README"), "bench\n")?;
        git(&repo, &["add", "."])?;
        git(&repo, &["commit", "-qm", "first"])?;
        let ma = |args: &[&str]| microagent(&bin, &home, args);
        ma(&[
            "repo",
            "allow",
            repo.to_str().unwrap_or(""),
            "--task-command",
            COMMAND,
            "--json",
        ])?;
        std::fs::write(
            home.join("config.json"),
            // One more than measured at once: the task alone may still run.
            format!(r#"{{"task": {{"max_slots": {}}}}}"#, AT_ONCE + 1),
        )?;
        let start = |ws: &str, extra: &[&str]| -> anyhow::Result<f64> {
            let mut args = vec!["create", ws, "--image", "debian", "--mem", "1024", "--json"];
            args.extend_from_slice(extra);
            ma(&args)?;
            let (_, t) = timed(|| ma(&["start", ws, "--json"]))?;
            ma(&["delete", ws, "--force", "--yes", "--json"])?;
            Ok(t)
        };
        // The first start of the shape boots and keeps the warm snapshot.
        let cold = start("cold", &[])?;
        let warm = start("warm", &[])?;
        let cloned = start("cloned", &["--repo", "proj"])?;
        // One task alone, then AT_ONCE together.
        let one = ma(&["task", "run", "--repo", "proj", "--json", "bench alone"])?;
        let id = one["task_id"].as_str().context("no task id")?.to_owned();
        let to_command = wait_command(&bin, &home, &id)?;
        let mut ids = Vec::new();
        for n in 0..AT_ONCE {
            let t = ma(&[
                "task",
                "run",
                "--repo",
                "proj",
                "--json",
                &format!("bench {n}"),
            ])?;
            ids.push(t["task_id"].as_str().context("no task id")?.to_owned());
        }
        for id in &ids {
            wait_command(&bin, &home, id)?;
        }
        let vmm_pss: u64 = pids_with("serve-workspace").into_iter().map(pss_kib).sum();
        let supervisors: u64 = pids_with("supervise").into_iter().map(pss_kib).sum();
        for id in std::iter::once(&id).chain(&ids) {
            ma(&["task", "rm", id, "--force", "--delete-ref", "--json"])?;
        }
        println!("tasks on `debian` (1024 MiB guests), one run:");
        println!("  cold boot (reference)                         {cold:>7.2} s");
        println!("  warm start                                    {warm:>7.2} s");
        println!("  warm start + repository clone                 {cloned:>7.2} s");
        println!("  task run -> task command running              {to_command:>7.2} s");
        println!(
            "  ratio to warm start + clone                   {:>7.2}x (target < 2x)",
            to_command / cloned
        );
        println!(
            "  host PSS of {AT_ONCE} tasks running at once          {:>7} MiB (VMMs {} MiB, supervisors {} MiB)",
            (vmm_pss + supervisors) >> 10,
            vmm_pss >> 10,
            supervisors >> 10
        );
        anyhow::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&home);
    result
}

/// Seconds from task `id`'s creation to its command starting, waiting
/// for it (at most 10 minutes).
fn wait_command(bin: &Path, home: &Path, id: &str) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let info = microagent(bin, home, &["task", "info", id, "--json"])?;
        let t = &info["timings"];
        if let (Some(created), Some(command)) =
            (t["created_ms"].as_u64(), t["command_started_ms"].as_u64())
        {
            return Ok(command.saturating_sub(created) as f64 / 1000.0);
        }
        if info["status"] == "failed" {
            bail!("task {id} failed: {info}");
        }
        if Instant::now() > deadline {
            bail!("task {id} did not reach its command in 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
