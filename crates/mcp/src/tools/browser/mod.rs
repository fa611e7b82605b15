//! Browser tools: browser_open, browser_snapshot, browser_click,
//! browser_fill, browser_close, browser_events, browser_screenshot. A
//! headless Chromium in the workspace (started on first use), driven by
//! accessibility snapshots whose refs click and fill take
//! (docs/browser.md).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::browser::{Element, PageOptions, DEFAULT_LOAD_TIMEOUT, MAX_LOAD_TIMEOUT};

use super::seconds;
use crate::error::ToolError;
use crate::output::{Out, ToolResult};
use crate::schema::browser::*;
use crate::MicroagentServer;

fn options(page: Option<String>, timeout_secs: Option<u64>) -> Result<PageOptions, ToolError> {
    let timeout = seconds(
        "timeout_secs",
        timeout_secs,
        DEFAULT_LOAD_TIMEOUT.as_secs(),
        MAX_LOAD_TIMEOUT.as_secs(),
    )?;
    Ok(PageOptions::page(page).timeout(timeout))
}

fn element(reference: Option<String>, selector: Option<String>) -> Result<Element, ToolError> {
    match (reference, selector) {
        (Some(r), None) => Ok(Element::Ref(r)),
        (None, Some(s)) => Ok(Element::Selector(s)),
        _ => Err(ToolError::InvalidInput(
            "give either ref (from the last snapshot) or selector".into(),
        )),
    }
}

#[tool_router(router = browser_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Open a URL in a page of the workspace's headless browser and return
    /// the page's accessibility snapshot once it has loaded: YAML of roles
    /// and names, interactive elements marked [ref=eN] for browser_click
    /// and browser_fill. The browser starts on first use (minutes on a host
    /// whose KVM is emulated); pages persist until browser_close or the
    /// workspace stops. A load past timeout_secs is TIMEOUT.
    #[tool(
        output_schema = crate::output::schema::<BrowserSnapshotResult>(),
        annotations(
            title = "Open a URL in the workspace's browser",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn browser_open(
        &self,
        Parameters(p): Parameters<BrowserOpenParams>,
    ) -> ToolResult<BrowserSnapshotResult> {
        let options = options(p.page, p.timeout_secs)?;
        let snap = self
            .ws
            .workspace(&p.name)?
            .browser()
            .open(&p.url, options)
            .await?;
        Ok(Out(BrowserSnapshotResult { result: snap }))
    }

    /// A new accessibility snapshot of an open page (its refs replace the
    /// previous snapshot's).
    #[tool(
        output_schema = crate::output::schema::<BrowserSnapshotResult>(),
        annotations(
            title = "Snapshot a browser page",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn browser_snapshot(
        &self,
        Parameters(p): Parameters<BrowserPageParams>,
    ) -> ToolResult<BrowserSnapshotResult> {
        let snap = self
            .ws
            .workspace(&p.name)?
            .browser()
            .snapshot(options(p.page, None)?)
            .await?;
        Ok(Out(BrowserSnapshotResult { result: snap }))
    }

    /// Click an element (a ref of the last snapshot, or a CSS selector),
    /// wait for the navigation or requests it sets off, and return the new
    /// snapshot. An unknown ref is INVALID_INPUT and nothing is clicked.
    #[tool(
        output_schema = crate::output::schema::<BrowserSnapshotResult>(),
        annotations(
            title = "Click in a browser page",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn browser_click(
        &self,
        Parameters(p): Parameters<BrowserClickParams>,
    ) -> ToolResult<BrowserSnapshotResult> {
        let target = element(p.reference, p.selector)?;
        let snap = self
            .ws
            .workspace(&p.name)?
            .browser()
            .click(&target, options(p.page, p.timeout_secs)?)
            .await?;
        Ok(Out(BrowserSnapshotResult { result: snap }))
    }

    /// Type a value into an element (a ref or a CSS selector), replacing
    /// what it held, and return the new snapshot.
    #[tool(
        output_schema = crate::output::schema::<BrowserSnapshotResult>(),
        annotations(
            title = "Fill a field in a browser page",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn browser_fill(
        &self,
        Parameters(p): Parameters<BrowserFillParams>,
    ) -> ToolResult<BrowserSnapshotResult> {
        let target = element(p.reference, p.selector)?;
        let snap = self
            .ws
            .workspace(&p.name)?
            .browser()
            .fill(&target, &p.value, options(p.page, p.timeout_secs)?)
            .await?;
        Ok(Out(BrowserSnapshotResult { result: snap }))
    }

    /// Close a page of the workspace's browser. preview: true says which
    /// pages would be left and closes nothing.
    #[tool(
        output_schema = crate::output::schema::<BrowserClosedResult>(),
        annotations(
            title = "Close a browser page",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn browser_close(
        &self,
        Parameters(p): Parameters<BrowserCloseParams>,
    ) -> ToolResult<BrowserClosedResult> {
        let closed = self
            .ws
            .workspace(&p.name)?
            .browser()
            .close(options(p.page, None)?, p.preview)
            .await?;
        Ok(Out(BrowserClosedResult {
            result: closed,
            preview: p.preview,
        }))
    }

    /// The browser's log, to recover context: every action, navigation,
    /// console message and failed request, each with a sequence number;
    /// read on from next_offset.
    #[tool(
        output_schema = crate::output::schema::<BrowserEventsResult>(),
        annotations(
            title = "Browser events",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn browser_events(
        &self,
        Parameters(p): Parameters<BrowserEventsParams>,
    ) -> ToolResult<BrowserEventsResult> {
        let limit = p.limit.unwrap_or(100);
        let max = workspace::browser::MAX_EVENTS_PER_CALL;
        if !(1..=max).contains(&limit) {
            return Err(ToolError::InvalidInput(format!(
                "limit is {limit}; use 1 to {max}"
            )));
        }
        let events = self
            .ws
            .workspace(&p.name)?
            .browser()
            .events(p.offset.unwrap_or(0), limit)
            .await?;
        Ok(Out(BrowserEventsResult { result: events }))
    }

    /// A PNG of a page's viewport (1280x720), as image content.
    #[tool(
        output_schema = crate::output::schema::<BrowserScreenshotResult>(),
        annotations(
            title = "Screenshot a browser page",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn browser_screenshot(
        &self,
        Parameters(p): Parameters<BrowserPageParams>,
    ) -> ToolResult<BrowserScreenshotResult> {
        let shot = self
            .ws
            .workspace(&p.name)?
            .browser()
            .screenshot(options(p.page, None)?)
            .await?;
        Ok(Out(BrowserScreenshotResult {
            workspace: p.name,
            bytes: shot.png.len(),
            page: shot.page,
            url: shot.url,
            width: shot.width,
            height: shot.height,
            png: shot.png,
        }))
    }
}
