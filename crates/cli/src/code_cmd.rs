//! `microagent code`: code sessions (a Jupyter kernel in a workspace that
//! keeps variables between runs). `code NAME` is a REPL on the terminal;
//! `code run NAME -- CODE` runs code in the workspace's session (started
//! on first use, kept for the next run); `code ls`, `code restart`, `code
//! stop`. Ctrl-C during a run interrupts the code, and the session goes on.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use workspace::code_sessions::{CodeLanguage, CodeRun, CodeRunLimits, DEFAULT_RUN_TIMEOUT};
use workspace::{Error, Workspaces};

use crate::output;

/// `code`'s arguments: a workspace for the REPL, or a subcommand.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CodeArgs {
    #[command(subcommand)]
    command: Option<CodeCommand>,
    /// Workspace whose session the REPL runs in (started on first use).
    workspace: Option<String>,
    #[command(flatten)]
    session: SessionArgs,
}

/// Which session: the one named, else the workspace's first of the language.
#[derive(clap::Args, Debug, Clone)]
pub struct SessionArgs {
    /// The session (`code-N`); default: the workspace's first running one
    /// of the language, started when there is none.
    #[arg(long)]
    session: Option<String>,
    /// The language of a session started here: python or javascript.
    #[arg(long, default_value = "python")]
    lang: String,
}

#[derive(clap::Subcommand, Debug)]
pub enum CodeCommand {
    /// Run CODE in the workspace's session and print what it printed,
    /// returned and raised (exit 1 when it raised).
    Run {
        /// Workspace name.
        workspace: String,
        #[command(flatten)]
        session: SessionArgs,
        /// Interrupt the code after this many seconds.
        #[arg(long, default_value_t = DEFAULT_RUN_TIMEOUT.as_secs())]
        timeout: u64,
        /// The code (its words are joined with spaces).
        #[arg(last = true, required = true)]
        code: Vec<String>,
    },
    /// List a workspace's code sessions.
    Ls {
        /// Workspace name.
        workspace: String,
    },
    /// Restart a session's kernel (what it held is gone).
    Restart {
        /// Workspace name.
        workspace: String,
        /// The session (`code-N`).
        session: String,
    },
    /// End a session.
    Stop {
        /// Workspace name.
        workspace: String,
        /// The session (`code-N`).
        session: String,
    },
    /// Start kernels once in a fresh workspace of IMAGE and keep it as the
    /// image's warm snapshot: every fresh workspace of its default size
    /// then starts with them, and its first session of each language
    /// takes one at once instead of waiting for a kernel to start.
    Prepare {
        /// The image (default: code, as `setup --with code` builds it).
        #[arg(default_value = workspace::code_sessions::IMAGE)]
        image: String,
        /// The kernels' languages, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "python,javascript")]
        lang: Vec<String>,
    },
}

