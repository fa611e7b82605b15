//! Red-team attacks on merge-back that the first hostile tests
//! (`hostile_tests.rs`) do not cover, through the same real path: the
//! guest's bundle checked and fetched, then [`super::merge::merge_task`] with the host's
//! git. Each test first shows plain git would have been hurt.

use std::path::Path;
use std::process::Command;

use super::hostile_tests::{bundle, repos, sh, take};
use crate::repos::incoming::RepoLimits;

/// Filter drivers are made inert when `host_tool::git_driver_overrides`
/// lists them; it must read the config the run reads, the user's own
/// `~/.gitconfig` included (where `git lfs install` writes `filter.lfs.*`),
/// or the guest's `.gitattributes` naming such a driver runs it on the
/// host. Run in a child test process with a HOME of its own.
#[test]
fn a_filter_in_the_users_global_config_never_runs_on_guest_data() {
    let test = "a_filter_in_the_users_global_config_never_runs_on_guest_data";
    const CHILD: &str = "MICROAGENT_REDTEAM_CHILD";
    if std::env::var_os(CHILD).is_none() {
        if base::host::settings::host_tool("git").is_none() {
            base::test_support::skip(test, "git is not installed");
            return;
        }
        let home = std::env::temp_dir().join(format!("ma-redteam-home-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tasks::redteam_hostile_tests::a_filter_in_the_users_global_config_never_runs_on_guest_data",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("HOME", &home)
            .env_remove("XDG_CONFIG_HOME")
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_dir_all(&home);
        assert!(said.contains("1 passed"), "the child test failed:\n{said}");
        return;
    }
    let Some((root, user, guest, base)) = repos(test, |_| {}) else {
        return;
    };
    let marker = root.join("ran");
    // In the user's ~/.gitconfig (this child's HOME), as `git lfs install`
    // writes its filter.
    sh(
        &user,
        &[
            "config",
            "--global",
            "filter.lfs.smudge",
            &format!("sh -c 'echo smudge >> {}; cat'", marker.display()),
        ],
    );
    std::fs::write(guest.join(".gitattributes"), "*.bin filter=lfs\n").unwrap();
    std::fs::write(guest.join("data.bin"), "guest\n").unwrap();
    sh(&guest, &["add", "."]);
    sh(&guest, &["commit", "-qm", "lfs"]);
    // Plain git would: the filter is the user's, the attribute the guest's.
    assert!(!marker.exists());
    let file = bundle(&root, &guest, &base);
    let r = take(&root, &user, &file, &base, &RepoLimits::default());
    assert!(
        !marker.exists(),
        "merged={}: the user's global filter.lfs.smudge ran on the guest's file",
        r.merged
    );
    let _ = std::fs::remove_dir_all(&root);
}
/// Bytes of the files under `dir`, `.git` left out.
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for e in entries.flatten() {
        if e.file_name() == ".git" {
            continue;
        }
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            total += tree_bytes(&e.path());
        } else {
            total += m.len();
        }
    }
    total
}

