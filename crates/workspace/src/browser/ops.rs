//! The browser calls of a workspace. Each takes the workspace's browser
//! lock, makes sure Chromium runs (`launch`), opens a DevTools connection
//! through the agent, acts on one page and returns its new snapshot.

use serde_json::{json, Value};
use tokio::net::UnixStream;

use crate::browser::cdp::Cdp;
use crate::browser::launch::{self, Endpoint};
use crate::browser::page::{png_size, Page};
use crate::browser::state::{BrowserDir, BrowserState, PageState};
use crate::browser::{
    check_url, BrowserError, BrowserEventKind, BrowserEvents, BrowserPageClosed, BrowserScreenshot,
    BrowserSnapshot, Element, PageOptions, MAX_EVENTS_PER_CALL, MAX_SNAPSHOT_BYTES,
};
use crate::error::{Error, Result};
use crate::servers::{check_answer_bytes, millis, RemoteWorkspace, ServerError, WorkspaceCall};
use crate::workspaces::handle::Workspace;
use base::store::file_lock::FileLock;
use base::store::workspace_dir::WorkspaceDir;

/// Bound on the browser-level commands (targets).
const TARGET_QUIET: std::time::Duration = std::time::Duration::from_secs(60);

/// One call's hold on the browser.
struct Call<'a> {
    ws: Workspace<'a>,
    dir: BrowserDir,
    _lock: FileLock,
    state: BrowserState,
    endpoint: Endpoint,
    cdp: Option<Cdp<UnixStream>>,
}

/// A DevTools connection to `endpoint` through the workspace's agent.
async fn connect(ws_dir: &WorkspaceDir, endpoint: &Endpoint) -> Result<Cdp<UnixStream>> {
    let stream = crate::guest::connect_agent(ws_dir)
        .await
        .map_err(Error::agent("connect"))?
        .tcp_connect(endpoint.port)
        .await
        .map_err(Error::agent("tcp_connect"))?;
    Ok(Cdp::handshake(stream, endpoint.port, &endpoint.path).await?)
}

impl<'a> Call<'a> {
    async fn begin(ws: Workspace<'a>) -> Result<Self> {
        // Too small to start Chromium in: refused now (running or not),
        // not after a start that cannot finish.
        let meta = ws.get_here()?;
        let needs = ws.all.image_defaults(&meta.spec.image).min_mem_mib;
        if let Some(needs) = needs.filter(|&n| meta.spec.mem_mib < n) {
            return Err(BrowserError::TooLittleMemory {
                workspace: ws.name.as_str().to_owned(),
                image: meta.spec.image.clone(),
                mem_mib: meta.spec.mem_mib,
                needs,
            }
            .into());
        }
        let (ws_dir, _) = ws.all.awake(ws.name.as_str()).await?;
        let dir = BrowserDir::new(ws_dir.path());
        let lock = dir.lock().await?;
        let began = std::time::Instant::now();
        let mut endpoint = launch::ensure(ws, &dir).await?;
        let cdp = match connect(&ws_dir, &endpoint).await {
            Ok(cdp) => cdp,
            // It exited or hung since it was last seen: start it again.
            Err(e) if !endpoint.fresh => {
                tracing::info!(
                    workspace = ws.name.as_str(),
                    "the browser does not answer ({e}); restarting it"
                );
                launch::stop(ws).await?;
                endpoint = launch::ensure(ws, &dir).await?;
                connect(&ws_dir, &endpoint).await?
            }
            Err(e) => return Err(e),
        };
        tracing::info!(
            workspace = ws.name.as_str(),
            port = endpoint.port,
            ms = began.elapsed().as_millis() as u64,
            "browser connected"
        );
        let mut state = dir.load();
        if state.browser_started_ms != endpoint.started_ms {
            // Another browser process: its pages are gone.
            state = BrowserState {
                browser_started_ms: endpoint.started_ms,
                ..BrowserState::default()
            };
        }
        Ok(Self {
            ws,
            dir,
            _lock: lock,
            state,
            endpoint,
            cdp: Some(cdp),
        })
    }

    fn workspace(&self) -> String {
        self.ws.name.as_str().to_owned()
    }

    fn cdp(&mut self) -> Result<&mut Cdp<UnixStream>> {
        self.cdp.as_mut().ok_or_else(|| BrowserError::Closed.into())
    }

