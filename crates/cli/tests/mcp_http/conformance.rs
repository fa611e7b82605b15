//! The official MCP conformance suite (`@modelcontextprotocol/conformance`)
//! against `serve mcp --http --dev`: its generic server scenarios, and
//! `json-schema-2020-12`, whose fixture tool test builds list (feature
//! `conformance-fixture`). The others test fixtures of its reference server
//! (`test://static-text`, prompts, sampling) that a real server does not
//! have, so they do not apply.

use std::process::Command;

use super::{home, Server};

/// The scenarios that apply to any server with tools and resources.
const SCENARIOS: [&str; 6] = [
    "server-initialize",
    "ping",
    "tools-list",
    "json-schema-2020-12",
    "dns-rebinding-protection",
    "resources-list",
];

#[test]
fn the_conformance_suite_passes_its_generic_server_scenarios() {
    let test = "mcp_http::conformance::the_conformance_suite_passes_its_generic_server_scenarios";
    let Some((node, suite)) = testkit::require(test, testkit::mcp_conformance()) else {
        return;
    };
    let home = home("conformance");
    let server = Server::start(&home, &["--dev"]);
    for scenario in SCENARIOS {
        let out = Command::new(&node)
            .arg(&suite)
            .args(["server", "--url", &server.url, "--scenario", scenario])
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{scenario} failed:\n{report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(report.contains("0 failed"), "{scenario}:\n{report}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(home);
}
