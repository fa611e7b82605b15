//! containerd runs containers in microagent workspaces through this
//! crate's shim, end to end: Debian's containerd started by the test with
//! its own root and socket, a busybox OCI image the test writes imported
//! with `ctr`, and `ctr` driving every step on the real guest kernel.
//! One suite, its steps in order: the first container boots, the others
//! resume the image's warm snapshot. A pod through the CRI plugin
//! (`cri.rs`) runs beside it with a containerd of its own.

mod cri;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use testkit::containerd::{self as harness, Containerd, RUNTIME};

/// The shim under test.
const SHIM: &str = env!("CARGO_BIN_EXE_containerd-shim-microagent-v2");

#[test]
fn containerd_runs_containers_in_microvms() {
    let test = "containerd_runs_containers_in_microvms";
    if testkit::require(test, harness::missing().map_or(Ok(()), Err)).is_none() {
        return;
    }
    let mut ctrd = Containerd::start("run", Path::new(SHIM));
    let image = ctrd.import_test_image();
    runs_on_the_guest_kernel(&ctrd, &image);
    keeps_streams_apart_with_the_exit_code(&ctrd, &image);
    feeds_stdin(&ctrd, &image);
    one_image_is_converted_once(&ctrd);
    runs_on_a_terminal_that_resizes(&ctrd, &image);
    detached_exec_kill_and_rm_leave_nothing(&ctrd, &image);
    outlives_a_containerd_restart(&mut ctrd, &image);
    a_killed_shim_leaves_nothing(&ctrd, &image);
    testkit::guest_faults::assert_no_faults_in(&ctrd.home);
}

#[test]
fn a_pods_containers_share_one_microvm() {
    let test = "a_pods_containers_share_one_microvm";
    if testkit::require(test, harness::missing().map_or(Ok(()), Err)).is_none() {
        return;
    }
    cri::a_pods_containers_share_one_microvm(Path::new(SHIM));
}

fn run_args<'a>(image: &'a str, id: &'a str, command: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--runtime", RUNTIME, "--rm", image, id];
    args.extend_from_slice(command);
    args
}

/// `ctr run ... uname -r` prints the release of the guest kernel (the one
/// in our kernel image), not the host's: a real microVM ran it.
fn runs_on_the_guest_kernel(ctrd: &Containerd, image: &str) {
    let release = ctrd.ctr_ok(&run_args(image, "uname", &["busybox", "uname", "-r"]));
    let release = release.trim();
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let kernel = std::fs::read(testkit::guest_assets().unwrap().kernel).unwrap();
    let banner = format!("Linux version {release} ");
    assert!(
        kernel.windows(banner.len()).any(|w| w == banner.as_bytes()),
        "the container's kernel release {release:?} is not our guest kernel's"
    );
    assert_ne!(release, host.trim(), "the container ran on the host kernel");
}

/// Stdout and stderr arrive apart, the exit code is the process's, and the
/// process runs as the image's user in its working directory.
fn keeps_streams_apart_with_the_exit_code(ctrd: &Containerd, image: &str) {
    let out = ctrd.ctr(&run_args(
        image,
        "streams",
        &[
            "sh",
            "-c",
            "id -u; pwd; echo to-out; echo to-err >&2; exit 3",
        ],
    ));
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1000\n/srv/app\nto-out\n"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "to-err\n");
}

