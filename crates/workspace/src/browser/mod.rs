//! A headless browser in a workspace, driven by accessibility snapshots
//! (docs/browser.md): the types, errors and limits, the DevTools client
//! over a websocket (`cdp`), one attached page (`page`), the accessibility
//! tree as YAML with refs (`aria`), and what outlives a call in the
//! workspace's directory (`state`). Chromium runs in the guest as `user`,
//! started on first use as the background process `browser`; the host
//! reaches it through the agent's `tcp_connect` (never a host TCP port).
//! The calls are those of `dev.browser()`, [`WorkspaceBrowser`] (`ops`),
//! on Chromium started on first use through the agent (`launch`).

pub(crate) mod aria;
pub(crate) mod cdp;
pub(crate) mod launch;
pub(crate) mod ops;
pub(crate) mod page;
pub(crate) mod state;

pub use ops::WorkspaceBrowser;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use base::code::ErrorCode;

/// The page a call acts on when none is named.
pub const DEFAULT_PAGE: &str = "default";
/// How long a navigation (and what an action sets off) may take, unless
/// the caller says.
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest load timeout a caller may ask for.
pub const MAX_LOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Largest snapshot returned, in bytes of YAML; past it lines are left out
/// and a note says how many.
pub const MAX_SNAPSHOT_BYTES: usize = 48 * 1024;
/// Most events one `browser_events` call returns.
pub const MAX_EVENTS_PER_CALL: usize = 1000;

/// The image the browser tools need, as `setup --with browser` builds it.
pub const IMAGE: &str = "browser";
/// Its Debian packages: Chromium's headless shell and a font to render.
pub const IMAGE_PACKAGES: &[&str] = &["chromium-headless-shell", "fonts-dejavu-core"];

/// vCPUs a workspace of the [`IMAGE`] gets unless asked otherwise.
pub const IMAGE_VCPUS: u8 = 2;
/// Guest memory (MiB) a workspace of the [`IMAGE`] gets unless asked
/// otherwise: Chromium, a page and its renderer.
pub const IMAGE_MEM_MIB: u64 = 2048;
/// The least guest memory (MiB) the browser tools start Chromium in; a
/// smaller workspace of the [`IMAGE`] is refused at once, not after a
/// start that cannot finish.
pub const MIN_MEM_MIB: u64 = 1024;

/// The build of the [`IMAGE`]: Debian bookworm with [`IMAGE_PACKAGES`].
pub fn image_request() -> crate::images::build::ImageBuildRequest {
    crate::images::build::ImageBuildRequest {
        vcpus: Some(IMAGE_VCPUS),
        mem_mib: Some(IMAGE_MEM_MIB),
        min_mem_mib: Some(MIN_MEM_MIB),
        ..crate::images::build::ImageBuildRequest::debian_recipe(
            IMAGE,
            IMAGE_PACKAGES,
            "Debian with headless Chromium, for the browser tools",
        )
    }
}

