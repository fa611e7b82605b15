//! The release bundle as a new user meets it: `cargo xtask dist --bundle`
//! (of this test build's binaries, not a second, release build), unpacked
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
        let _ = Command::new("pkill")
            .args(["-KILL", "-u", &self.name])
            .status();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let _ = Command::new("userdel").arg(&self.name).status();
        let _ = std::fs::remove_dir_all(&self.work);
    }
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

    let name = format!("mabundle{}", std::process::id() % 1_000_000);
    let work = std::env::temp_dir().join(format!("ma-{name}"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("home")).unwrap();
    // Every user passes through to the prefix; the home is the user's.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755)).unwrap();
    let user = TestUser { name, work };
    ok(
        "useradd",
        Command::new("useradd")
            .args(["--no-create-home", "--user-group", "--groups", "kvm"])
            .args(["--shell", "/bin/sh", "--home-dir"])
            .arg(user.work.join("home"))
            .arg(&user.name)
            .output()
            .unwrap(),
    );
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

    // The first command of a user who never ran setup.
    let run = as_user(&user, &prefix, "microagent", &["run", "--", "uname", "-a"]);
    let stdout = ok("microagent run -- uname -a as the kvm user", run);
    assert!(
        stdout.contains("Linux ") && stdout.contains("x86_64"),
        "{stdout}"
    );
    // Booted from the bundle's kernel, found through the user's own cache.
    let variant = testkit::host().unwrap().kernel_variant().vmlinux_file();
    let link = user
        .work
        .join("home/.cache/microagent/current")
        .join(&variant);
    let target = std::fs::canonicalize(&link).unwrap();
    assert!(
        target.starts_with(std::fs::canonicalize(prefix.join("share/microagent")).unwrap()),
        "{} -> {}",
        link.display(),
        target.display()
    );

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
