//! Code sessions in a real guest: the `code` image built from Debian's
//! packages (`image build`, as `setup --with code` plans it), a session
//! started by the CLI and used again through the official MCP Python SDK
//! over HTTP: state kept across runs and front ends, a DataFrame as an
//! HTML table, a matplotlib figure as PNG image content, an endless loop
//! cancelled and timed out with the session still answering, restart and
//! stop. The kernels are made ahead once (`code prepare`: the kernel
//! server's import of ipykernel, ten minutes of emulated guest work here,
//! and a kernel of each language forked): the sessions take them, each
//! reseeded, and the restarts are forks. One guest serves every step but
//! the draw (30 min in all here, alone).

use base64::Engine;
use serde_json::json;
use testkit::cli::CliHome;

use super::{python, Server, BIN};

#[test]
fn a_code_session_keeps_state_and_returns_rich_results() {
    let test = "mcp_http::code_sessions::a_code_session_keeps_state_and_returns_rich_results";
    if testkit::require(test, testkit::mcp_python()).is_none()
        || testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
        || testkit::require(test, testkit::host_tool("mmdebstrap")).is_none()
        || testkit::require(test, testkit::host_tool("mkfs.ext4")).is_none()
    {
        return;
    }
    let h = CliHome::new(BIN, "code");
    // `setup --with code` plans the image's build as a plan of its own.
    let preview = h.ok(&["setup", "--with", "code"]);
    assert!(
        preview.stdout.contains("python3-ipykernel") && preview.stdout.contains("--confirm"),
        "{}",
        preview.stdout
    );
    let began = std::time::Instant::now();
    let packages = workspace::code_sessions::IMAGE_PACKAGES.join(",");
    h.ok(&[
        "image",
        "build",
        workspace::code_sessions::IMAGE,
        "--from",
        "debian:bookworm",
        "--packages",
        &packages,
        "--mem",
        "1g",
        "--yes",
    ]);
    println!("image build: {:.1} s", began.elapsed().as_secs_f64());
    // Kernels made ahead once, in the image's warm snapshot.
    let began = std::time::Instant::now();
    let prepared = h.ok_json(&["code", "prepare", "code", "--json"]);
    println!("code prepare: {:.1} s", began.elapsed().as_secs_f64());
    assert_eq!(
        prepared["languages"],
        json!(["python", "javascript"]),
        "{prepared}"
    );
    // No workspace of the library's own is left behind, in any namespace.
    let everywhere = h.ok_json(&["ls", "--json", "--namespace", "*"]);
    assert_eq!(everywhere.as_array().map(Vec::len), Some(0), "{everywhere}");
    h.ok(&["create", "cs", "--image", "code"]);
    h.ok(&["create", "cs2", "--image", "code"]);
    h.ok(&["start", "cs"]);

    // The CLI starts the workspace's session on first use (taking the
    // kernel made ahead) and finds it again on the next run: x is still
    // there.
    let began = std::time::Instant::now();
    h.ok(&["code", "run", "cs", "--timeout", "1800", "--", "x = 41"]);
    println!(
        "session start (kernel made ahead) and first run: {:.1} s",
        began.elapsed().as_secs_f64()
    );
    let processes = h.ok(&["ps", "cs"]);
    assert!(
        processes.stdout.contains("code-ready-python"),
        "{}",
        processes.stdout
    );
    // Each workspace's taken kernel was reseeded: the same snapshot, two
    // draws of `random`.
    h.ok(&["start", "cs2"]);
    let draw = "import random; random.random()";
    let first = h.ok_json(&["code", "run", "cs", "--json", "--", draw]);
    let second = h.ok_json(&["code", "run", "cs2", "--json", "--", draw]);
    assert!(first["result"].is_string(), "{first}");
    assert_ne!(first["result"], second["result"], "{first} {second}");
    h.ok(&["rm", "-f", "-y", "cs2"]);
    let again = h.ok_json(&["code", "run", "cs", "--json", "--", "x + 1"]);
    assert_eq!(again["result"], "42", "{again}");
    let raised = h.run(&["code", "run", "cs", "--", "1/0"]);
    assert_eq!(raised.status, 1, "{}", raised.stderr);
    assert!(
        raised.stderr.contains("ZeroDivisionError"),
        "{}",
        raised.stderr
    );

    // The same session through the Python SDK, over HTTP.
    let server = Server::start(h.home(), &[]);
    let token = std::fs::read_to_string(h.home().join("mcp-token")).unwrap();
    let out = python(json!({
    "url": server.url, "token": token.trim(),
    "calls": [
        {"tool": "code_session_list", "args": {"workspace": "cs"}},
        {"tool": "code_run", "args": {"session": "cs/code-1", "code": "x + 1"}},
        {"tool": "code_run", "args": {"session": "cs/code-1",
            "code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})",
            "timeout_secs": 1800}},
        {"tool": "code_run", "args": {"session": "cs/code-1",
            "code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
            "timeout_secs": 1800}},
        // Abandoned by the client: cancelled, so interrupted.
        {"tool": "code_run", "args": {"session": "cs/code-1", "code": "while True:\n    pass"},
         "timeout": 10},
        {"tool": "code_run", "args": {"session": "cs/code-1", "code": "x"}},
        {"tool": "code_run", "args": {"session": "cs/code-1", "code": "while True:\n    pass",
            "timeout_secs": 2}},
        {"tool": "code_session_restart", "args": {"session": "cs/code-1"}},
        {"tool": "code_run", "args": {"session": "cs/code-1", "code": "x"}},
        {"tool": "code_run", "args": {"session": "cs/code-9", "code": "1"}},
        {"tool": "code_run", "args": {"session": "code-1", "code": "1"}},
        // A JavaScript session beside it keeps its variables too.
        {"tool": "code_session_start", "args": {"workspace": "cs", "language": "javascript"}},
        {"tool": "code_run", "args": {"session": "cs/code-2", "code": "let y = 41"}},
        {"tool": "code_run", "args": {"session": "cs/code-2", "code": "console.log('js'); y + 1"}},
    ]}))
    .unwrap();
    let calls = out["calls"].as_array().unwrap();
    for i in [0, 1, 2, 3, 5, 6, 7, 8] {
        assert_eq!(calls[i]["is_error"], false, "call {i}: {}", calls[i]);
    }
    let listed = &calls[0]["structured"]["sessions"];
    assert_eq!(listed[0]["session"], "cs/code-1", "{listed}");
    assert_eq!(listed[0]["running"], true, "{listed}");
    assert_eq!(calls[1]["structured"]["result"], "42", "{}", calls[1]);
    // The DataFrame: its text as the result, its table as HTML.
    let table = &calls[2]["structured"];
    assert!(
        table["result"].as_str().unwrap_or("").contains('a'),
        "{table}"
    );
    let html = &calls[2]["resources"][0];
    assert_eq!(html["mimeType"], "text/html", "{}", calls[2]);
    assert!(html["text"].as_str().unwrap().contains("<table"), "{html}");
    // The figure: a PNG as image content.
    let image = &calls[3]["images"][0];
    assert_eq!(image["mime"], "image/png", "{}", calls[3]);
    let png = base64::engine::general_purpose::STANDARD
        .decode(image["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(calls[4]["abandoned"].is_string(), "{}", calls[4]);
    assert_eq!(
        calls[5]["structured"]["result"], "41",
        "after a cancel: {}",
        calls[5]
    );
    let timed = &calls[6]["structured"];
    assert_eq!(timed["stopped"], "timed out after 2s", "{timed}");
    assert_eq!(timed["error"]["name"], "KeyboardInterrupt", "{timed}");
    // Restarted: what it held is gone.
    assert_eq!(
        calls[8]["structured"]["error"]["name"], "NameError",
        "{}",
        calls[8]
    );
    assert_eq!(calls[9]["is_error"], true);
    assert_eq!(calls[9]["structured"]["code"], "NOT_FOUND", "{}", calls[9]);
    assert_eq!(calls[10]["is_error"], true);
    assert_eq!(
        calls[10]["structured"]["code"], "INVALID_INPUT",
        "{}",
        calls[10]
    );
    for i in [11, 12, 13] {
        assert_eq!(calls[i]["is_error"], false, "call {i}: {}", calls[i]);
    }
    assert_eq!(
        calls[11]["structured"]["language"], "javascript",
        "{}",
        calls[11]
    );
    assert_eq!(calls[13]["structured"]["result"], "42", "{}", calls[13]);
    assert_eq!(calls[13]["structured"]["stdout"], "js\n", "{}", calls[13]);
    drop(server);

    // A JavaScript kernel started in the guest (not made ahead): what
    // the session held is gone.
    h.ok(&["code", "restart", "cs", "code-2"]);
    let fresh = h.ok_json(&[
        "code",
        "run",
        "cs",
        "--json",
        "--session",
        "code-2",
        "--",
        "typeof y",
    ]);
    assert_eq!(fresh["result"], "'undefined'", "{fresh}");
    let listed = h.ok_json(&["code", "ls", "cs", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    h.ok(&["code", "stop", "cs", "code-1"]);
    h.ok(&["code", "stop", "cs", "code-2"]);
    h.ok(&["rm", "-f", "-y", "cs"]);
}
