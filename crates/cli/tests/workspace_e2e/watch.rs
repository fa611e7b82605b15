//! File watches through `serve mcp` on a running workspace: a recursive
//! watch sees what a command in the guest creates, writes, moves and
//! removes, bad and ended watch ids are refused, the watch ends when
//! asked; a client subscribed to a file's resource hears of its change
//! and no more once unsubscribed; and `microagent watch` prints a change,
//! then ends at Ctrl-C.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use testkit::cli::CliHome;

use super::mcp_session::McpStdio;

/// Checks watches on the running workspace `ws`.
pub fn check(cli: &CliHome, ws: &str) {
    cli.ok(&["exec", ws, "--", "mkdir", "-p", "/root/watched"]);
    let mut mcp = McpStdio::open(cli, "watch");
    let started = mcp.call(
        "file_watch",
        json!({"name": ws, "path": "/root/watched", "recursive": true}),
    );
    let watch = started["watch"].as_str().unwrap().to_owned();
    assert_eq!(watch, format!("{ws}/watch-1"), "{started}");
    let script = "cd /root/watched && echo one > a && echo two >> a && mv a b \
                  && mkdir -p sub && echo three > sub/c && rm b";
    cli.ok(&["exec", ws, "--shell", "--", script]);
    let (mut events, mut since) = (Vec::new(), 0);
    let wanted = [
        "created /a",
        "modified /a",
        "moved /a",
        "created /sub",
        "deleted /b",
    ];
    for _ in 0..10 {
        let got = mcp.call(
            "file_watch_events",
            json!({"watch": watch, "since": since, "timeout_ms": 10000}),
        );
        since = got["next"].as_u64().unwrap();
        for e in got["events"].as_array().unwrap() {
            let path = e["path"]
                .as_str()
                .unwrap()
                .trim_start_matches("/root/watched");
            events.push(format!("{} {path}", e["kind"].as_str().unwrap()));
            if e["kind"] == "moved" {
                assert_eq!(e["to"], "/root/watched/b", "{e}");
            }
        }
        if wanted.iter().all(|w| events.iter().any(|e| e == w)) {
            break;
        }
    }
    for w in wanted {
        assert!(events.iter().any(|e| e == w), "{w} missing from {events:?}");
    }
    // The file in the directory made after the watch began: reported by
    // the new directory's scan or by its own watch.
    assert!(events.iter().any(|e| e == "created /sub/c"), "{events:?}");
    // A bad watch id is bad input; an unknown one in this workspace is
    // not found.
    let bad = mcp.call_result("file_watch_events", json!({"watch": "nothing"}));
    assert_eq!(bad["structuredContent"]["code"], "INVALID_INPUT", "{bad}");
    mcp.call("file_unwatch", json!({"watch": watch}));
    let gone = mcp.call_result("file_watch_events", json!({"watch": watch}));
    assert_eq!(gone["structuredContent"]["code"], "NOT_FOUND", "{gone}");
    subscriptions(cli, ws, &mut mcp);
    mcp.close();

    // The CLI prints each change until Ctrl-C, which ends its watch.
    let mut watcher = cli
        .command(&["watch", ws, "/root/watched"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = BufReader::new(watcher.stderr.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert!(said.starts_with("watching /root/watched in "), "{said}");
    cli.ok(&["exec", ws, "--", "touch", "/root/watched/by-cli"]);
    let line = BufReader::new(watcher.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(line, "created /root/watched/by-cli");
    // SAFETY: signals the child this test started and still waits for.
    unsafe { libc::kill(watcher.id() as i32, libc::SIGINT) };
    assert!(watcher.wait().unwrap().success());
}

/// `resources/subscribe` (the session speaks 2025-06-18; the Python SDK's
/// `subscriptions/listen` is in mcp_http): an update when the file
/// changes, none after `resources/unsubscribe`, and only file resources.
fn subscriptions(cli: &CliHome, ws: &str, mcp: &mut McpStdio) {
    const UPDATED: &str = "notifications/resources/updated";
    cli.ok(&["exec", ws, "--", "touch", "/root/watched/subscribed"]);
    let uri = format!("microagent://workspace/{ws}/files/root/watched/subscribed");
    let subscribed = mcp.request("resources/subscribe", json!({"uri": uri}));
    assert!(subscribed["result"].is_object(), "{subscribed}");
    cli.ok(&[
        "exec",
        ws,
        "--shell",
        "--",
        "echo changed >> /root/watched/subscribed",
    ]);
    let update = mcp
        .notification(UPDATED, Duration::from_secs(60))
        .expect("no update of the subscribed file");
    assert_eq!(update["params"]["uri"], uri, "{update}");
    let logs = format!("microagent://workspace/{ws}/logs");
    let refused = mcp.request("resources/subscribe", json!({"uri": logs}));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let absent = format!("microagent://workspace/{ws}/files/root/watched/absent");
    let refused = mcp.request("resources/subscribe", json!({"uri": absent}));
    assert!(refused["error"].is_object(), "{refused}");
    let unsubscribed = mcp.request("resources/unsubscribe", json!({"uri": uri}));
    assert!(unsubscribed["result"].is_object(), "{unsubscribed}");
    cli.ok(&[
        "exec",
        ws,
        "--shell",
        "--",
        "echo again >> /root/watched/subscribed",
    ]);
    let late = mcp.notification(UPDATED, Duration::from_secs(5));
    assert!(late.is_none(), "an update after unsubscribing: {late:?}");
}