/// Why a browser call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrowserError {
    /// The workspace's image has no Chromium.
    #[error("workspace `{workspace}` has no Chromium (looked for {looked_for})")]
    NotInstalled {
        /// The workspace.
        workspace: String,
        /// The paths tried.
        looked_for: String,
    },
    /// The workspace has less memory than its image's programs need.
    #[error(
        "workspace `{workspace}` has {mem_mib} MiB of memory; its image `{image}` needs at least {needs} MiB to run the browser (create it with mem_mib {needs} or more, or without mem_mib to get the image's own size)"
    )]
    TooLittleMemory {
        /// The workspace.
        workspace: String,
        /// Its image.
        image: String,
        /// Its memory, MiB.
        mem_mib: u64,
        /// The image's least, MiB.
        needs: u64,
    },
    /// Chromium did not start.
    #[error("Chromium did not start in workspace `{workspace}`: {detail}")]
    Start {
        /// The workspace.
        workspace: String,
        /// How it ended, and the last lines it wrote.
        detail: String,
    },
    /// No page of that name.
    #[error("no browser page `{page}` in workspace `{workspace}`")]
    UnknownPage {
        /// The workspace.
        workspace: String,
        /// The page asked for.
        page: String,
    },
    /// A ref the last snapshot of the page did not give.
    #[error("no element `{reference}` in the last snapshot of page `{page}`")]
    UnknownRef {
        /// The workspace.
        workspace: String,
        /// The page.
        page: String,
        /// The ref asked for.
        reference: String,
    },
    /// A CSS selector that matches nothing (or does not parse).
    #[error("no element matches the selector {selector:?} on page `{page}`")]
    NoMatch {
        /// The workspace.
        workspace: String,
        /// The page.
        page: String,
        /// The selector.
        selector: String,
    },
    /// The element is not rendered, so it cannot be clicked.
    #[error("the element {element} on page `{page}` is not visible")]
    NotVisible {
        /// The workspace.
        workspace: String,
        /// The page.
        page: String,
        /// The ref or selector.
        element: String,
    },
    /// A bad argument: a URL, a page name, a timeout.
    #[error("{0}")]
    Invalid(String),
    /// The page could not be loaded.
    #[error("{url} could not be loaded: {reason}")]
    LoadFailed {
        /// The URL.
        url: String,
        /// Chromium's reason (`net::ERR_CONNECTION_REFUSED`, ...).
        reason: String,
    },
    /// A step did not finish in time.
    #[error("{what} did not finish within {secs} s")]
    Timeout {
        /// The step.
        what: String,
        /// The bound.
        secs: u64,
    },
    /// The browser answered a command with an error.
    #[error("the browser refused {method}: {message}")]
    Protocol {
        /// The DevTools method.
        method: String,
        /// Its message.
        message: String,
    },
    /// The DevTools connection closed (the browser exited).
    #[error("the browser closed its DevTools connection")]
    Closed,
    /// The websocket failed.
    #[error("the DevTools websocket failed")]
    Websocket(#[source] Box<tokio_tungstenite::tungstenite::Error>),
    /// The browser's state or event files could not be used.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The event log failed.
    #[error(transparent)]
    Events(#[from] base::store::events::EventsError),
}

impl crate::error::ConcernError for BrowserError {
    fn code(&self) -> ErrorCode {
        match self {
            BrowserError::NotInstalled { .. }
            | BrowserError::TooLittleMemory { .. }
            | BrowserError::UnknownRef { .. }
            | BrowserError::NoMatch { .. }
            | BrowserError::NotVisible { .. }
            | BrowserError::Invalid(_)
            | BrowserError::LoadFailed { .. } => ErrorCode::InvalidInput,
            BrowserError::UnknownPage { .. } => ErrorCode::NotFound,
            BrowserError::Timeout { .. } => ErrorCode::Timeout,
            BrowserError::Start { .. }
            | BrowserError::Protocol { .. }
            | BrowserError::Closed
            | BrowserError::Websocket(_)
            | BrowserError::Io { .. }
            | BrowserError::Events(_) => ErrorCode::Internal,
        }
    }

    fn remedy(&self) -> Option<base::remedy::Remedy> {
        use base::remedy::Remedy;
        match self {
            BrowserError::NotInstalled { .. } => Some(Remedy::UseBrowserImage),
            BrowserError::UnknownRef {
                workspace, page, ..
            }
            | BrowserError::NoMatch {
                workspace, page, ..
            }
            | BrowserError::NotVisible {
                workspace, page, ..
            } => Some(Remedy::TakeBrowserSnapshot {
                workspace: workspace.clone(),
                page: page.clone(),
            }),
            BrowserError::UnknownPage { workspace, page } => Some(Remedy::OpenBrowserPage {
                workspace: workspace.clone(),
                page: page.clone(),
            }),
            _ => None,
        }
    }
}

impl From<BrowserError> for crate::error::Error {
    fn from(e: BrowserError) -> Self {
        crate::error::Error::Browser(crate::error::ConcernFailure::new(e))
    }
}

/// The element a click or fill acts on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Element {
    /// A ref of the page's last snapshot (`e3`).
    Ref(String),
    /// A CSS selector (its first match).
    Selector(String),
}

impl std::fmt::Display for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Element::Ref(r) => write!(f, "{r}"),
            Element::Selector(s) => write!(f, "{s:?}"),
        }
    }
}

/// A page's accessibility snapshot, as every page call returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct BrowserSnapshot {
    /// The workspace.
    pub workspace: String,
    /// The page.
    pub page: String,
    /// Where the page is.
    pub url: String,
    /// Its title.
    pub title: String,
    /// The accessibility tree as YAML (Playwright's `ariaSnapshot` shape);
    /// interactive elements carry `[ref=eN]` for click and fill.
    pub snapshot: String,
    /// How many refs the snapshot gave.
    pub refs: usize,
    /// The refs themselves, in order (`e1`, `e2`, ...).
    #[serde(default)]
    pub ref_ids: Vec<String>,
    /// True when lines past the size cap were left out.
    pub truncated: bool,
    /// Set when this call had to restart a browser that had exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarted: Option<String>,
}

/// A closed page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct BrowserPageClosed {
    /// The workspace.
    pub workspace: String,
    /// The page.
    pub page: String,
    /// The pages still open.
    pub pages: Vec<String>,
}

/// A screenshot of a page's viewport.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BrowserScreenshot {
    /// The page.
    pub page: String,
    /// Where the page is.
    pub url: String,
    /// The PNG file.
    #[serde(with = "crate::wire_bytes")]
    pub png: Vec<u8>,
    /// Its width in pixels.
    pub width: u32,
    /// Its height in pixels.
    pub height: u32,
}

