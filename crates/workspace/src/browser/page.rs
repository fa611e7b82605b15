//! One page over a DevTools connection: attached to its target, it
//! navigates, waits for loads and network quiet, acts on elements, takes
//! accessibility snapshots and screenshots, and logs what the page did
//! (navigations, console messages, failed requests) as it reads events.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::aria;
use super::cdp::{Cdp, CdpEvent};
use super::{BrowserError, BrowserEventKind, Element};
use base::store::events::EventLog;

/// How long the browser may stay silent during one DevTools command that
/// does not load anything; while it keeps answering, the command waits
/// on, up to [`super::cdp::stretched`] of it (see `Cdp::call`).
const CALL_QUIET: Duration = Duration::from_secs(60);
/// The same for each command that attaches to a page and turns its
/// domains on: the first page of a fresh browser in a guest whose kernel
/// code is emulated took over 60 s for `Page.enable` alone (CI,
/// 2026-11-28), and a fixed 60 s failed a user's first `browser_open`.
const ATTACH_QUIET: Duration = Duration::from_secs(120);
/// How long stopping a load that ran out of time may take.
const STOP_BOUND: Duration = Duration::from_secs(10);
/// How long after an action a navigation may begin and still be waited for.
const NAVIGATION_GRACE: Duration = Duration::from_millis(1500);
/// Quiet time that counts as network idle.
const IDLE_QUIET: Duration = Duration::from_millis(500);
/// Longest wait for network idle after a load or an action that did not
/// navigate (a page that polls never goes quiet).
const IDLE_BOUND: Duration = Duration::from_secs(5);

/// An attached page.
pub struct Page<S> {
    cdp: Cdp<S>,
    session: String,
    /// The main frame's id, which is the target's.
    main_frame: Option<String>,
    workspace: String,
    name: String,
    log: EventLog<BrowserEventKind>,
    /// Requests in flight: id -> URL.
    inflight: HashMap<String, String>,
    last_network: Instant,
    loaded: bool,
    navigating: bool,
    /// Newest console message logged (its timestamp): enabling the
    /// runtime replays older ones, logged by earlier calls.
    console_ms: f64,
}

