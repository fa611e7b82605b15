//! Chromium in the guest: the background process `browser`, started on
//! first use (and again when it has exited), as `user`, with its profile
//! in the workspace and DevTools on a port Chromium picks on the guest's
//! loopback, which it writes to `DevToolsActivePort` in the profile.

use std::time::{Duration, Instant};

use crate::browser::cdp;
use crate::browser::state::BrowserDir;
use crate::browser::{BrowserError, BrowserEventKind};
use crate::error::Result;
use crate::guest::processes::ProcessInfo;
use crate::guest::processes::{CpuProgress, ProcessOptions};
use crate::guest::request::ExecRequest;
use crate::workspaces::handle::Workspace;

/// The background process's id (`microagent ps` shows it).
pub const PROCESS_ID: &str = "browser";
/// Chromium binaries tried in order: Debian's old headless shell (no GTK,
/// the `browser` image's), then the full browser in headless mode.
const BINARIES: &[&str] = &[
    "/usr/lib/chromium/chromium-headless-shell",
    "/usr/lib/chromium/chromium",
];
/// The user it runs as, and its profile.
const USER: &str = "user";
const HOME: &str = "/home/user";
const PROFILE: &str = "/home/user/.cache/microagent-browser";
/// The viewport, which screenshots have.
pub const VIEWPORT: (u32, u32) = (1280, 720);
/// How long Chromium's start may go without progress (a line on its
/// stderr, or CPU time spent by its process): a start that keeps working
/// is waited for up to [`cdp::stretched`] of it, as a slow host needs
/// (where guest kernel mode is emulated, loading Chromium alone takes one
/// to several minutes); a stuck one fails after this.
const START_QUIET: Duration = Duration::from_secs(120);
/// Longest single wait for Chromium's output while it starts.
const START_POLL: Duration = Duration::from_secs(30);

/// The browser's DevTools endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The guest port.
    pub port: u16,
    /// The browser target's websocket path (`/devtools/browser/<id>`).
    pub path: String,
    /// When the browser process started (the guest's clock).
    pub started_ms: u64,
    /// Why it was started again, when this call restarted it.
    pub restarted: Option<String>,
    /// Started by this call.
    pub fresh: bool,
}

/// Kills the browser process (one that hangs) and waits for it to end.
pub async fn stop(ws: Workspace<'_>) -> Result<()> {
    match ws.processes().process_signal(PROCESS_ID, "KILL").await {
        Ok(()) => {}
        // Already gone.
        Err(e) if e.code() == base::code::ErrorCode::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    ws.processes()
        .process_wait(PROCESS_ID, Duration::from_secs(30))
        .await?;
    Ok(())
}

/// The command line: no setuid or namespace sandbox inside the guest (the
/// microVM is the boundary, docs/browser.md); one process, because every
/// new process costs seconds where guest kernel mode is emulated; nothing
/// that calls out on its own (updates, sync, metrics).
pub fn command_line(binary: &str) -> Vec<String> {
    let mut args = vec![
        binary.to_owned(),
        "--headless".into(),
        "--no-sandbox".into(),
        "--single-process".into(),
        "--no-zygote".into(),
        "--remote-debugging-address=127.0.0.1".into(),
        "--remote-debugging-port=0".into(),
        format!("--user-data-dir={PROFILE}"),
        format!("--window-size={},{}", VIEWPORT.0, VIEWPORT.1),
        "--hide-scrollbars".into(),
        "--no-first-run".into(),
        "--no-default-browser-check".into(),
        "--disable-gpu".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-default-apps".into(),
        "--disable-extensions".into(),
        "--disable-sync".into(),
        "--disable-breakpad".into(),
        "--metrics-recording-only".into(),
        "--mute-audio".into(),
    ];
    args.push("about:blank".into());
    args
}

/// `DevToolsActivePort`: the port, then the browser's websocket path.
pub fn parse_active_port(text: &str) -> Option<(u16, String)> {
    let mut lines = text.lines();
    let port = lines
        .next()?
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)?;
    let path = lines.next()?.trim();
    (path.starts_with("/devtools/browser/") && path.len() < 256).then(|| (port, path.to_owned()))
}

/// The running browser's endpoint, starting it first when it is not
/// running (logged in `dir`'s events).
pub async fn ensure(ws: Workspace<'_>, dir: &BrowserDir) -> Result<Endpoint> {
    let previous = ws
        .processes()
        .process_list()
        .await?
        .into_iter()
        .find(|p| p.id == PROCESS_ID);
    let restarted = match previous {
        Some(p) if p.running() => return wait_ready(ws, &p, None, false).await,
        Some(p) => {
            ws.processes().process_remove(PROCESS_ID).await?;
            Some(format!("the browser had exited ({})", p.status()))
        }
        None => None,
    };
    let binary = find_binary(ws).await?;
    let port_file = format!("{PROFILE}/DevToolsActivePort");
    if ws.files().stat_if_exists(&port_file).await?.is_some() {
        ws.files().remove(&port_file, false, false).await?;
    }
    let req = ExecRequest::argv(command_line(&binary))
        .user(USER)
        .env("HOME", HOME);
    let options = ProcessOptions {
        id: Some(PROCESS_ID.to_owned()),
        ..ProcessOptions::default()
    };
    let info = ws.processes().process_start(req, options).await?;
    dir.events().append(BrowserEventKind::BrowserStarted {
        restarted_after: restarted.clone(),
    })?;
    wait_ready(ws, &info, restarted, true).await
}

