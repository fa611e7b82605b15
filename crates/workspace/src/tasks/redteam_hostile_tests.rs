//! Red-team attacks on merge-back that the first hostile tests
//! (`hostile_tests.rs`) do not cover, through the same real path: the
//! guest's bundle checked and fetched, then [`merge_task`] with the host's
//! git. Each test first shows plain git would have been hurt.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::merge::merge_task;
use crate::repos::git;
use crate::repos::incoming::{check_bundle, RepoLimits};

fn sh(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// (root, user repo on `main`, guest clone, base commit).
fn repos(test: &str) -> Option<(PathBuf, PathBuf, PathBuf, String)> {
    if crate::host::settings::host_tool("git").is_none() {
        crate::test_support::skip(test, "git is not installed");
        return None;
    }
    let root = std::env::temp_dir().join(format!("ma-redteam-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let user = root.join("user");
    std::fs::create_dir_all(&user).unwrap();
    sh(&user, &["init", "-q", "-b", "main"]);
    std::fs::write(user.join("README"), "hello\n").unwrap();
    sh(&user, &["add", "."]);
    sh(&user, &["commit", "-qm", "first"]);
    let base = sh(&user, &["rev-parse", "HEAD"]);
    let guest = root.join("guest");
    let out = Command::new("git")
        .args(["clone", "-q"])
        .arg(&user)
        .arg(&guest)
        .output()
        .unwrap();
    assert!(out.status.success());
    Some((root, user, guest, base))
}

fn bundle(root: &Path, guest: &Path, base: &str) -> PathBuf {
    let file = root.join("pull.bundle");
    let range = format!("{base}..HEAD");
    sh(
        guest,
        &[
            "bundle",
            "create",
            "-q",
            file.to_str().unwrap(),
            "HEAD",
            &range,
        ],
    );
    file
}

fn take(
    root: &Path,
    user: &Path,
    file: &Path,
    base: &str,
    limits: &RepoLimits,
) -> super::merge::MergeResult {
    check_bundle(file, limits).unwrap();
    git::fetch_bundle_head(user, file, "refs/tasks/t1").unwrap();
    merge_task(
        user,
        "main",
        base,
        "refs/tasks/t1",
        &root.join("scratch"),
        limits,
    )
    .unwrap()
}

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
        if crate::host::settings::host_tool("git").is_none() {
            crate::test_support::skip(test, "git is not installed");
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
    let Some((root, user, guest, base)) = repos(test) else {
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
