//! `cargo xtask bench agent`: guest agent figures, each beside the same
//! operation against the agent running as a host process in the same run:
//! exec round trip of `true`, a background process's start to its first
//! output, and file write and read throughput. Then exec of `true` through
//! the CLI in a workspace, beside the agent's own measure of the same exec
//! and beside a bare fork+exec+wait of `true` timed inside the guest (the
//! floor under any exec path on the host at hand).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use guest_agent::client::{AgentEndpoint, ExecStdin};
use guest_agent::protocol::{ExecCall, WriteMode};

use crate::bench_workspace::microagent;
use crate::{cache, images, kernel, sh};

const EXECS: usize = 10;
const FILE_BYTES: usize = 4 << 20;
const AGENT_PORT: u32 = 1024;

/// CLI execs timed, and floor runs inside the guest.
const CLI_EXECS: usize = 15;

struct Figures {
    exec_ms: f64,
    process_first_output_ms: f64,
    write_mib_s: f64,
    read_mib_s: f64,
}

/// `process_start` of `echo`, then `process_output` (long-polling) until
/// its output is there; the mean over EXECS / 2 processes.
async fn process_first_output_ms(endpoint: &AgentEndpoint) -> anyhow::Result<f64> {
    let runs = EXECS / 2;
    let start = Instant::now();
    let mut ids = Vec::new();
    for _ in 0..runs {
        let info = endpoint
            .connect()
            .await?
            .process_start(ExecCall::argv(["echo", "first"]))
            .await?;
        loop {
            let read = endpoint
                .connect()
                .await?
                .process_output(&info.id, [0, 0], None, Duration::from_secs(30))
                .await?;
            if !read.stdout.is_empty() {
                break;
            }
        }
        ids.push(info.id);
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / runs as f64;
    for id in ids {
        let client = endpoint.connect().await?;
        client.process_wait(&id, Duration::from_secs(30)).await?;
        endpoint.connect().await?.process_remove(&id).await?;
    }
    Ok(ms)
}

async fn measure(endpoint: &AgentEndpoint) -> anyhow::Result<Figures> {
    let start = Instant::now();
    for _ in 0..EXECS {
        let out = endpoint
            .connect()
            .await?
            .exec_collect(ExecCall::argv(["true"]), ExecStdin::None)
            .await?;
        if !out.exited.success() {
            bail!("`true` failed: {:?}", out.exited);
        }
    }
    let exec_ms = start.elapsed().as_secs_f64() * 1e3 / EXECS as f64;
    let process_first_output_ms = process_first_output_ms(endpoint).await?;
    let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 13) as u8).collect();
    let mib = FILE_BYTES as f64 / (1 << 20) as f64;
    let start = Instant::now();
    endpoint
        .connect()
        .await?
        .write_file(
            "/tmp/microagent-bench.bin",
            WriteMode::Truncate,
            None,
            &data,
        )
        .await?;
    let write_mib_s = mib / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let back = endpoint
        .connect()
        .await?
        .read_file("/tmp/microagent-bench.bin")
        .await?;
    let read_mib_s = mib / start.elapsed().as_secs_f64();
    if back != data {
        bail!("file read back differs");
    }
    endpoint
        .connect()
        .await?
        .remove("/tmp/microagent-bench.bin", false)
        .await?;
    Ok(Figures {
        exec_ms,
        process_first_output_ms,
        write_mib_s,
        read_mib_s,
    })
}

