//! `cargo xtask bench density [--forks N] [--release]`: how many idle
//! workspaces one host keeps, and what each costs it (`--release`: with
//! the release VMM users run). Forks of one snapshot of a running
//! `minimal` workspace (256 MiB guest), up to 10, 50 and N (default 100)
//! at once, idle-paused (made a batch at a time, each left to pause
//! before the next), every fork's agent having answered; at each step the host PSS of
//! every process of theirs (VMMs and passt), split into what the guests
//! dirtied (their memory mapping's private pages) and what the VMM and
//! passt hold beside it, per fork; beside the guest memory size, the
//! reference a fork that copied its guest would cost.

use std::path::Path;
use std::time::Instant;

use crate::bench_forks::{clean_up, fork_paced, prepare, processes_of, snapshot_source, ForkArgs};

/// The forks' idle pause: short, so a batch pauses soon after it is made.
const IDLE_PAUSE: &str = "30s";

/// Host memory of the forks, KiB.
#[derive(Default)]
pub(crate) struct Memory {
    pub(crate) vmm_pss: u64,
    guest_dirty: u64,
    passt_pss: u64,
}

/// Sums `field` (KiB) over the mappings of `smaps` that `keep` accepts
/// (by their header line).
fn smaps_sum(smaps: &str, field: &str, keep: impl Fn(&str) -> bool) -> u64 {
    let mut sum = 0;
    let mut counting = false;
    for line in smaps.lines() {
        let is_header = line
            .split_whitespace()
            .next()
            .is_some_and(|first| first.contains('-') && !first.ends_with(':'));
        if is_header {
            counting = keep(line);
        } else if counting && line.starts_with(field) {
            sum += line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    sum
}

/// The processes serving `home`, by what they are.
pub(crate) fn memory_of(home: &Path) -> Memory {
    let mut m = Memory::default();
    for (pid, cmdline) in processes_of(home) {
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
        let pss = smaps_sum(&smaps, "Pss:", |_| true);
        if cmdline.contains("passt") {
            m.passt_pss += pss;
        } else if cmdline.contains("serve-workspace") {
            m.vmm_pss += pss;
            // The guest's memory: the snapshot's file, mapped private.
            m.guest_dirty += smaps_sum(&smaps, "Private_Dirty:", |h| h.ends_with("memory.raw"));
        }
    }
    m
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let args = ForkArgs::parse(args, "density", 100, 10)?;
    let (bin, home) = prepare(args.release, "bden")?;
    let result = measure(&bin, &home, args.forks);
    clean_up(&bin, &home, args.forks);
    result
}

fn measure(bin: &Path, home: &Path, forks: usize) -> anyhow::Result<()> {
    // The forks pause when idle, as users' do (and as this host needs to
    // carry many: see FORK_BATCH); a paused fork keeps its memory.
    snapshot_source(bin, home, &["--idle-pause", IDLE_PAUSE])?;
    let guest_kib = 256 * 1024;
    // Never past `forks`: the cleanup halts f0 .. f{forks - 1}.
    let mut steps: Vec<usize> = [10, 50, forks]
        .into_iter()
        .filter(|&s| s <= forks)
        .collect();
    steps.dedup();
    println!("density: forks of one 256 MiB minimal snapshot, idle-paused, every agent answered its fork (KiB per fork):");
    println!(
        "  {:>5}  {:>10}  {:>12}  {:>14}  {:>10}  {:>18}",
        "forks", "host PSS", "guest dirty", "VMM beside it", "passt", "reference: guest"
    );
    let mut made = 0;
    let began = Instant::now();
    for &step in &steps {
        // A fork returns once its agent answered the restored guest's
        // first call; checking each again here would wake them all.
        fork_paced(bin, home, made, step)?;
        made = step;
        eprintln!(
            "xtask: {made} forks idle-paused ({:.0} s)",
            began.elapsed().as_secs_f64()
        );
        let m = memory_of(home);
        let n = made as u64;
        // Printed as measured: a host whose CPUs the idle guests fill
        // (each wakes its emulated kernel) may not reach the next step.
        println!(
            "  {made:>5}  {:>10}  {:>12}  {:>14}  {:>10}  {guest_kib:>18}",
            (m.vmm_pss + m.passt_pss) / n,
            m.guest_dirty / n,
            m.vmm_pss.saturating_sub(m.guest_dirty) / n,
            m.passt_pss / n,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::smaps_sum;

    #[test]
    fn sums_a_field_over_the_mappings_kept() {
        let smaps = "\
7f00-7f10 rw-p 00000000 00:00 0 
Pss:                  4 kB
Private_Dirty:        4 kB
7f10-7f20 rw-p 00000000 08:01 12 /s/snapshots/s1/memory.raw
Pss:                100 kB
Private_Dirty:       60 kB
VmFlags: rd wr mr mw me ac
";
        assert_eq!(smaps_sum(smaps, "Pss:", |_| true), 104);
        assert_eq!(
            smaps_sum(smaps, "Private_Dirty:", |h| h.ends_with("memory.raw")),
            60
        );
    }
}
