//! `cargo xtask bench devices`: virtio-vsock throughput and round-trip
//! latency (host -> guest echo) and virtio-blk sequential read throughput,
//! each beside the same operation on the host's own loopback (a Unix socket
//! echo thread, a plain file read) measured in the same run.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::{cache, kernel, rootfs, sh};

const DISK_BYTES: usize = 16 << 20;
const STREAM_BYTES: usize = 4 << 20;
const STEP: usize = 64 << 10;
const PINGS: usize = 200;

struct Figures {
    rtt_us: f64,
    stream_mib_s: f64,
}

/// Round trips of one byte, then a stream echoed in STEP-sized steps.
fn measure_echo(conn: &mut UnixStream) -> anyhow::Result<Figures> {
    let mut byte = [0u8; 1];
    let start = Instant::now();
    for _ in 0..PINGS {
        conn.write_all(&[7])?;
        conn.read_exact(&mut byte)?;
    }
    let rtt_us = start.elapsed().as_secs_f64() * 1e6 / PINGS as f64;
    let chunk = vec![0x5au8; STEP];
    let mut back = vec![0u8; STEP];
    let start = Instant::now();
    for _ in 0..STREAM_BYTES / STEP {
        conn.write_all(&chunk)?;
        conn.read_exact(&mut back)?;
    }
    // Each byte crossed twice (there and back).
    let stream_mib_s = (2 * STREAM_BYTES) as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64();
    Ok(Figures {
        rtt_us,
        stream_mib_s,
    })
}

fn host_echo() -> anyhow::Result<Figures> {
    let (mut a, mut b) = UnixStream::pair()?;
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; STEP];
        while let Ok(n) = b.read(&mut buf) {
            if n == 0 || b.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let figures = measure_echo(&mut a)?;
    drop(a);
    let _ = echo.join();
    Ok(figures)
}

fn host_file_read(path: &Path) -> anyhow::Result<f64> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    let mut total = 0;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n;
    }
    Ok(total as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64())
}

fn row(name: &str, unit: &str, guest: f64, host: f64) {
    println!("{name:<34} guest {guest:>12.2} {unit:<6} host loopback {host:>12.2} {unit:<6} guest/host {:>8.4}", guest / host);
}

pub fn run() -> anyhow::Result<()> {
    let profile = vmm_core::host::probe()?;
    let vmlinux = kernel::build(profile.kernel_variant())?;
    let root = rootfs::build()?;
    sh::run(
        Command::new(env!("CARGO"))
            .args(["build", "--release", "--quiet", "-p", "microagent"])
            .current_dir(cache::repo_root()),
    )?;
    let dir = std::env::temp_dir().join(format!("microagent-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let disk = dir.join("data.img");
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 31 + 7) as u8).collect();
    let mut f = std::fs::File::create(&disk)?;
    for _ in 0..DISK_BYTES >> 20 {
        f.write_all(&block)?;
    }
    f.sync_all()?;
    drop(f);
    let host_file = host_file_read(&disk)?;
    let host = host_echo()?;

    let uds = dir.join("vsock.sock");
    let mut child = Command::new(cache::repo_root().join("target/release/microagent"))
        .args([
            "vmm",
            "boot",
            "--timeout",
            "600",
            "--mem-mib",
            "128",
            "--cpu-template",
            profile.cpu_template().name(),
            "--kernel",
        ])
        .arg(&vmlinux)
        .arg("--disk")
        .arg(format!("{}:ro", root.display()))
        .arg("--disk")
        .arg(format!("{}:ro", disk.display()))
        .arg("--vsock")
        .arg(&uds)
        .args([
            "--cmdline",
            "root=/dev/vda ro rootfstype=ext4 init=/init -- bench",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut console = BufReader::new(child.stdout.take().context("no console")?);
    let mut blk = None;
    let mut line = String::new();
    while console.read_line(&mut line)? > 0 {
        if let Some(rest) = line.trim().strip_prefix("MICROAGENT-DEVTEST blk-read ") {
            let field = |k: &str| {
                rest.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            blk = Some(
                field("bytes=").context("bytes")?
                    / (1 << 20) as f64
                    / (field("ns=").context("ns")? / 1e9),
            );
        }
        if line.contains("listening 5000") {
            break;
        }
        if line.contains("FAIL") {
            bail!("the guest failed: {line}");
        }
        line.clear();
    }
    let blk = blk.context("the guest never reported its disk read")?;
    let mut conn = UnixStream::connect(&uds)?;
    conn.set_read_timeout(Some(Duration::from_secs(120)))?;
    conn.write_all(b"CONNECT 5000\n")?;
    let mut ok = [0u8; 32];
    let n = conn.read(&mut ok)?;
    if !ok[..n].starts_with(b"OK ") {
        bail!(
            "vsock handshake failed: {:?}",
            String::from_utf8_lossy(&ok[..n])
        );
    }
    let guest = measure_echo(&mut conn)?;
    drop(conn);
    // Let the guest see EOF and reboot; the rest of the console is not needed.
    std::thread::spawn(move || std::io::copy(&mut console, &mut std::io::sink()));
    let status = child.wait()?;
    std::fs::remove_dir_all(&dir)?;
    println!(
        "host: KVM {} ({:.1} ns per ring-0 loop iteration); guest 1 vCPU, 128 MiB; disk {} MiB read with O_DIRECT in 1 MiB reads; vsock {} pings, {} MiB echoed in {} KiB steps",
        profile.mode.name(),
        profile.ring0_ns_per_iteration,
        DISK_BYTES >> 20,
        PINGS,
        STREAM_BYTES >> 20,
        STEP >> 10
    );
    row("vsock round trip (1 byte)", "us", guest.rtt_us, host.rtt_us);
    row(
        "vsock echo throughput",
        "MiB/s",
        guest.stream_mib_s,
        host.stream_mib_s,
    );
    row("virtio-blk sequential read", "MiB/s", blk, host_file);
    if !status.success() {
        bail!("the guest did not stop cleanly ({status})");
    }
    Ok(())
}