/// The guest's `.gitattributes` names `ident`: each 4-byte `$Id$` becomes
/// `$Id: <40 hex> $` (46 bytes) on checkout, so a tree whose blobs sum to
/// under `max_checkout_bytes` writes 11.5 times that (1 GiB -> 11.5 GiB).
#[test]
fn an_ident_attribute_never_writes_past_the_checkout_limit() {
    let test = "an_ident_attribute_never_writes_past_the_checkout_limit";
    let Some((root, user, guest, base)) = repos(test, |_| {}) else {
        return;
    };
    let limit: u64 = 1 << 20;
    std::fs::write(guest.join(".gitattributes"), "* ident\n").unwrap();
    let blob = "$Id$".repeat(65536); // 256 KiB
    for i in 0..3 {
        std::fs::write(guest.join(format!("f{i}")), &blob).unwrap();
    }
    sh(&guest, &["add", "."]);
    sh(&guest, &["commit", "-qm", "ident"]);
    let file = bundle(&root, &guest, &base);
    let limits = RepoLimits {
        max_checkout_bytes: limit,
        ..RepoLimits::default()
    };
    let before = tree_bytes(&user);
    let r = take(&root, &user, &file, &base, &limits);
    let written = tree_bytes(&user) - before;
    assert!(
        written <= limit,
        "merged={} ({:?}): {written} bytes written into the work tree, over the limit of {limit}",
        r.merged,
        r.reason
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The limit is checked on the task's final tree only, but a rebase checks
/// out every commit it replays: commit 1 adds a fan-out (one blob named
/// many times), commit 2 removes it. The final tree is tiny; the scratch
/// worktree still gets the whole fan-out (a 4 KiB bundle naming one 4 MiB
/// blob 4,096 times puts 16 GiB on the host's disk).
#[test]
fn a_rebase_never_writes_an_intermediate_commit_past_the_checkout_limit() {
    let test = "a_rebase_never_writes_an_intermediate_commit_past_the_checkout_limit";
    let Some((root, user, guest, base)) = repos(test, |_| {}) else {
        return;
    };
    let limit: u64 = 1 << 20;
    let blob: Vec<u8> = (0..(256u32 << 10))
        .map(|i| i.wrapping_mul(2654435761) as u8)
        .collect();
    for i in 0..128 {
        std::fs::write(guest.join(format!("b{i}")), &blob).unwrap();
    }
    sh(&guest, &["add", "."]);
    sh(&guest, &["commit", "-qm", "fan-out"]);
    sh(&guest, &["rm", "-q", "b*"]);
    sh(&guest, &["commit", "-qm", "gone"]);
    std::fs::write(guest.join("note"), "task\n").unwrap();
    sh(&guest, &["add", "note"]);
    sh(&guest, &["commit", "-qm", "note"]);
    let file = bundle(&root, &guest, &base);
    // The branch moved: merge-back rebases in `scratch`.
    std::fs::write(user.join("moved"), "x\n").unwrap();
    sh(&user, &["add", "moved"]);
    sh(&user, &["commit", "-qm", "moved"]);
    let scratch = root.join("scratch");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (done, scratch) = (done.clone(), scratch.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(tree_bytes(&scratch));
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            most
        })
    };
    let limits = RepoLimits {
        max_checkout_bytes: limit,
        ..RepoLimits::default()
    };
    let r = take(&root, &user, &file, &base, &limits);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().unwrap();
    assert!(
        most <= limit,
        "merged={} method={:?}: the rebase's scratch worktree held {most} bytes, over the limit of {limit}",
        r.merged,
        r.method
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The user signs their commits (`commit.gpgSign`, `gpg.program`): a
/// rebase of the guest's commits runs the user's signing program on them
/// (the guest's content signed with the user's key), though `gpg.program`
/// names a program and every such key is to be made inert.
#[test]
fn a_rebase_never_runs_the_users_signing_program_on_guest_commits() {
    let test = "a_rebase_never_runs_the_users_signing_program_on_guest_commits";
    let Some((root, user, guest, base)) = repos(test, |_| {}) else {
        return;
    };
    let marker = root.join("ran");
    let gpg = root.join("gpg");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(
            &gpg,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\ncat >/dev/null\necho '[GNUPG:] SIG_CREATED ' >&2\n",
                marker.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&gpg, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(guest.join("note"), "guest\n").unwrap();
    sh(&guest, &["add", "note"]);
    sh(&guest, &["commit", "-qm", "guest"]);
    let file = bundle(&root, &guest, &base);
    std::fs::write(user.join("moved"), "x\n").unwrap();
    sh(&user, &["add", "moved"]);
    sh(&user, &["commit", "-qm", "moved"]);
    sh(&user, &["config", "commit.gpgSign", "true"]);
    sh(&user, &["config", "gpg.program", gpg.to_str().unwrap()]);
    let r = take(&root, &user, &file, &base, &RepoLimits::default());
    assert!(
        !marker.exists(),
        "merged={} method={:?}: the user's gpg.program ran: {}",
        r.merged,
        r.method,
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&root);
}
