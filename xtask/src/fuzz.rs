//! `cargo xtask fuzz [--seconds N]`: feeds pseudo-random queues to the
//! virtio-blk, virtio-vsock and virtio-net queue processing (the same entry points as
//! the cargo-fuzz targets in fuzz/, which need nightly) for a bounded time,
//! on the stable toolchain. Inputs are mostly random with structured
//! descriptor tables, so chains, loops, and out-of-range addresses all occur.
//! The parsers and unpackers of untrusted input take turns with them
//! (`fuzz_inputs`). `--guided TARGET` runs one of the cargo-fuzz targets
//! (the same entry points, coverage-guided) under libFuzzer instead.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmm_core::devices::virtio::fuzz::{
    blk_queue, egress_frames, mmio_registers, net_queue, vsock_queue,
};

use crate::fuzz_inputs::XorShift;

/// An input laid out as the harness maps it: descriptors at 0, avail ring at
/// 0x1000, buffers after; fields biased towards plausible values.
fn input(rng: &mut XorShift) -> Vec<u8> {
    let mut data = vec![0u8; 0x4000];
    for byte in data.iter_mut() {
        *byte = rng.next() as u8;
    }
    for i in 0..16u64 {
        let d = (i * 16) as usize;
        let addr = 0x3000 + (rng.next() % 0x1000);
        let addr = if rng.next().is_multiple_of(8) {
            rng.next()
        } else {
            addr
        };
        let len = if rng.next().is_multiple_of(8) {
            rng.next() as u32
        } else {
            (rng.next() % 0x1200) as u32
        };
        let flags = (rng.next() % 8) as u16; // NEXT, WRITE, INDIRECT
        let next = (rng.next() % 18) as u16;
        data[d..d + 8].copy_from_slice(&addr.to_le_bytes());
        data[d + 8..d + 12].copy_from_slice(&len.to_le_bytes());
        data[d + 12..d + 14].copy_from_slice(&flags.to_le_bytes());
        data[d + 14..d + 16].copy_from_slice(&next.to_le_bytes());
    }
    // avail ring: flags, idx (a few entries), ring of heads.
    let idx = (rng.next() % 20) as u16;
    data[0x1002..0x1004].copy_from_slice(&idx.to_le_bytes());
    for slot in 0..16 {
        let head = (rng.next() % 17) as u16;
        data[0x1004 + slot * 2..0x1006 + slot * 2].copy_from_slice(&head.to_le_bytes());
    }
    data
}

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [--guided TARGET]";

/// The cargo-fuzz targets in fuzz/ (coverage-guided, nightly).
pub const GUIDED_TARGETS: [&str; 11] = [
    "blk_chain",
    "net_chain",
    "vsock_chain",
    "egress_frames",
    "mmio_registers",
    "snapshot_state",
    "agent_frames",
    "control_line",
    "host_write_unpack",
    "oci_apply_layer",
    "oci_config",
];

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut seconds = 30u64;
    let mut guided = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--seconds" => {
                let n = rest.next().context(USAGE)?;
                seconds = n.parse().context("--seconds takes a number")?;
            }
            "--guided" => guided = Some(rest.next().context(USAGE)?.clone()),
            _ => bail!(USAGE),
        }
    }
    if let Some(target) = guided {
        return run_guided(&target, seconds);
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    println!(
        "fuzzing virtio queues, virtio-mmio registers, egress frames, snapshot state, agent frames, control lines and archive unpacking for {seconds} s (seed {seed:#x})"
    );
    let mut rng = XorShift(seed);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut runs = 0u64;
    while Instant::now() < deadline {
        let data = input(&mut rng);
        // A panic aborts the run with the backtrace; the seed reproduces it.
        blk_queue(&data);
        vsock_queue(&data);
        net_queue(&data);
        egress_frames(&crate::fuzz_inputs::frames(&mut rng));
        mmio_registers(&crate::fuzz_inputs::mmio_accesses(&mut rng));
        crate::fuzz_inputs::snapshot_state(&mut rng);
        crate::fuzz_inputs::agent_frames(&mut rng);
        crate::fuzz_inputs::control_line(&mut rng);
        // The unpackers touch the disk: one turn in eight.
        if runs.is_multiple_of(8) {
            crate::fuzz_inputs::host_write_unpack(&mut rng);
            crate::fuzz_inputs::oci_apply_layer(&mut rng);
            crate::fuzz_inputs::oci_config(&mut rng);
        }
        runs += 1;
    }
    println!(
        "{runs} inputs per target ({} per unpacker), no panic, nothing escaped",
        runs.div_ceil(8)
    );
    Ok(())
}

/// One cargo-fuzz target under libFuzzer for `seconds`, with its corpus
/// in fuzz/corpus/TARGET (kept between runs).
fn run_guided(target: &str, seconds: u64) -> anyhow::Result<()> {
    if !GUIDED_TARGETS.contains(&target) {
        bail!(
            "no fuzz target `{target}`; the targets are {}",
            GUIDED_TARGETS.join(", ")
        );
    }
    let fuzz_dir = crate::cache::repo_root().join("fuzz");
    let status = std::process::Command::new("cargo")
        .args(["+nightly", "fuzz", "run", target, "--"])
        .arg(format!("-max_total_time={seconds}"))
        .current_dir(&fuzz_dir)
        .status()
        .context("running `cargo +nightly fuzz` (rustup toolchain install nightly; cargo install cargo-fuzz)")?;
    if !status.success() {
        bail!("cargo fuzz run {target} failed ({status}); a crash's input is in fuzz/artifacts/{target}/");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--guided` knows every cargo-fuzz target and no other.
    #[test]
    fn the_guided_targets_are_the_fuzz_crates_binaries() {
        let manifest =
            std::fs::read_to_string(crate::cache::repo_root().join("fuzz/Cargo.toml")).unwrap();
        let mut named: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|n| *n != "microagent-fuzz")
            .collect();
        named.sort_unstable();
        let mut known = GUIDED_TARGETS.to_vec();
        known.sort_unstable();
        assert_eq!(named, known);
        for target in GUIDED_TARGETS {
            let file = format!("fuzz/fuzz_targets/{target}.rs");
            assert!(crate::cache::repo_root().join(&file).exists(), "{file}");
        }
    }
}
