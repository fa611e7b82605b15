//! Preview URLs on the real workspace of `a_real_workspace_over_http`:
//! made through the Python SDK, fetched as a browser would (plain HTTP and
//! an upgraded connection), revoked, expired; and a real WebSocket through
//! one.

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
    fetch(&format!("http://{}{path}", server.authority), &[])
}

/// `GET url` with curl (which resolves `*.localhost` to loopback itself,
/// as browsers do) and `headers`: the status code and the whole answer.
fn fetch(url: &str, headers: &[&str]) -> (u16, String) {
    let fetched = std::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "120"])
        .args(headers.iter().flat_map(|h| ["-H", h]))
        .arg(url)
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
            {"tool": "port_preview", "args": {"workspace": name, "port": 9000}},
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
        let sandboxed = s["sandboxed_url"].as_str().unwrap();
        assert!(url.ends_with(&path) && url.starts_with("http://pv"), "{s}");
        assert!(url.contains(".localhost:"), "{s}");
        assert_eq!(sandboxed, format!("http://{}{path}", server.authority));
        (url, path)
    };
    assert_eq!(calls[5]["structured"]["exit_code"], 0, "{out}");
    let (web_url, web) = made(6);
    let (upgrade_url, upgrade) = made(7);
    // The guest's page on the preview's own origin (`pv<id>.localhost`);
    // on the server's origin, the same page sandboxed.
    let (status, page) = fetch(&web_url, &[]);
    assert_eq!(status, 200, "{page}");
    assert!(page.ends_with("from the guest\n"), "{page}");
    // Its own pages get referrers (so their requests carry their real
    // Origin), nothing beyond it does; an agent cluster of its own.
    let lowered = page.to_ascii_lowercase();
    assert!(lowered.contains("referrer-policy: same-origin"), "{page}");
    assert!(lowered.contains("origin-agent-cluster: ?1"), "{page}");
    assert!(!lowered.contains("content-security-policy"), "{page}");
    let (status, page) = get(server, &web);
    assert_eq!(status, 200, "{page}");
    assert!(page.ends_with("from the guest\n"), "{page}");
    let lowered = page.to_ascii_lowercase();
    assert!(
        lowered.contains("content-security-policy: sandbox allow-scripts"),
        "{page}"
    );
    assert!(lowered.contains("referrer-policy: no-referrer"), "{page}");
    // A preview's own origin serves it alone: not another preview's
    // token, not /mcp; and not to another preview's pages.
    let web_origin = web_url.trim_end_matches(&web).to_owned();
    let upgrade_origin = upgrade_url.trim_end_matches(&upgrade).to_owned();
    assert_ne!(web_origin, upgrade_origin);
    assert_eq!(fetch(&format!("{web_origin}{upgrade}"), &[]).0, 404);
    assert_eq!(fetch(&format!("{web_origin}/mcp"), &[]).0, 404);
    assert_eq!(fetch(&format!("{web_origin}/"), &[]).0, 404);
    let (status, _) = fetch(&web_url, &[&format!("Origin: {upgrade_origin}")]);
    assert_eq!(status, 403);
    let (status, _) = fetch(&web_url, &[&format!("Origin: {web_origin}")]);
    assert_eq!(status, 200);
    let (status, moved) = get(server, web.trim_end_matches('/'));
    assert_eq!(status, 308, "{moved}");
    let (status, _) = get(server, &format!("/preview/{}/", "0".repeat(64)));
    assert_eq!(status, 404);
    // An upgraded connection reaches the guest's server and echoes.
    let mut stream = connect(server);
    let own_host = upgrade_origin.trim_start_matches("http://");
    write!(
        stream,
        "GET {upgrade} HTTP/1.1\r\nHost: {own_host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
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
    assert_eq!(fetch(&web_url, &[]).0, 404);
    // Expired: a preview of 30 s serves, then is nothing (made here, so
    // that only one fetch falls in its time on a busy host).
    let short = python(json!({
    "url": server.url, "token": token,
    "calls": [{"tool": "port_preview", "args": {"workspace": name, "port": 8000, "expires_secs": 30}}],
    }))
    .unwrap();
    let short = short["calls"][0]["structured"]["path"]
        .as_str()
        .unwrap_or_else(|| panic!("{short}"))
        .to_owned();
    assert_eq!(get(server, &short).0, 200);
    std::thread::sleep(Duration::from_secs(31));
    assert_eq!(get(server, &short).0, 404);
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
    // The server's own origin answers previews sandboxed, even a 404.
    let (_, answer) = get(&server, &format!("/preview/{}/", "a".repeat(64)));
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-security-policy: sandbox"),
        "{answer}"
    );
    // A preview's own host name serves only the token it is named after:
    // not another, not /mcp, not its root; another page's Origin is 403.
    let token = "b".repeat(64);
    let port = server.authority.rsplit(':').next().unwrap();
    let label = workspace::store::previews::origin_label(&token).unwrap();
    let own = format!("http://{label}.localhost:{port}");
    let (status, answer) = fetch(&format!("{own}/preview/{}/", "a".repeat(64)), &[]);
    assert_eq!(status, 404, "{answer}");
    assert!(!answer
        .to_ascii_lowercase()
        .contains("content-security-policy"));
    assert_eq!(fetch(&format!("{own}/preview/{token}/"), &[]).0, 404);
    assert_eq!(fetch(&format!("{own}/mcp"), &[]).0, 404);
    let from_other = "Origin: http://pv0123456789abcdef.localhost";
    assert_eq!(
        fetch(&format!("{own}/preview/{token}/"), &[from_other]).0,
        403
    );
    let bad_label = format!("http://pvxyz.localhost:{port}/preview/{token}/");
    assert_eq!(fetch(&bad_label, &[]).0, 403);
    // A page the browser sandboxed (Origin: null) reaches previews on the
    // server's origin: the token is the access.
    let unknown = format!("/preview/{}/", "a".repeat(64));
    let shared = format!("http://{}{unknown}", server.authority);
    assert_eq!(fetch(&shared, &["Origin: null"]).0, 404);
    // The other loopback address answers too: held by the server, so no
    // other program answers a `localhost` name there.
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        assert_eq!(fetch(&format!("http://[::1]:{port}{unknown}"), &[]).0, 404);
    }
    // One Host, naming what the target names.
    let twice = crate::post(
        &server,
        &unknown,
        &[("Host", &server.authority), ("Host", "evil.example")],
        "{}",
    );
    assert_eq!(twice.status, 400);
    let elsewhere = crate::post(&server, &format!("http://evil.example{unknown}"), &[], "{}");
    assert_eq!(elsewhere.status, 400);
    assert!(server.terminate());
    let _ = std::fs::remove_dir_all(home);
}

