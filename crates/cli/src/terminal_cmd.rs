//! `microagent shell WS` and `microagent exec -t WS -- CMD`: a command on a
//! pseudo-terminal in the guest, driven from this terminal.
//!
//! This terminal goes into raw mode, so every key (Ctrl-C included) goes
//! to the guest, whose terminal turns it into a signal for the command
//! there. The window size is sent at the start and on every SIGWINCH. The
//! terminal is restored on every way out: the command's exit, an error,
//! SIGTERM or SIGHUP (which also kill the command), and a panic.

use std::convert::Infallible;
use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use workspace::Workspaces;
use workspace::{
    guest::ExecEnd, guest::ExecEvent, guest::PtySize, guest::TerminalInput, Error, ExecInput,
    ExecRequest,
};

use crate::exec_cmd::exit_status;

/// TERM in the guest when this process has none.
const DEFAULT_TERM: &str = "xterm-256color";
/// What `shell` runs: the image's bash as a login shell, else sh.
const LOGIN_SHELL: &str =
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi";
/// Keystrokes buffered between the reading thread and the connection.
const INPUT_QUEUE: usize = 64;

/// The login shell as a request.
pub fn login_shell() -> ExecRequest {
    ExecRequest::shell(LOGIN_SHELL)
}

/// This terminal in raw mode until dropped.
struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    /// Raw mode on stdin when it is a terminal; None otherwise.
    fn enter() -> Option<Self> {
        if !std::io::stdin().is_terminal() {
            return None;
        }
        // SAFETY: termios is plain data; tcgetattr fills it.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd 0 and a valid pointer to a termios.
        if unsafe { libc::tcgetattr(0, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only edits the struct it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: fd 0 and a valid termios.
        if unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: fd 0 and the termios saved at entry.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.saved) };
    }
}

/// This terminal's size (stdout's, else stdin's), or 24 x 80.
fn terminal_size() -> PtySize {
    for fd in [1, 0] {
        // SAFETY: winsize is plain data; TIOCGWINSZ fills it or fails.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to a winsize for the call's duration.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
        if rc == 0 && ws.ws_row > 0 && ws.ws_col > 0 {
            return PtySize {
                rows: ws.ws_row,
                cols: ws.ws_col,
            };
        }
    }
    PtySize::default()
}

/// Reads stdin on a thread of its own (a blocked read must not keep the
/// runtime from ending) and sends what it reads.
fn forward_stdin(tx: mpsc::Sender<TerminalInput>) {
    let spawned = std::thread::Builder::new()
        .name("terminal-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 4096];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx
                            .blocking_send(TerminalInput::Data(buf[..n].to_vec()))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("microagent: cannot read this terminal ({e}); input is not forwarded");
    }
}

/// Sends the terminal's size whenever it changes, until the exec ends.
async fn forward_resizes(tx: mpsc::Sender<TerminalInput>) -> Infallible {
    let Ok(mut winch) = signal(SignalKind::window_change()) else {
        return std::future::pending().await;
    };
    while winch.recv().await.is_some() {
        if tx
            .send(TerminalInput::Resize(terminal_size()))
            .await
            .is_err()
        {
            break;
        }
    }
    std::future::pending().await
}

/// Completes on SIGTERM or SIGHUP (the terminal went away).
async fn terminated() {
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(mut term), Ok(mut hup)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// Runs `req` on a pty in workspace `name` with this terminal attached;
/// `forward_input` is false for `exec -t` without `-i`.
pub async fn run(
    ws: &Workspaces,
    name: &str,
    req: ExecRequest,
    forward_input: bool,
) -> Result<ExitCode, Error> {
    let term = std::env::var("TERM").unwrap_or_else(|_| DEFAULT_TERM.to_owned());
    let req = req.env("TERM", term).terminal(terminal_size());
    let (tx, rx) = mpsc::channel(INPUT_QUEUE);
    let raw = if forward_input {
        forward_stdin(tx.clone());
        RawMode::enter()
    } else {
        None
    };
    let on_event = |event: ExecEvent| {
        if let ExecEvent::Stdout(b) | ExecEvent::Stderr(b) = event {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(&b).and_then(|()| o.flush());
        }
    };
    let exec =
        ws.workspace(name)?
            .exec_cancellable(req, ExecInput::Terminal(rx), on_event, terminated());
    let end = tokio::select! {
        end = exec => end,
        never = forward_resizes(tx) => match never {},
    };
    drop(raw);
    match end? {
        ExecEnd::Exited(exited) => Ok(ExitCode::from(exit_status(&exited))),
        ExecEnd::Cancelled { killed, .. } => {
            let what = if killed {
                "killed"
            } else {
                "not confirmed killed"
            };
            eprintln!("microagent: terminated; the command in workspace {name} was {what}");
            Ok(ExitCode::from(crate::exec_cmd::INTERRUPTED))
        }
    }
}
