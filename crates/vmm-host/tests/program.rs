//! The `microagent-vmm` program as `microagent start` meets it. (Also what
//! makes `cargo test --workspace` build the program, which the CLI's tests
//! run beside `microagent`.)

/// Started by hand, without the launch arguments, it says what it is and
/// what it takes, and exits 2 without touching anything.
#[test]
fn without_a_launch_it_says_what_it_takes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_microagent-vmm"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("started by `microagent start`"), "{err}");
    assert!(err.contains("--home DIR --kernel VARIANT"), "{err}");
    assert!(out.stdout.is_empty());
}
