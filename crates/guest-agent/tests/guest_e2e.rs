//! End to end on the real guest kernel with the `minimal` workspace image:
//! the image's init overlays a writable disk on the read-only base and execs
//! the agent, which the host reaches through the VMM's hybrid vsock socket.
//! One boot: handshake, `uname -a`, a file written then read, a 10 MiB round
//! trip, tens of short-lived processes (the stress check of
//! docs/host-compat.md), a timeout that kills its process, then `reboot -f`
//! ends the VM. A guest process that dies of a fault fails the test with the
//! console's tail.

use std::process::Command;
use std::time::{Duration, Instant};

use guest_agent::client::{AgentEndpoint, ExecOutput, ExecStdin};
use guest_agent::protocol::{ExecCall, WriteMode};
use vmm_core::devices::serial::ConsoleSink;
use vmm_core::machine::{DiskConfig, VsockConfig};
use vmm_core::{Machine, MachineConfig, StopReason};

const AGENT_PORT: u32 = 1024;
/// Written through the agent, then found on the writable disk by debugfs.
const HELLO: &[u8] = b"hello from the host\n";

/// Short-lived processes the stress step starts from a guest shell loop;
/// `MICROAGENT_STRESS_PROCESSES` overrides it (`cargo xtask soak` sets
/// more). Forty, not hundreds: each costs about a second of emulated
/// kernel work here, issue 10's cause (YMM state leaking between
/// processes) has its direct check below, and `cargo xtask soak` runs
/// thousands.
const STRESS_PROCESSES: u32 = 40;
/// Commands the stress step runs through the agent's own exec path.
const STRESS_AGENT_EXECS: u32 = 10;
/// Checks per process of the YMM switch check (each spins ~10 ms).
const YMM_CHECKS: &str = "40";