    /// The open targets' ids.
    async fn targets(&mut self) -> Result<Vec<String>> {
        let answer = self
            .cdp()?
            .call(None, "Target.getTargets", json!({}), TARGET_QUIET)
            .await?;
        Ok(answer
            .get("targetInfos")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|t| t.get("type").and_then(Value::as_str) == Some("page"))
            .filter_map(|t| t.get("targetId").and_then(Value::as_str))
            .map(str::to_owned)
            .collect())
    }

    /// Page `name`'s target, if the browser still has it open.
    async fn known_target(&mut self, name: &str) -> Result<Option<String>> {
        let targets = self.targets().await?;
        Ok(self
            .state
            .pages
            .get(name)
            .filter(|p| targets.contains(&p.target_id))
            .map(|p| p.target_id.clone()))
    }

    /// Attaches to page `name`, opening it when `open` (else it must exist).
    async fn page(&mut self, name: &str, open: bool) -> Result<Page<UnixStream>> {
        let target = match self.known_target(name).await? {
            Some(t) => t,
            None if open => {
                let began = std::time::Instant::now();
                let created = self
                    .cdp()?
                    .call(
                        None,
                        "Target.createTarget",
                        json!({"url": "about:blank"}),
                        TARGET_QUIET,
                    )
                    .await?;
                let id = created
                    .get("targetId")
                    .and_then(Value::as_str)
                    .ok_or_else(|| BrowserError::Protocol {
                        method: "Target.createTarget".into(),
                        message: "no targetId in the answer".into(),
                    })?
                    .to_owned();
                self.state.pages.insert(
                    name.to_owned(),
                    PageState {
                        target_id: id.clone(),
                        ..PageState::default()
                    },
                );
                self.dir.save(&self.state)?;
                tracing::info!(
                    page = name,
                    ms = began.elapsed().as_millis() as u64,
                    "page created"
                );
                id
            }
            None => {
                self.state.pages.remove(name);
                return Err(BrowserError::UnknownPage {
                    workspace: self.workspace(),
                    page: name.to_owned(),
                }
                .into());
            }
        };
        let cdp = self.cdp.take().ok_or(BrowserError::Closed)?;
        let workspace = self.workspace();
        let began = std::time::Instant::now();
        let console_ms = self.state.pages.get(name).map_or(0.0, |p| p.console_ms);
        let page = Page::attach(
            cdp,
            &target,
            (&workspace, name),
            self.dir.events(),
            console_ms,
        )
        .await?;
        tracing::info!(
            workspace,
            page = name,
            ms = began.elapsed().as_millis() as u64,
            "page attached"
        );
        Ok(page)
    }

    fn action(&self, page: &str, action: String) -> Result<()> {
        self.dir.events().append(BrowserEventKind::Action {
            page: page.to_owned(),
            action,
        })?;
        Ok(())
    }

    /// The node `element` names on `page`.
    async fn node(
        &self,
        page: &mut Page<UnixStream>,
        name: &str,
        element: &Element,
    ) -> Result<i64> {
        match element {
            Element::Ref(r) => self
                .state
                .pages
                .get(name)
                .and_then(|p| p.refs.get(r))
                .copied()
                .ok_or_else(|| {
                    BrowserError::UnknownRef {
                        workspace: self.workspace(),
                        page: name.to_owned(),
                        reference: r.clone(),
                    }
                    .into()
                }),
            Element::Selector(s) => Ok(page.select(s).await?),
        }
    }

    /// Closes the connection `page` holds and notes what it saw (the
    /// caller saves the state).
    async fn release(&mut self, page: Page<UnixStream>, name: &str) {
        let (cdp, console_ms) = page.into_cdp();
        cdp.close().await;
        if let Some(p) = self.state.pages.get_mut(name) {
            p.console_ms = console_ms;
        }
    }

    /// Snapshots `page`, keeps its refs, and ends the call.
    async fn finish(mut self, mut page: Page<UnixStream>, name: &str) -> Result<BrowserSnapshot> {
        let snap = page.snapshot(MAX_SNAPSHOT_BYTES).await?;
        let refs = snap.rendered.refs.len();
        let ref_ids = crate::browser::aria::ref_order(&snap.rendered.refs);
        self.release(page, name).await;
        if let Some(p) = self.state.pages.get_mut(name) {
            p.refs = snap.rendered.refs;
        }
        self.dir.save(&self.state)?;
        Ok(BrowserSnapshot {
            workspace: self.workspace(),
            page: name.to_owned(),
            url: snap.url,
            title: snap.title,
            snapshot: snap.rendered.yaml,
            refs,
            ref_ids,
            truncated: snap.rendered.truncated_lines > 0,
            restarted: self.endpoint.restarted.take(),
        })
    }
}

/// A workspace's browser (`dev.browser()`): a headless Chromium in the
/// guest, started on first use, its pages kept between calls. `Copy`; its
/// calls take it by value, as the handle's do.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceBrowser<'a> {
    ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's browser.
    pub fn browser(self) -> WorkspaceBrowser<'a> {
        WorkspaceBrowser { ws: self }
    }
}

