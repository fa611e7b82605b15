//! `microagent serve mcp --http` as MCP clients reach it: the official MCP
//! Python SDK over Streamable HTTP (client.py), and raw HTTP requests for
//! what a client library would not send (no token, a wrong one, a foreign
//! Host or Origin). All on loopback. Tests that need the SDK, openssl or a
//! guest record a skip where those are missing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod abuse;
mod code_sessions;
mod conformance;
mod previews;
mod session;
mod tasks;

const BIN: &str = env!("CARGO_BIN_EXE_microagent");
const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_http/client.py");

/// Deletes workspace `name` of the state directory `home` when the test
/// fails before it does (its VMM would outlive the test).
struct DeleteOnPanic<'a> {
    home: &'a Path,
    name: &'a str,
}

impl Drop for DeleteOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = Command::new(BIN)
                .env("MICROAGENT_HOME", self.home)
                .args(["rm", "-f", "-y", self.name])
                .output();
        }
    }
}

/// A private state directory short enough for the VMM's Unix sockets.
fn home(tag: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/mcph-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&dir)
        .unwrap();
    dir
}

/// A running `serve mcp --http`.
struct Server {
    child: Child,
    url: String,
    /// Host and port.
    authority: String,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    fn start(home: &Path, extra: &[&str]) -> Server {
        Self::start_with(home, extra, |_| {})
    }

    /// As [`Server::start`], with the command changed by `adjust` first.
    fn start_with(home: &Path, extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Server {
        let serve = ["serve", "mcp", "--http", "127.0.0.1:0"];
        Self::launch(home, &serve, extra, adjust, ("serving MCP at ", "/mcp"))
    }

    /// `serve preview` on a free loopback port (`url` is the previews' base).
    fn start_previews(home: &Path) -> Server {
        let serve = ["serve", "preview", "127.0.0.1:0"];
        let said = ("serving preview URLs at ", "/preview/");
        Self::launch(home, &serve, &[], |_| {}, said)
    }

    /// Runs `serve` with `extra`, and waits for the line saying where it
    /// serves (`said`: what comes before the URL, and its path).
    fn launch(
        home: &Path,
        serve: &[&str],
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
        (said, path): (&'static str, &'static str),
    ) -> Server {
        let mut command = Command::new(BIN);
        command
            .args(serve)
            .args(extra)
            .current_dir(std::env::temp_dir())
            .env("MICROAGENT_HOME", home)
            .env("MICROAGENT_LOG", "info")
            .envs(testkit::shared_warm_dir().map(|w| ("MICROAGENT_WARM_DIR", w)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        adjust(&mut command);
        let mut child = command.spawn().expect("start microagent serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let (pipe, stderr) = (child.stderr.take().unwrap(), stderr.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    eprintln!("server: {line}");
                    stderr.lock().unwrap().push_str(&format!("{line}\n"));
                    if let Some(rest) = line.split(said).nth(1) {
                        let url = rest.split_whitespace().next().unwrap_or_default();
                        let _ = tx.send(url.to_owned());
                    }
                }
            });
        }
        let url = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no URL; stderr: {}", stderr.lock().unwrap()));
        let authority = url
            .split("://")
            .nth(1)
            .unwrap()
            .trim_end_matches(path)
            .to_owned();
        Server {
            child,
            url,
            authority,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Ends it with SIGTERM; whether it exited cleanly within 15 s.
    fn terminate(mut self) -> bool {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response as the test reads it.
struct Reply {
    status: u16,
    head: String,
    body: String,
}

fn initialize_body(version: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "mcp_http test", "version": "1"}}})
    .to_string()
}

