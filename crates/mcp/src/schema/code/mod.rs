//! Inputs and outputs of the code-session tools: code_session_start,
//! code_run, code_session_restart, code_session_stop, code_session_list.

use rmcp::model::{ContentBlock, ResourceContents};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::code_sessions::{CodeLanguage, CodeRun, CodeSessionInfo};

use crate::output::Render;

/// Whether `data` is standard base64 (what image content carries; the
/// library took out the line breaks IPython writes).
fn is_base64(data: &str) -> bool {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(data.as_bytes())
        .is_ok()
}

/// Longest `timeout_secs` of code_run.
pub const MAX_RUN_SECS: u64 = 3600;
/// Largest `code` of code_run, in bytes.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
/// Longest session id.
pub const MAX_SESSION_CHARS: usize = 200;

/// `code_session_start`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeSessionStartParams {
    /// Workspace name (an image with Jupyter's kernel: `code`).
    pub workspace: String,
    /// The session's language: python (the default) or javascript (node).
    #[serde(default = "python")]
    pub language: CodeLanguage,
}

fn python() -> CodeLanguage {
    CodeLanguage::Python
}

/// `code_run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeRunParams {
    /// The session, as code_session_start returned it (`WORKSPACE/code-N`).
    #[schemars(length(max = 200))]
    pub session: String,
    /// The code: what earlier runs defined and imported is there.
    #[schemars(length(max = MAX_CODE_BYTES))]
    pub code: String,
    /// Interrupt it after this many seconds (1-3600); default 300. The
    /// session goes on.
    #[schemars(range(min = 1, max = MAX_RUN_SECS))]
    pub timeout_secs: Option<u64>,
}

/// `code_session_restart` and `code_session_stop`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeSessionParams {
    /// The session, as code_session_start returned it.
    #[schemars(length(max = 200))]
    pub session: String,
}

/// `code_session_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeSessionListParams {
    /// Workspace name.
    pub workspace: String,
}

/// A session, as the tools return it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CodeSessionResult {
    /// The session: what code_run and the other tools take.
    pub session: String,
    /// Its workspace.
    pub workspace: String,
    /// Its language.
    pub language: CodeLanguage,
    /// Whether its kernel runs (it ends with its workspace's stop).
    pub running: bool,
    /// When it was started, Unix ms.
    pub created_unix_ms: u64,
}

impl CodeSessionResult {
    /// `info` of `workspace` as a result.
    pub fn new(workspace: &str, info: CodeSessionInfo) -> Self {
        Self {
            session: format!("{workspace}/{}", info.id),
            workspace: workspace.to_owned(),
            language: info.language,
            running: info.running,
            created_unix_ms: info.created_unix_ms,
        }
    }
}

impl Render for CodeSessionResult {
    fn render(&self) -> String {
        let state = if self.running { "running" } else { "ended" };
        format!(
            "code session {} ({}, {state})",
            self.session,
            self.language.as_str()
        )
    }
}

/// The result of `code_session_list`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CodeSessionList {
    /// The workspace.
    pub workspace: String,
    /// Its sessions.
    pub sessions: Vec<CodeSessionResult>,
}

impl Render for CodeSessionList {
    fn render(&self) -> String {
        if self.sessions.is_empty() {
            return format!("no code sessions in {}", self.workspace);
        }
        let lines: Vec<String> = self.sessions.iter().map(Render::render).collect();
        lines.join("\n")
    }
}

/// The result of `code_session_stop`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CodeSessionStopped {
    /// The session ended.
    pub session: String,
}

impl Render for CodeSessionStopped {
    fn render(&self) -> String {
        format!("code session {} ended", self.session)
    }
}

/// The result of `code_run`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CodeRunResult {
    /// The session it ran in.
    pub session: String,
    /// What it printed, returned, displayed and raised.
    #[serde(flatten)]
    pub run: CodeRun,
}

impl Render for CodeRunResult {
    fn render(&self) -> String {
        let run = &self.run;
        let mut parts = Vec::new();
        if !run.stdout.is_empty() {
            parts.push(run.stdout.trim_end().to_owned());
        }
        if !run.stderr.is_empty() {
            parts.push(format!("stderr:\n{}", run.stderr.trim_end()));
        }
        if let Some(result) = &run.result {
            parts.push(match run.execution_count {
                Some(n) => format!("Out[{n}]: {result}"),
                None => result.clone(),
            });
        }
        if let Some(e) = &run.error {
            let trace = e.traceback.join("\n");
            parts.push(
                format!("{}: {}\n{trace}", e.name, e.value)
                    .trim_end()
                    .to_owned(),
            );
        }
        if !run.outputs.is_empty() {
            let mimes: Vec<&str> = run.outputs.iter().map(|o| o.mime.as_str()).collect();
            parts.push(format!("displayed: {}", mimes.join(", ")));
        }
        if let Some(why) = &run.stopped {
            parts.push(format!("stopped: {why} (the session goes on)"));
        }
        if run.truncated {
            parts.push("(some output was left out past the limits)".into());
        }
        if parts.is_empty() {
            parts.push("(no output)".into());
        }
        parts.join("\n")
    }

    /// Images as image content (clients show plots); HTML, JSON, Markdown,
    /// SVG and plain text as embedded text resources of their type.
    fn blocks(&self) -> Vec<ContentBlock> {
        self.run
            .outputs
            .iter()
            .enumerate()
            .map(|(i, o)| match o.mime.as_str() {
                // Guest text: an image only when it is base64 (a client may
                // refuse a whole result for a bad one).
                "image/png" | "image/jpeg" | "image/gif" | "image/webp" if is_base64(&o.data) => {
                    ContentBlock::image(o.data.clone(), o.mime.clone())
                }
                mime => {
                    let uri = format!("microagent://code/{}/outputs/{i}", self.session);
                    ContentBlock::resource(
                        ResourceContents::text(o.data.clone(), uri).with_mime_type(mime),
                    )
                }
            })
            .collect()
    }
}
