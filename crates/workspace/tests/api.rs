//! The library as a program that embeds it sees it: the builder, a fake
//! image, the life cycle of a workspace that never boots, and the stable
//! codes and remedies of what fails. No KVM needed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use testkit::disks::{FailingDisk, SmallDisk};
use workspace::{
    DeleteOptions, ErrorCode, ExecInput, ExecRequest, ListFilter, Remedy, State, WorkspaceSpec,
    Workspaces,
};

/// A state directory with one fake image, removed on drop.
struct Home {
    root: PathBuf,
    ws: Workspaces,
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn home(test: &str) -> Home {
    let root = std::env::temp_dir().join(format!("microagent-api-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let src = root.join("image");
    testkit::fake_image_files(&src);
    let ws = Workspaces::builder()
        .state_dir(root.join("state"))
        .assets(None)
        .vmm_program("/nonexistent/vmm")
        .build()
        .unwrap();
    ws.image_registry().import_dir("fake", &src).unwrap();
    Home { root, ws }
}

/// Creating a workspace formats its disk with mkfs.ext4.
fn have_mkfs(test: &str) -> bool {
    workspace::test_support::have_mkfs(
        test,
        workspace::host::settings::host_tool("mkfs.ext4").is_some(),
    )
}

fn spec() -> WorkspaceSpec {
    WorkspaceSpec {
        image: "fake".into(),
        disk_mib: 64,
        ..WorkspaceSpec::default()
    }
}

#[test]
fn a_workspace_from_create_to_delete() {
    let test = "a_workspace_from_create_to_delete";
    if !have_mkfs(test) {
        return;
    }
    let h = home("cycle");
    let meta = h.ws.create("dev", spec()).unwrap();
    assert_eq!(meta.state, State::Stopped);
    let names: Vec<String> =
        h.ws.list(&ListFilter::default())
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
    assert_eq!(names, ["dev"]);

    let taken = h.ws.create("dev", spec()).unwrap_err();
    assert_eq!(taken.code(), ErrorCode::Conflict);
    assert_eq!(
        taken.remedy(),
        Some(Remedy::ChooseAnotherName {
            workspace: "dev".into()
        })
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stopped = rt
        .block_on(
            h.ws.workspace("dev")
                .unwrap()
                .exec_collect(ExecRequest::argv(["true"]), ExecInput::None),
        )
        .unwrap_err();
    assert_eq!(stopped.code(), ErrorCode::NotRunning);
    assert_eq!(
        stopped.remedy(),
        Some(Remedy::StartWorkspace {
            workspace: "dev".into()
        })
    );
    // The VMM program does not exist: the start fails and names it.
    let failed = rt
        .block_on(
            h.ws.workspace("dev")
                .unwrap()
                .start(Duration::from_secs(5), |_| {}),
        )
        .unwrap_err();
    assert!(
        failed.full_message().contains("/nonexistent/vmm"),
        "{failed}"
    );

    h.ws.workspace("dev")
        .unwrap()
        .get()
        .unwrap()
        .check_delete(DeleteOptions::default())
        .unwrap();
    h.ws.workspace("dev")
        .unwrap()
        .delete(DeleteOptions::default())
        .unwrap();
    assert!(h.ws.list(&ListFilter::default()).unwrap().is_empty());
}

#[test]
fn unknown_names_fail_with_codes_and_change_nothing() {
    let h = home("unknown");
    let missing = h.ws.workspace("nope").unwrap().get().unwrap_err();
    assert_eq!(missing.code(), ErrorCode::NotFound);
    assert_eq!(missing.remedy(), Some(Remedy::ListWorkspaces));
    let bad =
        h.ws.workspace("Not A Name")
            .and_then(|w| w.get())
            .unwrap_err();
    assert_eq!(bad.code(), ErrorCode::InvalidInput);
    assert_eq!(
        h.ws.workspace("Not A Name").unwrap_err().code(),
        ErrorCode::InvalidInput
    );
    let handle = h.ws.workspace("nope").unwrap();
    assert_eq!(handle.name(), "nope");
    assert_eq!(handle.get().unwrap_err().code(), ErrorCode::NotFound);
    let no_image =
        h.ws.create(
            "dev",
            WorkspaceSpec {
                image: "nope".into(),
                ..spec()
            },
        )
        .unwrap_err();
    assert_eq!(no_image.code(), ErrorCode::NotFound);
    assert_eq!(no_image.remedy(), Some(Remedy::ListImages));
    assert!(h.ws.list(&ListFilter::default()).unwrap().is_empty());
}

#[test]
fn one_shot_runs_clean_up_whatever_happens() {
    let test = "one_shot_runs_clean_up_whatever_happens";
    if !have_mkfs(test) {
        return;
    }
    let h = home("oneshot");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let run = workspace::OneShot::new("try", spec());
    let none = || h.ws.list(&ListFilter::default()).unwrap().is_empty();

    // A boot cancelled before it began: nothing ran, nothing remains.
    let end = rt
        .block_on(h.ws.run_once(
            &run,
            |_| async { Ok::<_, workspace::Error>(false) },
            |_| async { Ok(()) },
        ))
        .unwrap();
    assert!(end.workspace.starts_with("try-"), "{}", end.workspace);
    assert!(matches!(end.outcome, Ok(None)));
    end.cleanup.unwrap();
    assert!(none());

    // The work failed: its error comes back, and the workspace is gone.
    let end = rt
        .block_on(
            h.ws.run_once(
                &run,
                |_| async { Ok(true) },
                |name| async move {
                    Err::<(), _>(workspace::Error::InvalidInput(format!("{name} failed")))
                },
            ),
        )
        .unwrap();
    assert!(end.outcome.unwrap_err().to_string().ends_with(" failed"));
    assert!(none());

    // Kept: stopped, there to inspect.
    let kept = run
        .clone()
        .named(Some("kept".into()))
        .afterwards(workspace::Afterwards::KeepStopped);
    let end = rt
        .block_on(h.ws.run_once(
            &kept,
            |_| async { Ok::<_, workspace::Error>(true) },
            |name| async move { Ok(name) },
        ))
        .unwrap();
    assert_eq!(end.outcome.unwrap().as_deref(), Some("kept"));
    assert_eq!(
        h.ws.workspace("kept").unwrap().get().unwrap().state,
        State::Stopped
    );

    // A name that is taken fails before anything is created.
    let taken = rt.block_on(h.ws.run_once(
        &kept,
        |_| async { Ok::<_, workspace::Error>(true) },
        |_| async { Ok(()) },
    ));
    assert_eq!(taken.unwrap_err().code(), ErrorCode::Conflict);
    h.ws.workspace("kept")
        .unwrap()
        .delete(DeleteOptions::default())
        .unwrap();
}

/// The host budget (`budget.json` in the state directory): a create below
/// the free-disk floor and a start past the running budget are refused
/// with CONFLICT before anything is made or launched.
#[tokio::test]
async fn the_host_budget_refuses_creates_and_starts_past_it() {
    let test = "the_host_budget_refuses_creates_and_starts_past_it";
    if !have_mkfs(test) {
        return;
    }
    let h = home("budget");
    let budget = h
        .root
        .join("state")
        .join(workspace::host::budget::BUDGET_FILE);
    std::fs::write(&budget, r#"{"min_free_disk_mib": 1099511627776}"#).unwrap();
    let err = h.ws.create("full", spec()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Conflict, "{err}");
    assert!(err.to_string().contains("floor"), "{err}");
    assert!(h.ws.list(&ListFilter::default()).unwrap().is_empty());

    std::fs::write(&budget, r#"{"max_running": 0}"#).unwrap();
    h.ws.create("dev", spec()).unwrap();
    let err =
        h.ws.workspace("dev")
            .unwrap()
            .start(Duration::from_secs(5), |_| {})
            .await
            .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Conflict, "{err}");
    assert!(err.to_string().contains("host budget"), "{err}");
    // Refused before any VMM was launched: still stopped.
    assert_eq!(
        h.ws.workspace("dev").unwrap().get().unwrap().state,
        State::Stopped
    );

    std::fs::write(&budget, r#"{"max_running": "many"}"#).unwrap();
    let err = h.ws.create("bad", spec()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidInput, "{err}");
}

/// A stopped workspace's disk copied into a snapshot store that fails
/// (`fail` mounts it on the store's directory): a clear error naming one
/// of `errors`, no snapshot, no temporary directory, the workspace as it
/// was.
fn a_failed_snapshot_leaves_nothing<G>(
    test: &str,
    tag: &str,
    fail: impl FnOnce(&Path) -> Option<G>,
    errors: &[&str],
) {
    if !have_mkfs(test) {
        return;
    }
    let h = home(tag);
    h.ws.create("dev", spec()).unwrap();
    let snapshots = h.ws.state_dir().root().join("snapshots");
    let Some(disk) = fail(&snapshots) else {
        return;
    };
    let taken = h.ws.workspace("dev").unwrap().snapshot_take(Some("full"));
    let left: Vec<_> = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    drop(disk);
    let err = taken.unwrap_err();
    let chain = workspace::error_chain(&err);
    assert!(errors.iter().any(|e| chain.contains(e)), "{chain}");
    assert!(left.is_empty(), "left in the snapshot store: {left:?}");
    assert!(h.ws.snapshots().get("full").is_err());
    assert_eq!(
        h.ws.workspace("dev").unwrap().get().unwrap().state,
        State::Stopped
    );
}

/// ENOSPC: the snapshot store a 256 KiB tmpfs (root only).
#[test]
fn a_snapshot_onto_a_full_disk_leaves_nothing() {
    let test = "a_snapshot_onto_a_full_disk_leaves_nothing";
    a_failed_snapshot_leaves_nothing(
        test,
        "fullsnap",
        |at| SmallDisk::mount(test, at, "256k"),
        &["No space left"],
    );
}

/// EIO: the snapshot store on a disk whose device fails every write (root
/// only); the copy is synced, so the failure is seen now.
#[test]
fn a_snapshot_onto_a_failing_disk_leaves_nothing() {
    let test = "a_snapshot_onto_a_failing_disk_leaves_nothing";
    a_failed_snapshot_leaves_nothing(
        test,
        "eiosnap",
        |at| {
            let mut disk = FailingDisk::mount(test, at)?;
            disk.fail(true);
            Some(disk)
        },
        &["Input/output error"],
    );
}