/// A container that reads stdin gets what the client writes, then end of
/// file.
fn feeds_stdin(ctrd: &Containerd, image: &str) {
    let mut child = ctrd
        .ctr_command(&run_args(image, "stdin", &["sh", "-c", "cat; echo done"]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"line one\nline two\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "line one\nline two\ndone\n"
    );
}

/// Every container so far had the same image: its root filesystem was
/// converted once.
fn one_image_is_converted_once(ctrd: &Containerd) {
    let images: Vec<String> = std::fs::read_dir(ctrd.home.join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ctr-rootfs-"))
        .collect();
    assert_eq!(images.len(), 1, "{images:?}");
}

/// `ctr run -t`: a shell on a terminal whose size follows the client's.
fn runs_on_a_terminal_that_resizes(ctrd: &Containerd, image: &str) {
    let mut cmd = ctrd.ctr_command(&[
        "run",
        "--runtime",
        RUNTIME,
        "--rm",
        "-t",
        image,
        "tty",
        "sh",
    ]);
    cmd.env("TERM", "dumb");
    let mut term = testkit::terminal::Terminal::spawn(cmd, 24, 80);
    term.type_text("busybox stty size\n");
    term.wait_for("24 80", Duration::from_secs(120));
    term.resize(30, 100);
    // The client passes the new size on when it sees SIGWINCH.
    std::thread::sleep(Duration::from_millis(500));
    term.type_text("busybox stty size\n");
    term.wait_for("30 100", Duration::from_secs(60));
    term.type_text("exit 7\n");
    let status = term.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(7), "{}", term.screen());
}

/// `ctr run -d IMAGE ID busybox sleep 1000`.
fn run_detached(ctrd: &Containerd, image: &str, id: &str) {
    let args = [
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        image,
        id,
        "busybox",
        "sleep",
        "1000",
    ];
    ctrd.ctr_ok(&args);
}

/// `ctr run -d`, a second process by `ctr task exec`, SIGTERM by `ctr task
/// kill` (exit status 143, as runc's), and `ctr task rm`: no VMM, passt,
/// cgroup or workspace state left.
fn detached_exec_kill_and_rm_leave_nothing(ctrd: &Containerd, image: &str) {
    run_detached(ctrd, image, "bg");
    assert!(ctrd.ctr_ok(&["tasks", "ls"]).contains("RUNNING"));
    let out = ctrd.ctr_ok(&[
        "tasks",
        "exec",
        "--exec-id",
        "e1",
        "bg",
        "sh",
        "-c",
        "echo from-exec; id -u",
    ]);
    assert_eq!(out, "from-exec\n1000\n");
    let pids = ctrd.ctr_ok(&["tasks", "ps", "bg"]);
    assert!(pids.lines().count() >= 2, "{pids}");
    // The guest's memory, in cgroup terms.
    let metrics = ctrd.ctr_ok(&["tasks", "metrics", "bg"]);
    let usage = metrics
        .lines()
        .find(|l| l.starts_with("memory.usage_in_bytes"))
        .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok());
    assert!(usage.is_some_and(|u| u > 0), "{metrics}");
    // Pause and resume: the guest's vCPUs.
    ctrd.ctr_ok(&["tasks", "pause", "bg"]);
    assert!(ctrd.ctr_ok(&["tasks", "ls"]).contains("PAUSED"));
    ctrd.ctr_ok(&["tasks", "resume", "bg"]);
    assert!(ctrd.ctr_ok(&["tasks", "ls"]).contains("RUNNING"));
    // A checkpoint (containerd pauses, asks, resumes) is a full-VM
    // snapshot of the workspace, and the container runs on.
    ctrd.ctr_ok(&["tasks", "checkpoint", "bg"]);
    let all = testkit::open_state_dir(&ctrd.home).unwrap();
    let snapshots = all.snapshots().list(None, true).unwrap();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    assert!(snapshots[0].has_memory);
    let out = ctrd.ctr_ok(&[
        "tasks",
        "exec",
        "--exec-id",
        "e2",
        "bg",
        "busybox",
        "echo",
        "after",
    ]);
    assert_eq!(out, "after\n");
    all.snapshots().delete(&snapshots[0].name).unwrap();
    ctrd.ctr_ok(&["tasks", "kill", "-s", "SIGTERM", "bg"]);
    let stopped = testkit::wait_until(Duration::from_secs(30), || {
        ctrd.ctr_ok(&["tasks", "ls"]).contains("STOPPED")
    });
    assert!(stopped, "{}", ctrd.ctr_ok(&["tasks", "ls"]));
    // `ctr task rm` reports the task's status.
    let rm = ctrd.ctr(&["tasks", "rm", "bg"]);
    assert!(rm.status.success(), "{rm:?}");
    assert!(
        String::from_utf8_lossy(&rm.stderr).contains("exit code 143"),
        "{rm:?}"
    );
    ctrd.ctr_ok(&["containers", "rm", "bg"]);
    assert_nothing_left(ctrd);
}

/// containerd restarted: it finds the running task through its shim.
fn outlives_a_containerd_restart(ctrd: &mut Containerd, image: &str) {
    run_detached(ctrd, image, "kept");
    ctrd.stop();
    ctrd.launch();
    let tasks = ctrd.ctr_ok(&["tasks", "ls"]);
    assert!(
        tasks
            .lines()
            .any(|l| l.starts_with("kept") && l.contains("RUNNING")),
        "{tasks}"
    );
    let out = ctrd.ctr_ok(&[
        "tasks",
        "exec",
        "--exec-id",
        "after",
        "kept",
        "busybox",
        "echo",
        "still-here",
    ]);
    assert_eq!(out, "still-here\n");
    ctrd.ctr_ok(&["tasks", "kill", "-s", "SIGKILL", "kept"]);
    assert!(testkit::wait_until(Duration::from_secs(30), || {
        ctrd.ctr_ok(&["tasks", "ls"]).contains("STOPPED")
    }));
    let _ = ctrd.ctr(&["tasks", "rm", "kept"]);
    ctrd.ctr_ok(&["containers", "rm", "kept"]);
    assert_nothing_left(ctrd);
}

/// The shim killed with SIGKILL: containerd runs the shim's `delete`,
/// which stops and removes the container's workspace; the task is
/// reported ended (status 137) and nothing is left.
fn a_killed_shim_leaves_nothing(ctrd: &Containerd, image: &str) {
    run_detached(ctrd, image, "doomed");
    let shims = ctrd.shim_pids();
    assert_eq!(shims.len(), 1, "{shims:?}");
    // SAFETY: kill takes two integers.
    unsafe { libc::kill(shims[0] as i32, libc::SIGKILL) };
    assert!(Containerd::wait_gone(shims[0], Duration::from_secs(10)));
    let cleaned = testkit::wait_until(Duration::from_secs(60), || {
        testkit::leftovers::processes_of(&ctrd.home).is_empty()
    });
    assert!(
        cleaned,
        "{:?}\n{}",
        testkit::leftovers::processes_of(&ctrd.home),
        harness::tail(&ctrd.log(), 40)
    );
    let tasks = ctrd.ctr_ok(&["tasks", "ls"]);
    assert!(
        !tasks
            .lines()
            .any(|l| l.starts_with("doomed") && l.contains("RUNNING")),
        "{tasks}"
    );
    let _ = ctrd.ctr(&["tasks", "rm", "doomed"]);
    ctrd.ctr_ok(&["containers", "rm", "doomed"]);
    assert_nothing_left(ctrd);
}

fn assert_nothing_left(ctrd: &Containerd) {
    let gone = testkit::wait_until(Duration::from_secs(30), || {
        testkit::leftovers::processes_of(&ctrd.home).is_empty()
    });
    assert!(gone, "{:?}", testkit::leftovers::processes_of(&ctrd.home));
    testkit::leftovers::assert_none(&ctrd.home);
}
