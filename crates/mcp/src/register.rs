//! How to register the server with MCP clients: what `microagent serve mcp`
//! prints (to stderr) when it is started from a terminal instead of by a
//! client.

use std::path::{Path, PathBuf};

/// The command clients should run: `microagent` when that name on `PATH` is
/// this executable, else this executable's full path.
pub fn program() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "microagent".into();
    };
    let exe = exe.canonicalize().unwrap_or(exe);
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<PathBuf>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("microagent"))
        .find(|candidate| candidate.is_file());
    match on_path.and_then(|p| p.canonicalize().ok()) {
        Some(found) if found == exe => "microagent".into(),
        _ => display(&exe),
    }
}

fn display(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// The registration text for `program`.
pub fn instructions(program: &str) -> String {
    let cmd = json_string(program);
    let shell = if program
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
    {
        program.to_owned()
    } else {
        format!("'{}'", program.replace('\'', r"'\''"))
    };
    format!(
        r#"microagent serve mcp: the microagent MCP server (JSON-RPC over stdin/stdout).
It is started by an MCP client, not by hand. Register it with your client:

Claude Code (one line; user scope, so every project has it):
  claude mcp add --transport stdio --scope user microagent -- {shell} serve mcp

Project-scoped .mcp.json (Claude Code and others):
  {{"mcpServers": {{"microagent": {{"type": "stdio", "command": {cmd}, "args": ["serve", "mcp"]}}}}}}
A first boot here can take a minute: Claude Code waits MCP_TOOL_TIMEOUT ms
for a call (its environment, or "env" in ~/.claude/settings.json), e.g.
MCP_TOOL_TIMEOUT=600000.

Codex, ~/.codex/config.toml:
  [mcp_servers.microagent]
  command = {cmd}
  args = ["serve", "mcp"]
  tool_timeout_sec = 600

VS Code, .vscode/mcp.json:
  {{"servers": {{"microagent": {{"type": "stdio", "command": {cmd}, "args": ["serve", "mcp"]}}}}}}

Cursor, ~/.cursor/mcp.json:
  {{"mcpServers": {{"microagent": {{"command": {cmd}, "args": ["serve", "mcp"]}}}}}}

Gemini CLI (one line, or ~/.gemini/settings.json; timeout in ms):
  gemini mcp add --scope user microagent {shell} serve mcp
  {{"mcpServers": {{"microagent": {{"command": {cmd}, "args": ["serve", "mcp"], "timeout": 600000}}}}}}

GitHub Copilot CLI (one line, or ~/.copilot/mcp-config.json):
  copilot mcp add microagent -- {shell} serve mcp
  {{"mcpServers": {{"microagent": {{"type": "stdio", "command": {cmd}, "args": ["serve", "mcp"], "tools": ["*"]}}}}}}

Workspaces live in $MICROAGENT_HOME (default ~/.microagent) and outlive the
server; set MICROAGENT_HOME in the client's "env" to use another store.
Tools and examples: docs/mcp.md."#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_name_the_program_and_are_valid() {
        let text = instructions("microagent");
        assert!(text.contains(
            "claude mcp add --transport stdio --scope user microagent -- microagent serve mcp"
        ));
        assert!(text.contains("copilot mcp add microagent -- microagent serve mcp"));
        let json_lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('{'))
            .collect();
        assert!(text.contains("gemini mcp add --scope user microagent microagent serve mcp"));
        assert_eq!(json_lines.len(), 5);
        for line in json_lines {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let server = v
                .get("mcpServers")
                .or_else(|| v.get("servers"))
                .unwrap()
                .get("microagent")
                .unwrap();
            assert_eq!(server["command"], "microagent");
            assert_eq!(server["args"], serde_json::json!(["serve", "mcp"]));
        }
        assert!(text.contains(r#""timeout": 600000"#));
        let odd = instructions("/opt/my tools/microagent");
        assert!(odd.contains("-- '/opt/my tools/microagent' serve mcp"));
        assert!(odd.contains(r#""command": "/opt/my tools/microagent""#));
    }
}
