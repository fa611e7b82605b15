//! Tasks on real guests: two at once on one repository, both merged (one
//! fast-forward, one rebase) and each reported once; two editing the same
//! line (the second conflicts, its ref keeps its commits, cleanup deletes
//! the ref); a secret masked in the task's log and in no file of the state
//! directory but its own; refusals. A dirty worktree left alone is the
//! merge's own test (`tasks::merge`, real git, no guest): a third round of
//! guests here cost CI four minutes for no path the others miss.

use std::collections::BTreeSet;
use std::io::Write;

use serde_json::Value;
use testkit::cli::CliHome;

use crate::{can_boot, git, home, make_repo};

/// The task command, a script in the repository: task.md's first line
/// names a file, its second the text its first line becomes; it commits
/// and prints the secret it was given. Two processes (the shell reads the
/// lines, the file is tracked): each costs seconds of emulated guest
/// kernel work here.
const AGENT: &str = r#"set -e
{ read -r file; read -r text; } < /workspace/task.md
sed -i "1s/.*/$text/" "$file"
git commit -qam "$file: $text"
echo "token: ${MY_TOKEN:-none}"
"#;
const SECRET: &str = "s3cr3t-Value-7f3a";

fn run_task(cli: &CliHome, file: &str, text: &str, extra: &[&str]) -> String {
    let description = format!("{file}\n{text}\n");
    let mut args = vec!["task", "run", "--repo", "proj", "--mem", "256", "--json"];
    args.extend_from_slice(extra);
    args.push(&description);
    let started = cli.ok_json(&args);
    assert!(
        ["pending", "running"].contains(&started["status"].as_str().unwrap()),
        "{started}"
    );
    started["task_id"].as_str().unwrap().to_owned()
}

/// The next ended task nobody was told of.
fn next_event(cli: &CliHome) -> Value {
    let ended = cli.ok_json(&["task", "wait", "--timeout", "900", "--json"]);
    assert!(ended.get("timeout").is_none(), "a task ends: {ended}");
    ended
}