pub async fn run(ws: &Workspaces, args: &CodeArgs, json: bool) -> Result<ExitCode, Error> {
    match (&args.command, &args.workspace) {
        (Some(CodeCommand::Run { workspace, session, timeout, code }), _) => {
            let id = session_of(ws, workspace, session, json).await?;
            let code = code.join(" ");
            let timeout = Duration::from_secs(*timeout);
            let ran = run_once(ws, workspace, &id, &code, timeout, !json).await?;
            if json {
                output::json(&ran);
            } else {
                print_run(&ran);
            }
            Ok(if ran.error.is_some() { ExitCode::FAILURE } else { ExitCode::SUCCESS })
        }
        (Some(CodeCommand::Ls { workspace }), _) => {
            let sessions = ws.workspace(workspace)?.code().list().await?;
            if json {
                output::json(&sessions);
            } else if sessions.is_empty() {
                println!("no code sessions in {workspace} (start one: microagent code run {workspace} -- 1+1)");
            } else {
                for s in &sessions {
                    let state = if s.running { "running" } else { "ended" };
                    println!("{:<10} {:<8} {state}", s.id, s.language.as_str());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        (Some(CodeCommand::Restart { workspace, session }), _) => {
            let info = ws.workspace(workspace)?.code().restart(session).await?;
            if json {
                output::json(&info);
            } else {
                println!("restarted code session {} of {workspace}", info.id);
            }
            Ok(ExitCode::SUCCESS)
        }
        (Some(CodeCommand::Stop { workspace, session }), _) => {
            ws.workspace(workspace)?.code().stop(session).await?;
            if json {
                output::json(&serde_json::json!({"workspace": workspace, "session": session, "stopped": true}));
            } else {
                println!("stopped code session {session} of {workspace}");
            }
            Ok(ExitCode::SUCCESS)
        }
        (Some(CodeCommand::Prepare { image, lang }), _) => {
            prepare(ws, image, lang, json).await?;
            Ok(ExitCode::SUCCESS)
        }
        (None, Some(workspace)) => repl(ws, workspace, &args.session).await,
        (None, None) => Err(Error::InvalidInput(
            "give a workspace (`microagent code NAME` for a REPL) or a subcommand (run, ls, restart, stop, prepare)".into(),
        )),
    }
}

/// `code prepare`: kernels made ahead in `image`'s warm snapshot, with
/// each step on stderr.
pub async fn prepare(
    ws: &Workspaces,
    image: &str,
    lang: &[String],
    json: bool,
) -> Result<(), Error> {
    let languages = lang
        .iter()
        .map(|l| l.trim().parse::<CodeLanguage>())
        .collect::<Result<Vec<_>, _>>()?;
    let began = std::time::Instant::now();
    let prepared = workspace::code_sessions::prepare(ws, image, &languages, |step| {
        eprintln!(
            "code prepare {image}: [{:>5.0} s] {step}",
            began.elapsed().as_secs_f64()
        )
    })
    .await?;
    if json {
        output::json(&prepared);
    } else {
        let names: Vec<&str> = prepared.languages.iter().map(|l| l.as_str()).collect();
        println!(
            "{} kernels ready in {}'s warm snapshot ({:.0} s): a fresh workspace of it starts with them",
            names.join(" and "),
            prepared.image,
            prepared.secs
        );
    }
    Ok(())
}

/// The session to use: the one named, else the first running one of the
/// language, else a new one.
async fn session_of(
    ws: &Workspaces,
    workspace: &str,
    args: &SessionArgs,
    quiet: bool,
) -> Result<String, Error> {
    if let Some(id) = &args.session {
        return Ok(id.clone());
    }
    let language: CodeLanguage = args.lang.parse()?;
    let code = ws.workspace(workspace)?.code();
    if let Some(s) = code
        .list()
        .await?
        .into_iter()
        .find(|s| s.running && s.language == language)
    {
        return Ok(s.id);
    }
    if !quiet {
        eprintln!("starting a {} kernel in {workspace} ...", language.as_str());
    }
    let started = code.start(language).await?;
    if !quiet {
        eprintln!("code session {} started", started.id);
    }
    Ok(started.id)
}

/// One run; with `live`, its output is printed as it comes. Ctrl-C
/// interrupts it.
async fn run_once(
    ws: &Workspaces,
    workspace: &str,
    id: &str,
    code: &str,
    timeout: Duration,
    live: bool,
) -> Result<CodeRun, Error> {
    let on_stream = |name: &str, text: &str| {
        if !live {
            return;
        }
        // Guest text: on a terminal it cannot drive the terminal.
        let _ = if name == "stderr" {
            let mut err = std::io::stderr().lock();
            err.write_all(for_stderr(text).as_bytes())
                .and_then(|()| err.flush())
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(output::guest_text(text).as_bytes())
                .and_then(|()| out.flush())
        };
    };
    let interrupted = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let mut ran = ws
        .workspace(workspace)?
        .code()
        .run(
            id,
            code,
            timeout,
            CodeRunLimits::default(),
            interrupted,
            on_stream,
        )
        .await?;
    if live {
        // Printed already as it came.
        ran.stdout.clear();
        ran.stderr.clear();
    }
    Ok(ran)
}

/// Guest text for stderr: inert on a terminal.
fn for_stderr(text: &str) -> std::borrow::Cow<'_, str> {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        output::inert(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// What a run printed (when not already), returned, displayed and raised
/// (all guest text: inert on a terminal).
fn print_run(ran: &CodeRun) {
    print!("{}", output::guest_text(&ran.stdout));
    eprint!("{}", for_stderr(&ran.stderr));
    if let Some(result) = &ran.result {
        println!("{}", output::guest_text(result));
    }
    for o in &ran.outputs {
        if o.mime.starts_with("image/") {
            println!(
                "[{} displayed: {} bytes in base64; --json has it]",
                output::field(&o.mime),
                o.data.len()
            );
        } else if o.mime != "text/html" || ran.result.is_none() {
            println!("{}", output::guest_text(&o.data));
        }
    }
    if let Some(e) = &ran.error {
        for line in &e.traceback {
            eprintln!("{}", for_stderr(line));
        }
        if e.traceback.is_empty() {
            eprintln!("{}: {}", output::field(&e.name), output::field(&e.value));
        }
    }
    if let Some(why) = &ran.stopped {
        eprintln!("({why}: the session goes on)");
    }
    if ran.truncated {
        eprintln!("(some output was left out past the limits)");
    }
}

/// Whether `line` opens a block that goes on to the next empty line: a
/// Python line ending in `:`, a JavaScript one ending in an opening
/// bracket, a comma or an arrow.
fn opens_block(language: CodeLanguage, line: &str) -> bool {
    let line = line.trim_end();
    match language {
        CodeLanguage::Python => line.ends_with(':'),
        CodeLanguage::JavaScript => line.ends_with(['{', '(', '[', ',']) || line.ends_with("=>"),
    }
}

/// A read-eval-print loop: a line that opens a block ([`opens_block`])
/// continues until an empty line; Ctrl-D ends it, Ctrl-C interrupts a run.
async fn repl(ws: &Workspaces, workspace: &str, args: &SessionArgs) -> Result<ExitCode, Error> {
    let language: CodeLanguage = args.lang.parse()?;
    let id = session_of(ws, workspace, args, false).await?;
    eprintln!("code session {id} of {workspace}: Ctrl-D ends, Ctrl-C interrupts a run");
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut block = String::new();
    loop {
        let prompt = if block.is_empty() { ">>> " } else { "... " };
        eprint!("{prompt}");
        let _ = std::io::stderr().flush();
        let Ok(Some(line)) = lines.next_line().await else {
            eprintln!();
            break;
        };
        let continues = !block.is_empty() && !line.trim().is_empty();
        let opens = opens_block(language, &line);
        if !block.is_empty() || opens {
            block.push_str(&line);
            block.push('\n');
            if continues || opens {
                continue;
            }
        } else {
            block = line;
        }
        let code = std::mem::take(&mut block);
        if code.trim().is_empty() {
            continue;
        }
        let ran = run_once(ws, workspace, &id, &code, DEFAULT_RUN_TIMEOUT, true).await?;
        print_run(&ran);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_open_as_each_language_writes_them() {
        assert!(opens_block(CodeLanguage::Python, "for i in range(3):  "));
        assert!(!opens_block(CodeLanguage::Python, "x = {"));
        for line in [
            "function f() {",
            "const xs = [",
            "f(a,",
            "const g = (x) =>",
            "call(",
        ] {
            assert!(opens_block(CodeLanguage::JavaScript, line), "{line}");
        }
        for line in ["x + 1", "f(a)", "if (x) y():"] {
            assert!(!opens_block(CodeLanguage::JavaScript, line), "{line}");
        }
    }
}
