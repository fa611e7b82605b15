//! Preview URLs on the real workspace of `a_real_workspace_over_http`:
//! made through the Python SDK, fetched as a browser would (plain HTTP and
//! an upgraded connection), revoked, expired.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{python, Server};

/// A guest server that answers any request with `101` and then echoes
/// (what a WebSocket server does once upgraded, without the framing).
const UPGRADE_SERVER: &str = r#"#!/bin/sh
while read -r line; do
  case "$line" in "$(printf '\r')"|'') break;; esac
done
printf 'HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n'
exec cat
"#;

/// A connection to the server, reads bounded (a wake may take a while).
fn connect(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(&server.authority).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    stream
}

/// `GET path` on the server with curl, as a user would fetch a preview;
/// the status code and the whole answer (headers, then the body).
/// Waits up to 60 s for the guest's two servers to listen.
const WAIT_LISTENING: &str = "for i in $(seq 300); do \
    grep -q ':1F40 00000000:0000 0A' /proc/net/tcp && \
    grep -q ':2328 00000000:0000 0A' /proc/net/tcp && exit 0; sleep 0.2; done; exit 1";

fn get(server: &Server, path: &str) -> (u16, String) {
    let fetched = std::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "120"])
        .arg(format!("http://{}{path}", server.authority))
        .output()
        .expect("curl runs");
    let answer = String::from_utf8_lossy(&fetched.stdout).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// Makes previews of an HTTP server and an upgrading one in `name`, then
/// uses, revokes and outlives them.
pub(crate) fn previews_reach_the_guests_servers(server: &Server, token: &str, name: &str) {
    if testkit::require("mcp_http::previews", testkit::host_tool("curl")).is_none() {
        return;
    }
    let out = python(json!({
        "url": server.url, "token": token,
        "calls": [
            {"tool": "workspace_exec", "args": {"name": name, "command": ["sh", "-c",
                "mkdir -p /tmp/www && echo 'from the guest' > /tmp/www/index.html"]}},
            {"tool": "file_write", "args": {"name": name, "path": "/tmp/up.sh", "content": UPGRADE_SERVER}},
            {"tool": "workspace_exec", "args": {"name": name, "command": ["chmod", "+x", "/tmp/up.sh"]}},
            {"tool": "process_start", "args": {"name": name,
                "command": ["busybox", "httpd", "-f", "-p", "8000", "-h", "/tmp/www"]}},
            {"tool": "process_start", "args": {"name": name,
                "command": ["busybox", "nc", "-ll", "-p", "9000", "-e", "/tmp/up.sh"]}},
            // Both listen before they are used (a guest process takes a
            // while to start here): 8000 and 9000 in LISTEN (0A).
            {"tool": "workspace_exec", "args": {"name": name, "command": ["sh", "-c", WAIT_LISTENING]}},
            {"tool": "port_preview", "args": {"workspace": name, "port": 8000}},
            {"tool": "port_preview", "args": {"workspace": name, "port": 9000, "expires_secs": 20}},
        ]}))
    .unwrap();
    let calls = out["calls"].as_array().unwrap();
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call["is_error"], false, "call {i}: {out}");
    }
    let made = |i: usize| -> (String, String) {
        let s: &Value = &calls[i]["structured"];
        let url = s["url"].as_str().unwrap().to_owned();
        let path = s["path"].as_str().unwrap().to_owned();
        assert!(url.ends_with(&path) && url.starts_with("http://"), "{s}");
        (url, path)
    };
    assert_eq!(calls[5]["structured"]["exit_code"], 0, "{out}");
    let (_, web) = made(6);
    let (_, upgrade) = made(7);
    // The guest's page, through the preview; its prefix without the slash
    // is sent to the slash; another token is nothing.
    let (status, page) = get(server, &web);
    assert_eq!(status, 200, "{page}");
    assert!(page.ends_with("from the guest\n"), "{page}");
    assert!(
        page.to_ascii_lowercase()
            .contains("referrer-policy: no-referrer"),
        "{page}"
    );
    let (status, moved) = get(server, web.trim_end_matches('/'));
    assert_eq!(status, 308, "{moved}");
    let (status, _) = get(server, &format!("/preview/{}/", "0".repeat(64)));
    assert_eq!(status, 404);
    // An upgraded connection reaches the guest's server and echoes.
    let mut stream = connect(server);
    write!(
        stream,
        "GET {upgrade} HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
        server.authority
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    stream.write_all(b"through the preview").unwrap();
    let mut echoed = [0u8; 19];
    stream.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"through the preview");
    drop(stream);
    // Listed (without tokens); revoked: 404 at once; expired: 404 too.
    let revoked = python(json!({
    "url": server.url, "token": token,
    "calls": [
        {"tool": "port_preview_list", "args": {"workspace": name}},
        {"tool": "port_preview_revoke", "args": {"workspace": name, "port": 8000}},
    ]}))
    .unwrap();
    let listed = &revoked["calls"][0]["structured"]["previews"];
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{revoked}");
    assert!(!listed
        .to_string()
        .contains(web.trim_start_matches("/preview/").trim_end_matches('/')));
    assert_eq!(revoked["calls"][1]["structured"]["revoked"], 1, "{revoked}");
    assert_eq!(get(server, &web).0, 404);
    std::thread::sleep(Duration::from_secs(21));
    assert_eq!(get(server, &upgrade).0, 404);
}

/// `serve preview` serves previews alone: no MCP endpoint, the same
/// `Host` rules, an unknown token 404.
#[test]
fn a_preview_server_serves_previews_only() {
    let test = "mcp_http::a_preview_server_serves_previews_only";
    if testkit::require(test, testkit::host_tool("curl")).is_none() {
        return;
    }
    let home = crate::home("preview-server");
    let server = Server::start_previews(&home);
    assert!(server.url.ends_with("/preview/"), "{}", server.url);
    let (status, answer) = get(&server, "/mcp");
    assert_eq!(status, 404, "{answer}");
    assert!(answer.contains("preview URLs only"), "{answer}");
    assert_eq!(
        get(&server, &format!("/preview/{}/", "a".repeat(64))).0,
        404
    );
    let reply = crate::post(&server, "/preview/x/", &[("Host", "evil.example")], "{}");
    assert_eq!(reply.status, 403);
    assert!(server.terminate());
    let _ = std::fs::remove_dir_all(home);
}