/// The page's answer to a snapshot.
pub struct Snapshot {
    pub url: String,
    pub title: String,
    pub rendered: aria::Rendered,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Page<S> {
    /// Attaches to `target_id` over `cdp` and turns on the events it logs.
    pub async fn attach(
        mut cdp: Cdp<S>,
        target_id: &str,
        (workspace, name): (&str, &str),
        log: EventLog<BrowserEventKind>,
        console_ms: f64,
    ) -> Result<Self, BrowserError> {
        let attached = cdp
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target_id, "flatten": true}),
                ATTACH_QUIET,
            )
            .await?;
        let session = attached
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or_else(|| BrowserError::Protocol {
                method: "Target.attachToTarget".into(),
                message: "no sessionId in the answer".into(),
            })?
            .to_owned();
        let mut page = Self {
            cdp,
            session,
            main_frame: Some(target_id.to_owned()),
            workspace: workspace.to_owned(),
            name: name.to_owned(),
            log,
            inflight: HashMap::new(),
            last_network: Instant::now(),
            loaded: true,
            navigating: false,
            console_ms,
        };
        let session = page.session.clone();
        for (method, params) in [
            ("Page.enable", json!({})),
            ("Network.enable", json!({})),
            ("Runtime.enable", json!({})),
            ("Page.setLifecycleEventsEnabled", json!({"enabled": true})),
        ] {
            page.cdp
                .call(Some(&session), method, params, ATTACH_QUIET)
                .await?;
        }
        Ok(page)
    }

    /// Gives the connection back, and the newest console message's time.
    pub fn into_cdp(self) -> (Cdp<S>, f64) {
        (self.cdp, self.console_ms)
    }

    /// True for a console event not logged yet (and notes its time).
    fn new_console(&mut self, p: &Value) -> bool {
        let at = p.get("timestamp").and_then(Value::as_f64).unwrap_or(0.0);
        if at <= self.console_ms {
            return false;
        }
        self.console_ms = at;
        true
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, BrowserError> {
        let session = self.session.clone();
        self.cdp
            .call(Some(&session), method, params, CALL_QUIET)
            .await
    }

    /// Goes to `url` and waits for it to load, within `timeout`.
    pub async fn navigate(&mut self, url: &str, timeout: Duration) -> Result<(), BrowserError> {
        let deadline = Instant::now() + timeout;
        self.loaded = false;
        self.navigating = true;
        let session = self.session.clone();
        // Bound by the caller's timeout, not stretched past it.
        let answer = self
            .cdp
            .call_by(
                Some(&session),
                "Page.navigate",
                json!({"url": url}),
                deadline,
            )
            .await;
        let answer = match answer {
            Err(BrowserError::Timeout { .. }) => return self.gave_up(url, timeout).await,
            other => other?,
        };
        if let Some(reason) = answer.get("errorText").and_then(Value::as_str) {
            if !reason.is_empty() {
                return Err(BrowserError::LoadFailed {
                    url: url.to_owned(),
                    reason: reason.to_owned(),
                });
            }
        }
        // A navigation within the document (a #fragment) loads nothing.
        if answer.get("loaderId").is_none() {
            self.loaded = true;
        }
        if !self.wait_loaded(deadline).await? {
            return self.gave_up(url, timeout).await;
        }
        self.wait_idle(deadline.min(Instant::now() + IDLE_BOUND))
            .await
    }

    /// Stops the load that ran out of time and says so.
    async fn gave_up(&mut self, url: &str, timeout: Duration) -> Result<(), BrowserError> {
        self.stop_loading().await;
        Err(BrowserError::Timeout {
            what: format!("loading {url}"),
            secs: timeout.as_secs(),
        })
    }

    /// Stops a load that ran out of its time, within a short bound of its
    /// own (the caller's time is up already).
    async fn stop_loading(&mut self) {
        let session = self.session.clone();
        let by = Instant::now() + STOP_BOUND;
        let _ = self
            .cdp
            .call_by(Some(&session), "Page.stopLoading", json!({}), by)
            .await;
    }

    /// Reads events until the main frame's load event; false at `deadline`.
    async fn wait_loaded(&mut self, deadline: Instant) -> Result<bool, BrowserError> {
        while !self.loaded {
            if !self.pump(deadline).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Reads events until no request has been in flight for a moment, or
    /// `until`.
    async fn wait_idle(&mut self, until: Instant) -> Result<(), BrowserError> {
        loop {
            let quiet_at = self.last_network + IDLE_QUIET;
            if self.inflight.is_empty() && Instant::now() >= quiet_at {
                return Ok(());
            }
            let next = if self.inflight.is_empty() {
                quiet_at.min(until)
            } else {
                until
            };
            if !self.pump(next).await? && Instant::now() >= until {
                return Ok(());
            }
        }
    }

    /// After an action: waits for the navigation it set off (if one begins
    /// soon) to load, then for network quiet; all within `timeout`.
    pub async fn settle(&mut self, timeout: Duration) -> Result<(), BrowserError> {
        let deadline = Instant::now() + timeout;
        let grace = Instant::now() + NAVIGATION_GRACE.min(timeout);
        while !self.navigating && Instant::now() < grace {
            if !self.pump(grace).await? {
                break;
            }
        }
        if self.navigating && !self.wait_loaded(deadline).await? {
            self.stop_loading().await;
            return Err(BrowserError::Timeout {
                what: "the navigation the action started".into(),
                secs: timeout.as_secs(),
            });
        }
        self.wait_idle(deadline.min(Instant::now() + IDLE_BOUND))
            .await
    }

    /// Handles one event; false when none came before `deadline`.
    async fn pump(&mut self, deadline: Instant) -> Result<bool, BrowserError> {
        match self.cdp.next_event(deadline).await? {
            Some(event) => {
                self.handle(event)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn handle(&mut self, event: CdpEvent) -> Result<(), BrowserError> {
        if event.session.as_deref() != Some(self.session.as_str()) {
            return Ok(());
        }
        let p = &event.params;
        let text =
            |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
        let page = self.name.clone();
        match event.method.as_str() {
            "Page.frameStartedLoading" | "Page.frameRequestedNavigation"
                if self.is_main_frame(p) =>
            {
                self.navigating = true;
                self.loaded = false;
            }
            "Page.loadEventFired" => {
                self.loaded = true;
                self.navigating = false;
            }
            "Page.frameNavigated" => {
                let frame = p.get("frame").unwrap_or(&Value::Null);
                if frame.get("parentId").is_none() {
                    self.log.append(BrowserEventKind::Navigated {
                        page,
                        url: text(frame, "url"),
                    })?;
                }
            }
            "Page.navigatedWithinDocument" => {
                self.log.append(BrowserEventKind::Navigated {
                    page,
                    url: text(p, "url"),
                })?;
            }
            "Network.requestWillBeSent" => {
                let url = p.get("request").map(|r| text(r, "url")).unwrap_or_default();
                self.inflight.insert(text(p, "requestId"), url);
                self.last_network = Instant::now();
            }
            "Network.responseReceived" => {
                let response = p.get("response").unwrap_or(&Value::Null);
                let status = response.get("status").and_then(Value::as_u64).unwrap_or(0);
                if status >= 400 {
                    self.log.append(BrowserEventKind::RequestFailed {
                        page,
                        url: text(response, "url"),
                        error: format!("HTTP {status}"),
                    })?;
                }
            }
            "Network.loadingFinished" => {
                self.inflight.remove(&text(p, "requestId"));
                self.last_network = Instant::now();
            }
            "Network.loadingFailed" => {
                let url = self
                    .inflight
                    .remove(&text(p, "requestId"))
                    .unwrap_or_default();
                self.last_network = Instant::now();
                if p.get("canceled").and_then(Value::as_bool) != Some(true) {
                    self.log.append(BrowserEventKind::RequestFailed {
                        page,
                        url,
                        error: text(p, "errorText"),
                    })?;
                }
            }
            "Runtime.consoleAPICalled" if self.new_console(p) => {
                let args = p.get("args").and_then(Value::as_array);
                let words: Vec<String> = args
                    .into_iter()
                    .flatten()
                    .map(|a| match a.get("value") {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => text(a, "description"),
                    })
                    .collect();
                self.log.append(BrowserEventKind::Console {
                    page,
                    level: text(p, "type"),
                    text: cut(&words.join(" ")),
                })?;
            }
            "Runtime.exceptionThrown" if self.new_console(p) => {
                let details = p.get("exceptionDetails").unwrap_or(&Value::Null);
                let described = details
                    .get("exception")
                    .map(|e| text(e, "description"))
                    .filter(|d| !d.is_empty())
                    .unwrap_or_else(|| text(details, "text"));
                self.log.append(BrowserEventKind::Console {
                    page,
                    level: "exception".into(),
                    text: cut(&described),
                })?;
            }
            _ => {}
        }
        Ok(())
    }

    fn is_main_frame(&self, p: &Value) -> bool {
        // Events name frames by id; the main frame's id is the target's.
        p.get("frameId")
            .and_then(Value::as_str)
            .is_some_and(|f| self.main_frame.as_deref().is_none_or(|m| m == f))
    }

    /// The accessibility snapshot, at most `cap` bytes of YAML.
    pub async fn snapshot(&mut self, cap: usize) -> Result<Snapshot, BrowserError> {
        let tree = self.call("Accessibility.getFullAXTree", json!({})).await?;
        let nodes: Vec<aria::AxNode> = tree
            .get("nodes")
            .cloned()
            .and_then(|n| serde_json::from_value(n).ok())
            .unwrap_or_default();
        let rendered = aria::render(&nodes, cap);
        let (url, title) = self.location().await?;
        Ok(Snapshot {
            url,
            title,
            rendered,
        })
    }

    /// The page's URL and title.
    pub async fn location(&mut self) -> Result<(String, String), BrowserError> {
        let answer = self
            .call(
                "Runtime.evaluate",
                json!({"expression": "({url: location.href, title: document.title})", "returnByValue": true}),
            )
            .await?;
        let value = answer
            .pointer("/result/value")
            .cloned()
            .unwrap_or(Value::Null);
        let field = |k: &str| {
            value
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        Ok((field("url"), field("title")))
    }

    /// The DOM node (backendNodeId) of `selector`'s first match.
    pub async fn select(&mut self, selector: &str) -> Result<i64, BrowserError> {
        let (workspace, page) = (self.workspace.clone(), self.name.clone());
        let no_match = || BrowserError::NoMatch {
            workspace,
            page,
            selector: selector.to_owned(),
        };
        let expression = format!(
            "(() => {{ try {{ return document.querySelector({}); }} catch (e) {{ return null; }} }})()",
            serde_json::to_string(selector).unwrap_or_default()
        );
        let found = self
            .call("Runtime.evaluate", json!({"expression": expression}))
            .await?;
        let Some(object) = found.pointer("/result/objectId").and_then(Value::as_str) else {
            return Err(no_match());
        };
        let described = self
            .call("DOM.describeNode", json!({"objectId": object}))
            .await?;
        described
            .pointer("/node/backendNodeId")
            .and_then(Value::as_i64)
            .ok_or_else(no_match)
    }

    /// Clicks the middle of node `backend` as a mouse would.
    pub async fn click(&mut self, backend: i64, element: &Element) -> Result<(), BrowserError> {
        let _ = self
            .call(
                "DOM.scrollIntoViewIfNeeded",
                json!({"backendNodeId": backend}),
            )
            .await;
        let (workspace, page) = (self.workspace.clone(), self.name.clone());
        let not_visible = || BrowserError::NotVisible {
            workspace,
            page,
            element: element.to_string(),
        };
        let model = match self
            .call("DOM.getBoxModel", json!({"backendNodeId": backend}))
            .await
        {
            Ok(m) => m,
            Err(BrowserError::Protocol { .. }) => return Err(not_visible()),
            Err(e) => return Err(e),
        };
        let quad: Vec<f64> = model
            .pointer("/model/border")
            .and_then(Value::as_array)
            .map(|q| q.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        if quad.len() != 8 {
            return Err(not_visible());
        }
        let x = (quad[0] + quad[2] + quad[4] + quad[6]) / 4.0;
        let y = (quad[1] + quad[3] + quad[5] + quad[7]) / 4.0;
        self.navigating = false;
        for (kind, buttons) in [("mouseMoved", 0), ("mousePressed", 1), ("mouseReleased", 0)] {
            let mut params = json!({"type": kind, "x": x, "y": y, "buttons": buttons});
            if kind != "mouseMoved" {
                params["button"] = json!("left");
                params["clickCount"] = json!(1);
            }
            self.call("Input.dispatchMouseEvent", params).await?;
        }
        Ok(())
    }

    /// Replaces the value of node `backend` with `value`, as typing would
    /// (input events), then fires `change`.
    pub async fn fill(&mut self, backend: i64, value: &str) -> Result<(), BrowserError> {
        let resolved = self
            .call("DOM.resolveNode", json!({"backendNodeId": backend}))
            .await?;
        let object = resolved
            .pointer("/object/objectId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let select = "function() { this.focus(); \
            if (typeof this.select === 'function') { this.select(); } \
            else { const r = document.createRange(); r.selectNodeContents(this); \
                   const s = getSelection(); s.removeAllRanges(); s.addRange(r); } }";
        self.call(
            "Runtime.callFunctionOn",
            json!({"objectId": object, "functionDeclaration": select}),
        )
        .await?;
        self.navigating = false;
        if value.is_empty() {
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": "keyDown", "key": "Delete", "code": "Delete", "windowsVirtualKeyCode": 46}),
            )
            .await?;
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": "keyUp", "key": "Delete", "code": "Delete", "windowsVirtualKeyCode": 46}),
            )
            .await?;
        } else {
            self.call("Input.insertText", json!({"text": value}))
                .await?;
        }
        self.call(
            "Runtime.callFunctionOn",
            json!({"objectId": object, "functionDeclaration":
                "function() { this.dispatchEvent(new Event('change', {bubbles: true})); }"}),
        )
        .await?;
        Ok(())
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&mut self) -> Result<Vec<u8>, BrowserError> {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await?;
        let data = shot.get("data").and_then(Value::as_str).unwrap_or("");
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| BrowserError::Protocol {
                method: "Page.captureScreenshot".into(),
                message: format!("the image is not base64: {e}"),
            })
    }
}

/// A console message cut to a size a log line should have.
fn cut(s: &str) -> String {
    const MAX: usize = 2000;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Width and height from a PNG's header, if it is one.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if png.len() < 24 || !png.starts_with(SIGNATURE) || &png[12..16] != b"IHDR" {
        return None;
    }
    let word = |at: usize| u32::from_be_bytes([png[at], png[at + 1], png[at + 2], png[at + 3]]);
    Some((word(16), word(20)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_png_header_gives_its_size_and_other_bytes_none() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend(1280u32.to_be_bytes());
        png.extend(720u32.to_be_bytes());
        assert_eq!(png_size(&png), Some((1280, 720)));
        assert_eq!(png_size(&png[..20]), None);
        assert_eq!(png_size(b"GIF89a................."), None);
    }

    #[test]
    fn long_console_text_is_cut_on_a_character() {
        assert_eq!(cut("short"), "short");
        let long = "é".repeat(1500);
        let c = cut(&long);
        assert!(c.ends_with("...") && c.len() <= 2003);
    }
}