fn stress_processes() -> u32 {
    std::env::var("MICROAGENT_STRESS_PROCESSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(STRESS_PROCESSES)
}

/// Runs `req` through the agent; fails with the console tail when the
/// process died of a fault signal.
async fn exec(endpoint: &AgentEndpoint, req: ExecCall, console: &testkit::Capture) -> ExecOutput {
    let what = match (&req.argv, &req.shell) {
        (Some(argv), _) => argv.join(" "),
        (None, shell) => shell.clone().unwrap_or_default(),
    };
    let out = endpoint
        .connect()
        .await
        .unwrap()
        .exec_collect(req, ExecStdin::None)
        .await
        .unwrap();
    testkit::guest_faults::assert_not_faulted(&what, out.exited.signal, &console.text());
    out
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

async fn wait_for_agent(
    endpoint: &AgentEndpoint,
    deadline: Instant,
) -> guest_agent::client::AgentHello {
    loop {
        if let Ok(client) = endpoint.connect().await {
            if let Ok(hello) = client.hello().await {
                return hello;
            }
        }
        assert!(Instant::now() < deadline, "the agent never answered");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn agent_in_a_real_guest() {
    let test = "agent_in_a_real_guest";
    let Some(assets) = testkit::require(test, testkit::guest_assets()) else {
        return;
    };
    let Some(image) = testkit::require(test, testkit::workspace_image("minimal")) else {
        return;
    };
    let Some(debugfs) = testkit::require(test, testkit::host_tool("debugfs")) else {
        return;
    };
    let Some(mkfs) = testkit::require(test, testkit::host_tool("mkfs.ext4")) else {
        return;
    };
    let Some(ymmcheck) = testkit::require(test, testkit::guest_program("ymmcheck")) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("microagent-agent-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let layer = dir.join("layer.ext4");
    std::fs::File::create(&layer)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    assert!(Command::new(&mkfs)
        .args(["-q", "-F"])
        .arg(&layer)
        .status()
        .unwrap()
        .success());
    let uds = dir.join("vsock.sock");

    let console = testkit::Capture::default();
    let machine = Machine::build(MachineConfig {
        kernel: assets.kernel.clone(),
        initrd: None,
        // `MICROAGENT_SOAK_CMDLINE` (`cargo xtask soak --cmdline`) adds guest
        // kernel options, to test a hypothesis on a host that shows faults.
        extra_cmdline: Some(format!(
            "root=/dev/vda ro rootfstype=ext4 microagent_overlay=/dev/vdb microagent_hostname=e2e {}",
            std::env::var("MICROAGENT_SOAK_CMDLINE").unwrap_or_default()
        )),
        mem_mib: 256,
        vcpus: 1,
        template: assets.host.cpu_template(),
        console: ConsoleSink::new().with(Box::new(console.clone())),
        disks: vec![
            DiskConfig {
                path: image,
                read_only: true,
                id: None,
            },
            DiskConfig {
                path: layer.clone(),
                read_only: false,
                id: None,
            },
        ],
        vsock: Some(VsockConfig {
            guest_cid: 3,
            uds_path: uds.clone(),
            routes: Default::default(),
        }),
        net: None,
        balloon: false,
    })
    .unwrap();
    // Bounds that grow with the stress count (about a second per guest
    // process where guest kernel mode is emulated, more on a busy host).
    // A hang guard, not a speed target: a busy emulating host took 921 s
    // and, with two CI runs side by side, over 1050 s for what takes about
    // 600 s alone.
    let bound = Duration::from_secs(1200 + 6 * u64::from(stress_processes()));
    let vm =
        std::thread::spawn(move || machine.run(Some(bound + Duration::from_secs(120))).unwrap());
    // Whatever happens below, show the guest console when the test fails.
    let guard = ConsoleOnPanic(console.clone());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let endpoint = AgentEndpoint::HybridVsock {
        uds: uds.clone(),
        port: AGENT_PORT,
    };
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());
    rt.block_on(within("the guest operations", bound, async {
        let hello = wait_for_agent(&endpoint, Instant::now() + Duration::from_secs(300)).await;
        assert_eq!(hello.version, 1);
        // Before it answered, the agent ran one command through its exec
        // path (what an image's warm snapshot keeps warm).
        assert!(
            !console.text().contains("warming the exec path"),
            "{}",
            console.text()
        );
        step("agent answered");

        let out = exec(&endpoint, ExecCall::argv(["uname", "-a"]), &console).await;
        let uname = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.exited.success(), "{:?}", out.exited);
        assert!(
            uname.starts_with("Linux e2e ") && uname.contains("x86_64"),
            "{uname}"
        );

        step("uname done");
        let text = HELLO;
        endpoint
            .connect()
            .await
            .unwrap()
            .write_file("/root/hello.txt", WriteMode::Truncate, Some(0o644), text)
            .await
            .unwrap();
        assert_eq!(
            endpoint
                .connect()
                .await
                .unwrap()
                .read_file("/root/hello.txt")
                .await
                .unwrap(),
            text
        );

        step("small file done");
        let big = pattern(10 << 20);
        let written = endpoint
            .connect()
            .await
            .unwrap()
            .write_file("/root/big.bin", WriteMode::Truncate, None, &big)
            .await
            .unwrap();
        assert_eq!(written, big.len() as u64);
        let back = endpoint
            .connect()
            .await
            .unwrap()
            .read_file("/root/big.bin")
            .await
            .unwrap();
        assert!(
            back == big,
            "10 MiB round trip differs ({} bytes back)",
            back.len()
        );

        step("10 MiB round trip done");
        // An idle guest drops its caches once (big.bin's pages go), and
        // not again until it is used.
        let reclaim = |idle_secs| {
            guest_agent::client::blocking::BlockingClient::connect_hybrid_vsock(
                &uds,
                AGENT_PORT,
                Duration::from_secs(30),
            )
            .and_then(|agent| agent.reclaim(idle_secs))
            .unwrap()
        };
        // The first ask counts the programs' CPU since the agent started
        // ("busy"): ask until a quiet spell has passed. The round trip's
        // end is use too, and a slow guest may mark it after a first drop
        // (it does so once its last frame went; the VMM asks only when no
        // connection is open): ask until a drop is followed by an ask
        // that drops nothing.
        let mut first = None;
        let asked = Instant::now();
        while asked.elapsed() < Duration::from_secs(60) {
            let answer = reclaim(0);
            if answer.dropped {
                first.get_or_insert(answer);
                continue;
            }
            if first.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let first = first.expect("the idle guest never dropped its caches");
        assert!(
            first.free_kib_after >= first.free_kib_before + 5 * 1024,
            "the 10 MiB file's cache was not dropped: {first:?}"
        );
        assert!(!reclaim(0).dropped, "dropped twice without use");
        assert!(!reclaim(3600).dropped, "not idle for an hour");
        step("reclaim done");
        // Right after heavy I/O, as in the CI failures of issue 10: many
        // fresh processes, each of which must start with its own TLS intact.
        let n = stress_processes();
        let script = format!(
            "i=0; while [ $i -lt {n} ]; do /bin/sleep 0; r=$?; \
             [ $r -eq 0 ] || {{ echo \"process $i ended with $r\"; exit 1; }}; i=$((i+1)); done"
        );
        let out = exec(&endpoint, ExecCall::shell(script), &console).await;
        assert!(
            out.exited.success(),
            "{:?}: {}\n{}",
            out.exited,
            String::from_utf8_lossy(&out.stdout),
            testkit::guest_faults::tail(&console.text(), testkit::guest_faults::TAIL_LINES)
        );
        step(&format!("{n} shell-started processes done"));
        for _ in 0..STRESS_AGENT_EXECS {
            let out = exec(&endpoint, ExecCall::argv(["true"]), &console).await;
            assert!(out.exited.success(), "{:?}", out.exited);
        }
        testkit::guest_faults::assert_no_faults("agent e2e guest", &console.text());
        step(&format!("{STRESS_AGENT_EXECS} agent execs done"));
        // Issue 10's cause: the upper halves of the YMM registers must not
        // leak between processes (they did on emulating hosts).
        endpoint
            .connect()
            .await
            .unwrap()
            .write_file(
                "/root/ymmcheck",
                WriteMode::Truncate,
                Some(0o755),
                &ymmcheck,
            )
            .await
            .unwrap();
        let out = exec(
            &endpoint,
            ExecCall::argv(["/root/ymmcheck", "2", YMM_CHECKS]),
            &console,
        )
        .await;
        assert!(
            out.exited.success(),
            "{:?}: {}",
            out.exited,
            String::from_utf8_lossy(&out.stdout)
        );
        step(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or("ymmcheck done"),
        );
        let mut sleeper = ExecCall::argv(["sleep", "600"]);
        sleeper.timeout_ms = Some(2000);
        let out = exec(&endpoint, sleeper, &console).await;
        assert!(out.exited.timed_out, "{:?}", out.exited);
        assert_eq!(out.exited.signal, Some(9));
        let ps = exec(
            &endpoint,
            ExecCall::shell("ps | grep 'sleep 600' | grep -v grep || true"),
            &console,
        )
        .await;
        assert!(
            ps.stdout.is_empty(),
            "the timed-out process survived: {}",
            String::from_utf8_lossy(&ps.stdout)
        );

        step("timeout checked");
        // Syncs and ends the VM.
        endpoint.connect().await.unwrap().shutdown().await.unwrap();
    }));
    let outcome = vm.join().unwrap();
    testkit::guest_faults::assert_no_faults("agent e2e guest", &console.text());
    std::mem::forget(guard);
    assert_eq!(
        outcome.reason,
        StopReason::Reset,
        "registers: {:?}\n{}",
        outcome.registers,
        console.text()
    );
    // The file written through the overlay landed on the writable disk.
    let out = Command::new(&debugfs)
        .args(["-R", "cat /upper/root/hello.txt"])
        .arg(&layer)
        .output()
        .unwrap();
    assert_eq!(out.stdout, HELLO);
    std::fs::remove_dir_all(&dir).unwrap();
}

struct ConsoleOnPanic(testkit::Capture);

impl Drop for ConsoleOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("guest console:\n{}", self.0.text());
        }
    }
}

/// Bounds the guest operations (slow where guest kernel mode is emulated).
async fn within<T>(what: &str, bound: Duration, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(bound, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took over {} s", bound.as_secs()))
}