/// What the browser log records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum BrowserEventKind {
    /// The browser started (on first use, or again after it exited).
    BrowserStarted {
        /// Why it had to start again, when it had been running.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        restarted_after: Option<String>,
    },
    /// A call acted on a page: `open URL`, `click e3`, `fill e2`, `close`.
    Action {
        /// The page.
        page: String,
        /// What was done.
        action: String,
    },
    /// The page's main frame went to a URL.
    Navigated {
        /// The page.
        page: String,
        /// Where.
        url: String,
    },
    /// A console message or an uncaught exception.
    Console {
        /// The page.
        page: String,
        /// `log`, `warning`, `error`, ...
        level: String,
        /// The message.
        text: String,
    },
    /// A request failed, or was answered with an HTTP error.
    RequestFailed {
        /// The page.
        page: String,
        /// The request's URL.
        url: String,
        /// `net::ERR_...` or `HTTP 404`.
        error: String,
    },
}

/// One entry of the browser log.
pub type BrowserEvent = base::store::events::Event<BrowserEventKind>;

/// A slice of the browser log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct BrowserEvents {
    /// The workspace.
    pub workspace: String,
    /// The events after the offset, oldest first.
    pub events: Vec<BrowserEvent>,
    /// The offset to pass next time (the last sequence number returned).
    pub next_offset: u64,
}

/// How a page call behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PageOptions {
    /// The page (default [`DEFAULT_PAGE`]).
    pub page: String,
    /// The bound on loading (default [`DEFAULT_LOAD_TIMEOUT`]).
    pub timeout: Duration,
}

impl Default for PageOptions {
    fn default() -> Self {
        Self {
            page: DEFAULT_PAGE.to_owned(),
            timeout: DEFAULT_LOAD_TIMEOUT,
        }
    }
}

impl PageOptions {
    /// Options for `page` (None: the default page).
    pub fn page(page: Option<String>) -> Self {
        Self {
            page: page.unwrap_or_else(|| DEFAULT_PAGE.to_owned()),
            ..Self::default()
        }
    }

    /// The same with another load bound.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Refuses names and bounds out of range.
    pub fn check(&self) -> Result<(), BrowserError> {
        let ok = !self.page.is_empty()
            && self.page.len() <= 64
            && self
                .page
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            return Err(BrowserError::Invalid(format!(
                "page name {:?}: use 1-64 of A-Z a-z 0-9 . _ -",
                self.page
            )));
        }
        if self.timeout.is_zero() || self.timeout > MAX_LOAD_TIMEOUT {
            return Err(BrowserError::Invalid(format!(
                "timeout: 1 to {} seconds",
                MAX_LOAD_TIMEOUT.as_secs()
            )));
        }
        Ok(())
    }
}

/// Refuses URLs the browser should not be sent to: only http, https and
/// about:blank.
pub fn check_url(url: &str) -> Result<(), BrowserError> {
    let lower = url.to_ascii_lowercase();
    let ok = (lower.starts_with("http://") || lower.starts_with("https://"))
        && url.len() > "http://".len()
        && url.len() <= 8192
        && !url.chars().any(char::is_control)
        || lower == "about:blank";
    if ok {
        Ok(())
    } else {
        Err(BrowserError::Invalid(format!(
            "URL {url:?}: give an http:// or https:// URL (or about:blank)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_element_travels_as_one_tagged_string() {
        let element = Element::Selector("a[href]".into());
        let text = serde_json::to_string(&element).unwrap();
        assert_eq!(text, r#"{"selector":"a[href]"}"#);
        assert_eq!(serde_json::from_str::<Element>(&text).unwrap(), element);
        for hostile in [
            r#"{"script":"x"}"#,
            r#"{"ref":"e1","selector":"a"}"#,
            r#""e1""#,
        ] {
            assert!(
                serde_json::from_str::<Element>(hostile).is_err(),
                "{hostile}"
            );
        }
    }

    #[test]
    fn urls_and_page_names_are_checked() {
        for good in [
            "http://host.microagent.internal:8000/",
            "https://x.org/a?b",
            "about:blank",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "http://",
            "ftp://x",
            "http://a\nb",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        assert!(PageOptions::default().check().is_ok());
        assert!(PageOptions::page(Some("docs-2".into())).check().is_ok());
        for bad in ["", "a b", "../x", &"p".repeat(65)] {
            assert!(
                PageOptions::page(Some(bad.into())).check().is_err(),
                "{bad}"
            );
        }
        let slow = PageOptions::default().timeout(Duration::from_secs(601));
        assert!(slow.check().is_err());
        assert!(PageOptions::default()
            .timeout(Duration::ZERO)
            .check()
            .is_err());
    }
}