async fn wait_for_agent(endpoint: &AgentEndpoint, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(client) = endpoint.connect().await {
            if client.hello().await.is_ok() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("the agent did not answer within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn row(name: &str, unit: &str, guest: f64, host: f64) {
    println!("{name:<28} guest {guest:>10.2} {unit:<6} host process {host:>10.2} {unit:<6} guest/host {:>9.3}", guest / host);
}

pub fn run() -> anyhow::Result<()> {
    let profile = vmm_core::host::probe()?;
    let vmlinux = kernel::build(profile.kernel_variant())?;
    images::run(&["minimal".to_string()])?;
    let image = cache::root()?.join("current/rootfs-minimal.ext4");
    sh::run(
        Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--quiet",
                "-p",
                "microagent",
                "-p",
                "guest-agent",
            ])
            .current_dir(cache::repo_root()),
    )?;
    let release = cache::repo_root().join("target/release");
    let dir = std::env::temp_dir().join(format!("microagent-bench-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    let host_sock = dir.join("agent.sock");
    let mut host_agent = Command::new(release.join("microagent-agent"))
        .arg("--unix")
        .arg(&host_sock)
        .spawn()?;
    let host_endpoint = AgentEndpoint::Unix(host_sock);
    let host = rt.block_on(async {
        wait_for_agent(&host_endpoint, Duration::from_secs(10)).await?;
        measure(&host_endpoint).await
    });
    let _ = host_agent.kill();
    let _ = host_agent.wait();
    let host = host?;

    let layer = dir.join("layer.ext4");
    std::fs::File::create(&layer)?.set_len(64 << 20)?;
    sh::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&layer))?;
    let uds = dir.join("vsock.sock");
    let mut vm = Command::new(release.join("microagent"))
        .args([
            "vmm",
            "boot",
            "--timeout",
            "900",
            "--mem-mib",
            "256",
            "--console",
            "/dev/null",
            "--cpu-template",
            profile.cpu_template().name(),
            "--kernel",
        ])
        .arg(&vmlinux)
        .arg("--disk")
        .arg(format!("{}:ro", image.display()))
        .arg("--disk")
        .arg(&layer)
        .arg("--vsock")
        .arg(&uds)
        .args([
            "--cmdline",
            "root=/dev/vda ro rootfstype=ext4 microagent_overlay=/dev/vdb",
        ])
        .stdout(Stdio::null())
        .spawn()?;
    let guest_endpoint = AgentEndpoint::HybridVsock {
        uds,
        port: AGENT_PORT,
    };
    let guest = rt.block_on(async {
        wait_for_agent(&guest_endpoint, Duration::from_secs(300)).await?;
        let figures = measure(&guest_endpoint).await?;
        guest_endpoint.connect().await?.shutdown().await?;
        anyhow::Ok(figures)
    });
    let guest = match guest {
        Ok(g) => g,
        Err(e) => {
            let _ = vm.kill();
            return Err(e).context("measuring the agent in the guest");
        }
    };
    let status = vm.wait()?;
    std::fs::remove_dir_all(&dir)?;
    println!(
        "host: KVM {} ({:.1} ns per ring-0 loop iteration); guest 1 vCPU, 256 MiB, minimal image; {EXECS} execs, {} MiB file",
        profile.mode.name(),
        profile.ring0_ns_per_iteration,
        FILE_BYTES >> 20
    );
    row("exec `true` round trip", "ms", guest.exec_ms, host.exec_ms);
    row(
        "process start to 1st output",
        "ms",
        guest.process_first_output_ms,
        host.process_first_output_ms,
    );
    row("file write", "MiB/s", guest.write_mib_s, host.write_mib_s);
    row("file read", "MiB/s", guest.read_mib_s, host.read_mib_s);
    if !status.success() {
        bail!("the guest did not stop cleanly ({status})");
    }
    exec_floor(&release.join("microagent"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Exec of `true` through the CLI in a workspace of a private state
/// directory, the agent's own spawn-to-exit time of the same execs, and
/// the bare fork+exec+wait floor measured by `guest/forkexec` in the guest.
fn exec_floor(bin: &Path) -> anyhow::Result<()> {
    let forkexec = crate::rootfs::guest_program("forkexec")?;
    let home = std::env::temp_dir().join(format!("microagent-bench-floor-{}", std::process::id()));
    // microagent makes it, private (it refuses one others can read).
    let _ = std::fs::remove_dir_all(&home);
    let run = |args: &[&str]| microagent(bin, &home, args);
    run(&["create", "floor", "--json"])?;
    let measured = (|| {
        run(&["start", "floor", "--json"])?;
        let dst = "floor:/tmp/forkexec";
        run(&[
            "cp",
            forkexec.to_str().context("cache path")?,
            dst,
            "--json",
        ])?;
        let mut cli_ms = Vec::new();
        let mut agent_ms = Vec::new();
        for _ in 0..CLI_EXECS {
            let t = Instant::now();
            let out = run(&["exec", "floor", "--json", "--", "true"])?;
            cli_ms.push(t.elapsed().as_secs_f64() * 1e3);
            agent_ms.push(
                out["wall_ms"]
                    .as_f64()
                    .context("exec result without wall_ms")?,
            );
        }
        let count = CLI_EXECS.to_string();
        let floor = run(&[
            "exec",
            "floor",
            "--json",
            "--",
            "/tmp/forkexec",
            &count,
            "/bin/true",
        ])?;
        let text = floor["stdout"].as_str().unwrap_or_default();
        let floor_us: f64 = text
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("forkexec printed {text:?}"))?;
        anyhow::Ok((median(cli_ms), median(agent_ms), floor_us / 1e3))
    })();
    let _ = run(&["delete", "floor", "--force", "--yes", "--json"]);
    let _ = std::fs::remove_dir_all(&home);
    let (cli, agent, floor) = measured?;
    println!("exec `true` in a workspace (1 vCPU, minimal image), medians of {CLI_EXECS}:");
    println!(
        "  `microagent exec WS -- true` (CLI, whole command)  {cli:>9.1} ms  {:>5.2}x the floor",
        cli / floor
    );
    println!(
        "  the same execs as the agent timed them (spawn to exit)  {agent:>9.1} ms  {:>5.2}x",
        agent / floor
    );
    println!("  floor: fork+exec+wait of /bin/true inside the guest  {floor:>9.1} ms");
    Ok(())
}
