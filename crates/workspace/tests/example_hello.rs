//! The example `hello` (crates/workspace/examples/hello.rs) run as a user
//! runs it: a real workspace booted, a command run, its file read, the
//! workspace deleted. Needs /dev/kvm and the images of `cargo xtask setup`;
//! without them it is recorded as skipped, with the reason.

use std::path::PathBuf;
use std::process::Command;

const TEST: &str = "the_hello_example_runs_a_command_in_a_fresh_workspace";

/// `cargo test` builds the examples beside the test binaries'
/// `deps/` directory.
fn example_binary() -> PathBuf {
    let me = std::env::current_exe().unwrap();
    let profile_dir = me.parent().and_then(|deps| deps.parent()).unwrap();
    profile_dir.join("examples").join("hello")
}

/// Why the example cannot run here, if it cannot.
fn missing_precondition() -> Option<String> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return Some(format!("/dev/kvm is not usable: {e}"));
    }
    let Some(assets) = workspace::host::settings::asset_dir() else {
        return Some("no asset cache directory (HOME is not set)".into());
    };
    let kernel = ["vmlinux-compat", "vmlinux-standard"]
        .iter()
        .any(|k| assets.join(k).exists());
    if !kernel || !assets.join("rootfs-minimal.ext4").exists() {
        return Some(format!(
            "the guest kernel or the minimal image is not built in {} (cargo xtask setup)",
            assets.display()
        ));
    }
    if workspace::host::settings::host_tool("mkfs.ext4").is_none() {
        return Some("mkfs.ext4 is not installed (apt-get install e2fsprogs)".into());
    }
    None
}

#[test]
fn the_hello_example_runs_a_command_in_a_fresh_workspace() {
    if let Some(reason) = missing_precondition() {
        testkit::skip(TEST, &reason);
        return;
    }
    let example = example_binary();
    assert!(
        example.exists(),
        "{} is missing: cargo test builds the examples",
        example.display()
    );
    let home = std::env::temp_dir().join(format!("microagent-hello-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let warm = testkit::shared_warm_dir();
    let out = Command::new(&example)
        .env("MICROAGENT_HOME", &home)
        .envs(warm.map(|w| ("MICROAGENT_WARM_DIR", w)))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let left: Vec<_> = std::fs::read_dir(home.join("workspaces"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&home);
    assert!(
        out.status.success(),
        "hello failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    assert!(
        stdout.starts_with("Linux hello-"),
        "uname -a of the workspace, read back from its file: {stdout:?}"
    );
    assert!(
        left.is_empty(),
        "the example deletes its workspace: {left:?}"
    );
}
