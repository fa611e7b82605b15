//! An in-process MCP client talking to a [`MicroagentServer`] over an
//! in-memory pipe, over a temporary state directory.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mcp::MicroagentServer;
use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ServiceError, ServiceExt};
use serde_json::Value;
use workspace::{StateDir, Workspaces};

pub struct McpHarness {
    pub client: RunningService<RoleClient, ()>,
    pub root: PathBuf,
    pub ws: Workspaces,
    pub tools: Vec<Tool>,
}

impl McpHarness {
    /// A server over a fresh state directory (no guest assets, a VMM that
    /// does not exist) and a client connected to it.
    pub async fn new(tag: &str) -> McpHarness {
        Self::with_grants(tag, mcp::Grants::default()).await
    }

    /// [`McpHarness::new`] of a server granted `grants`.
    pub async fn with_grants(tag: &str, grants: mcp::Grants) -> McpHarness {
        let root = PathBuf::from(format!("/tmp/mcp-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let state = StateDir::at(&root).unwrap();
        let ws = Workspaces::new(state, None, PathBuf::from("/nonexistent-vmm"));
        let server = MicroagentServer::new(ws.clone(), host_roots(&root)).with_grants(grants);
        let (server_end, client_end) = tokio::io::duplex(1 << 20);
        let (reader, writer) = tokio::io::split(server_end);
        tokio::spawn(mcp::serve(server, reader, writer));
        let client = ().serve(client_end).await.unwrap();
        let mut tools = client.list_all_tools().await.unwrap();
        // Test builds with the conformance fixture list it too.
        tools.retain(|t| t.name != mcp::CONFORMANCE_FIXTURE_TOOL);
        McpHarness {
            client,
            root,
            ws,
            tools,
        }
    }

    pub fn tool(&self, name: &str) -> &Tool {
        self.tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    /// Calls `tool` with `args` (a JSON object).
    pub async fn try_call(&self, tool: &str, args: Value) -> Result<CallToolResult, ServiceError> {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        self.client.call_tool(params).await
    }

    /// A successful call's structured content, checked against the tool's
    /// output schema.
    pub async fn ok(&self, tool: &str, args: Value) -> Value {
        let result = self.try_call(tool, args.clone()).await.unwrap();
        let text = text(&result);
        assert_eq!(result.is_error, Some(false), "{tool} {args} failed: {text}");
        assert!(!text.is_empty(), "{tool} has a text rendering");
        let value = result.structured_content.expect("structured content");
        let schema = Value::Object(
            self.tool(tool)
                .output_schema
                .as_deref()
                .cloned()
                .expect("an output schema"),
        );
        let validator = jsonschema::validator_for(&schema).unwrap();
        if let Err(e) = validator.validate(&value) {
            panic!("{tool}'s result does not match its output schema: {e}\n{value:#}");
        }
        value
    }

    /// A failed call's message, after checking its code.
    pub async fn fails(&self, tool: &str, args: Value, code: &str) -> String {
        let result = self.try_call(tool, args.clone()).await.unwrap();
        let text = text(&result);
        assert_eq!(
            result.is_error,
            Some(true),
            "{tool} {args} should fail: {text}"
        );
        let structured = result.structured_content.expect("structured error");
        assert_eq!(structured["code"], code, "{tool} {args}: {text}");
        assert!(text.starts_with(&format!("{code}: ")), "{text}");
        structured["message"].as_str().unwrap().to_owned()
    }

    /// Every file under the state directory and its content.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        walk(&self.root, &mut out);
        out
    }

    /// Registers a fake image (right magic numbers, not bootable).
    pub fn fake_image(&self, name: &str) {
        let src = self.root.join(format!("src-{name}"));
        testkit::fake_image_files(&src);
        self.ws.image_registry().import_dir(name, &src).unwrap();
    }

    pub async fn finish(self) {
        let _ = self.client.cancel().await;
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The host directories the test servers may use: the harness's own
/// directory (relative paths go there) and this crate's source.
pub fn host_roots(root: &Path) -> mcp::HostRoots {
    mcp::HostRoots::new(&[root.to_owned(), PathBuf::from(env!("CARGO_MANIFEST_DIR"))]).unwrap()
}

pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.insert(path.clone(), Vec::new());
            walk(&path, out);
        } else {
            out.insert(path.clone(), std::fs::read(&path).unwrap_or_default());
        }
    }
}