/// The guest's WebSocket echo server: the `ws` library Debian ships
/// (`node-ws`, copied in from the host), on port 9001; text comes back
/// marked, binary as it came.
const WEBSOCKET_SERVER: &str = "const { WebSocketServer } = require('/tmp/ws'); \
    new WebSocketServer({ port: 9001 }).on('connection', (s) => \
    s.on('message', (m, binary) => s.send(binary ? m : 'echo: ' + m.toString())));";

/// The host's client (the same library): a text frame and a 256 KiB
/// binary one through the URL in argv[1]; prints what came back. Node
/// does not resolve `*.localhost` as browsers do: its lookup says
/// loopback.
const WEBSOCKET_CLIENT: &str = "const WebSocket = require('/usr/share/nodejs/ws'); \
    const lookup = (host, o, cb) => o && o.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) \
      : cb(null, '127.0.0.1', 4); \
    const big = Buffer.alloc(262144, 7); const ws = new WebSocket(process.argv[1], { lookup }); \
    ws.on('open', () => { ws.send('through the preview'); ws.send(big); }); \
    let n = 0; ws.on('message', (m, binary) => { n += 1; \
      console.log(binary ? 'binary ' + m.length + ' ' + m.equals(big) : m.toString()); \
      if (n === 2) ws.close(); }); \
    ws.on('close', () => process.exit(n === 2 ? 0 : 3)); \
    ws.on('error', (e) => { console.error(e.message); process.exit(1); }); \
    setTimeout(() => { console.error('no echo in 120 s'); process.exit(2); }, 120000);";

/// Where Debian's `node-ws` keeps the library.
const NODE_WS: &str = "/usr/share/nodejs/ws";

#[test]
fn a_preview_carries_websocket_frames_both_ways() {
    let test = "mcp_http::previews::a_preview_carries_websocket_frames_both_ways";
    let node_ws = if std::path::Path::new(NODE_WS).join("index.js").is_file() {
        Ok(())
    } else {
        Err(format!("{NODE_WS} is missing (apt-get install node-ws)"))
    };
    if testkit::require(test, testkit::mcp_python()).is_none()
        || testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("debian")).is_none()
        || testkit::require(test, testkit::host_tool("node")).is_none()
        || testkit::require(test, node_ws).is_none()
    {
        return;
    }
    let h = testkit::cli::CliHome::new(crate::BIN, "ws-preview");
    h.ok(&["create", "wsp", "--image", "debian"]);
    h.ok(&["start", "wsp"]);
    h.ok(&["cp", NODE_WS, "wsp:/tmp/ws"]);
    h.ok(&[
        "exec",
        "wsp",
        "--detach",
        "--",
        "node",
        "-e",
        WEBSOCKET_SERVER,
    ]);
    // Listening (9001 is 2329) before it is used: node takes a while to
    // start where guest kernel mode is emulated. The shell's own `read`
    // looks, and a `sleep` every 2 s is the only process: a `grep` and a
    // `sleep` every half second took the vCPU from node's start.
    let listening = "for i in $(seq 300); do for t in /proc/net/tcp /proc/net/tcp6; do \
        while read -r _ local _ state _; do case \"$local $state\" in *:2329\\ 0A) exit 0;; esac; \
        done < $t; done; sleep 2; done; exit 1";
    h.ok(&["exec", "wsp", "--", "sh", "-c", listening]);
    let server = Server::start(h.home(), &[]);
    let token = std::fs::read_to_string(h.home().join("mcp-token")).unwrap();
    let made = python(json!({
        "url": server.url, "token": token.trim(),
        "calls": [{"tool": "port_preview", "args": {"workspace": "wsp", "port": 9001}}],
    }))
    .unwrap();
    let url = made["calls"][0]["structured"]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("{made}"))
        .replacen("http://", "ws://", 1);
    let echoed = std::process::Command::new("node")
        .args(["-e", WEBSOCKET_CLIENT, &url])
        .output()
        .expect("node runs");
    let said = String::from_utf8_lossy(&echoed.stdout);
    assert!(
        echoed.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&echoed.stderr)
    );
    assert_eq!(said, "echo: through the preview\nbinary 262144 true\n");
    // Another token is no WebSocket.
    let wrong = url.replace(url.rsplit('/').nth(1).unwrap_or_default(), &"0".repeat(64));
    let refused = std::process::Command::new("node")
        .args(["-e", WEBSOCKET_CLIENT, &wrong])
        .output()
        .expect("node runs");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    drop(server);
    h.ok(&["rm", "-f", "-y", "wsp"]);
}
