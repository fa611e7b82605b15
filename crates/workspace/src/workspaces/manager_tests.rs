//! Life-cycle tests that need no KVM: a fake image, and fake VMM processes.

use super::*;
use crate::code::ErrorCode;
use crate::host::settings::{host_tool, now_ms};
use crate::images::registry::{KERNEL_FILE, ROOTFS_FILE};
use crate::vmm_process::guard::seccomp_violation;

struct Fixture {
    root: PathBuf,
    ws: Workspaces,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn fixture(test: &str, vmm_binary: &str) -> Fixture {
    let root = PathBuf::from(format!("/tmp/ma-mgr-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let src = root.join("src");
    crate::test_support::fake_image_files(&src);
    assert!(src.join(KERNEL_FILE).exists() && src.join(ROOTFS_FILE).exists());
    let state = StateDir::at(root.join("state")).unwrap();
    let ws = Workspaces::new(state, None, PathBuf::from(vmm_binary));
    ws.images().import_dir("fake", &src).unwrap();
    Fixture { root, ws }
}

fn spec() -> WorkspaceSpec {
    WorkspaceSpec {
        image: "fake".into(),
        disk_mib: 64,
        ..WorkspaceSpec::default()
    }
}

/// Whether mkfs.ext4 is here (else `test` is recorded as skipped).
fn have_mkfs(test: &str) -> bool {
    crate::test_support::have_mkfs(test, host_tool("mkfs.ext4").is_some())
}

#[test]
fn create_list_inspect_delete() {
    if !have_mkfs("create_list_inspect_delete") {
        return;
    }
    let f = fixture("cycle", "/nonexistent");
    let meta = f.ws.create("dev", spec()).unwrap();
    assert_eq!(meta.state, State::Stopped);
    assert_eq!(
        f.ws.create("dev", spec()).unwrap_err().code(),
        ErrorCode::Conflict
    );
    let info = f.ws.inspect("dev").unwrap();
    assert!(info.dir.join("disk.ext4").exists());
    assert_eq!(
        std::fs::metadata(info.dir.join("disk.ext4")).unwrap().len(),
        64 << 20
    );
    assert_eq!(f.ws.list(&ListFilter::default()).unwrap().len(), 1);
    let only_running = ListFilter {
        state: Some(State::Running),
        ..ListFilter::default()
    };
    assert!(f.ws.list(&only_running).unwrap().is_empty());
    assert_eq!(f.ws.image_users("fake").unwrap(), vec!["dev".to_string()]);
    assert_eq!(
        f.ws.remove_image("fake").unwrap_err().code(),
        ErrorCode::Conflict
    );
    // Halting or stopping a stopped workspace changes nothing.
    assert_eq!(f.ws.halt("dev").unwrap().state, State::Stopped);
    f.ws.delete("dev", DeleteOptions::default()).unwrap();
    let left: Vec<_> = std::fs::read_dir(f.ws.state_dir().root().join("workspaces"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "delete removes the directory and the lock");
    assert_eq!(f.ws.get("dev").unwrap_err().code(), ErrorCode::NotFound);
    f.ws.remove_image("fake").unwrap();
}

#[test]
fn a_dead_vmm_is_recorded_as_crashed_once() {
    if !have_mkfs("a_dead_vmm_is_recorded_as_crashed_once") {
        return;
    }
    let f = fixture("crash", "/nonexistent");
    f.ws.create("dev", spec()).unwrap();
    let dir = f.ws.dir("dev").unwrap();
    std::fs::write(dir.path().join("console.log"), "booting\nKernel says hi\n").unwrap();
    // A process that ran and is gone stands for a VMM killed with -9.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let ticks = process::start_ticks(pid).unwrap_or(1);
    child.wait().unwrap();
    let mut meta = dir.read_meta().unwrap();
    meta.state = State::Running;
    meta.runtime = Some(Runtime {
        pid,
        pid_start: ticks,
        started_at_ms: now_ms(),
        ready_at_ms: Some(now_ms()),
        ttl_deadline_ms: None,
        start_kind: None,
        launched_mono_ns: None,
        vcpu_running_us: None,
        protections: Vec::new(),
        ready_us: None,
    });
    dir.write_meta(&meta).unwrap();
    std::fs::write(dir.control(), b"").unwrap();

    let seen = f.ws.get("dev").unwrap();
    assert_eq!(seen.state, State::Crashed);
    let exit = seen.last_exit.unwrap();
    assert!(exit.reason.contains(&pid.to_string()));
    assert_eq!(exit.console_tail, vec!["booting", "Kernel says hi"]);
    assert!(
        !dir.control().exists(),
        "the dead VMM's sockets are removed"
    );
    assert_eq!(f.ws.get("dev").unwrap().state, State::Crashed);
    let crashes = dir
        .events()
        .read_after(0)
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e.kind, EventKind::Crashed { .. }))
        .count();
    assert_eq!(crashes, 1, "recorded once, however often it is looked at");
    let err = futures_exec(&f.ws);
    assert_eq!(err.code(), ErrorCode::NotRunning);
}

fn futures_exec(ws: &Workspaces) -> Error {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(ws.exec_collect(
        "dev",
        crate::ExecRequest::argv(["true"]),
        crate::ExecInput::None,
    ))
    .unwrap_err()
}

#[test]
fn a_start_whose_vmm_cannot_run_changes_nothing() {
    if !have_mkfs("a_start_whose_vmm_cannot_run_changes_nothing") {
        return;
    }
    let f = fixture("nostart", "/nonexistent/microagent");
    f.ws.create("dev", spec()).unwrap();
    let before = f.ws.get("dev").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(f.ws.start("dev", Duration::from_secs(5), |_| {}))
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Internal);
    assert!(err.full_message().contains("/nonexistent/microagent"));
    assert_eq!(f.ws.get("dev").unwrap(), before);
    assert_eq!(
        rt.block_on(f.ws.start("ghost", Duration::from_secs(5), |_| {}))
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
}

#[test]
fn concurrent_creates_of_one_name_make_one_workspace() {
    if !have_mkfs("concurrent_creates_of_one_name_make_one_workspace") {
        return;
    }
    let f = fixture("race", "/nonexistent");
    let results: Vec<Result<Meta>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| f.ws.create("same", spec())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.code(), ErrorCode::Conflict);
    }
    assert_eq!(f.ws.list(&ListFilter::default()).unwrap().len(), 1);
    // Delete racing with deletes: one wins, the others find nothing.
    let deleted: Vec<Result<Meta>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| s.spawn(|| f.ws.delete("same", DeleteOptions::default().force(true))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(deleted.iter().filter(|r| r.is_ok()).count(), 1);
    let left: Vec<_> = std::fs::read_dir(f.ws.state_dir().root().join("workspaces"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "losing deletes leave no lock file: {left:?}"
    );
}

#[test]
fn a_damaged_record_does_not_hide_the_others() {
    if !have_mkfs("a_damaged_record_does_not_hide_the_others") {
        return;
    }
    let f = fixture("damaged", "/nonexistent");
    f.ws.create("good", spec()).unwrap();
    f.ws.create("bad", spec()).unwrap();
    std::fs::write(f.ws.dir("bad").unwrap().meta_path(), b"{ torn").unwrap();
    let names: Vec<String> =
        f.ws.list(&ListFilter::default())
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
    assert_eq!(names, vec!["good".to_string()]);
    let err = f.ws.inspect("bad").unwrap_err();
    assert!(
        err.full_message().contains("damaged"),
        "{}",
        err.full_message()
    );
}

#[test]
fn waiting_for_events_returns_new_ones_or_times_out() {
    if !have_mkfs("waiting_for_events_returns_new_ones_or_times_out") {
        return;
    }
    let f = fixture("events-wait", "/nonexistent");
    f.ws.create("dev", spec()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let last = rt
        .block_on(f.ws.events("dev", 0, Duration::ZERO))
        .unwrap()
        .last()
        .map_or(0, |e| e.seq);
    let start = std::time::Instant::now();
    let none = rt
        .block_on(f.ws.events("dev", last, Duration::from_millis(300)))
        .unwrap();
    assert!(none.is_empty());
    assert!(start.elapsed() >= Duration::from_millis(300));
    let writer = f.ws.dir("dev").unwrap().events();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        writer.append(EventKind::TtlExpired).unwrap();
    });
    let got = rt
        .block_on(f.ws.events("dev", last, Duration::from_secs(10)))
        .unwrap();
    assert_eq!(got[0].kind, EventKind::TtlExpired);
    t.join().unwrap();
}

#[test]
fn extending_a_stopped_workspaces_ttl_adds_to_it() {
    if !have_mkfs("extending_a_stopped_workspaces_ttl_adds_to_it") {
        return;
    }
    let f = fixture("ttlext", "/nonexistent");
    f.ws.create("dev", spec()).unwrap();
    // No TTL yet: the extension becomes it.
    assert_eq!(
        f.ws.extend_ttl("dev", 1800).unwrap().spec.ttl_secs,
        Some(1800)
    );
    assert_eq!(
        f.ws.extend_ttl("dev", 3600).unwrap().spec.ttl_secs,
        Some(5400)
    );
    let max = crate::store::spec::LIMITS.max_ttl_secs;
    let err = f.ws.extend_ttl("dev", max).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidInput, "{err}");
    assert_eq!(
        f.ws.extend_ttl("dev", 0).unwrap_err().code(),
        ErrorCode::InvalidInput
    );
    assert_eq!(
        f.ws.get("dev").unwrap().spec.ttl_secs,
        Some(5400),
        "refusals change nothing"
    );
    assert_eq!(
        f.ws.extend_ttl("ghost", 60).unwrap_err().code(),
        ErrorCode::NotFound
    );
}

