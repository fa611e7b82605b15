//! Inputs and outputs of the browser tools: browser_open, browser_snapshot,
//! browser_click, browser_fill, browser_close, browser_events,
//! browser_screenshot.

use base64::Engine;
use rmcp::model::ContentBlock;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::browser::{BrowserEvents, BrowserPageClosed, BrowserSnapshot};

use crate::output::Render;

/// `browser_open`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserOpenParams {
    /// Workspace name (running; its image needs Chromium: `browser`).
    pub name: String,
    /// http://, https:// or about:blank. The host's loopback is
    /// host.microagent.internal:PORT when the workspace's network opens it.
    pub url: String,
    /// The page; default "default". A new name opens a new page.
    pub page: Option<String>,
    /// Seconds the load may take (default 60, at most 600).
    #[schemars(range(min = 1, max = workspace::browser::MAX_LOAD_TIMEOUT.as_secs()))]
    pub timeout_secs: Option<u64>,
}

/// `browser_snapshot`, `browser_screenshot`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserPageParams {
    /// Workspace name.
    pub name: String,
    /// The page; default "default".
    pub page: Option<String>,
}

/// `browser_close`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserCloseParams {
    /// Workspace name.
    pub name: String,
    /// The page; default "default".
    pub page: Option<String>,
    /// Only report what would happen (the pages left); close nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `browser_click`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserClickParams {
    /// Workspace name.
    pub name: String,
    /// A ref from the page's last snapshot (`e3`); or give `selector`.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    /// A CSS selector (its first match) instead of a ref.
    pub selector: Option<String>,
    /// The page; default "default".
    pub page: Option<String>,
    /// Seconds what the click sets off may take to load (default 60).
    #[schemars(range(min = 1, max = workspace::browser::MAX_LOAD_TIMEOUT.as_secs()))]
    pub timeout_secs: Option<u64>,
}

/// `browser_fill`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserFillParams {
    /// Workspace name.
    pub name: String,
    /// A ref from the page's last snapshot (`e2`); or give `selector`.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    /// A CSS selector (its first match) instead of a ref.
    pub selector: Option<String>,
    /// The text that replaces the element's value.
    pub value: String,
    /// The page; default "default".
    pub page: Option<String>,
    /// Seconds what typing sets off may take (default 60).
    #[schemars(range(min = 1, max = workspace::browser::MAX_LOAD_TIMEOUT.as_secs()))]
    pub timeout_secs: Option<u64>,
}

/// `browser_events`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserEventsParams {
    /// Workspace name.
    pub name: String,
    /// Only events after this sequence number (default 0: from the start);
    /// pass the last result's next_offset to read on.
    pub offset: Option<u64>,
    /// At most this many (default 100, at most 1000).
    #[schemars(range(min = 1, max = workspace::browser::MAX_EVENTS_PER_CALL))]
    pub limit: Option<usize>,
}

/// A page's snapshot (open, snapshot, click, fill).
#[derive(Debug, Serialize, JsonSchema)]
pub struct BrowserSnapshotResult {
    /// The result.
    #[serde(flatten)]
    pub result: BrowserSnapshot,
}

impl Render for BrowserSnapshotResult {
    fn render(&self) -> String {
        let s = &self.result;
        let mut text = String::new();
        if let Some(why) = &s.restarted {
            text.push_str(&format!("(the browser was restarted: {why})\n"));
        }
        text.push_str(&format!(
            "page {} of {}: {:?} at {}\n{}",
            s.page, s.workspace, s.title, s.url, s.snapshot
        ));
        text
    }
}

/// A closed page.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BrowserClosedResult {
    /// The result (for a preview: the pages that would be left).
    #[serde(flatten)]
    pub result: BrowserPageClosed,
    /// Only a preview: nothing was closed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preview: bool,
}

impl Render for BrowserClosedResult {
    fn render(&self) -> String {
        let c = &self.result;
        format!(
            "{} page {} of {}; open: {}",
            if self.preview {
                "would close"
            } else {
                "closed"
            },
            c.page,
            c.workspace,
            c.pages.join(", ")
        )
    }
}

/// A slice of the browser log.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BrowserEventsResult {
    /// The result.
    #[serde(flatten)]
    pub result: BrowserEvents,
}

impl Render for BrowserEventsResult {
    fn render(&self) -> String {
        let e = &self.result;
        let mut text = format!(
            "{} browser events of {} (next_offset {})",
            e.events.len(),
            e.workspace,
            e.next_offset
        );
        for event in &e.events {
            let kind = serde_json::to_string(&event.kind).unwrap_or_default();
            text.push_str(&format!("\n{} {kind}", event.seq));
        }
        text
    }
}

/// A screenshot: its facts here, the PNG as image content.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BrowserScreenshotResult {
    /// The workspace.
    pub workspace: String,
    /// The page.
    pub page: String,
    /// Where the page is.
    pub url: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Size of the PNG.
    pub bytes: usize,
    /// The PNG (sent as image content).
    #[serde(skip)]
    #[schemars(skip)]
    pub png: Vec<u8>,
}

impl Render for BrowserScreenshotResult {
    fn render(&self) -> String {
        format!(
            "{}x{} PNG of page {} of {} at {}",
            self.width, self.height, self.page, self.workspace, self.url
        )
    }

    fn blocks(&self) -> Vec<ContentBlock> {
        let data = base64::engine::general_purpose::STANDARD.encode(&self.png);
        vec![ContentBlock::image(data, "image/png")]
    }
}
