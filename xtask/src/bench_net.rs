//! `cargo xtask bench net`: TCP throughput and round-trip latency between a
//! workspace and the host, through the `user` network and (as root, in a
//! network namespace of its own) a `tap` network (guest to host, timed in
//! the guest by guest/netbench), and through a published port (host to
//! guest, timed on the host), beside the host's own loopback measured in the
//! same run; and (as root) the egress filter's cost: one workspace on the
//! user network reaching a server in a network namespace, first under
//! `--egress all` without rules, then under an allowlist of 32 rules whose
//! last admits the server, then under `all` again. All traffic stays on
//! this machine.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::{cache, images, kernel, rootfs};

/// KiB each throughput run moves: where guest kernel mode is emulated the
/// guest moves tens of KiB/s, and Debian 12's passt resets a connection
/// whose far end stays silent for 24 s (docs/networking.md), so the guest's
/// own send stays well under that.
const LOOPBACK_KIB: usize = 64 << 10;
const GUEST_SEND_KIB: usize = 512;
const PUBLISHED_KIB: usize = 4 << 10;
/// Round trips each latency run makes.
const ROUND_TRIPS: usize = 200;
/// Connections each connection-setup run opens.
const CONNECTIONS: usize = 50;
/// The "internet" server of the filter runs: a documentation address
/// (TEST-NET-2) on a veth interface of the bench's own namespace.
const WORLD_SERVER: &str = "198.51.100.20";
/// The workspace's echo and sink servers (busybox nc) listen on these.
const GUEST_ECHO_PORT: u16 = 7007;
const GUEST_SINK_PORT: u16 = 9009;
/// The host's loopback as the user network's guests reach it.
const HOST_FROM_GUEST: &str = "10.0.2.2";

/// A host server on 127.0.0.1 that reads everything and closes; with
/// `ready`, it first answers one byte with `r` (the guest's sink does the
/// same, so that [`send_to`] times the transfer, not the connection setup).
fn host_sink(ready: bool) -> anyhow::Result<u16> {
    host_sink_at("127.0.0.1", ready)
}

fn host_sink_at(addr: &str, ready: bool) -> anyhow::Result<u16> {
    let l = TcpListener::bind((addr, 0))?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut b = [0u8; 1];
            if ready && (c.read_exact(&mut b).is_err() || c.write_all(b"r").is_err()) {
                continue;
            }
            let _ = std::io::copy(&mut &c, &mut std::io::sink());
        }
    });
    Ok(port)
}

/// A host server on 127.0.0.1 that echoes every byte.
fn host_echo() -> anyhow::Result<u16> {
    host_echo_at("127.0.0.1")
}

fn host_echo_at(addr: &str) -> anyhow::Result<u16> {
    let l = TcpListener::bind((addr, 0))?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let _ = c.set_nodelay(true);
            let _ = std::io::copy(&mut &c, &mut &c);
        }
    });
    Ok(port)
}

/// After the sink's `r`, sends `kib` KiB to 127.0.0.1:`port`, half-closes
/// and waits for the close: MiB/s.
fn send_to(port: u16, kib: usize) -> anyhow::Result<f64> {
    let chunk = vec![0u8; 64 << 10];
    let mut c = TcpStream::connect(("127.0.0.1", port))?;
    c.set_read_timeout(Some(Duration::from_secs(300)))?;
    c.write_all(b"x")?;
    let mut r = [0u8; 1];
    c.read_exact(&mut r)?;
    let began = Instant::now();
    for _ in 0..(kib << 10) / chunk.len() {
        c.write_all(&chunk)?;
    }
    c.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    c.read_to_end(&mut rest)?;
    Ok(kib as f64 / 1024.0 / began.elapsed().as_secs_f64())
}

/// `ROUND_TRIPS` one-byte round trips to an echo server on 127.0.0.1:`port`:
/// (median, fastest) in microseconds.
fn round_trips(port: u16) -> anyhow::Result<(f64, f64)> {
    let mut c = TcpStream::connect(("127.0.0.1", port))?;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut times = Vec::with_capacity(ROUND_TRIPS);
    let mut b = [0u8; 1];
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        c.write_all(b"x")?;
        c.read_exact(&mut b)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[0]))
}

/// `key=value` from the guest program's output line.
fn field(out: &str, key: &str) -> anyhow::Result<f64> {
    out.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .with_context(|| format!("no {key}= in {out:?}"))?
        .parse()
        .with_context(|| format!("{key} in {out:?}"))
}

/// The `microagent` binary with a state directory, optionally run in a
/// network namespace (`ip netns exec`).
struct Runner<'a> {
    bin: &'a Path,
    home: &'a Path,
    netns: Option<&'a str>,
}