/// One POST (with `headers`, `Host` among them unless given) to `path`.
fn post(server: &Server, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut stream = TcpStream::connect(&server.authority).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut request = format!("POST {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {}\r\n", server.authority));
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!(
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    // Until the server closes, or the answer to the call has come (an
    // event stream may stay open).
    while let Ok(n) = stream.read(&mut chunk) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
        if String::from_utf8_lossy(&raw).contains("\"result\"") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    Reply {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

/// The Python SDK's session: `spec` as client.py takes it.
fn python(spec: Value) -> Result<Value, String> {
    python_script(CLIENT, spec)
}

/// The SDK driver `script` with `spec`: the JSON it printed.
fn python_script(script: &str, spec: Value) -> Result<Value, String> {
    testkit::mcp_python_run(script, spec)
}

#[test]
fn the_gate_answers_before_the_server() {
    let home = home("gate");
    let server = Server::start(&home, &[]);
    let token_file = home.join("mcp-token");
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(token.len(), 64, "{token}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Printed once, when it was made.
    assert_eq!(
        server.stderr().matches(&token).count(),
        1,
        "{}",
        server.stderr()
    );
    let init = initialize_body("2025-06-18");
    let bearer = format!("Bearer {token}");

    let none = post(&server, "/mcp", &[], &init);
    assert_eq!(none.status, 401, "{}", none.body);
    assert!(
        none.head.contains("www-authenticate: bearer"),
        "{}",
        none.head
    );
    let wrong = post(&server, "/mcp", &[("Authorization", "Bearer 0000")], &init);
    assert_eq!(wrong.status, 401);
    // DNS rebinding: a foreign Host or Origin is refused, token or not.
    let host = [("Host", "evil.example"), ("Authorization", bearer.as_str())];
    assert_eq!(post(&server, "/mcp", &host, &init).status, 403);
    assert_eq!(post(&server, "/mcp", &host[..1], &init).status, 403);
    let origin = [
        ("Origin", "http://evil.example"),
        ("Authorization", bearer.as_str()),
    ];
    assert_eq!(post(&server, "/mcp", &origin, &init).status, 403);
    let auth = [("Authorization", bearer.as_str())];
    assert_eq!(post(&server, "/other", &auth, &init).status, 404);

    // The older protocol version, spoken raw, is served.
    let ok = post(&server, "/mcp", &auth, &init);
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(
        ok.body.contains("\"protocolVersion\":\"2025-06-18\""),
        "{}",
        ok.body
    );
    assert!(ok.body.contains("\"name\":\"microagent\""), "{}", ok.body);
    assert!(ok.head.contains("mcp-session-id:"), "{}", ok.head);
    assert!(server.terminate(), "SIGTERM ends the server cleanly");

    // The next start reads the same token and does not print it.
    let again = Server::start(&home, &[]);
    assert!(!again.stderr().contains(&token));
    assert_eq!(post(&again, "/mcp", &auth, &init).status, 200);
    drop(again);
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn the_python_sdk_calls_tools_with_the_token() {
    let test = "mcp_http::the_python_sdk_calls_tools_with_the_token";
    if testkit::require(test, testkit::mcp_python()).is_none() {
        return;
    }
    let home = home("sdk");
    let token_file = home.join("token");
    std::fs::write(&token_file, "a-token-of-ours\n").unwrap();
    let server = Server::start(&home, &["--token-file", token_file.to_str().unwrap()]);
    assert!(
        !home.join("mcp-token").exists(),
        "--token-file makes no token"
    );
    let out = python(json!({
    "url": server.url, "token": "a-token-of-ours",
    "calls": [
        {"tool": "workspace_list", "args": {}},
        {"tool": "contract", "args": {}},
        {"tool": "workspace_inspect", "args": {"name": "nope"}},
    ]}))
    .unwrap();
    assert_eq!(out["server"], "microagent");
    assert_eq!(out["protocol"], "2025-11-25", "{out}");
    let tools = out["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t == "workspace_create"), "{out}");
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls[0]["structured"]["count"], 0, "{out}");
    assert_eq!(calls[1]["is_error"], false);
    let transports = &calls[1]["structured"]["transports"];
    assert!(transports.to_string().contains("streamable-http"), "{out}");
    assert_eq!(calls[2]["is_error"], true);
    assert_eq!(calls[2]["structured"]["code"], "NOT_FOUND", "{out}");
    // Resources: the inventory and the templates; an unknown workspace is
    // "resource not found".
    let resources = python(json!({
        "url": server.url, "token": "a-token-of-ours",
        "reads": ["microagent://workspaces", "microagent://workspace/nope", "microagent://x"]}))
    .unwrap();
    assert_eq!(
        resources["resources"],
        json!(["microagent://workspaces"]),
        "{resources}"
    );
    let templates = resources["templates"].to_string();
    assert!(
        templates.contains("microagent://workspace/{name}/files/{path}"),
        "{templates}"
    );
    let inventory = &resources["reads"][0]["contents"][0];
    assert_eq!(inventory["mimeType"], "application/json", "{resources}");
    let listed: Value = serde_json::from_str(inventory["text"].as_str().unwrap()).unwrap();
    assert_eq!(listed["count"], 0);
    for missing in &resources["reads"].as_array().unwrap()[1..] {
        assert_eq!(missing["code"], -32002, "{resources}");
    }
    // The SDK with a wrong token gets nothing.
    assert!(python(json!({"url": server.url, "token": "wrong"})).is_err());
    drop(server);
    let _ = std::fs::remove_dir_all(home);
}

/// `args`, expected to fail, and what the server said.
fn refused(home: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["serve", "mcp"])
        .args(args)
        .env("MICROAGENT_HOME", home)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} was served");
    assert!(out.stdout.is_empty());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn off_loopback_needs_public_and_tls_and_dev_stays_on_loopback() {
    let home = home("bind");
    let e = refused(&home, &["--http", "0.0.0.0:0"]);
    assert!(e.contains("--public"), "{e}");
    let e = refused(&home, &["--http", "0.0.0.0:0", "--public"]);
    assert!(e.contains("TLS") && e.contains("--tls-cert"), "{e}");
    let e = refused(&home, &["--http", "0.0.0.0:0", "--public", "--dev"]);
    assert!(e.contains("loopback"), "{e}");
    let e = refused(
        &home,
        &["--http", "127.0.0.1:0", "--token-file", "/nonexistent/t"],
    );
    assert!(e.contains("--token-file"), "{e}");
    let e = refused(&home, &["--dev"]);
    assert!(e.contains("--http"), "{e}");
    assert!(
        !home.join("mcp-token").exists(),
        "nothing made for a refused start"
    );

    // --dev on loopback: no token asked, and still no foreign Host.
    let server = Server::start(&home, &["--dev"]);
    let init = initialize_body("2025-11-25");
    assert_eq!(post(&server, "/mcp", &[], &init).status, 200);
    assert_eq!(
        post(&server, "/mcp", &[("Host", "evil.example")], &init).status,
        403
    );
    // Its own origin is a client's (MCP's DNS-rebinding rule), so no
    // guest page may share it: no previews without a token.
    let own = format!("http://{}", server.authority);
    assert_eq!(
        post(&server, "/mcp", &[("Origin", &own)], &init).status,
        200
    );
    let preview = format!("/preview/{}/", "a".repeat(64));
    let answer = post(&server, &preview, &[], "");
    assert_eq!(answer.status, 404, "{}", answer.body);
    assert!(answer.body.contains("/mcp"), "{}", answer.body);
    drop(server);
    let _ = std::fs::remove_dir_all(home);
}

/// A self-signed certificate for 127.0.0.1 and its key, made by openssl
/// in `home`; none (a recorded skip) without openssl.
fn test_certificate(test: &str, home: &Path) -> Option<(PathBuf, PathBuf)> {
    let (cert, key) = (home.join("cert.pem"), home.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status();
    testkit::require(
        test,
        match made {
            Ok(s) if s.success() => Ok((cert, key)),
            _ => Err("openssl could not make a test certificate (apt-get install openssl)".into()),
        },
    )
}

#[test]
fn tls_serves_the_sdk() {
    let test = "mcp_http::tls_serves_the_sdk";
    if testkit::require(test, testkit::mcp_python()).is_none() {
        return;
    }
    let home = home("tls");
    let Some((cert, key)) = test_certificate(test, &home) else {
        return;
    };
    let args = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let server = Server::start(&home, &args);
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let token = std::fs::read_to_string(home.join("mcp-token")).unwrap();
    let out = python(json!({
        "url": server.url, "token": token.trim(), "cafile": cert,
        "calls": [{"tool": "workspace_list", "args": {}}]}))
    .unwrap();
    assert_eq!(out["calls"][0]["is_error"], false, "{out}");
    drop(server);
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn a_real_workspace_over_http() {
    let test = "mcp_http::a_real_workspace_over_http";
    if testkit::require(test, testkit::mcp_python()).is_none()
        || testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
    {
        return;
    }
    let home = home("vm");
    // With the token: a server without one (`--dev`) serves no previews.
    let server = Server::start(&home, &[]);
    let token = std::fs::read_to_string(home.join("mcp-token")).unwrap();
    let token = token.trim();
    let name = "over-http";
    let _on_failure = DeleteOnPanic { home: &home, name };
    let out = python(json!({
        "url": server.url, "token": token,
        "calls": [
            {"tool": "workspace_create", "args": {"name": name, "image": "minimal"}},
            {"tool": "workspace_start", "args": {"name": name}},
            {"tool": "workspace_exec", "args": {"name": name, "command": ["echo", "over http"]}},
            {"tool": "file_write", "args": {"name": name, "path": "/tmp/note.txt", "content": "read as a resource\n"}},
            // Part of the file: a link to all of it, which reads.
            {"tool": "file_read", "args": {"name": name, "path": "/tmp/note.txt", "length": 4}},
            // Abandoned by the client: the call is cancelled, its guest
            // process killed, and the server goes on.
            {"tool": "workspace_exec", "args": {"name": name, "command": ["sleep", "600"]}, "timeout": 8},
            {"tool": "workspace_exec", "args": {"name": name, "command": ["sh", "-c",
                "n=0; while ps | grep -q '[s]leep 600'; do n=$((n+1)); [ $n -gt 30 ] && exit 1; sleep 1; done"]}},
            // Subscribed to the file's resource, the client hears that a
            // write changed it; only file resources take subscriptions.
            {"subscribe": format!("microagent://workspace/{name}/files/tmp/note.txt"),
             "then": {"tool": "file_write", "args": {"name": name, "path": "/tmp/note.txt", "content": "read as a resource\n"}},
             "timeout": 60},
            {"subscribe": format!("microagent://workspace/{name}/logs"),
             "then": {"tool": "workspace_exec", "args": {"name": name, "command": ["true"]}},
             "timeout": 5},
            // A file watch sees what a command makes, writes, moves and
            // removes.
            {"watch": "/tmp", "name": name,
             "then": {"tool": "workspace_exec", "args": {"name": name, "command": ["sh", "-c",
                "cd /tmp && echo one > w && echo two >> w && mv w w2 && rm w2"]}},
             "until": ["created", "modified", "moved", "deleted"]},
        ],
        "reads": [
            format!("microagent://workspace/{name}/files/tmp/note.txt"),
            format!("microagent://workspace/{name}/files/%2Ftmp%2Fnote.txt"),
            format!("microagent://workspace/{name}"),
            format!("microagent://workspace/{name}/logs"),
            format!("microagent://workspace/{name}/files/tmp/absent"),
        ]}))
    .unwrap();
    let calls = out["calls"].as_array().unwrap();
    for (i, call) in calls
        .iter()
        .enumerate()
        .filter(|(i, _)| ![5, 8].contains(i))
    {
        assert_eq!(call["is_error"], false, "call {i}: {out}");
    }
    assert_eq!(calls[2]["structured"]["stdout"], "over http\n", "{out}");
    assert_eq!(calls[4]["structured"]["content"], "read", "{out}");
    assert_eq!(
        calls[4]["links"],
        json!([format!("microagent://workspace/{name}/files/tmp/note.txt")]),
        "{out}"
    );
    assert!(calls[5]["abandoned"].is_string(), "{out}");
    assert_eq!(
        calls[6]["structured"]["exit_code"], 0,
        "sleep 600 outlived its cancel: {out}"
    );
    // The SDK's handshake speaks 2025-11-25: resources/subscribe.
    let note = format!("microagent://workspace/{name}/files/tmp/note.txt");
    assert_eq!(calls[7]["via"], "subscribe", "{out}");
    assert_eq!(calls[7]["updated"], json!(note), "{out}");
    assert_eq!(calls[7]["then_error"], false, "{out}");
    assert_eq!(calls[8]["code"], -32602, "{out}");
    assert_eq!(calls[9]["then_error"], false, "{out}");
    let seen = calls[9]["events"].to_string();
    for kind in ["created", "modified", "moved", "deleted"] {
        assert!(
            seen.contains(&format!("[\"{kind}\",\"/tmp/w")),
            "{kind}: {seen}"
        );
    }
    let reads = out["reads"].as_array().unwrap();
    for file in &reads[..2] {
        assert_eq!(file["contents"][0]["text"], "read as a resource\n", "{out}");
    }
    let inspected: Value =
        serde_json::from_str(reads[2]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(inspected["state"], "running", "{inspected}");
    assert_eq!(reads[3]["contents"][0]["mimeType"], "text/plain", "{out}");
    assert_eq!(reads[4]["code"], -32002, "{out}");
    let listed = out["resources"].to_string();
    assert!(
        listed.contains(&format!("microagent://workspace/{name}/logs")),
        "{listed}"
    );
    // 2026-07-28's subscriptions/listen: the same update on the listen
    // stream; what cannot be followed is left out of what it honours.
    let modern = python(json!({
        "url": server.url, "token": token,
        "modern": true,
        "calls": [
            {"subscribe": note,
             "then": {"tool": "file_write", "args": {"name": name, "path": "/tmp/note.txt", "content": "read as a resource\n"}},
             "timeout": 60},
            {"subscribe": format!("microagent://workspace/{name}/logs"),
             "then": {"tool": "workspace_exec", "args": {"name": name, "command": ["true"]}},
             "timeout": 5},
        ]}))
    .unwrap();
    assert_eq!(modern["protocol"], "2026-07-28", "{modern}");
    let listens = &modern["calls"];
    assert_eq!(listens[0]["via"], "listen", "{modern}");
    assert_eq!(listens[0]["honored"], json!([note]), "{modern}");
    assert_eq!(listens[0]["updated"], json!(note), "{modern}");
    assert_eq!(listens[1]["honored"], json!([]), "{modern}");
    assert_eq!(listens[1]["updated"], Value::Null, "{modern}");
    previews::previews_reach_the_guests_servers(&server, token, name);
    let deleted = python(json!({
        "url": server.url, "token": token,
        "calls": [{"tool": "workspace_delete", "args": {"name": name, "force": true}}]}))
    .unwrap();
    assert_eq!(deleted["calls"][0]["is_error"], false, "{deleted}");
    assert!(server.terminate());
    testkit::leftovers::assert_none(&home);
    let _ = std::fs::remove_dir_all(&home);
}
