//! `cargo xtask bench tti [--runs N] [--cold-runs N] [--release]
//! [--restores-only] [--against DIST_DIR [--against-cache DIR]]`: time to interactive, from "create" to the
//! first command's output, as sandbox users compare it. In one run, on
//! the `minimal` image: the reference, a bare `exec -- true` round trip on
//! a running workspace; then the CLI's `create && start && exec -- true`
//! and MCP's `workspace_create` + `workspace_start` + `workspace_exec`
//! (one `serve mcp` session), each from a pool (settled: the refill after
//! the previous claim done), from the warm snapshot, and cold; the CLI's
//! `start` alone, warm beside cold, with the VMM's own steps (launch to
//! vCPU running, to the agent answering); then a snapshot's forks, launch
//! to vCPU running, each in a VMM process started for it and each handed
//! to a standby VMM process made ahead, beside the bare start of the VMM
//! program (`--restores-only`: these alone). Debug
//! binaries unless `--release`. With `--against` the same figures are
//! measured for this tree's `cargo xtask dist` and then for the other
//! build in DIST_DIR, in one run, each in a state directory of its own.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench_workspace::microagent;
use crate::{cache, images, kernel};

/// How a measured start comes up.
#[derive(Clone, Copy, PartialEq)]
enum From {
    Pool,
    Warm,
    Cold,
}

impl From {
    fn name(self) -> &'static str {
        match self {
            From::Pool => "from a pool",
            From::Warm => "warm snapshot",
            From::Cold => "cold boot",
        }
    }
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn show(label: &str, v: Vec<f64>, reference: f64) {
    let (min, med, max) = median(v);
    println!(
        "  {label:<34} median {:>7.3} s  (min {min:.3}, max {max:.3})  {:.2}x the exec round trip",
        med,
        med / reference
    );
}

