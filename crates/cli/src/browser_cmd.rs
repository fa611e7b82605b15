//! `microagent browser open | snapshot | click | fill | close | events |
//! screenshot WS ...`: the workspace's headless browser (docs/browser.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde::Serialize;
use workspace::browser::{BrowserSnapshot, Element, PageOptions, DEFAULT_PAGE};
use workspace::{Error, Workspaces};

use crate::output;

#[derive(Debug, Subcommand)]
pub enum BrowserCommand {
    /// Open URL in a page (made on first use; the browser starts on first
    /// use, which takes minutes where guest kernel mode is emulated) and
    /// print its accessibility snapshot once it has loaded.
    Open {
        /// Workspace name.
        workspace: String,
        /// http://, https:// or about:blank.
        url: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Print a new accessibility snapshot of an open page.
    Snapshot {
        /// Workspace name.
        workspace: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Click an element (a ref of the last snapshot, or --selector) and
    /// print the snapshot after what it set off.
    Click {
        /// Workspace name.
        workspace: String,
        #[command(flatten)]
        element: ElementArgs,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Type VALUE into an element (replacing what it held) and print the
    /// new snapshot.
    Fill {
        /// Workspace name.
        workspace: String,
        #[command(flatten)]
        element: ElementArgs,
        /// The text.
        #[arg(long)]
        value: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Close a page.
    Close {
        /// Workspace name.
        workspace: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// The browser's log: actions, navigations, console messages, failed
    /// requests, each with a sequence number.
    Events {
        /// Workspace name.
        workspace: String,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Save a PNG of a page's viewport to FILE.
    Screenshot {
        /// Workspace name.
        workspace: String,
        /// The PNG file to write.
        file: PathBuf,
        #[command(flatten)]
        page: PageArgs,
    },
}

/// Which page, and how long a load may take.
#[derive(Debug, Args)]
pub struct PageArgs {
    /// The page.
    #[arg(long, default_value = DEFAULT_PAGE)]
    page: String,
    /// Seconds a load (and what an action sets off) may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    timeout: u64,
}

impl PageArgs {
    fn options(&self) -> PageOptions {
        PageOptions::page(Some(self.page.clone())).timeout(Duration::from_secs(self.timeout))
    }
}

/// A ref or a selector.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ElementArgs {
    /// A ref of the page's last snapshot (`e3`).
    #[arg(value_name = "REF")]
    reference: Option<String>,
    /// A CSS selector (its first match) instead of a ref.
    #[arg(long)]
    selector: Option<String>,
}

impl ElementArgs {
    fn element(&self) -> Element {
        match (&self.reference, &self.selector) {
            (_, Some(s)) => Element::Selector(s.clone()),
            (Some(r), None) => Element::Ref(r.clone()),
            // clap's group makes one of them required.
            (None, None) => Element::Selector(String::new()),
        }
    }
}

pub async fn run(ws: &Workspaces, cmd: &BrowserCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        BrowserCommand::Open {
            workspace,
            url,
            page,
        } => {
            if !json && output::interactive() {
                eprintln!(
                    "microagent: opening {url} in {workspace} (page {})",
                    page.page
                );
            }
            let snap = ws
                .workspace(workspace)?
                .browser()
                .open(url, page.options())
                .await?;
            print_snapshot(&snap, json);
        }
        BrowserCommand::Snapshot { workspace, page } => {
            let snap = ws
                .workspace(workspace)?
                .browser()
                .snapshot(page.options())
                .await?;
            print_snapshot(&snap, json);
        }
        BrowserCommand::Click {
            workspace,
            element,
            page,
        } => {
            let snap = ws
                .workspace(workspace)?
                .browser()
                .click(&element.element(), page.options())
                .await?;
            print_snapshot(&snap, json);
        }
        BrowserCommand::Fill {
            workspace,
            element,
            value,
            page,
        } => {
            let snap = ws
                .workspace(workspace)?
                .browser()
                .fill(&element.element(), value, page.options())
                .await?;
            print_snapshot(&snap, json);
        }
        BrowserCommand::Close { workspace, page } => {
            let closed = ws
                .workspace(workspace)?
                .browser()
                .close(page.options(), false)
                .await?;
            if json {
                output::json(&closed);
            } else {
                println!(
                    "closed page {} of {}",
                    output::field(&closed.page),
                    output::field(&closed.workspace)
                );
            }
        }
        BrowserCommand::Events {
            workspace,
            offset,
            limit,
        } => {
            let events = ws
                .workspace(workspace)?
                .browser()
                .events(*offset, *limit)
                .await?;
            if json {
                output::json(&events);
            } else {
                for e in &events.events {
                    let line = serde_json::to_value(&e.kind).unwrap_or_default();
                    println!("{:>5}  {}", e.seq, output::field(&line.to_string()));
                }
            }
        }
        BrowserCommand::Screenshot {
            workspace,
            file,
            page,
        } => {
            let shot = ws
                .workspace(workspace)?
                .browser()
                .screenshot(page.options())
                .await?;
            // A new private file renamed over FILE: never written through
            // a link there, never left half-written.
            let mut tmp = workspace::host::host_write::TempFile::beside(file)?;
            std::io::Write::write_all(tmp.file(), &shot.png)
                .map_err(Error::host_io(format!("writing {}", file.display())))?;
            tmp.persist(0o644, file)?;
            #[derive(Serialize)]
            struct Saved<'a> {
                file: &'a std::path::Path,
                page: &'a str,
                url: &'a str,
                width: u32,
                height: u32,
                bytes: usize,
            }
            let saved = Saved {
                file,
                page: &shot.page,
                url: &shot.url,
                width: shot.width,
                height: shot.height,
                bytes: shot.png.len(),
            };
            if json {
                output::json(&saved);
            } else {
                println!(
                    "saved {} ({}x{} PNG of {})",
                    file.display(),
                    shot.width,
                    shot.height,
                    output::field(&shot.url)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_snapshot(snap: &BrowserSnapshot, json: bool) {
    if json {
        output::json(snap);
        return;
    }
    if let Some(why) = &snap.restarted {
        eprintln!(
            "microagent: the browser was restarted: {}",
            output::field(why)
        );
    }
    // The page's title, address and text are the web page's words.
    println!(
        "# page {} of {}: \"{}\" at {}",
        output::field(&snap.page),
        output::field(&snap.workspace),
        output::field(&snap.title),
        output::field(&snap.url)
    );
    print!("{}", output::inert(&snap.snapshot));
}