async fn find_binary(ws: Workspace<'_>) -> Result<String> {
    for binary in BINARIES {
        if ws.files().stat_if_exists(binary).await?.is_some() {
            return Ok((*binary).to_owned());
        }
    }
    Err(BrowserError::NotInstalled {
        workspace: ws.name.as_str().to_owned(),
        looked_for: BINARIES.join(", "),
    }
    .into())
}

/// Waits for `process` to say where DevTools listens. A browser started
/// by this call is followed through its stderr, long-polled (the agent
/// answers when output comes, so the wait costs the guest nothing); one
/// already running is asked through the port file it wrote.
async fn wait_ready(
    ws: Workspace<'_>,
    process: &ProcessInfo,
    restarted: Option<String>,
    fresh: bool,
) -> Result<Endpoint> {
    let endpoint = |(port, path)| Endpoint {
        port,
        path,
        started_ms: process.started_unix_ms,
        restarted: restarted.clone(),
        fresh,
    };
    if !fresh {
        let port_file = format!("{PROFILE}/DevToolsActivePort");
        if ws.files().stat_if_exists(&port_file).await?.is_some() {
            let text = ws.files().read_file(&port_file, None, Some(512)).await?;
            if let Some(found) = parse_active_port(&String::from_utf8_lossy(&text.data)) {
                return Ok(endpoint(found));
            }
        }
    }
    let started = Instant::now();
    let ceiling = started + cdp::stretched(START_QUIET);
    let mut progress = CpuProgress::new(process.pid);
    let mut said = String::new();
    let mut cursors = [0, 0];
    loop {
        let now = Instant::now();
        let by = progress.last + START_QUIET;
        if now >= by.min(ceiling) {
            let what = match now >= ceiling {
                true => "starting Chromium".to_owned(),
                false => format!(
                    "starting Chromium (no output and no CPU time for {} s)",
                    START_QUIET.as_secs()
                ),
            };
            return Err(BrowserError::Timeout {
                what,
                secs: started.elapsed().as_secs(),
            }
            .into());
        }
        let left = by.min(ceiling) - now;
        let out = ws
            .processes()
            .process_output(PROCESS_ID, cursors, Some(64 * 1024), left.min(START_POLL))
            .await?;
        cursors = [out.stdout.next_cursor, out.stderr.next_cursor];
        said.push_str(&String::from_utf8_lossy(&out.stderr.bytes));
        if let Some(found) = parse_listening(&said) {
            return Ok(endpoint(found));
        }
        if !out.stderr.bytes.is_empty() || !out.stdout.bytes.is_empty() {
            progress.last = Instant::now();
        } else if out.process.running() {
            progress.sample(ws).await;
        }
        // Only the last lines matter for a failure.
        if said.len() > 16 * 1024 {
            // On a character: the text is the guest's.
            let mut cut = said.len() - 8 * 1024;
            while !said.is_char_boundary(cut) {
                cut += 1;
            }
            said.drain(..cut);
        }
        if !out.process.running() {
            let tail: Vec<&str> = said.lines().rev().take(5).collect();
            return Err(BrowserError::Start {
                workspace: ws.name.as_str().to_owned(),
                detail: format!(
                    "{}: {}",
                    out.process.status(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ),
            }
            .into());
        }
    }
}

/// `DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID`, which
/// Chromium writes to stderr once DevTools listens.
pub fn parse_listening(stderr: &str) -> Option<(u16, String)> {
    let line = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("DevTools listening on ws://"))?;
    let (_, rest) = line.split_once(':')?;
    let (port, path) = rest.split_at(rest.find('/')?);
    parse_active_port(&format!("{port}\n{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_active_port_file_is_read_and_odd_ones_refused() {
        let ok = "39037\n/devtools/browser/cec6ab41-999b-4546-b181-a51e518853c3\n";
        assert_eq!(
            parse_active_port(ok),
            Some((
                39037,
                "/devtools/browser/cec6ab41-999b-4546-b181-a51e518853c3".into()
            ))
        );
        for bad in [
            "",
            "39037",
            "0\n/devtools/browser/x",
            "x\n/devtools/browser/x",
            "1\n/etc/x",
        ] {
            assert_eq!(parse_active_port(bad), None, "{bad:?}");
        }
        let stderr = "[1128/013000.1:WARNING:x.cc(1)] noise\n\
            DevTools listening on ws://127.0.0.1:43207/devtools/browser/c40f5c42-103a\n";
        assert_eq!(
            parse_listening(stderr),
            Some((43207, "/devtools/browser/c40f5c42-103a".into()))
        );
        assert_eq!(
            parse_listening("DevTools listening on ws://127.0.0.1:0/x"),
            None
        );
        assert_eq!(parse_listening("nothing yet"), None);
    }

    #[test]
    fn the_browser_listens_on_the_guest_loopback_only_with_a_port_it_picks() {
        let args = command_line(BINARIES[0]);
        assert_eq!(args[0], BINARIES[0]);
        assert!(args.contains(&"--remote-debugging-address=127.0.0.1".to_owned()));
        assert!(args.contains(&"--remote-debugging-port=0".to_owned()));
        assert!(args.contains(&format!("--user-data-dir={PROFILE}")));
        assert_eq!(args.last().map(String::as_str), Some("about:blank"));
    }
}