/// Waits until `image`'s pool has all its members ready and no filler at
/// work (the previous claim's refill done).
fn settled_pool(bin: &Path, home: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let pools = microagent(bin, home, &["pool", "ls", "--json"])?;
        let ready = pools.as_array().and_then(|a| a.first()).is_some_and(|p| {
            p["ready"] == p["size"] && p["starting"] == 0 && p["size"].as_u64() > Some(0)
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the pool never filled: {pools}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until no pool member is left (after `pool set IMAGE 0`).
fn drained_pool(bin: &Path, home: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pools = microagent(bin, home, &["pool", "ls", "--json"])?;
        let left = pools.as_array().is_some_and(|a| {
            a.iter()
                .any(|p| p["ready"].as_u64() > Some(0) || p["starting"].as_u64() > Some(0))
        });
        if !left {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the pool never drained: {pools}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The start kind a start `from` must report.
fn expected_kind(from: From) -> &'static str {
    match from {
        From::Pool => "pooled",
        From::Warm => "warm",
        From::Cold => "cold",
    }
}

/// One CLI `create && start && exec -- true`.
struct CliRun {
    /// The whole of it, seconds.
    tti: f64,
    /// `start` alone, seconds.
    start: f64,
    /// The VMM's own record: launch to vCPU running, and launch to the
    /// agent answering (identity given), ms.
    vcpu_running_ms: f64,
    ready_ms: f64,
}

fn cli_tti(bin: &Path, home: &Path, from: From) -> anyhow::Result<CliRun> {
    let began = Instant::now();
    microagent(
        bin,
        home,
        &["create", "tti", "--image", "minimal", "--json"],
    )?;
    let mut start = vec!["start", "tti", "--json"];
    if from == From::Cold {
        start.push("--cold");
    }
    let start_began = Instant::now();
    let started = microagent(bin, home, &start)?;
    let start_secs = start_began.elapsed().as_secs_f64();
    microagent(bin, home, &["exec", "tti", "--json", "--", "true"])?;
    let secs = began.elapsed().as_secs_f64();
    let runtime = &started["runtime"];
    let kind = runtime["start_kind"].as_str().unwrap_or("?");
    let us = |key: &str| {
        runtime[key]
            .as_u64()
            .map_or(f64::NAN, |us| us as f64 / 1000.0)
    };
    let run = CliRun {
        tti: secs,
        start: start_secs,
        vcpu_running_ms: us("vcpu_running_us"),
        ready_ms: us("ready_us"),
    };
    microagent(bin, home, &["delete", "tti", "--yes", "--force", "--json"])?;
    let expected = expected_kind(from);
    if kind != expected {
        bail!("a start meant to be {expected} was {kind}");
    }
    Ok(run)
}

/// Whether `bin` has the subcommand `name` (its `--help` succeeds).
fn knows_command(bin: &Path, name: &str) -> bool {
    Command::new(bin)
        .args([name, "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A `serve mcp` session over stdio.
struct McpSession {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl McpSession {
    fn open(bin: &Path, home: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(bin)
            .args(["serve", "mcp"])
            .env("MICROAGENT_HOME", home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting serve mcp")?;
        let out = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut session = Self {
            child,
            out,
            next_id: 1,
        };
        session.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "xtask-bench", "version": "1"}
            }),
        )?;
        session
            .send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(session)
    }

    fn send(&mut self, msg: &serde_json::Value) -> anyhow::Result<()> {
        let stdin = self.child.stdin.as_mut().context("no stdin")?;
        writeln!(stdin, "{msg}")?;
        Ok(stdin.flush()?)
    }

    fn request(
        &mut self,
        method: &str,
        params: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.out.read_line(&mut line)? == 0 {
                bail!("serve mcp ended during {method}");
            }
            let msg: serde_json::Value = serde_json::from_str(&line)?;
            if msg["id"] == id {
                if !msg["error"].is_null() {
                    bail!("{method} failed: {}", msg["error"]);
                }
                return Ok(msg["result"].clone());
            }
        }
    }

    fn tool(&mut self, name: &str, args: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let result = self.request(
            "tools/call",
            serde_json::json!({"name": name, "arguments": args}),
        )?;
        if result["isError"] == true {
            bail!("{name} failed: {}", result["content"]);
        }
        Ok(result["structuredContent"].clone())
    }
}

impl Drop for McpSession {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// One MCP `workspace_create` + `workspace_start` + `workspace_exec`.
fn mcp_tti(mcp: &mut McpSession, from: From) -> anyhow::Result<f64> {
    let began = Instant::now();
    mcp.tool(
        "workspace_create",
        serde_json::json!({"name": "mtti", "image": "minimal"}),
    )?;
    let started = mcp.tool(
        "workspace_start",
        serde_json::json!({"name": "mtti", "cold": from == From::Cold}),
    )?;
    mcp.tool(
        "workspace_exec",
        serde_json::json!({"name": "mtti", "command": ["true"]}),
    )?;
    let secs = began.elapsed().as_secs_f64();
    mcp.tool(
        "workspace_delete",
        serde_json::json!({"name": "mtti", "force": true}),
    )?;
    let kind = started["runtime"]["start_kind"].as_str().unwrap_or("?");
    if kind != expected_kind(from) {
        bail!(
            "an MCP start meant to be {} was {kind}: {started}",
            expected_kind(from)
        );
    }
    Ok(secs)
}

/// Forks of a snapshot of a running workspace: launch to vCPU running, ms;
/// each restore in a VMM process started for it, then each handed to a
/// standby VMM process made ahead (`config.json` `standby.count` 1). An
/// older build measured as a reference (`other`) may have no standbys:
/// then the second list is empty.
fn restore_ms(
    bin: &Path,
    home: &Path,
    runs: usize,
    other: bool,
) -> anyhow::Result<(Vec<Fork>, Vec<Fork>)> {
    // An older build may not know `--egress` (every guest could reach
    // everything then).
    let mut create = vec!["create", "src", "--image", "minimal"];
    if !other {
        create.extend(["--egress", "all"]);
    }
    microagent(bin, home, &create)?;
    microagent(bin, home, &["start", "src", "--json"])?;
    microagent(bin, home, &["snapshot", "take", "src", "s1", "--json"])?;
    let config = home.join("config.json");
    let fork = |name: &str, standby: bool| -> anyhow::Result<Fork> {
        let forked = microagent(
            bin,
            home,
            &["fork", "src", name, "--snapshot", "s1", "--json"],
        )?;
        let us = forked["runtime"]["vcpu_running_us"]
            .as_u64()
            .context("a fork without vcpu_running_us")?;
        let log = std::fs::read_to_string(home.join(format!("workspaces/{name}/vmm.log")))?;
        if standby != log.contains("standby=true") {
            bail!("fork {name}: expected standby={standby}; vmm.log: {log}");
        }
        microagent(bin, home, &["delete", name, "--yes", "--force", "--json"])?;
        Ok(Fork {
            vcpu_running_ms: us as f64 / 1000.0,
            steps: steps_of(&log),
        })
    };
    let mut fresh = Vec::new();
    for i in 0..runs {
        fresh.push(fork(&format!("fork{i}"), false)?);
    }
    std::fs::write(&config, r#"{"standby": {"count": 1}}"#)?;
    // The first fork makes the standby the next one takes.
    fork("first", false)?;
    let mut standby = Vec::new();
    for i in 0..runs {
        if !standby_waiting(home, Duration::from_secs(30)) {
            if other && i == 0 {
                eprintln!("xtask: no standby VMM came in 30 s: a build without standbys");
                break;
            }
            bail!("no standby VMM waiting after 30 s");
        }
        // Settled: its VM made before the fork is timed.
        std::thread::sleep(Duration::from_millis(500));
        standby.push(fork(&format!("standby{i}"), true)?);
    }
    std::fs::remove_file(&config)?;
    workspace::vmm::standby::retire_all(home);
    microagent(bin, home, &["delete", "src", "--yes", "--force", "--json"])?;
    Ok((fresh, standby))
}

/// Whether a standby VMM of `home` waits, looking for up to `within`.
fn standby_waiting(home: &Path, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while workspace::vmm::standby::waiting_all(home) == 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// `start` alone from the warm snapshot and cold, with the VMM's own
/// steps, and how many times faster the warm one is.
fn show_starts(starts: &[(From, Vec<CliRun>)]) {
    println!("CLI start alone (no pool), and the VMM's steps from its launch:");
    let start_of = |from: From| -> Option<f64> {
        let runs = &starts.iter().find(|(f, _)| *f == from)?.1;
        let (min, med, max) = median(runs.iter().map(|r| r.start).collect());
        let (_, vcpu, _) = median(runs.iter().map(|r| r.vcpu_running_ms).collect());
        let (_, ready, _) = median(runs.iter().map(|r| r.ready_ms).collect());
        println!(
            "  start, {:<27} median {med:>7.3} s  (min {min:.3}, max {max:.3})  vCPU running {vcpu:.1} ms, agent answering {ready:.0} ms",
            from.name()
        );
        Some(med)
    };
    if let (Some(warm), Some(cold)) = (start_of(From::Warm), start_of(From::Cold)) {
        println!(
            "  a warm start is {:.1}x faster than a cold one",
            cold / warm
        );
    }
}

/// The bare start of the VMM program (spawn to exit of `--help`), ms.
fn vmm_process_ms(bin: &Path, runs: usize) -> anyhow::Result<Vec<f64>> {
    let vmm = bin.with_file_name("microagent-vmm");
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            Command::new(&vmm)
                .arg("--help")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            Ok(t.elapsed().as_secs_f64() * 1000.0)
        })
        .collect()
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let (args, against) = crate::bench::split_against(args)?;
    let (mut runs, mut cold_runs, mut release) = (10usize, 10usize, false);
    let mut restores_only = false;
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        if flag == "--release" {
            release = true;
            continue;
        }
        if flag == "--restores-only" {
            restores_only = true;
            continue;
        }
        let n = rest.next().context("a number after the flag")?.parse()?;
        match flag.as_str() {
            "--runs" => runs = n,
            "--cold-runs" => cold_runs = n,
            _ => bail!(
                "usage: cargo xtask bench tti [--runs N] [--cold-runs N] [--release] [--restores-only] [--against DIST_DIR [--against-cache DIR]]"
            ),
        }
    }
    if runs == 0 || cold_runs == 0 {
        bail!("each count must be at least 1");
    }
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    // Beside another build, both are release builds (`cargo xtask dist`).
    // Each build, and the other build when it is that one.
    let builds = match &against {
        None => vec![(cache::build_microagent_as(release)?, None)],
        Some(other) => {
            println!("this tree's dist:");
            vec![
                (crate::dist::build()?, None),
                (other.microagent(), Some(other)),
            ]
        }
    };
    for (bin, theirs) in builds {
        if let Some(theirs) = theirs {
            println!("{}:", theirs.dist.display());
            theirs.use_its_assets();
        }
        let other = theirs.is_some();
        let home = crate::bench_workspace::private_home("btti")?;
        let result = if restores_only {
            restore_ms(&bin, &home, runs, other).and_then(|r| {
                show_restores(r, vmm_process_ms(&bin, runs)?);
                Ok(())
            })
        } else {
            measure(&bin, &home, runs, cold_runs, other)
        };
        let _ = microagent(&bin, &home, &["pool", "set", "minimal", "0"]);
        for name in ["ref", "tti", "mtti", "src"] {
            let _ = microagent(&bin, &home, &["delete", name, "--yes", "--force"]);
        }
        std::thread::sleep(Duration::from_secs(2));
        let _ = std::fs::remove_dir_all(&home);
        result?;
    }
    Ok(())
}

fn measure(
    bin: &Path,
    home: &Path,
    runs: usize,
    cold_runs: usize,
    other: bool,
) -> anyhow::Result<()> {
    // The warm snapshot, made once (a cold boot) before anything is timed.
    microagent(
        bin,
        home,
        &["create", "ref", "--image", "minimal", "--json"],
    )?;
    microagent(bin, home, &["start", "ref", "--json"])?;
    // A guest just up still settles for seconds: the reference is the
    // round trip of a workspace in use.
    for _ in 0..3 {
        microagent(bin, home, &["exec", "ref", "--json", "--", "true"])?;
    }
    std::thread::sleep(Duration::from_secs(10));
    let mut exec = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        microagent(bin, home, &["exec", "ref", "--json", "--", "true"])?;
        exec.push(t.elapsed().as_secs_f64());
    }
    microagent(bin, home, &["delete", "ref", "--yes", "--force", "--json"])?;
    let (_, reference, _) = median(exec.clone());

    let mut cli = Vec::new();
    let mut mcp = Vec::new();
    // An older build measured as a reference may have no pools.
    let pools = !other || knows_command(bin, "pool");
    if !pools {
        eprintln!(
            "xtask: {} has no pools: measured warm and cold only",
            bin.display()
        );
    }
    let froms = [From::Pool, From::Warm, From::Cold];
    for from in froms.into_iter().filter(|f| pools || *f != From::Pool) {
        let n = if from == From::Cold { cold_runs } else { runs };
        let size = if from == From::Pool { "1" } else { "0" };
        if pools {
            microagent(bin, home, &["pool", "set", "minimal", size, "--json"])?;
            if from != From::Pool {
                drained_pool(bin, home)?;
            }
        }
        let mut times = Vec::new();
        for i in 0..n {
            eprintln!("xtask: tti CLI {} {}/{n}", from.name(), i + 1);
            if from == From::Pool {
                settled_pool(bin, home)?;
            }
            times.push(cli_tti(bin, home, from)?);
        }
        cli.push((from, times));
        let mut session = McpSession::open(bin, home)?;
        let mut times = Vec::new();
        for i in 0..n {
            eprintln!("xtask: tti MCP {} {}/{n}", from.name(), i + 1);
            if from == From::Pool {
                settled_pool(bin, home)?;
            }
            times.push(mcp_tti(&mut session, from)?);
        }
        mcp.push((from, times));
    }
    if pools {
        microagent(bin, home, &["pool", "set", "minimal", "0", "--json"])?;
    }
    let restore = restore_ms(bin, home, runs, other)?;
    let process = vmm_process_ms(bin, runs)?;

    println!("time to interactive (create, start, first command's output), minimal image:");
    let (min, _, max) = median(exec);
    println!(
        "  {:<34} median {reference:>7.3} s  (min {min:.3}, max {max:.3})  reference",
        "exec -- true on a running workspace"
    );
    let mut starts = Vec::new();
    for (from, times) in cli {
        let tti = times.iter().map(|r| r.tti).collect();
        show(&format!("CLI, {}", from.name()), tti, reference);
        starts.push((from, times));
    }
    for (from, times) in mcp {
        show(&format!("MCP, {}", from.name()), times, reference);
    }
    show_starts(&starts);
    show_restores(restore, process);
    Ok(())
}

/// One fork's launch to vCPU running, and its VMM's steps (ms).
struct Fork {
    vcpu_running_ms: f64,
    steps: Vec<f64>,
}

/// The VMM's steps its `vmm.log` times, in the order they happen: each
/// since the launch but the restore's and the confinement's own (indented:
/// since the restore or the confinement began; seccomp's compile alone
/// since its own start).
const STEPS: [(&str, &str); 18] = [
    ("process_ms", "process running its main"),
    ("cgroup_ms", "cgroup joined (or renamed)"),
    ("network_ms", "network attached (passt started)"),
    ("mount_ns_ms", "mount namespace made"),
    (
        "state_memory_and_vm_us",
        "  restore: state read, memory mapped",
    ),
    ("irqchip_and_devices_us", "  restore: devices attached"),
    ("restored_us", "  restore: vCPU and device state set"),
    ("built_ms", "machine built"),
    ("ports_bound_ms", "published ports bound"),
    ("lockdown_ms", "confinement began"),
    ("private_root_us", "  confinement: private root made"),
    ("account_us", "  confinement: account, capabilities"),
    ("landlock_us", "  confinement: Landlock"),
    (
        "seccomp_compiled_us",
        "  confinement: seccomp compiled (alone)",
    ),
    ("seccomp_us", "  confinement: seccomp installed"),
    ("confined_ms", "confined"),
    (
        "record_checked_ms",
        "record checked (ticketed: after confinement)",
    ),
    ("threads_ms", "threads started (after the vCPUs')"),
];

/// The figures of [`STEPS`] in `log` (NaN for a missing one), in ms.
fn steps_of(log: &str) -> Vec<f64> {
    STEPS
        .iter()
        .map(|(key, _)| {
            let value = log
                .split_whitespace()
                .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok());
            match value {
                Some(us) if key.ends_with("_us") => us / 1000.0,
                Some(ms) => ms,
                None => f64::NAN,
            }
        })
        .collect()
}

/// Forks' launch to vCPU running, fresh and onto a standby, beside the
/// VMM program's bare start, then the medians of their VMMs' steps.
fn show_restores((fresh, standby): (Vec<Fork>, Vec<Fork>), process: Vec<f64>) {
    println!("restore of a snapshot (forks), launch to vCPU running:");
    let total = |forks: &[Fork]| forks.iter().map(|f| f.vcpu_running_ms).collect::<Vec<_>>();
    for (label, ms) in [
        ("fork, VMM process started for it", total(&fresh)),
        ("fork, handed to a standby VMM", total(&standby)),
        ("microagent-vmm --help, spawn to exit", process),
    ] {
        if ms.is_empty() {
            println!("  {label:<37} none (a build without them)");
            continue;
        }
        let (min, med, max) = median(ms);
        println!("  {label:<37} median {med:>6.2} ms (min {min:.2}, max {max:.2})");
    }
    println!("  (target: under 3 ms; the last line is the reference)");
    println!("  the VMM's steps, median ms since the launch     fresh   standby");
    for (index, (_, label)) in STEPS.iter().enumerate() {
        let step = |forks: &[Fork]| {
            (!forks.is_empty()).then(|| median(forks.iter().map(|f| f.steps[index]).collect()).1)
        };
        println!(
            "    {label:<44} {:>6.2}   {:>6.2}",
            step(&fresh).unwrap_or(f64::NAN),
            step(&standby).unwrap_or(f64::NAN)
        );
    }
}
