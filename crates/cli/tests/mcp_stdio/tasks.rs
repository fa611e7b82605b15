//! Tasks over stdio: run_task, then the server is killed with SIGKILL;
//! the task runs on (its supervisor is its own process) and a new
//! server's wait_next_event reports its end, once. Unknown ids are
//! NOT_FOUND; cleanup_task removes the record and, asked to, the ref.
//! The command prints 3 MB into a log capped at 1 MiB: the log stays
//! under its cap with the marker, and get_task_logs returns what it is
//! asked for and no more.

use std::process::Command;
use std::time::Duration;

use serde_json::json;
use testkit::git;

use super::{home, Session, BIN};

/// The repository's task command: edit the file task.md names, commit.
const AGENT: &str = r#"set -e
{ read -r file; read -r text; } < /workspace/task.md
echo "$text" > "$file"
git add "$file"
git commit -qm "task edits $file"
yes 'a line the task prints without end' | head -c 3000000
echo done
"#;

/// The cap of the task's log in this test, bytes (`task.max_log_bytes`).
const LOG_CAP: u64 = 1 << 20;

impl Session {
    /// Kills the server with SIGKILL, as a crashed client host would; the
    /// state directory stays.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

#[test]
fn a_task_outlives_a_killed_server() {
    let test = "mcp_stdio::a_task_outlives_a_killed_server";
    if testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("debian")).is_none()
        || testkit::require(test, testkit::host_tool("git")).is_none()
    {
        return;
    }
    let home = home("task");
    // Private, as the library demands of a state directory.
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&home)
        .unwrap();
    std::fs::write(
        home.join("config.json"),
        json!({"task": {"max_log_bytes": LOG_CAP}}).to_string(),
    )
    .unwrap();
    let repo = home.join("proj");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("agent.sh"), AGENT).unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "first"]);
    let allowed = Command::new(BIN)
        .args([
            "repo",
            "allow",
            repo.to_str().unwrap(),
            "--task-command",
            "sh agent.sh",
        ])
        .env("MICROAGENT_HOME", &home)
        .output()
        .unwrap();
    assert!(allowed.status.success(), "{allowed:?}");

    let (mut s, _) = Session::start_in(home.clone(), "2025-06-18");
    let repos = s.ok("list_repos", json!({}));
    assert_eq!(repos["repos"][0]["alias"], "proj", "{repos}");
    let started = s.ok(
        "run_task",
        json!({"description": "out.txt\nfrom the task\n", "repo": "proj", "mem_mib": 256}),
    );
    let id = started["task_id"].as_str().unwrap().to_owned();
    let listed = s.ok("list_tasks", json!({}));
    assert_eq!(listed["tasks"][0]["task_id"], id.as_str(), "{listed}");
    s.kill();

    let (mut s, _) = Session::start_in(home.clone(), "2025-06-18");
    let event = s.ok_within(
        "wait_next_event",
        json!({"timeout_ms": 900_000}),
        Duration::from_secs(960),
    );
    assert_eq!(event["timeout"], false, "{event}");
    assert_eq!(event["task"]["task_id"], id.as_str(), "{event}");
    assert_eq!(event["task"]["status"], "completed", "{event}");
    // At the top level too, as microvm-orchestrator answers.
    assert_eq!(
        (&event["type"], &event["task_id"]),
        (&json!("completed"), &json!(id)),
        "{event}"
    );
    assert_eq!(event["task"]["merge_result"]["merged"], true, "{event}");
    assert_eq!(
        std::fs::read_to_string(repo.join("out.txt")).unwrap(),
        "from the task\n"
    );
    let again = s.ok("wait_next_event", json!({"timeout_ms": 1000}));
    assert_eq!(again["timeout"], true, "reported once: {again}");
    let logs = s.ok("get_task_logs", json!({"task_id": id}));
    assert!(logs["text"].as_str().unwrap().ends_with("done\n"), "{logs}");
    // Capped, the oldest part dropped under a marker; reads bounded.
    let path = std::path::PathBuf::from(logs["path"].as_str().unwrap());
    let on_disk = std::fs::metadata(&path).unwrap().len();
    assert!(on_disk <= LOG_CAP, "the log is {on_disk} bytes");
    let dropped = logs["dropped_bytes"].as_u64().unwrap();
    assert!(dropped >= 3_000_000 - LOG_CAP, "{logs}");
    assert!(logs["size"].as_u64().unwrap() > 3_000_000, "{logs}");
    let mut head = vec![0; 200];
    let n = std::io::Read::read(&mut std::fs::File::open(&path).unwrap(), &mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(
        head.starts_with(&format!("[microagent: the first {dropped} bytes")),
        "{head}"
    );
    let ranged = s.ok(
        "get_task_logs",
        json!({"task_id": id, "offset": 0, "limit": 4096}),
    );
    assert_eq!(ranged["offset"], dropped, "{ranged}");
    assert_eq!(ranged["text"].as_str().unwrap().len(), 4096);
    assert_eq!(ranged["next_offset"], dropped + 4096);
    let over = s.call_async(
        "get_task_logs",
        json!({"task_id": id, "limit": 1u64 << 30}),
        None,
    );
    let over = s.response(over, Duration::from_secs(30));
    assert_eq!(
        over["result"]["structuredContent"]["code"], "INVALID_INPUT",
        "{over}"
    );
    let info = s.ok("get_task_info", json!({"task_id": id}));
    assert_eq!(info["exit_code"], 0, "{info}");
    assert!(info["timings"]["command_started_ms"].is_u64(), "{info}");
    let id_missing = s.call_async("get_task_info", json!({"task_id": "nope"}), None);
    let missing = s.response(id_missing, Duration::from_secs(30));
    assert_eq!(
        missing["result"]["structuredContent"]["code"], "NOT_FOUND",
        "{missing}"
    );
    let slots = s.ok("list_slots", json!({}));
    assert_eq!(slots["active"], json!([]), "{slots}");
    // Previews say what would happen and change nothing.
    let cancel = s.ok("cancel_task", json!({"task_id": id, "preview": true}));
    let would = cancel["preview"].as_str().unwrap_or_default();
    assert!(would.starts_with("nothing: task"), "{cancel}");
    let cleanup = s.ok(
        "cleanup_task",
        json!({"task_id": id, "delete_ref": true, "preview": true}),
    );
    let would = cleanup["preview"].as_str().unwrap_or_default();
    assert!(would.contains(&format!("and refs/tasks/{id}")), "{cleanup}");
    assert_eq!(cleanup["ref_deleted"], false, "{cleanup}");
    assert!(!git(&repo, &["for-each-ref", &format!("refs/tasks/{id}")]).is_empty());
    s.ok("get_task_info", json!({"task_id": id}));
    s.ok("cleanup_task", json!({"task_id": id, "delete_ref": true}));
    assert!(git(&repo, &["for-each-ref", &format!("refs/tasks/{id}")]).is_empty());
    assert_eq!(s.ok("list_tasks", json!({}))["tasks"], json!([]));
    s.close();
}
