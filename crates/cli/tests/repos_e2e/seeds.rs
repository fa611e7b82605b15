//! `docs/examples/seed_scenarios.py`: other MCP servers' documented calls,
//! in their argument shapes, through the official MCP Python SDK on one
//! `serve mcp` session: microsandbox's, devbox's (a service from an image
//! in a registry on loopback, reached by its name), microvm-orchestrator's
//! and agentkernel's.

use crate::{can_boot, git, home, make_repo};

/// The port the service's image serves on.
const SERVICE_PORT: u16 = 8080;

#[test]
fn each_seeds_calls_work_in_its_own_shapes() {
    let test = "each_seeds_calls_work_in_its_own_shapes";
    if !can_boot(test) {
        return;
    }
    let Some(python) = testkit::require(test, testkit::mcp_python()) else {
        return;
    };
    let Some(skopeo) = testkit::require(test, testkit::host_tool("skopeo")) else {
        return;
    };
    let cli = home("seeds");
    let Some(registry) = testkit::require(
        test,
        testkit::oci::Registry::start(&cli.home().join("registry")),
    ) else {
        return;
    };
    let layout = cli.home().join("layout");
    testkit::oci::write_layout_serving(&layout, SERVICE_PORT, "served by the web service\n");
    let image = format!("127.0.0.1:{}/web:1", registry.port);
    testkit::oci::push(&skopeo, &layout, &image);

    // The orchestrator's `run_task` names no size: the host's default
    // for tasks is the size the other task tests run at, so this one
    // resumes their warm snapshot instead of booting one of its own.
    std::fs::write(
        cli.home().join("config.json"),
        r#"{"task": {"mem_mib": 256}}"#,
    )
    .unwrap();
    let repo = cli.home().join("proj");
    make_repo(&repo);
    std::fs::write(
        repo.join("agent.sh"),
        "set -e\ncat /workspace/task.md > notes.txt\ngit commit -qam task\n",
    )
    .unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "agent"]);
    cli.ok(&[
        "repo",
        "allow",
        repo.to_str().unwrap(),
        "--task-command",
        "sh agent.sh",
    ]);

    let program = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/examples/seed_scenarios.py"
    );
    let mut run = std::process::Command::new(&python);
    run.args([program, &image, "proj"])
        .env("MICROAGENT", env!("CARGO_BIN_EXE_microagent"))
        .envs(
            cli.command(&[])
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .stderr(std::process::Stdio::inherit());
    let out = run.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}: {stdout}", out.status);
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();

    let ms = &seen["microsandbox"];
    assert_eq!(ms["state"], "running", "{seen}");
    assert_eq!(ms["mem_mib"], 512, "{seen}");
    assert_eq!(ms["stdout"], "hello from microsandbox\n", "{seen}");
    assert!(
        ms["metrics_of"].as_array().unwrap().contains(&"ms".into()),
        "{seen}"
    );

    let devbox = &seen["devbox"];
    assert_eq!(devbox["state"], "running", "{seen}");
    assert_eq!(devbox["services"], serde_json::json!(["web"]), "{seen}");
    assert_eq!(devbox["fetched"], "served by the web service\n", "{seen}");
    assert!(
        devbox["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h.as_str().is_some_and(|h| !h.is_empty())),
        "{seen}"
    );
    assert_eq!(devbox["someone_elses"], 0, "{seen}");

    let orchestrator = &seen["orchestrator"];
    assert_eq!(orchestrator["type"], "completed", "{seen}");
    assert_eq!(
        orchestrator["event_task_id"], orchestrator["task_id"],
        "{seen}"
    );

    let ak = &seen["agentkernel"];
    assert_eq!(ak["ttl_secs"], serde_json::json!([600, 4200]), "{seen}");
    assert_eq!(ak["restored"], "ak-restored", "{seen}");
    assert_eq!(ak["restored_state"], "running", "{seen}");
    assert_eq!(ak["restored_ran"], 0, "{seen}");

    // Nothing of the scenarios is left but the task's record.
    assert_eq!(cli.ok_json(&["list", "--json"]), serde_json::json!([]));
}
