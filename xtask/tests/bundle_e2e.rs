//! The release bundle as a new user meets it: `cargo xtask dist --bundle`
//! (of the binaries `cargo test --workspace` built beside the xtask, not
//! a second, release build; run alone, `cargo build` them first), unpacked
//! and installed into a fresh prefix with its `install.sh`, then, as a
//! user of the `kvm` group made here who never ran setup and has no Rust
//! toolchain on PATH, `microagent run -- uname -a` boots a workspace from
//! the bundle's own kernel and `minimal` image; its bash completion loads
//! and `man microagent` renders.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TEST: &str = "bundle_e2e::an_unpacked_bundle_runs_a_workspace_for_a_kvm_user";

fn root() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err("it makes a user of its own, which needs root".into())
    }
}

/// The user this test made, and its files: gone when dropped.
struct TestUser {
    name: String,
    work: PathBuf,
}

impl Drop for TestUser {
    fn drop(&mut self) {
        // A VMM left by a failed run would keep the user busy.
        for _ in 0..20 {
            let _ = Command::new("pkill")
                .args(["-KILL", "-u", &self.name])
                .status();
            std::thread::sleep(std::time::Duration::from_millis(250));
            let gone = Command::new("userdel").arg(&self.name).status();
            if gone.is_ok_and(|s| s.success()) {
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The test's directory: a fresh name under /tmp, made here (never one
/// that was there already), root's, which every user may pass through.
fn fresh_work_dir() -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    // /tmp itself: TMPDIR may name a directory the new user cannot pass.
    let work = PathBuf::from(format!("/tmp/ma-bundle-{}-{nanos:x}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&work)
        .unwrap_or_else(|e| panic!("making {}: {e}", work.display()));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755)).unwrap();
    work
}

fn ok(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `program args` as the test user, with only the environment a login
/// would give it (no cargo, no MICROAGENT_* of the test run).
fn as_user(user: &TestUser, prefix: &Path, program: &str, args: &[&str]) -> Output {
    let home = user.work.join("home");
    Command::new("setpriv")
        .args([
            "--reuid",
            &user.name,
            "--regid",
            &user.name,
            "--init-groups",
            "--",
        ])
        .args(["env", "-i"])
        .arg(format!("HOME={}", home.display()))
        .arg(format!(
            "PATH={}/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            prefix.display()
        ))
        .arg(format!("MANPATH={}/share/man", prefix.display()))
        .args(["LANG=C.UTF-8", "MANPAGER=cat", "MAN_KEEP_FORMATTING="])
        .arg(program)
        .args(args)
        .current_dir(&home)
        .output()
        .unwrap()
}

/// `debugfs -R "stat PATH"` of the image `rootfs`: (uid, gid, mode).
fn owner_in_image(rootfs: &Path, path: &str) -> (u32, u32, String) {
    let out = ok(
        "debugfs",
        Command::new("debugfs")
            .args(["-R", &format!("stat {path}")])
            .arg(rootfs)
            .output()
            .unwrap(),
    );
    let after = |key: &str| -> String {
        out.split(key)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("{key} of {path}: {out}"))
            .to_owned()
    };
    (
        after("User:").parse().unwrap(),
        after("Group:").parse().unwrap(),
        after("Mode:"),
    )
}

/// As the kvm user, a Debian image built without root (mmdebstrap in the
/// user's subordinate ids, which `useradd` gave them): its files keep
/// root's, the shadow group's and the image user's owners, and setuid
/// bits.
fn rootless_debian_build(user: &TestUser, prefix: &Path) {
    const TEST: &str = "bundle_e2e::a_debian_image_is_built_without_root";
    let ids = std::fs::read_to_string("/etc/subuid")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with(&format!("{}:", user.name)));
    let ids = if ids {
        Ok(())
    } else {
        Err(format!("useradd gave {} no subordinate uids", user.name))
    };
    if testkit::require(TEST, ids).is_none()
        || testkit::require(TEST, testkit::host_tool("newuidmap")).is_none()
        || testkit::require(TEST, testkit::host_tool("mmdebstrap")).is_none()
    {
        return;
    }
    let built = as_user(
        user,
        prefix,
        "microagent",
        &[
            "image",
            "build",
            "deb-user",
            "--from",
            "debian:bookworm",
            "--yes",
            "--json",
        ],
    );
    ok("image build --from debian:bookworm as the kvm user", built);
    let inspected = as_user(
        user,
        prefix,
        "microagent",
        &["image", "inspect", "deb-user", "--json"],
    );
    let info: serde_json::Value = serde_json::from_str(&ok("image inspect", inspected)).unwrap();
    let rootfs = PathBuf::from(info["rootfs"].as_str().unwrap_or_else(|| panic!("{info}")));
    assert!(
        rootfs.starts_with(user.work.join("home")),
        "{}",
        rootfs.display()
    );
    assert_eq!(
        owner_in_image(&rootfs, "/etc/shadow").1,
        42,
        "the shadow group"
    );
    assert_eq!(
        owner_in_image(&rootfs, "/home/user").0,
        1000,
        "the image's user"
    );
    let (uid, _, mode) = owner_in_image(&rootfs, "/usr/bin/passwd");
    assert_eq!((uid, mode.as_str()), (0, "04755"), "setuid root");
    assert_eq!(owner_in_image(&rootfs, "/etc/resolv.conf").0, 0);
}

#[test]
fn an_unpacked_bundle_runs_a_workspace_for_a_kvm_user() {
    let Some(()) = testkit::require(TEST, root()) else {
        return;
    };
    let Some(()) = testkit::require(TEST, testkit::kvm()) else {
        return;
    };
    let Some(_) = testkit::require(TEST, testkit::guest_assets()) else {
        return;
    };
    let Some(_) = testkit::require(TEST, testkit::workspace_image("minimal")) else {
        return;
    };
    assert!(
        workspace::host::kvm_group::missing_steps().is_none(),
        "the kvm group cannot use /dev/kvm: `cargo xtask setup` (or `microagent setup --yes`) gives it"
    );

    let work = fresh_work_dir();
    // Unique per run (a killed run's user must not block the next).
    let name = format!(
        "mab{}",
        work.file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("ma-bundle-")
            .replace('-', "")
    );
    let name: String = name.chars().take(31).collect();
    std::fs::create_dir(work.join("home")).unwrap();
    // The kvm group, if the host has one (a device every user may use
    // needs none).
    let groups: &[&str] = if workspace::host::kvm_group::group_id("kvm").is_some() {
        &["--groups", "kvm"]
    } else {
        &[]
    };
    // A name taken already fails here, before a guard would remove it.
    let made = Command::new("useradd")
        .args(["--no-create-home", "--user-group"])
        .args(groups)
        .args(["--shell", "/bin/sh", "--home-dir"])
        .arg(work.join("home"))
        .arg(&name)
        .output()
        .unwrap();
    if !made.status.success() {
        let _ = std::fs::remove_dir_all(&work);
        panic!("useradd {name}: {}", String::from_utf8_lossy(&made.stderr));
    }
    let user = TestUser { name, work };
    ok(
        "chown",
        Command::new("chown")
            .arg(format!("{0}:{0}", user.name))
            .arg(user.work.join("home"))
            .output()
            .unwrap(),
    );

    // The bundle of this build's binaries (they sit beside the xtask).
    let xtask = Path::new(env!("CARGO_BIN_EXE_xtask"));
    let out = user.work.join("out");
    let built = ok(
        "xtask dist --bundle",
        Command::new(xtask)
            .args(["dist", "--bundle", "--kernels", "host", "--binaries"])
            .arg(xtask.parent().unwrap())
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap(),
    );
    let tarball = PathBuf::from(built.trim());
    let file_name = tarball.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        file_name.starts_with("microagent-") && file_name.ends_with("-x86_64-linux.tar.gz"),
        "{file_name}"
    );

    // Unpacked elsewhere, then installed into a fresh prefix.
    let unpacked = user.work.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    ok(
        "tar",
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&unpacked)
            .output()
            .unwrap(),
    );
    let tree = unpacked.join(file_name.trim_end_matches(".tar.gz"));
    for part in ["LICENSE", "lib/systemd/system/microagent-mcp.service"] {
        assert!(tree.join(part).is_file(), "{part} is in the bundle");
    }
    let prefix = user.work.join("prefix");
    ok(
        "install.sh",
        Command::new(tree.join("install.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .output()
            .unwrap(),
    );
    for part in [
        "bin/microagent",
        "bin/microagent-vmm",
        "bin/containerd-shim-microagent-v2",
        "libexec/microagent/microagent-agent",
        "libexec/microagent/microagent-init",
        "share/microagent/rootfs-minimal.ext4",
        "share/zsh/site-functions/_microagent",
        "share/fish/vendor_completions.d/microagent.fish",
    ] {
        assert!(prefix.join(part).is_file(), "{part} is installed");
    }

    // The first commands of a user who never ran setup: the doctor finds
    // the bundle's kernel, and a workspace runs.
    let doctor = as_user(&user, &prefix, "microagent", &["doctor", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let kernel = report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "guest_kernel"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(kernel["status"], "ok", "{report}");
    let run = as_user(&user, &prefix, "microagent", &["run", "--", "uname", "-a"]);
    let stdout = ok("microagent run -- uname -a as the kvm user", run);
    assert!(
        stdout.contains("Linux ") && stdout.contains("x86_64"),
        "{stdout}"
    );
    rootless_debian_build(&user, &prefix);
    // Booted from the bundle's kernel, copied into the user's own cache
    // (a link to the bundle's path could later name someone else's file).
    let variant = testkit::host().unwrap().kernel_variant().vmlinux_file();
    let cache = user.work.join("home/.cache/microagent");
    let target = std::fs::canonicalize(cache.join("current").join(&variant)).unwrap();
    assert!(
        target.starts_with(cache.join("bundle")),
        "{}",
        target.display()
    );
    assert!(
        std::fs::read(&target).unwrap()
            == std::fs::read(prefix.join("share/microagent").join(&variant)).unwrap(),
        "the cache's copy is the bundle's kernel"
    );

    // Installed again (an upgrade): each file is a new one, renamed into
    // place, so a running VMM or a registry's link keeps the old.
    use std::os::unix::fs::MetadataExt;
    let inode = |p: &str| std::fs::metadata(prefix.join(p)).unwrap().ino();
    let kernel = format!("share/microagent/{variant}");
    let before = (inode("bin/microagent-vmm"), inode(&kernel));
    ok(
        "install.sh again",
        Command::new(tree.join("install.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .output()
            .unwrap(),
    );
    assert_ne!(inode("bin/microagent-vmm"), before.0);
    assert_ne!(inode(&kernel), before.1);
    // As root, a prefix another user could write is refused.
    let theirs = user.work.join("home/prefix");
    std::fs::create_dir(&theirs).unwrap();
    let refused = Command::new("chown")
        .arg(&user.name)
        .arg(&theirs)
        .status()
        .unwrap();
    assert!(refused.success());
    let out = Command::new(tree.join("install.sh"))
        .arg("--prefix")
        .arg(&theirs)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a user's directory as root's prefix");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not root's alone"));

    let completion = as_user(
        &user,
        &prefix,
        "bash",
        &[
            "-c",
            &format!(
                "source {}/share/bash-completion/completions/microagent && complete -p microagent",
                prefix.display()
            ),
        ],
    );
    let said = ok("bash loads the completion", completion);
    assert!(said.contains("microagent"), "{said}");

    for page in ["microagent", "microagent-run"] {
        let man = ok("man", as_user(&user, &prefix, "man", &[page]));
        let text: String = man.chars().filter(|c| *c != '\u{8}').collect();
        assert!(
            text.contains("SYNOPSIS") && text.contains(page),
            "{page}: {text}"
        );
    }
}
