//! `cargo xtask bench balloon`: memory a guest frees goes back to the
//! host. A running `minimal` workspace of 1 GiB fills 200 MiB of its
//! tmpfs, then removes it; the VMM's host PSS is read before, after the
//! fill (the reference: what the fill cost the host, in the same run) and
//! every quarter second after the removal, until 150 MiB came back or
//! 30 s passed. The target: at least 150 MiB back within 10 s.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench_workspace::microagent;
use crate::{cache, images, kernel};

const FILL_MIB: u64 = 200;
const TARGET_MIB: u64 = 150;
const TARGET_SECS: f64 = 10.0;
const GIVE_UP: Duration = Duration::from_secs(30);

pub fn run(args: &[String]) -> anyhow::Result<()> {
    if !args.is_empty() {
        bail!("usage: cargo xtask bench balloon");
    }
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = cache::build_microagent()?;
    let home = crate::bench_workspace::private_home("bbal")?;
    let result = measure(&bin, &home);
    let _ = microagent(&bin, &home, &["halt", "b"]);
    let _ = std::fs::remove_dir_all(&home);
    result
}

/// The VMM's PSS, KiB.
fn vmm_pss_kib(home: &Path) -> u64 {
    crate::bench_density::memory_of(home).vmm_pss
}

fn sh(bin: &Path, home: &Path, line: &str) -> anyhow::Result<()> {
    let done = microagent(bin, home, &["exec", "b", "--json", "--shell", "--", line])?;
    if done["exit_code"] != 0 {
        bail!("`{line}` failed in the guest: {done}");
    }
    Ok(())
}

fn measure(bin: &Path, home: &Path) -> anyhow::Result<()> {
    microagent(
        bin,
        home,
        &[
            "create", "b", "--image", "minimal", "--mem", "1024", "--json",
        ],
    )?;
    microagent(bin, home, &["start", "b", "--json"])?;
    sh(bin, home, "true")?;
    std::thread::sleep(Duration::from_secs(5));
    let idle = vmm_pss_kib(home);
    sh(
        bin,
        home,
        &format!("dd if=/dev/zero of=/dev/shm/fill bs=1M count={FILL_MIB} 2>/dev/null"),
    )?;
    std::thread::sleep(Duration::from_secs(3));
    let filled = vmm_pss_kib(home);
    let cost_mib = filled.saturating_sub(idle) as f64 / 1024.0;
    sh(bin, home, "rm /dev/shm/fill").context("freeing the fill")?;
    let freed_at = Instant::now();
    let mut at_target = None;
    let mut at_ten = None;
    let mut last = filled;
    while freed_at.elapsed() < GIVE_UP {
        std::thread::sleep(Duration::from_millis(250));
        last = vmm_pss_kib(home);
        let back_mib = filled.saturating_sub(last) as f64 / 1024.0;
        let secs = freed_at.elapsed().as_secs_f64();
        if secs <= TARGET_SECS {
            at_ten = Some(back_mib);
        }
        if back_mib >= TARGET_MIB as f64 {
            at_target = Some(secs);
            break;
        }
    }
    let metrics = microagent(bin, home, &["metrics", "b", "--json"])?;
    let back_mib = filled.saturating_sub(last) as f64 / 1024.0;
    println!("balloon: a 1 GiB minimal guest fills {FILL_MIB} MiB of tmpfs, then frees it (VMM host PSS):");
    println!(
        "  idle                      {:>8.1} MiB",
        idle as f64 / 1024.0
    );
    println!("  filled                    {:>8.1} MiB  (reference: the fill cost the host {cost_mib:.1} MiB)", filled as f64 / 1024.0);
    println!(
        "  back within {TARGET_SECS:.0} s           {:>8.1} MiB  (target: at least {TARGET_MIB} MiB)",
        at_ten.unwrap_or(0.0)
    );
    match at_target {
        Some(secs) => println!("  {TARGET_MIB} MiB back after       {secs:>8.1} s"),
        None => println!(
            "  {TARGET_MIB} MiB not back in {} s: {back_mib:.1} MiB came back",
            GIVE_UP.as_secs()
        ),
    }
    println!(
        "  the balloon's count       {:>8.1} MiB given back in {} reports",
        metrics["balloon"]["given_back_bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0,
        metrics["balloon"]["reports"].as_u64().unwrap_or(0)
    );
    Ok(())
}
