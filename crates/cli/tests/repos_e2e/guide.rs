//! docs/agent-guide.md's program, `docs/examples/simple_agent.py`, run as
//! its reader runs it: the official MCP Python SDK starts `serve mcp`, and
//! the program creates a workspace with a repository, runs its tests and
//! reads a file.

use crate::{can_boot, git, home, make_repo};

#[test]
fn the_guides_simple_agent_runs_a_repositorys_tests() {
    let test = "the_guides_simple_agent_runs_a_repositorys_tests";
    if !can_boot(test) {
        return;
    }
    let Some(python) = testkit::require(test, testkit::mcp_python()) else {
        return;
    };
    let cli = home("guide");
    let repo = cli.home().join("proj");
    make_repo(&repo);
    std::fs::write(
        repo.join("test.sh"),
        "set -e\ngrep -q two notes.txt\necho 'tests passed'\n",
    )
    .unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "tests"]);
    cli.ok(&["repo", "allow", repo.to_str().unwrap()]);

    let program = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/examples/simple_agent.py"
    );
    let out = std::process::Command::new(&python)
        .args([program, "proj"])
        .env("MICROAGENT", env!("CARGO_BIN_EXE_microagent"))
        .env("MICROAGENT_HOME", cli.home())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}", out.status);
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(seen["state"], "running", "{seen}");
    assert_eq!(seen["exit_code"], 0, "{seen}");
    assert_eq!(seen["stdout"], "tests passed\n", "{seen}");
    assert_eq!(seen["readme"], "a test repository\n", "{seen}");
    // Session-scoped: gone with the program's session.
    assert_eq!(
        cli.run(&["inspect", "simple-agent", "--json"]).error_code(),
        "NOT_FOUND"
    );

    // Tests that fail: the program says so by its exit status.
    let failed = std::process::Command::new(&python)
        .args([program, "proj", "sh -c 'echo broken; exit 3'"])
        .env("MICROAGENT", env!("CARGO_BIN_EXE_microagent"))
        .env("MICROAGENT_HOME", cli.home())
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1), "{failed:?}");
    let seen: serde_json::Value = serde_json::from_slice(failed.stdout.trim_ascii()).unwrap();
    assert_eq!(seen["exit_code"], 3, "{seen}");
}