impl WorkspaceBrowser<'_> {
    /// Opens `url` in page `options.page` (made on first use; the browser
    /// starts on first use) and returns its snapshot once it has loaded.
    pub async fn open(self, url: &str, options: PageOptions) -> Result<BrowserSnapshot> {
        check_url(url)?;
        options.check()?;
        if let Some(remote) = self.ws.remote()? {
            let call = WorkspaceCall::BrowserOpen {
                url: url.to_owned(),
                page: options.page,
                timeout_ms: millis(options.timeout),
            };
            return page_there(&remote, call).await;
        }
        let mut call = Call::begin(self.ws).await?;
        let mut page = call.page(&options.page, true).await?;
        call.action(&options.page, format!("open {url}"))?;
        page.navigate(url, options.timeout).await?;
        call.finish(page, &options.page).await
    }

    /// A new snapshot of an open page.
    pub async fn snapshot(self, options: PageOptions) -> Result<BrowserSnapshot> {
        options.check()?;
        if let Some(remote) = self.ws.remote()? {
            let call = WorkspaceCall::BrowserSnapshot {
                page: options.page,
                timeout_ms: millis(options.timeout),
            };
            return page_there(&remote, call).await;
        }
        let mut call = Call::begin(self.ws).await?;
        let page = call.page(&options.page, false).await?;
        call.finish(page, &options.page).await
    }

    /// Clicks `element` on an open page, waits for what it sets off
    /// (a navigation, requests) and returns the new snapshot.
    pub async fn click(self, element: &Element, options: PageOptions) -> Result<BrowserSnapshot> {
        self.act(element, None, options).await
    }

    /// Types `value` into `element` (replacing what it held) on an open
    /// page and returns the new snapshot.
    pub async fn fill(
        self,
        element: &Element,
        value: &str,
        options: PageOptions,
    ) -> Result<BrowserSnapshot> {
        self.act(element, Some(value), options).await
    }

    /// A click (no `value`) or a fill, then the wait for what it set off.
    async fn act(
        self,
        element: &Element,
        value: Option<&str>,
        options: PageOptions,
    ) -> Result<BrowserSnapshot> {
        options.check()?;
        if let Some(remote) = self.ws.remote()? {
            let call = WorkspaceCall::BrowserAct {
                element: serde_json::to_value(element).map_err(ServerError::Encode)?,
                value: value.map(str::to_owned),
                page: options.page,
                timeout_ms: millis(options.timeout),
            };
            return page_there(&remote, call).await;
        }
        let mut call = Call::begin(self.ws).await?;
        let mut page = call.page(&options.page, false).await?;
        let node = call.node(&mut page, &options.page, element).await?;
        let verb = if value.is_some() { "fill" } else { "click" };
        call.action(&options.page, format!("{verb} {element}"))?;
        match value {
            Some(v) => page.fill(node, v).await?,
            None => page.click(node, element).await?,
        }
        page.settle(options.timeout).await?;
        call.finish(page, &options.page).await
    }

    /// Closes an open page.
    pub async fn close(self, options: PageOptions, preview: bool) -> Result<BrowserPageClosed> {
        options.check()?;
        if let Some(remote) = self.ws.remote()? {
            let call = WorkspaceCall::BrowserClose {
                page: options.page,
                timeout_ms: millis(options.timeout),
                preview,
            };
            return Ok(remote.call(call).await?);
        }
        if preview {
            return self.close_preview(options.page);
        }
        let mut call = Call::begin(self.ws).await?;
        let name = options.page;
        let Some(target) = call.known_target(&name).await? else {
            return Err(BrowserError::UnknownPage {
                workspace: call.workspace(),
                page: name,
            }
            .into());
        };
        call.cdp()?
            .call(
                None,
                "Target.closeTarget",
                json!({"targetId": target}),
                TARGET_QUIET,
            )
            .await?;
        call.state.pages.remove(&name);
        call.dir.save(&call.state)?;
        call.action(&name, "close".into())?;
        if let Some(cdp) = call.cdp.take() {
            cdp.close().await;
        }
        Ok(BrowserPageClosed {
            workspace: call.workspace(),
            page: name,
            pages: call.state.pages.keys().cloned().collect(),
        })
    }

    /// What closing `page` would leave, from the pages the browser's
    /// saved state knows (Chromium is neither started nor asked).
    fn close_preview(self, page: String) -> Result<BrowserPageClosed> {
        let (ws_dir, _) = self.ws.all.running(self.ws.name.as_str())?;
        let state = BrowserDir::new(ws_dir.path()).load();
        let workspace = self.ws.name().to_owned();
        if !state.pages.contains_key(&page) {
            return Err(BrowserError::UnknownPage { workspace, page }.into());
        }
        let pages = state
            .pages
            .keys()
            .filter(|p| **p != page)
            .cloned()
            .collect();
        Ok(BrowserPageClosed {
            workspace,
            page,
            pages,
        })
    }

    /// The server's side of a browser call on a workspace placed on it.
    pub(crate) async fn answer(self, call: WorkspaceCall) -> Result<Value> {
        let options = |page: String, timeout_ms: u64| {
            PageOptions::page(Some(page)).timeout(std::time::Duration::from_millis(timeout_ms))
        };
        let value = match call {
            WorkspaceCall::BrowserOpen {
                url,
                page,
                timeout_ms,
            } => serde_json::to_value(self.open(&url, options(page, timeout_ms)).await?),
            WorkspaceCall::BrowserSnapshot { page, timeout_ms } => {
                serde_json::to_value(self.snapshot(options(page, timeout_ms)).await?)
            }
            WorkspaceCall::BrowserAct {
                element,
                value,
                page,
                timeout_ms,
            } => {
                let bad = |e: serde_json::Error| Error::InvalidInput(format!("an element: {e}"));
                let element: Element = serde_json::from_value(element).map_err(bad)?;
                let options = options(page, timeout_ms);
                serde_json::to_value(match value {
                    Some(value) => self.fill(&element, &value, options).await?,
                    None => self.click(&element, options).await?,
                })
            }
            WorkspaceCall::BrowserClose {
                page,
                timeout_ms,
                preview,
            } => serde_json::to_value(self.close(options(page, timeout_ms), preview).await?),
            WorkspaceCall::BrowserScreenshot { page, timeout_ms } => {
                serde_json::to_value(self.screenshot(options(page, timeout_ms)).await?)
            }
            WorkspaceCall::BrowserEvents { offset, limit } => {
                serde_json::to_value(self.events(offset, limit).await?)
            }
            _ => return Err(Error::InvalidInput("not a browser call".into())),
        };
        Ok(value.map_err(ServerError::Encode)?)
    }

    /// A PNG of an open page's viewport.
    pub async fn screenshot(self, options: PageOptions) -> Result<BrowserScreenshot> {
        options.check()?;
        if let Some(remote) = self.ws.remote()? {
            let call = WorkspaceCall::BrowserScreenshot {
                page: options.page,
                timeout_ms: millis(options.timeout),
            };
            let mut shot: BrowserScreenshot = remote.call(call).await?;
            // Its size is the PNG's own, read here.
            (shot.width, shot.height) = png_size(&shot.png)
                .ok_or_else(|| garbled(&remote, "its screenshot is not a PNG".into()))?;
            return Ok(shot);
        }
        let mut call = Call::begin(self.ws).await?;
        let mut page = call.page(&options.page, false).await?;
        let png = page.screenshot().await?;
        let (snap_url, _) = page.location().await?;
        call.release(page, &options.page).await;
        call.dir.save(&call.state)?;
        call.action(&options.page, "screenshot".into())?;
        let (width, height) = png_size(&png).ok_or_else(|| BrowserError::Protocol {
            method: "Page.captureScreenshot".into(),
            message: "the answer is not a PNG".into(),
        })?;
        Ok(BrowserScreenshot {
            page: options.page,
            url: snap_url,
            png,
            width,
            height,
        })
    }

    /// The browser log after sequence number `offset`, at most `limit`
    /// events (at most [`MAX_EVENTS_PER_CALL`]).
    pub async fn events(self, offset: u64, limit: usize) -> Result<BrowserEvents> {
        let limit = limit.clamp(1, MAX_EVENTS_PER_CALL);
        if let Some(remote) = self.ws.remote()? {
            let answer: BrowserEvents = remote
                .call(WorkspaceCall::BrowserEvents { offset, limit })
                .await?;
            let (got, asked) = (answer.events.len(), limit as u64);
            check_answer_bytes(remote.server(), "browser events", got, asked)?;
            return Ok(answer);
        }
        let ws = self.ws;
        let dir = BrowserDir::new(ws.all.dir(ws.name.as_str())?.path());
        ws.get_here()?;
        let mut events = dir.events().read_after(offset)?;
        events.truncate(limit);
        let next_offset = events.last().map_or(offset, |e| e.seq);
        Ok(BrowserEvents {
            workspace: ws.name.as_str().to_owned(),
            events,
            next_offset,
        })
    }
}

/// A page call on the workspace's server: its snapshot, held to the size a
/// snapshot here is cut at.
async fn page_there(remote: &RemoteWorkspace, call: WorkspaceCall) -> Result<BrowserSnapshot> {
    let snap: BrowserSnapshot = remote.call(call).await?;
    let (got, cap) = (snap.snapshot.len(), MAX_SNAPSHOT_BYTES as u64);
    check_answer_bytes(remote.server(), "browser snapshot", got, cap)?;
    Ok(snap)
}

fn garbled(remote: &RemoteWorkspace, detail: String) -> Error {
    ServerError::Garbled {
        server: remote.server().to_owned(),
        detail,
    }
    .into()
}
