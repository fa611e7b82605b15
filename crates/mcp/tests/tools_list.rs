//! The `tools/list` answer (names, descriptions, input and output schemas,
//! annotations) is part of our interface: clients cache it and agents are
//! prompted with it. This test holds it byte for byte against the checked-in
//! copy `tools_list.json`, so a refactoring cannot change it unnoticed. A
//! change made on purpose rewrites the copy with
//! `MICROAGENT_BLESS=1 cargo test -p mcp --test tools_list`; the diff then
//! shows in review.

mod common;

use common::McpHarness;

const COPY: &str = "tests/tools_list.json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_list_is_the_checked_in_one() {
    let h = McpHarness::new("tools-list").await;
    // In the order the server lists them: that order is part of the answer.
    let answer = serde_json::to_string_pretty(&h.tools).unwrap() + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(COPY);
    if std::env::var_os("MICROAGENT_BLESS").is_some() {
        std::fs::write(&path, &answer).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    if answer != expected {
        let line = answer
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| answer.lines().count().min(expected.lines().count()));
        panic!(
            "tools/list differs from {COPY} at line {}:\n  now:      {}\n  expected: {}\n\
             If the change is meant, rewrite the copy with MICROAGENT_BLESS=1 and review its diff.",
            line + 1,
            answer.lines().nth(line).unwrap_or("(end)"),
            expected.lines().nth(line).unwrap_or("(end)"),
        );
    }
    h.finish().await;
}