impl Runner<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = match self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(self.bin);
                c
            }
            None => Command::new(self.bin),
        };
        cmd.args(args).env("MICROAGENT_HOME", self.home);
        cmd
    }

    /// `microagent ARGS`: its stdout, or why it failed.
    fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command(args)
            .output()
            .with_context(|| format!("running microagent {args:?}"))?;
        if !out.status.success() {
            bail!(
                "microagent {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `microagent exec bench -- ARGS`: its stdout.
    fn guest(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["exec", "bench", "--"];
        all.extend_from_slice(args);
        self.ok(&all)
    }

    /// Copies netbench into the running `bench`.
    fn copy_netbench(&self, netbench: &Path) -> anyhow::Result<()> {
        let src = netbench.display().to_string();
        self.ok(&["cp", &src, "bench:/root/netbench"]).map(drop)
    }

    /// Guest to `host`:`sink`/`echo`, timed in the guest by netbench.
    fn guest_to_host(&self, host: &str, sink: u16, echo: u16) -> anyhow::Result<Figures> {
        let sent = self.guest(&[
            "/root/netbench",
            "send",
            host,
            &sink.to_string(),
            &GUEST_SEND_KIB.to_string(),
        ])?;
        let rtt = self.guest(&[
            "/root/netbench",
            "rtt",
            host,
            &echo.to_string(),
            &ROUND_TRIPS.to_string(),
        ])?;
        Ok(Figures {
            mib_s: field(&sent, "bytes")? / (1 << 20) as f64 / (field(&sent, "us")? / 1e6),
            rtt_median_us: field(&rtt, "median_us")?,
            rtt_min_us: field(&rtt, "min_us")?,
        })
    }
}

impl Runner<'_> {
    /// Guest to the world server under the policy in force: throughput,
    /// round trips, connection setup.
    fn with_policy(&self, sink: u16, echo: u16) -> anyhow::Result<PolicyFigures> {
        let traffic = self.guest_to_host(WORLD_SERVER, sink, echo)?;
        let conns = self.guest(&[
            "/root/netbench",
            "conn",
            WORLD_SERVER,
            &echo.to_string(),
            &CONNECTIONS.to_string(),
        ])?;
        Ok(PolicyFigures {
            traffic,
            conn_median_us: field(&conns, "median_us")?,
            conn_min_us: field(&conns, "min_us")?,
        })
    }
}

struct Figures {
    mib_s: f64,
    rtt_median_us: f64,
    rtt_min_us: f64,
}

/// What one egress policy costs: throughput, round trips, and connection
/// setup (median, fastest), timed in the guest.
struct PolicyFigures {
    traffic: Figures,
    conn_median_us: f64,
    conn_min_us: f64,
}

/// The egress filter under `--egress all` without rules, under an
/// allowlist of 32 rules, and under `all` again (the drift between the
/// two `all` runs says how far to trust the ratio), in a namespace whose
/// veth interface holds the server.
fn measure_filter(bin: &Path, netbench: &Path) -> anyhow::Result<[PolicyFigures; 3]> {
    let ns = format!("mabenchf{}", std::process::id());
    let home = std::path::PathBuf::from(format!("/tmp/ma-bench-filter-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let r = Runner {
        bin,
        home: &home,
        netns: Some(&ns),
    };
    let ip = |args: &[&str]| -> anyhow::Result<()> {
        if !Command::new("ip").args(args).status()?.success() {
            bail!("ip {args:?} failed");
        }
        Ok(())
    };
    let measured = (|| -> anyhow::Result<[PolicyFigures; 3]> {
        ip(&["netns", "add", &ns])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        // A veth pair inside the namespace (hosts without the dummy
        // module have veth): one end holds the server's address.
        ip(&[
            "-n",
            &ns,
            "link",
            "add",
            "world",
            "type",
            "veth",
            "peer",
            "name",
            "world-peer",
        ])?;
        ip(&["-n", &ns, "link", "set", "world-peer", "up"])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{WORLD_SERVER}/24"),
            "dev",
            "world",
        ])?;
        ip(&["-n", &ns, "link", "set", "world", "up"])?;
        // passt takes its addresses from the interface of the default route.
        ip(&["-n", &ns, "route", "add", "default", "dev", "world"])?;
        let (sink, echo) = servers_in(&ns, WORLD_SERVER)?;
        r.ok(&["create", "bench", "--egress", "all", "--json"])?;
        r.ok(&["start", "bench", "--cold", "--json"])?;
        r.copy_netbench(netbench)?;
        let all = r.with_policy(sink, echo)?;
        let mut rules: Vec<String> = (1..32)
            .map(|i| format!("--allow=bench-{i}.example"))
            .collect();
        rules.push(format!("--allow={WORLD_SERVER}"));
        let mut args = vec!["network", "policy", "bench", "--egress", "allowlist"];
        args.extend(rules.iter().map(String::as_str));
        args.push("--json");
        r.ok(&args)?;
        let allowlist = r.with_policy(sink, echo)?;
        r.ok(&[
            "network",
            "policy",
            "bench",
            "--egress",
            "all",
            "--no-allow",
            "--json",
        ])?;
        let again = r.with_policy(sink, echo)?;
        Ok([all, allowlist, again])
    })();
    let _ = r.ok(&["delete", "bench", "--yes", "--force"]);
    if let Ok(pids) = Command::new("ip").args(["netns", "pids", &ns]).output() {
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let _ = std::fs::remove_dir_all(&home);
    measured
}

