//! End to end on the real guest kernel: the ext4 test root filesystem on a
//! read-only /dev/vda, a writable ext4 data disk on /dev/vdb, and vsock.
//! The guest's /init (guest/devtest/devtest.c) writes a file on vdb, echoes
//! 1 MiB the host sends over a host-initiated vsock connection, and sends
//! 1 MiB over a guest-initiated one that the host echoes back. One boot.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use vmm_core::devices::serial::ConsoleSink;
use vmm_core::machine::{DiskConfig, VsockConfig};
use vmm_core::{Machine, MachineConfig, StopReason};

const TOTAL: usize = 1 << 20;
const STEP: usize = 64 << 10;

/// The byte at `off` of the test stream; the guest program computes the same.
fn pattern(off: u64) -> u8 {
    off.wrapping_mul(131)
        .wrapping_add((off >> 8).wrapping_mul(7))
        .wrapping_add(1) as u8
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Echoes everything it reads on the first connection to `<uds>_6000`.
fn echo_server(listener: UnixListener) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; STEP];
        let mut total = 0;
        loop {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break total,
                Ok(n) => {
                    conn.write_all(&buf[..n]).unwrap();
                    total += n;
                }
            }
        }
    })
}

/// Connects through the hybrid socket and checks the guest echoes 1 MiB.
fn host_initiated_echo(uds: &Path) {
    let mut conn = UnixStream::connect(uds).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    conn.write_all(b"CONNECT 5000\n").unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("OK "),
        "unexpected handshake answer {line:?}"
    );
    let mut back = vec![0u8; STEP];
    for step in 0..TOTAL / STEP {
        let chunk: Vec<u8> = (0..STEP)
            .map(|i| pattern((step * STEP + i) as u64))
            .collect();
        conn.write_all(&chunk).unwrap();
        reader.read_exact(&mut back).unwrap();
        assert!(back == chunk, "echo of step {step} differs");
    }
}

#[test]
fn guest_uses_ext4_root_data_disk_and_vsock() {
    let test = "guest_uses_ext4_root_data_disk_and_vsock";
    let Some(assets) = testkit::require(test, testkit::guest_assets()) else {
        return;
    };
    let (Some(mkfs), Some(debugfs)) = (
        testkit::require(test, testkit::host_tool("mkfs.ext4")),
        testkit::require(test, testkit::host_tool("debugfs")),
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("microagent-devtest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data.ext4");
    std::fs::File::create(&data)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    run(Command::new(&mkfs).args(["-q", "-F"]).arg(&data));
    let uds = dir.join("vsock.sock");
    let echo = echo_server(UnixListener::bind(format!("{}_6000", uds.display())).unwrap());

    let console = testkit::Capture::default();
    let machine = Machine::build(MachineConfig {
        kernel: assets.kernel.clone(),
        initrd: None,
        extra_cmdline: Some("root=/dev/vda ro rootfstype=ext4 init=/init".into()),
        mem_mib: 128,
        vcpus: 1,
        template: assets.host.cpu_template(),
        console: ConsoleSink::new().with(Box::new(console.clone())),
        disks: vec![
            DiskConfig {
                path: assets.test_rootfs.clone(),
                read_only: true,
                id: None,
            },
            DiskConfig {
                path: data.clone(),
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
    let vm = std::thread::spawn(move || machine.run(Some(Duration::from_secs(400))).unwrap());

    let listening = testkit::wait_until(Duration::from_secs(300), || {
        let text = console.text();
        text.contains("MICROAGENT-DEVTEST listening 5000")
            || text.contains("FAIL")
            || text.contains("reboot:")
    });
    assert!(
        listening && console.text().contains("listening 5000"),
        "guest never listened:\n{}",
        console.text()
    );
    host_initiated_echo(&uds);

    let outcome = vm.join().unwrap();
    let log = console.text();
    testkit::guest_faults::assert_no_faults("guest", &log);
    assert_eq!(
        outcome.reason,
        StopReason::Reset,
        "registers: {:?}\n{log}",
        outcome.registers
    );
    for marker in ["disk-ok", "echo-ok", "connect-ok", "done"] {
        assert!(
            log.contains(&format!("MICROAGENT-DEVTEST {marker}")),
            "no {marker}:\n{log}"
        );
    }
    assert_eq!(
        echo.join().unwrap(),
        TOTAL,
        "the host echoed all of the guest's data"
    );
    let file = run(Command::new(&debugfs)
        .args(["-R", "cat /from-guest.txt"])
        .arg(&data));
    assert_eq!(file, "written by the guest over virtio-blk\n");
    std::fs::remove_dir_all(&dir).unwrap();
}
