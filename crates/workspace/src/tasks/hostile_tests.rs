//! A guest's commits as an attacker writes them, through the host's real
//! path: the guest's bundle checked ([`check_bundle`]) and fetched
//! ([`git::fetch_bundle_head`]), then merged ([`merge_task`]) into a user
//! repository with the host's git. Each test first shows that plain git
//! would have been hurt, so none passes by accident.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::merge::merge_task;
use crate::repos::git;
use crate::repos::incoming::{check_bundle, RepoLimits};

/// Plain git, as a user runs it (hooks and filters as configured): its
/// trimmed stdout; the merge tests' too.
pub(super) fn sh(dir: &Path, args: &[&str]) -> String {
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

/// A user repository on `main` (with `setup` done and committed) and a
/// "guest" clone of it: (root, user repo, guest clone, base commit).
pub(super) fn repos(
    test: &str,
    setup: impl Fn(&Path),
) -> Option<(PathBuf, PathBuf, PathBuf, String)> {
    if base::host::settings::host_tool("git").is_none() {
        base::test_support::skip(test, "git is not installed");
        return None;
    }
    let root = std::env::temp_dir().join(format!("ma-hostile-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let user = root.join("user");
    std::fs::create_dir_all(&user).unwrap();
    sh(&user, &["init", "-q", "-b", "main"]);
    std::fs::write(user.join("README"), "hello\n").unwrap();
    setup(&user);
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

/// The guest's commits since `base` as a bundle, as the guest agent's
/// pull script writes it.
pub(super) fn bundle(root: &Path, guest: &Path, base: &str) -> PathBuf {
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

/// The host's side under `limits`: check, fetch to `refs/tasks/t1`, merge
/// onto main.
pub(super) fn take(
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

fn write_exec(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn hooks_and_filters_a_guest_commits_never_run_on_the_host() {
    let test = "hooks_and_filters_a_guest_commits_never_run_on_the_host";
    let Some((root, user, guest, base)) = repos(test, |_| {}) else {
        return;
    };
    let marker = root.join("ran");
    // A husky-style repository keeps its hooks in the work tree, and the
    // user has a filter driver the guest's attributes may name.
    sh(&user, &["config", "core.hooksPath", ".githooks"]);
    let touch = format!("#!/bin/sh\necho \"$0\" >> {}\n", marker.display());
    sh(
        &user,
        &[
            "config",
            "filter.evil.smudge",
            &format!("sh -c 'echo smudge >> {}; cat'", marker.display()),
        ],
    );
    for hook in [
        "reference-transaction",
        "post-merge",
        "post-checkout",
        "pre-auto-gc",
    ] {
        write_exec(&guest.join(".githooks").join(hook), &touch);
    }
    std::fs::write(guest.join(".gitattributes"), "*.txt filter=evil\n").unwrap();
    std::fs::write(guest.join("note.txt"), "guest\n").unwrap();
    sh(&guest, &["add", "."]);
    sh(&guest, &["commit", "-qm", "hooks"]);
    let file = bundle(&root, &guest, &base);
    let r = take(&root, &user, &file, &base, &RepoLimits::default());
    assert!(r.merged, "{r:?}");
    assert!(user.join(".githooks/reference-transaction").exists());
    // Later host git on the repository: deleting the task's ref, another
    // fetch.
    git::run(&user, ["update-ref", "-d", "refs/tasks/t1"]).unwrap();
    git::fetch_bundle_head(&user, &file, "refs/tasks/t2").unwrap();
    assert!(
        !marker.exists(),
        "host git ran guest code: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    // Plain git would have run them: the test can fail.
    sh(&user, &["update-ref", "refs/tasks/plain", "HEAD"]);
    assert!(marker.exists(), "plain git did not run the guest's hook");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_guest_commit_never_replaces_an_ignored_file() {
    let test = "a_guest_commit_never_replaces_an_ignored_file";
    let Some((root, user, guest, base)) = repos(test, |user| {
        std::fs::write(user.join(".gitignore"), ".env\nbuild/\n").unwrap();
    }) else {
        return;
    };
    std::fs::write(user.join(".env"), "SECRET=mine\n").unwrap();
    std::fs::write(guest.join(".env"), "SECRET=guest\n").unwrap();
    sh(&guest, &["add", "-f", ".env"]);
    sh(&guest, &["commit", "-qm", "env"]);
    let file = bundle(&root, &guest, &base);
    let tip = sh(&user, &["rev-parse", "main"]);
    let r = take(&root, &user, &file, &base, &RepoLimits::default());
    assert!(!r.merged, "{r:?}");
    assert!(r.reason.as_deref().unwrap().contains("`.env`"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(user.join(".env")).unwrap(),
        "SECRET=mine\n"
    );
    assert_eq!(sh(&user, &["rev-parse", "main"]), tip);
    assert!(!sh(&user, &["rev-parse", "refs/tasks/t1"]).is_empty());
    // Through an untracked file where the guest wants a directory.
    std::fs::write(user.join("build"), "mine\n").unwrap();
    sh(&guest, &["rm", "-q", "--cached", ".env"]);
    std::fs::create_dir_all(guest.join("build")).unwrap();
    std::fs::write(guest.join("build/x"), "guest\n").unwrap();
    sh(&guest, &["add", "-f", "build/x"]);
    sh(&guest, &["commit", "-qm", "build"]);
    let file = bundle(&root, &guest, &base);
    let r = take(&root, &user, &file, &base, &RepoLimits::default());
    assert!(
        !r.merged && r.reason.as_deref().unwrap().contains("`build`"),
        "{r:?}"
    );
    assert_eq!(
        std::fs::read_to_string(user.join("build")).unwrap(),
        "mine\n"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_fan_out_bundle_is_refused_before_anything_is_written() {
    let test = "a_fan_out_bundle_is_refused_before_anything_is_written";
    let Some((root, user, guest, base)) = repos(test, |_| {}) else {
        return;
    };
    // One 4 MiB blob, a tree naming it 64 times, a tree naming that 64
    // times: 16 GiB of files from a bundle of a few KiB.
    let mut hash = Command::new("git")
        .arg("-C")
        .arg(&guest)
        .args(["hash-object", "-w", "--stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    hash.stdin
        .take()
        .unwrap()
        .write_all(&vec![b'a'; 4 << 20])
        .unwrap();
    let blob = String::from_utf8(hash.wait_with_output().unwrap().stdout).unwrap();
    let mktree = |lines: String| {
        let mut c = Command::new("git")
            .arg("-C")
            .arg(&guest)
            .arg("mktree")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
        String::from_utf8(c.wait_with_output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_owned()
    };
    let inner = mktree(
        (0..64)
            .map(|i| format!("100644 blob {}\tf{i}\n", blob.trim()))
            .collect(),
    );
    let outer = mktree(
        (0..64)
            .map(|i| format!("040000 tree {inner}\td{i}\n"))
            .collect(),
    );
    let commit = sh(
        &guest,
        &["commit-tree", &outer, "-p", &base, "-m", "fan-out"],
    );
    sh(&guest, &["reset", "-q", "--soft", &commit]);
    let file = bundle(&root, &guest, &base);
    assert!(std::fs::metadata(&file).unwrap().len() < 64 << 10);
    let r = take(&root, &user, &file, &base, &RepoLimits::default());
    assert!(!r.merged, "{r:?}");
    assert!(
        r.reason
            .as_deref()
            .unwrap()
            .contains("repos.max_checkout_bytes"),
        "{r:?}"
    );
    assert_eq!(sh(&user, &["status", "--porcelain", "--ignored"]), "");
    assert!(!user.join("d0").exists() && !root.join("scratch").exists());
    // A bundle over the object limit is refused before git reads it.
    let few = RepoLimits {
        max_bundle_objects: 2,
        ..RepoLimits::default()
    };
    let why = check_bundle(&file, &few).unwrap_err();
    assert!(why.contains("repos.max_bundle_objects"), "{why}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A pack of one 16 MiB blob of zeros and one delta against it that
/// copies it 32 times (512 MiB), in a bundle of some 16 KiB.
fn delta_bomb(root: &Path) -> PathBuf {
    use flate2::{write::ZlibEncoder, Compression};
    fn header(kind: u8, mut size: u64) -> Vec<u8> {
        let mut out = vec![(kind << 4) | (size & 0x0f) as u8];
        size >>= 4;
        while size > 0 {
            *out.last_mut().unwrap() |= 0x80;
            out.push((size & 0x7f) as u8);
            size >>= 7;
        }
        out
    }
    fn varint(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn deflate(data: &[u8]) -> Vec<u8> {
        let mut z = ZlibEncoder::new(Vec::new(), Compression::best());
        z.write_all(data).unwrap();
        z.finish().unwrap()
    }
    let base_size: u64 = 16 << 20;
    let mut pack = b"PACK\0\0\0\x02\0\0\0\x02".to_vec();
    pack.extend(header(3, base_size));
    pack.extend(deflate(&vec![0u8; base_size as usize]));
    let delta_at = pack.len();
    let mut delta = Vec::new();
    varint(base_size, &mut delta);
    varint(32 * 0xff_ffff, &mut delta);
    for _ in 0..32 {
        delta.extend([0xf0, 0xff, 0xff, 0xff]);
    }
    pack.extend(header(6, delta.len() as u64));
    // The distance back to the base (at 12), in git's offset encoding.
    let mut ofs = (delta_at - 12) as u64;
    let mut enc = vec![(ofs & 0x7f) as u8];
    ofs >>= 7;
    while ofs > 0 {
        ofs -= 1;
        enc.insert(0, 0x80 | (ofs & 0x7f) as u8);
        ofs >>= 7;
    }
    pack.extend(enc);
    pack.extend(deflate(&delta));
    let pack_path = root.join("bomb.pack");
    std::fs::write(&pack_path, &pack).unwrap();
    let sum = Command::new("sha1sum").arg(&pack_path).output().unwrap();
    let hex = String::from_utf8(sum.stdout).unwrap();
    let hex = hex.split_whitespace().next().unwrap().to_owned();
    for i in 0..20 {
        pack.push(u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap());
    }
    std::fs::write(&pack_path, &pack).unwrap();
    let file = root.join("bomb.bundle");
    let mut bundle = format!("# v2 git bundle\n{} HEAD\n\n", "1".repeat(40)).into_bytes();
    bundle.extend(pack);
    std::fs::write(&file, bundle).unwrap();
    file
}

#[test]
fn a_delta_bomb_bundle_is_refused_with_host_git_under_its_cap() {
    let test = "a_delta_bomb_bundle_is_refused_with_host_git_under_its_cap";
    let Some((root, user, guest, _base)) = repos(test, |_| {}) else {
        return;
    };
    let file = delta_bomb(&root);
    assert!(std::fs::metadata(&file).unwrap().len() < 64 << 10);
    check_bundle(&file, &RepoLimits::default()).unwrap();
    let err = git::fetch_bundle_head(&user, &file, "refs/tasks/t1").unwrap_err();
    let text = base::error_chain::error_chain(&err);
    assert!(
        text.contains("over limit") || text.contains("allocate"),
        "{text}"
    );
    assert!(sh(&user, &["for-each-ref", "refs/tasks"]).is_empty());
    // Plain git takes the same pack, inflating 512 MiB: the cap is what
    // refused it.
    let plain = Command::new("git")
        .arg("-C")
        .arg(&guest)
        .args(["index-pack", "--stdin"])
        .stdin(std::fs::File::open(root.join("bomb.pack")).unwrap())
        .output()
        .unwrap();
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let _ = std::fs::remove_dir_all(&root);
}