/// A sink and an echo server on `addr` in namespace `ns` (sockets belong
/// to the namespace they were made in: a thread enters it to make them).
fn servers_in(ns: &str, addr: &str) -> anyhow::Result<(u16, u16)> {
    let ns_path = format!("/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<(u16, u16)> {
            let f = std::fs::File::open(&ns_path)?;
            // SAFETY: setns on a namespace fd we own; it changes only this
            // thread's network namespace.
            if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) } != 0
            {
                return Err(std::io::Error::last_os_error().into());
            }
            Ok((host_sink_at(addr, false)?, host_echo_at(addr)?))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))?
    })
}

fn measure_workspace(bin: &Path, home: &Path, netbench: &Path) -> anyhow::Result<[Figures; 2]> {
    let r = Runner {
        bin,
        home,
        netns: None,
    };
    let free =
        || -> anyhow::Result<u16> { Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
    let (sink_port, echo_port) = (free()?, free()?);
    // The guest reaches the host's loopback only on ports a rule opens.
    let (host_sink_port, host_echo_port) = (host_sink(false)?, host_echo()?);
    r.ok(&[
        "create",
        "bench",
        "--publish",
        &format!("{sink_port}:{GUEST_SINK_PORT}"),
        "--publish",
        &format!("{echo_port}:{GUEST_ECHO_PORT}"),
        "--allow",
        &format!("host:{host_sink_port}"),
        "--allow",
        &format!("host:{host_echo_port}"),
        "--json",
    ])?;
    r.ok(&["start", "bench", "--cold", "--json"])?;
    r.copy_netbench(netbench)?;

    // Guest to host through the user network, timed in the guest.
    let user = r.guest_to_host(HOST_FROM_GUEST, host_sink_port, host_echo_port)?;

    // Host to guest through the published ports, timed on the host: busybox
    // nc as the guest's sink and echo server (one connection each).
    r.guest(&[
        "sh",
        "-c",
        &format!(
            "printf '#!/bin/sh\\nhead -c 1 >/dev/null; echo -n r; exec cat >/dev/null\\n' >/root/sink && chmod +x /root/sink && \
             nc -l -p {GUEST_SINK_PORT} -e /root/sink </dev/null >/dev/null 2>&1 & \
             nc -l -p {GUEST_ECHO_PORT} -e /bin/cat </dev/null >/dev/null 2>&1 & \
             for i in $(seq 100); do n=$(netstat -ltn | grep -c -e ':{GUEST_SINK_PORT} ' -e ':{GUEST_ECHO_PORT} '); \
             [ \"$n\" = 2 ] && exit 0; sleep 0.2; done; echo the servers never listened; exit 1"
        ),
    ])?;
    let (median, min) = round_trips(echo_port)?;
    let published = Figures {
        mib_s: send_to(sink_port, PUBLISHED_KIB)?,
        rtt_median_us: median,
        rtt_min_us: min,
    };
    r.ok(&["delete", "bench", "--yes", "--force", "--json"])?;
    Ok([user, published])
}

/// Guest to host through a `tap` network (egress all), in a network
/// namespace of its own: the host's servers listen on the bridge's gateway
/// address there.
fn measure_tap(bin: &Path, netbench: &Path) -> anyhow::Result<Figures> {
    let ns = format!("mabench{}", std::process::id());
    let home = std::path::PathBuf::from(format!("/tmp/ma-bench-tap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let r = Runner {
        bin,
        home: &home,
        netns: Some(&ns),
    };
    let made = Command::new("ip").args(["netns", "add", &ns]).status()?;
    if !made.success() {
        bail!("ip netns add {ns} failed");
    }
    let measured = (|| -> anyhow::Result<Figures> {
        r.ok(&["network", "create", "bench", "--backend", "tap", "--json"])?;
        let preview: serde_json::Value =
            serde_json::from_str(&r.ok(&["network", "setup", "--json"])?)?;
        let token = preview["token"]
            .as_str()
            .context("no setup token")?
            .to_owned();
        r.ok(&["network", "setup", "--confirm", &token, "--json"])?;
        r.ok(&["create", "bench", "--network", "bench", "--json"])?;
        r.ok(&["start", "bench", "--cold", "--json"])?;
        r.copy_netbench(netbench)?;
        let gateway = "10.89.0.1";
        let (sink, echo) = servers_in(&ns, gateway)?;
        r.guest_to_host(gateway, sink, echo)
    })();
    let _ = r.ok(&["delete", "bench", "--yes", "--force"]);
    if let Ok(out) = r.ok(&["network", "teardown", "--json"]) {
        let token = serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v["token"].as_str().map(str::to_owned));
        if let Some(token) = token {
            let _ = r.ok(&["network", "teardown", "--confirm", &token]);
        }
    }
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let _ = std::fs::remove_dir_all(&home);
    measured
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    if !args.is_empty() {
        bail!("usage: cargo xtask bench net");
    }
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let netbench = rootfs::guest_program("netbench")?;
    let bin = cache::build_microagent()?;
    let home = std::path::PathBuf::from(format!("/tmp/ma-bench-net-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);

    let (sink, echo) = (host_sink(true)?, host_echo()?);
    let (median, min) = round_trips(echo)?;
    let loopback = Figures {
        mib_s: send_to(sink, LOOPBACK_KIB)?,
        rtt_median_us: median,
        rtt_min_us: min,
    };
    eprintln!("xtask: booting a workspace (user network, two published ports)");
    let measured = measure_workspace(&bin, &home, &netbench);
    if measured.is_err() {
        let r = Runner {
            bin: &bin,
            home: &home,
            netns: None,
        };
        let _ = r.ok(&["delete", "bench", "--yes", "--force"]);
    }
    let _ = std::fs::remove_dir_all(&home);
    let [user, published] = measured?;
    // SAFETY: geteuid has no preconditions.
    let (tap, filter) = if unsafe { libc::geteuid() } == 0 {
        eprintln!("xtask: booting a workspace on a tap network (in a network namespace)");
        let tap = measure_tap(&bin, &netbench)?;
        eprintln!(
            "xtask: booting a workspace for the egress filter's cost (in a network namespace)"
        );
        (Some(tap), Some(measure_filter(&bin, &netbench)?))
    } else {
        eprintln!("xtask: tap network and the egress filter's cost skipped: they need root (a network namespace, CAP_NET_ADMIN)");
        (None, None)
    };
    println!("TCP throughput and {ROUND_TRIPS} one-byte round trips (median / fastest):");
    let mut rows = vec![
        ("host loopback (reference)", LOOPBACK_KIB, &loopback),
        ("guest -> host, user network (passt)", GUEST_SEND_KIB, &user),
    ];
    if let Some(tap) = &tap {
        rows.push(("guest -> host, tap network (bridge)", GUEST_SEND_KIB, tap));
    }
    rows.push((
        "host -> guest, published port (vsock)",
        PUBLISHED_KIB,
        &published,
    ));
    for (name, kib, f) in rows {
        println!(
            "  {name:<40} {:>9.3} MiB/s ({kib:>5} KiB)   {:>9.0} us / {:>7.0} us",
            f.mib_s, f.rtt_median_us, f.rtt_min_us
        );
    }
    if let Some([all, allowlist, again]) = &filter {
        print_filter(all, allowlist, again);
    }
    Ok(())
}

fn print_filter(all: &PolicyFigures, allowlist: &PolicyFigures, again: &PolicyFigures) {
    println!(
        "egress filter, guest -> a server in the namespace (throughput, {ROUND_TRIPS} round trips, {CONNECTIONS} connection setups; median / fastest):"
    );
    for (name, f) in [
        ("--egress all, no rules (reference)", all),
        ("--egress allowlist, 32 rules", allowlist),
        ("--egress all, no rules (again)", again),
    ] {
        println!(
            "  {name:<40} {:>9.3} MiB/s   rtt {:>7.0} us / {:>7.0} us   connect {:>7.0} us / {:>7.0} us",
            f.traffic.mib_s,
            f.traffic.rtt_median_us,
            f.traffic.rtt_min_us,
            f.conn_median_us,
            f.conn_min_us
        );
    }
    // Against the mean of the two reference runs.
    let mean = |a: f64, b: f64| (a + b) / 2.0;
    println!(
        "  allowlist / all: throughput {:.2}x, round trip {:.2}x, connection setup {:.2}x (the two reference runs differ by {:.0}% in throughput)",
        allowlist.traffic.mib_s / mean(all.traffic.mib_s, again.traffic.mib_s),
        allowlist.traffic.rtt_median_us / mean(all.traffic.rtt_median_us, again.traffic.rtt_median_us),
        allowlist.conn_median_us / mean(all.conn_median_us, again.conn_median_us),
        100.0 * (all.traffic.mib_s - again.traffic.mib_s).abs() / mean(all.traffic.mib_s, again.traffic.mib_s)
    );
}
