//! `cargo xtask fuzz [--seconds N]`: feeds pseudo-random queues to the
//! virtio-blk, virtio-vsock and virtio-net queue processing (the same entry points as
//! the cargo-fuzz targets in fuzz/, which need nightly) for a bounded time,
//! on the stable toolchain. Inputs are mostly random with structured
//! descriptor tables, so chains, loops, and out-of-range addresses all occur.
//! The parsers and unpackers of untrusted input take turns with them
//! (`fuzz_inputs`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vmm_core::devices::virtio::fuzz::{blk_queue, net_queue, vsock_queue};

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

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let seconds: u64 = match args {
        [] => 30,
        [flag, n] if flag == "--seconds" => n.parse().context("--seconds takes a number")?,
        _ => bail!("usage: cargo xtask fuzz [--seconds N]"),
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    println!(
        "fuzzing virtio queues, snapshot state, agent frames, control lines and archive unpacking for {seconds} s (seed {seed:#x})"
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
        crate::fuzz_inputs::snapshot_state(&mut rng);
        crate::fuzz_inputs::agent_frames(&mut rng);
        crate::fuzz_inputs::control_line(&mut rng);
        // The unpackers touch the disk: one turn in eight.
        if runs.is_multiple_of(8) {
            crate::fuzz_inputs::host_write_unpack(&mut rng);
            crate::fuzz_inputs::oci_apply_layer(&mut rng);
        }
        runs += 1;
    }
    println!(
        "{runs} inputs per target ({} per unpacker), no panic, nothing escaped",
        runs.div_ceil(8)
    );
    Ok(())
}