fn set_secret(cli: &CliHome) {
    let mut child = cli
        .command(&["secret", "set", "MY_TOKEN"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(SECRET.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn tasks_merge_back_conflict_and_keep_secrets() {
    if !can_boot("tasks_merge_back_conflict_and_keep_secrets") {
        return;
    }
    let cli = home("tasks");
    let repo = cli.home().join("proj");
    make_repo(&repo);
    for f in ["a.txt", "b.txt"] {
        std::fs::write(repo.join(f), "one\ntwo\n").unwrap();
    }
    std::fs::write(repo.join("agent.sh"), AGENT).unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "the agent"]);
    std::fs::write(
        cli.home().join("config.json"),
        r#"{"task": {"max_slots": 2}}"#,
    )
    .unwrap();

    // Refusals change nothing.
    let bad = cli.run(&["task", "run", "--repo", "proj", "--json", "x"]);
    assert_eq!(bad.error_code(), "FORBIDDEN", "{}", bad.stderr);
    cli.ok(&[
        "repo",
        "allow",
        repo.to_str().unwrap(),
        "--task-command",
        "sh agent.sh",
    ]);
    let bad = cli.run(&["task", "run", "--repo", "proj", "--json", " "]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stderr);
    let bad = cli.run(&[
        "task", "run", "--repo", "proj", "--secret", "NOPE", "--json", "x",
    ]);
    assert_eq!(bad.error_code(), "NOT_FOUND", "{}", bad.stderr);
    // A default size below a task's floor (a workspace's default size,
    // above the smallest guest) is refused, saying where it came from.
    let config = cli.home().join("config.json");
    std::fs::write(&config, r#"{"task": {"max_slots": 2, "mem_mib": 128}}"#).unwrap();
    let bad = cli.run(&["task", "run", "--repo", "proj", "--json", "x"]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stderr);
    assert!(bad.stdout.contains("task.mem_mib"), "{}", bad.stdout);
    assert!(bad.stdout.contains("use 256 to"), "{}", bad.stdout);
    std::fs::write(&config, r#"{"task": {"max_slots": 2}}"#).unwrap();
    assert_eq!(
        cli.run(&["task", "info", "nope", "--json"]).error_code(),
        "NOT_FOUND"
    );
    assert_eq!(
        cli.ok_json(&["task", "ls", "--json"]),
        serde_json::json!([])
    );
    set_secret(&cli);

    // Two at once: both merge, one by fast-forward, one by rebase; each
    // reported once.
    let a = run_task(&cli, "a.txt", "alpha", &["--secret", "MY_TOKEN"]);
    let b = run_task(&cli, "b.txt", "beta", &[]);
    let slots = cli.ok_json(&["task", "slots", "--json"]);
    assert_eq!(slots["max_slots"], 2, "{slots}");
    let (first, second) = (next_event(&cli), next_event(&cli));
    let ids: BTreeSet<_> = [&first, &second]
        .iter()
        .map(|t| t["task_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, BTreeSet::from([a.clone(), b.clone()]));
    let mut methods = BTreeSet::new();
    for t in [&first, &second] {
        assert_eq!(t["status"], "completed", "{t}");
        assert_eq!(t["merge_result"]["merged"], true, "{t}");
        methods.insert(t["merge_result"]["method"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        methods,
        BTreeSet::from(["fast-forward".into(), "rebase".into()])
    );
    let quiet = cli.ok_json(&["task", "wait", "--timeout", "1", "--json"]);
    assert_eq!(quiet["timeout"], true, "each is reported once: {quiet}");
    assert_eq!(
        std::fs::read_to_string(repo.join("a.txt")).unwrap(),
        "alpha\ntwo\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("b.txt")).unwrap(),
        "beta\ntwo\n"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    assert!(git(&repo, &["log", "--format=%s", "main"]).contains("a.txt: alpha"));

    // The secret reached the command, masked in what callers read, and
    // is in no file but its own.
    let logs = cli.ok_json(&["task", "logs", &a, "--json"]);
    let tail = logs["text"].as_str().unwrap();
    assert!(tail.contains("token: ***"), "{logs}");
    assert!(!tail.contains(SECRET), "{logs}");
    let leaked = testkit::files_holding(cli.home(), SECRET.as_bytes(), "secrets");
    assert!(
        leaked.is_empty(),
        "the secret's value is on disk: {leaked:?}"
    );

    // The same line twice: one merges, the other conflicts and keeps its
    // commits at refs/tasks/ID until cleaned up with the ref.
    let c = run_task(&cli, "notes.txt", "gamma", &[]);
    let d = run_task(&cli, "notes.txt", "delta", &[]);
    let (x, y) = (next_event(&cli), next_event(&cli));
    let (won, lost) = if x["merge_result"]["merged"] == true {
        (x, y)
    } else {
        (y, x)
    };
    assert_eq!(won["merge_result"]["merged"], true, "{won}");
    assert_eq!(lost["merge_result"]["merged"], false, "{lost}");
    assert_eq!(
        lost["merge_result"]["conflicts"],
        serde_json::json!(["notes.txt"]),
        "{lost}"
    );
    let lost_id = lost["task_id"].as_str().unwrap();
    assert!([c.as_str(), d.as_str()].contains(&lost_id));
    let task_ref = format!("refs/tasks/{lost_id}");
    assert!(git(&repo, &["log", "--format=%s", "-1", &task_ref]).starts_with("notes.txt: "));
    cli.ok(&["task", "rm", lost_id, "--delete-ref"]);
    assert!(
        git(&repo, &["for-each-ref", &task_ref]).is_empty(),
        "the ref is gone"
    );
    assert_eq!(
        cli.run(&["task", "info", lost_id, "--json"]).error_code(),
        "NOT_FOUND"
    );

    // No workspace is left behind.
    let left = cli.ok_json(&["ls", "--json"]);
    assert_eq!(left, serde_json::json!([]), "{left}");
}
