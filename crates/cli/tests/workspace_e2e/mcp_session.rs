//! One stdio MCP session with the CLI's `serve mcp`, for the suites that
//! drive a real workspace through it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::cli::CliHome;
use testkit::mcp_tools;

/// How long an answer may take (a call on a slow guest included).
const ANSWER_WITHIN: Duration = Duration::from_secs(600);

/// One stdio MCP session with the CLI's `serve mcp`.
pub struct McpStdio {
    server: std::process::Child,
    stdin: ChildStdin,
    /// Messages the server wrote, read on a thread of their own.
    messages: Receiver<Value>,
    /// Read while looking for something else.
    held: VecDeque<Value>,
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
        let stdout = BufReader::new(server.stdout.take().unwrap());
        let (tx, messages) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if let Ok(message) = serde_json::from_str::<Value>(&line) {
                    if tx.send(message).is_err() {
                        return;
                    }
                }
            }
        });
        let mut session = Self {
            server,
            stdin,
            messages,
            held: VecDeque::new(),
            next_id: 2,
        };
        session.answer(1);
        session
    }

    /// The first message `wanted` takes, within `within`; the others read
    /// meanwhile are kept for later looks.
    fn take(&mut self, within: Duration, wanted: impl Fn(&Value) -> bool) -> Option<Value> {
        if let Some(at) = self.held.iter().position(&wanted) {
            return self.held.remove(at);
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(m) if wanted(&m) => return Some(m),
                Ok(m) => self.held.push_back(m),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn answer(&mut self, id: u64) -> Value {
        self.take(ANSWER_WITHIN, |m| {
            m["id"] == id && m.get("method").is_none()
        })
        .unwrap_or_else(|| panic!("no answer to request {id}"))
    }

    /// The whole answer (`result` or `error`) to a request of `method`.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{message}").unwrap();
        self.answer(id)
    }

    /// The next notification `method` the server sent, waiting up to
    /// `within`.
    pub fn notification(&mut self, method: &str, within: Duration) -> Option<Value> {
        self.take(within, |m| m["method"] == method && m.get("id").is_none())
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
