//! One stdio MCP session with the CLI's `serve mcp`, for the suites that
//! drive a real workspace through it.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout, Stdio};

use serde_json::Value;
use testkit::cli::CliHome;
use testkit::mcp_tools;

/// One stdio MCP session with the CLI's `serve mcp`.
pub struct McpStdio {
    server: std::process::Child,
    stdin: ChildStdin,
    stdout: std::io::Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl McpStdio {
    /// `serve mcp` with the session opened as client `client`.
    pub fn open(cli: &CliHome, client: &str) -> Self {
        let mut server = cli
            .command(&["serve", "mcp"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = server.stdin.take().unwrap();
        for message in mcp_tools::opening(client) {
            writeln!(stdin, "{message}").unwrap();
        }
        let stdout = BufReader::new(server.stdout.take().unwrap()).lines();
        let mut session = Self {
            server,
            stdin,
            stdout,
            next_id: 2,
        };
        session.answer(1);
        session
    }

    fn answer(&mut self, id: u64) -> Value {
        self.stdout
            .by_ref()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer to request {id}"))
    }

    /// The `structuredContent` of a successful call of `tool`.
    pub fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let result = self.call_result(tool, arguments);
        assert_ne!(result["isError"], true, "{tool}: {result}");
        result["structuredContent"].clone()
    }

    /// The `result` of a call of `tool`, an error or not.
    pub fn call_result(&mut self, tool: &str, arguments: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        writeln!(self.stdin, "{}", mcp_tools::tool_call(id, tool, arguments)).unwrap();
        self.answer(id)["result"].clone()
    }

    /// Ends the session; the server exits cleanly.
    pub fn close(self) {
        drop(self.stdin);
        let mut server = self.server;
        assert!(server.wait().unwrap().success());
    }
}