#[test]
fn a_seccomp_kill_is_named_from_the_vmm_log() {
    let f = fixture("seccomp", "/nonexistent-vmm");
    f.ws.create("dev", spec()).unwrap();
    let ws = f.ws.dir("dev").unwrap();
    assert_eq!(seccomp_violation(&ws), None, "no log yet");
    let log = format!(
        "INFO machine built\n{} the devices thread made syscall 59, outside its filter\n",
        vmm_core::seccomp::VIOLATION_PREFIX
    );
    std::fs::write(ws.path().join(VMM_LOG), log).unwrap();
    assert_eq!(
        seccomp_violation(&ws).as_deref(),
        Some("the devices thread made syscall 59, outside its filter")
    );
}

#[test]
fn a_snapshot_take_or_delete_killed_half_way_is_swept_by_the_next_listing() {
    let f = fixture("snapsweep", "/nonexistent/vmm");
    let dir = f.ws.state_dir().root().join(crate::store::SNAPSHOTS_DIR);
    let dead = [
        format!(".s1.{}.tmp", u32::MAX),
        format!(".s2.{}.rm", u32::MAX),
    ];
    let live = format!(".s3.{}.tmp", std::process::id());
    for name in dead.iter().chain([&live]) {
        std::fs::create_dir_all(dir.join(name)).unwrap();
    }
    assert!(f.ws.snapshot_list(None).unwrap().is_empty());
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, [live]);
}
