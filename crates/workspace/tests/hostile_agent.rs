//! The library's entry points against a hostile agent
//! (`guest_agent::fake`) on the workspace's vsock socket that answers
//! every request with more than was asked for, without end. Each entry
//! point ends with an error, keeps no more than its bound in memory, and
//! leaves no partial file on the host (MCP's `run_code` against the same
//! fake: crates/mcp/tests/hostile_agent.rs). No KVM needed: the
//! workspace's record says it runs, with this test process as its VMM.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use guest_agent::fake::{self, Hostility};
use testkit::disks::{FailingDisk, SmallDisk};
use workspace::{ErrorCode, ExecInput, ExecRequest, StateDir, WorkspaceSpec, Workspaces};

/// A state directory with a fake image and a workspace `dev` recorded as
/// running (its "VMM" is this process), its agent the hostile fake.
struct Home {
    root: PathBuf,
    ws: Workspaces,
}

impl Drop for Home {
    fn drop(&mut self) {
        // Never `delete`: it would halt the "VMM", this process.
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn home(test: &str, hostility: Hostility, limits: workspace::Limits) -> Option<Home> {
    if workspace::host::settings::host_tool("mkfs.ext4").is_none() {
        testkit::skip(
            test,
            "mkfs.ext4 is not installed (apt-get install e2fsprogs)",
        );
        return None;
    }
    let root = std::env::temp_dir().join(format!("ma-hostile-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    testkit::fake_image_files(&root.join("image"));
    let ws = Workspaces::builder()
        .state_dir(root.join("state"))
        .assets(None)
        .vmm_program("/nonexistent/vmm")
        .limits(limits)
        .build()
        .unwrap();
    ws.image_registry()
        .import_dir("fake", &root.join("image"))
        .unwrap();
    let spec = WorkspaceSpec {
        image: "fake".into(),
        disk_mib: 64,
        ..WorkspaceSpec::default()
    };
    ws.create("dev", spec).unwrap();
    let dir = StateDir::at(root.join("state"))
        .unwrap()
        .workspace_dir("dev")
        .unwrap();
    testkit::pretend_running(&dir);
    fake::serve(
        UnixListener::bind(dir.join("vsock.sock")).unwrap(),
        hostility,
    );
    Some(Home { root, ws })
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn read_file_and_copy_out_of_a_file_stop_at_their_bounds() {
    let Some(h) = home("file", Hostility::EndlessFile, workspace::LIMITS) else {
        return;
    };
    let rt = runtime();
    let read = rt
        .block_on(
            h.ws.workspace("dev")
                .unwrap()
                .files()
                .read_file("/f", None, Some(1 << 20)),
        )
        .unwrap_err();
    let chain = workspace::error_chain(&read);
    assert!(chain.contains("more than"), "{chain}");

    // The guest said 10 bytes: copy_out takes that plus the growth allowance.
    let dest = h.root.join("out");
    std::fs::create_dir_all(&dest).unwrap();
    let err = rt
        .block_on(
            h.ws.workspace("dev")
                .unwrap()
                .files()
                .copy_out("/f", &dest.join("f")),
        )
        .unwrap_err();
    let chain = workspace::error_chain(&err);
    let budget = 10 + workspace::host::host_write::COPY_OUT_GROWTH;
    assert!(
        chain.contains(&format!("over its budget of {budget} bytes")),
        "{chain}"
    );
    assert!(files_in(&dest).is_empty(), "left {:?}", files_in(&dest));
}

#[test]
fn copy_out_of_a_directory_stops_at_the_byte_budget() {
    let limits = workspace::Limits {
        max_copy_out_bytes: 8 << 20,
        ..workspace::LIMITS
    };
    let Some(h) = home("archive", Hostility::EndlessArchive, limits) else {
        return;
    };
    let dest = h.root.join("out");
    std::fs::create_dir_all(&dest).unwrap();
    let err = runtime()
        .block_on(
            h.ws.workspace("dev")
                .unwrap()
                .files()
                .copy_out("/d", &dest.join("d")),
        )
        .unwrap_err();
    let chain = workspace::error_chain(&err);
    assert!(
        chain.contains("over its budget of 8388608 bytes"),
        "{chain}"
    );
    // The directory is made first; nothing is in it, no temporary beside it.
    assert_eq!(files_in(&dest), ["d"]);
    assert!(files_in(&dest.join("d")).is_empty());
}

#[test]
fn copy_out_of_a_directory_stops_at_the_entry_budget() {
    let limits = workspace::Limits {
        max_copy_out_entries: 10,
        ..workspace::LIMITS
    };
    let Some(h) = home("entries", Hostility::ManyEntries(100), limits) else {
        return;
    };
    let dest = h.root.join("out");
    let err = runtime()
        .block_on(h.ws.workspace("dev").unwrap().files().copy_out("/d", &dest))
        .unwrap_err();
    let chain = workspace::error_chain(&err);
    assert!(chain.contains("entries"), "{chain}");
    assert!(files_in(&dest).len() <= 10, "{:?}", files_in(&dest));
}

#[test]
fn an_exec_that_floods_then_stalls_ends_with_its_deadline_and_bounded_memory() {
    let Some(h) = home("exec", Hostility::FloodThenStall, workspace::LIMITS) else {
        return;
    };
    let req = ExecRequest::argv(["yes"])
        .timeout(Duration::from_secs(1))
        .output_cap(1 << 20);
    let err = runtime()
        .block_on(
            h.ws.workspace("dev")
                .unwrap()
                .exec_collect(req, ExecInput::None),
        )
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Timeout, "{err}");
    // A gibibyte went by; what stayed was about the cap.
    let peak = testkit::peak_rss_kib();
    assert!(peak < 256 << 10, "peak resident {peak} KiB");
}

/// A guest file (`/f`) or directory (`/d`) copied out onto a disk that
/// fails: a clear error naming one of `errors`, the file that was there
/// intact, no temporary or partial file left. `mount` mounts the disk on
/// the destination's directory; `fail` makes it fail once what was there
/// is written.
fn copy_out_onto_a_failing_disk<G>(
    cases: [(&str, Hostility, &str); 2],
    mount: impl Fn(&Path) -> Option<G>,
    fail: impl Fn(&mut G),
    errors: &[&str],
) {
    for (tag, hostility, guest) in cases {
        let Some(h) = home(tag, hostility, workspace::LIMITS) else {
            return;
        };
        let dir = h.root.join("small");
        std::fs::create_dir_all(&dir).unwrap();
        let kept = dir.join("kept");
        let target = dir.join("out");
        let Some(mut disk) = mount(&dir) else {
            return;
        };
        std::fs::write(&kept, "what was there\n").unwrap();
        if guest == "/f" {
            std::fs::write(&target, "the previous copy\n").unwrap();
        }
        fail(&mut disk);
        let err = runtime()
            .block_on(
                h.ws.workspace("dev")
                    .unwrap()
                    .files()
                    .copy_out(guest, &target),
            )
            .unwrap_err();
        let chain = workspace::error_chain(&err);
        assert!(errors.iter().any(|e| chain.contains(e)), "{tag}: {chain}");
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "what was there\n");
        if guest == "/f" {
            assert_eq!(
                std::fs::read_to_string(&target).unwrap(),
                "the previous copy\n"
            );
        } else {
            // The directory is made first and stays empty or keeps what
            // it took before the disk failed, never more.
            assert!(target.is_dir(), "{tag}");
        }
        assert_eq!(files_in(&dir), ["kept", "out"], "{tag}");
        drop(disk);
    }
}

/// ENOSPC: the destination a 256 KiB tmpfs (root only); the guest sends
/// without end.
#[test]
fn copy_out_onto_a_full_disk_keeps_what_was_there() {
    let test = "copy_out_onto_a_full_disk_keeps_what_was_there";
    copy_out_onto_a_failing_disk(
        [
            ("fullfile", Hostility::EndlessFile, "/f"),
            ("fulldir", Hostility::EndlessArchive, "/d"),
        ],
        |dir| SmallDisk::mount(test, dir, "256k"),
        |_| {},
        &["No space left"],
    );
}

/// EIO: the destination on a disk whose device fails every write (root
/// only); the guest sends a whole file, or an archive of 50 files. The
/// copy is synced before it replaces anything, so the failure is seen.
#[test]
fn copy_out_onto_a_failing_disk_keeps_what_was_there() {
    let test = "copy_out_onto_a_failing_disk_keeps_what_was_there";
    copy_out_onto_a_failing_disk(
        [
            ("eiofile", Hostility::WholeFile(1 << 20), "/f"),
            ("eiodir", Hostility::ManyEntries(50), "/d"),
        ],
        |dir| FailingDisk::mount(test, dir),
        |disk| disk.fail(true),
        &["Input/output error"],
    );
}
