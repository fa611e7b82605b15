//! Secrets over stdio with a real guest: set with the CLI, allowed with
//! `serve mcp --allow-secret`, given to an exec and a background process.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::json;

use super::{Session, BIN};

/// The secret the real workspace's commands get, and its value.
pub(crate) const SECRET_NAME: &str = "E2E_TOKEN";
const SECRET_VALUE: &str = "s3cr3t-e2e-value";

/// A secret set with the CLI reaches a command's environment; the output
/// shows `***`, and no host file but the secret's own holds the value.
pub(crate) fn secrets_reach_the_command_only(s: &mut Session, name: &str) {
    let mut set = Command::new(BIN)
        .args(["secret", "set", SECRET_NAME])
        .env("MICROAGENT_HOME", &s.home)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = set.stdin.take().unwrap();
    stdin
        .write_all(format!("{SECRET_VALUE}\n").as_bytes())
        .unwrap();
    drop(stdin);
    assert!(set.wait().unwrap().success());
    let ran = s.ok(
        "workspace_exec",
        json!({"name": name, "secrets": [SECRET_NAME],
               "shell": format!("echo \"t=${SECRET_NAME}\"; printf %s \"${SECRET_NAME}\" | wc -c; echo \"${SECRET_NAME}\" >&2")}),
    );
    let stdout = ran["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("t=***\n"), "{ran}");
    assert_eq!(
        stdout.lines().nth(1).map(str::trim),
        Some(SECRET_VALUE.len().to_string().as_str()),
        "the command had the value: {ran}"
    );
    assert_eq!(ran["stderr"], "***\n", "{ran}");
    let started = s.ok(
        "process_start",
        json!({"name": name, "secrets": [SECRET_NAME], "shell": format!("echo \"p=${SECRET_NAME}\"")}),
    );
    let id = started["id"].as_str().unwrap().to_owned();
    s.ok(
        "process_wait",
        json!({"name": name, "id": id, "timeout_secs": 30}),
    );
    let out = s.ok("process_output", json!({"name": name, "id": id}));
    assert_eq!(out["stdout"], "p=***\n", "{out}");
    assert!(!out.to_string().contains(SECRET_VALUE), "{out}");
    let found = testkit::files_holding(&s.home, SECRET_VALUE.as_bytes(), "secrets");
    assert!(found.is_empty(), "the value is in {found:?}");
    assert!(s.home.join("secrets").join(SECRET_NAME).is_file());
}
