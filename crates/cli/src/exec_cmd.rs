//! `microagent exec` and `microagent run` (create + start + exec + delete).
//! Their exit status is the guest command's: its code, 128 + signal when a
//! signal killed it, 124 when its timeout killed it, 125 when microagent
//! itself failed, 130 when interrupted.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use workspace::DEFAULT_START_TIMEOUT;
use workspace::EXEC_FAILURE_EXIT_CODE;
use workspace::{guest::ExecEnd, Error, Workspaces};
use workspace::{guest::ExecEvent, guest::OutputCollector, ExecInput};
use workspace::{guest::Exited, ExecRequest};
use workspace::{Afterwards, OneShot};

use crate::output::{self, key_value};
use crate::workspace_cmd::{start_with_progress, SpecArgs};

/// Exit status after Ctrl-C.
pub(crate) const INTERRUPTED: u8 = 130;
/// Exit status when the command's timeout killed it (as timeout(1)).
const TIMED_OUT: u8 = 124;

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// Start the command in the background and print its process id at
    /// once (see `microagent ps` and `microagent process`); with -i its
    /// stdin stays open for `process stdin`, and --output-cap is the bytes
    /// of each stream kept (default 1 MiB).
    #[arg(short = 'd', long)]
    pub detach: bool,
    /// Run the command on a terminal in the guest, attached to this one
    /// (with -i, keys go to it in raw mode: Ctrl-C reaches the command).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Environment variable (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    #[command(flatten)]
    pub command: CommandArgs,
}

/// How to run the command (shared by `exec` and `run`).
#[derive(Debug, Clone, Args)]
pub struct CommandArgs {
    /// Run COMMAND as one /bin/sh -c line.
    #[arg(long)]
    pub shell: bool,
    /// Working directory in the guest.
    #[arg(long, short = 'w', visible_alias = "workdir", value_name = "DIR")]
    pub cwd: Option<String>,
    /// Run as this user: a name the guest's /etc/passwd lists (`root`,
    /// `node`), a uid, or USER:GROUP (default: the image's user, else root).
    #[arg(long, short = 'u', value_name = "USER")]
    pub user: Option<String>,
    /// Kill the command after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// Bytes of each output stream to return; the rest is counted, not sent.
    #[arg(long, value_name = "BYTES")]
    pub output_cap: Option<u64>,
    /// Give the command secret NAME (from `secret set`) as the environment
    /// variable NAME (repeatable); its value is masked (`***`) in the output.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Forward this terminal's stdin to the command.
    #[arg(short = 'i', long = "stdin")]
    pub stdin: bool,
    /// The command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

impl CommandArgs {
    pub(crate) fn request(&self, env: &[(String, String)]) -> Result<ExecRequest, Error> {
        let mut req = if self.shell {
            ExecRequest::shell(self.command.join(" "))
        } else {
            ExecRequest::argv(self.command.clone())
        }
        .envs(env.iter().cloned())
        .secrets(self.secrets.iter().cloned());
        if let Some(dir) = &self.cwd {
            req = req.cwd(dir);
        }
        if let Some(user) = &self.user {
            req = req.user(user);
        }
        if let Some(t) = self.timeout {
            if t == 0 {
                return Err(Error::InvalidInput(
                    "--timeout must be at least 1 second".into(),
                ));
            }
            req = req.timeout(Duration::from_secs(t));
        }
        if let Some(cap) = self.output_cap {
            req = req.output_cap(cap);
        }
        Ok(req)
    }
}

/// The exit status that stands for how the command ended.
pub fn exit_status(exited: &Exited) -> u8 {
    status_of(
        exited.timed_out,
        exited.code,
        exited.signal,
        EXEC_FAILURE_EXIT_CODE,
    )
}

/// The exit status for a command that ended so: 124 when its timeout
/// killed it, its code, 128 + signal, or `otherwise`.
pub fn status_of(timed_out: bool, code: Option<i32>, signal: Option<i32>, otherwise: u8) -> u8 {
    if timed_out {
        TIMED_OUT
    } else if let Some(code) = code {
        u8::try_from(code).unwrap_or(255)
    } else if let Some(sig) = signal {
        u8::try_from(sig.saturating_add(128)).unwrap_or(255)
    } else {
        otherwise
    }
}

async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How a command run by [`exec_in`] ended.
enum Ran {
    /// It ended; the exit status that stands for how.
    Exited(ExitCode),
    /// Ctrl-C came first and microagent sent it SIGKILL.
    Interrupted {
        /// Whether the guest agent confirmed the kill.
        killed: bool,
        /// Its pid (and process group) in the guest, if it started.
        pid: Option<u32>,
    },
}

/// Runs the command in `name`.
async fn exec_in(
    ws: &Workspaces,
    name: &str,
    args: &CommandArgs,
    env: &[(String, String)],
    json: bool,
) -> Result<Ran, Error> {
    let req = args.request(env)?;
    let input = if args.stdin {
        ExecInput::Reader(Box::new(tokio::io::stdin()))
    } else {
        ExecInput::None
    };
    // With --json the output goes into the one result; otherwise it streams.
    let mut collected = OutputCollector::new(None);
    let on_event = |event: ExecEvent| match event {
        ExecEvent::Stdout(b) if !json => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(&b).and_then(|()| o.flush());
        }
        ExecEvent::Stderr(b) if !json => {
            let _ = std::io::stderr().write_all(&b);
        }
        event => collected.on_event(event),
    };
    let end = ws
        .workspace(name)?
        .exec_cancellable(req, input, on_event, ctrl_c())
        .await?;
    let exited = match end {
        ExecEnd::Exited(exited) => exited,
        ExecEnd::Cancelled { killed, .. } => {
            let pid = collected.pid();
            return Ok(Ran::Interrupted { killed, pid });
        }
    };
    let status = exit_status(&exited);
    if json {
        output::json(&collected.finish(exited));
    } else {
        for (what, n) in [
            ("stdout", exited.stdout_dropped),
            ("stderr", exited.stderr_dropped),
        ] {
            if n > 0 {
                eprintln!("microagent: {n} bytes of {what} past the output cap were dropped (raise --output-cap, or redirect to a file and copy it out)");
            }
        }
        if exited.timed_out {
            eprintln!("microagent: the command ran past its timeout and was killed");
        }
    }
    Ok(Ran::Exited(ExitCode::from(status)))
}

/// Says what became of a command interrupted in workspace `name`, whose
/// workspace `remains` afterwards (`exec`) or not (`run` deletes or stops
/// it).
fn report_interrupt(name: &str, killed: bool, pid: Option<u32>, remains: bool) {
    if killed {
        eprintln!("microagent: interrupted; the command was killed");
    } else if !remains {
        eprintln!("microagent: interrupted; the kill of the command was not confirmed, but workspace {name} is cleaned up, which ends it");
    } else {
        let group = pid.map_or_else(String::new, |p| format!(" (process group {p})"));
        eprintln!("microagent: interrupted, but the kill of the command was not confirmed: it may still run in workspace {name}{group}; `microagent halt {name}` ends it with everything else in the workspace");
    }
}

/// The status for a command the guest could not start (as a shell gives:
/// 127 not found, 126 not executable), reported like any error.
fn not_started(e: Error, json: bool) -> Result<ExitCode, Error> {
    let status = match (&e, e.code()) {
        (Error::Agent { op: "exec", .. }, workspace::ErrorCode::NotFound) => 127,
        (Error::Agent { op: "exec", .. }, workspace::ErrorCode::Forbidden) => 126,
        _ => return Err(e),
    };
    Ok(output::error(&e, json, status))
}

/// Refuses the modes of `exec` that do not go together.
pub fn check_modes(args: &ExecArgs, json: bool) -> Result<(), Error> {
    if args.tty && (args.detach || json) {
        return Err(Error::InvalidInput(
            "--tty attaches this terminal; it does not go with --detach or --json".into(),
        ));
    }
    Ok(())
}

/// `exec` without `--detach` or `--tty` (the caller sends those to
/// `process_cmd::detach` and `terminal_cmd::run`).
pub async fn exec(
    ws: &Workspaces,
    name: &str,
    args: &ExecArgs,
    json: bool,
) -> Result<ExitCode, Error> {
    match exec_in(ws, name, &args.command, &args.env, json).await {
        Ok(Ran::Exited(code)) => Ok(code),
        Ok(Ran::Interrupted { killed, pid }) => {
            report_interrupt(name, killed, pid, true);
            Ok(ExitCode::from(INTERRUPTED))
        }
        Err(e) => not_started(e, json),
    }
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Workspace name (default: run-ID, with a fresh random ID).
    #[arg(long)]
    pub name: Option<String>,
    /// Keep the workspace afterwards (stopped) instead of deleting it.
    #[arg(long)]
    pub keep: bool,
    /// Seconds to wait for the workspace to boot.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_START_TIMEOUT.as_secs())]
    pub start_timeout: u64,
    /// After the command, before the workspace goes, copy the guest files
    /// GLOB matches into the host directory HOSTDIR (made if missing; an
    /// existing file there is not replaced): `--output '/out/*.png:plots'`
    /// (repeatable).
    #[arg(long = "output", value_name = "GLOB:HOSTDIR", value_parser = parse_output)]
    pub outputs: Vec<(String, std::path::PathBuf)>,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub exec: CommandArgs,
}

/// `GLOB:HOSTDIR`: the guest pattern is absolute and up to the first `:`.
fn parse_output(text: &str) -> Result<(String, std::path::PathBuf), String> {
    let (glob, dir) = text
        .split_once(':')
        .filter(|(g, d)| !g.is_empty() && !d.is_empty())
        .ok_or_else(|| format!("{text:?}: use GLOB:HOSTDIR, e.g. '/out/*.png:plots'"))?;
    workspace::guest::check_patterns(&[glob.to_owned()]).map_err(|e| e.to_string())?;
    Ok((glob.to_owned(), dir.into()))
}

/// Copies what each `--output` pattern matches in `name` into its host
/// directory (through the checked host writer), saying so on stderr.
async fn copy_outputs(
    ws: &Workspaces,
    name: &str,
    outputs: &[(String, std::path::PathBuf)],
) -> Result<(), Error> {
    for (pattern, dir) in outputs {
        let matched = ws
            .workspace(name)?
            .match_outputs(std::slice::from_ref(pattern))
            .await?;
        if matched.files.is_empty() {
            eprintln!("microagent: --output {pattern} matched no file");
            continue;
        }
        std::fs::create_dir_all(dir)
            .map_err(Error::host_io(format!("creating {}", dir.display())))?;
        for file in &matched.files {
            let base = std::path::Path::new(&file.path)
                .file_name()
                .map(std::path::PathBuf::from)
                .unwrap_or_default();
            let to = dir.join(base);
            ws.workspace(name)?
                .files()
                .copy_out(&file.path, &to)
                .await?;
            eprintln!(
                "microagent: copied {} to {}",
                output::field(&file.path),
                output::field(&to.display().to_string())
            );
        }
    }
    Ok(())
}

pub async fn run(ws: &Workspaces, args: &RunArgs, json: bool) -> Result<ExitCode, Error> {
    args.exec.request(&[])?;
    // An unknown secret fails before a workspace is made for nothing.
    ws.secrets().require(&args.exec.secrets)?;
    args.spec.build_missing_image(ws, json).await?;
    let one_shot = OneShot::new("run", args.spec.resolved_spec(ws).await?)
        .named(args.name.clone())
        .afterwards(if args.keep {
            Afterwards::KeepStopped
        } else {
            Afterwards::Delete
        });
    let timeout = Duration::from_secs(args.start_timeout);
    let end = ws
        .run_once(
            &one_shot,
            |name| async move {
                tokio::select! {
                    started = start_with_progress(ws, &name, timeout, json) => started.map(|_| true),
                    () = ctrl_c() => Ok(false),
                }
            },
            // The workspace's env (from --env) already applies to every command.
            |name| async move {
                let ran = exec_in(ws, &name, &args.exec, &[], json).await?;
                if matches!(ran, Ran::Exited(_)) {
                    copy_outputs(ws, &name, &args.outputs).await?;
                }
                Ok(ran)
            },
        )
        .await?;
    let name = end.workspace;
    if let Ok(Some(Ran::Interrupted { killed, pid })) = &end.outcome {
        report_interrupt(&name, *killed, *pid, false);
    }
    if let Err(e) = end.cleanup {
        eprintln!(
            "microagent: cleaning up workspace {name} failed: {}",
            e.full_message()
        );
    }
    match end.outcome {
        Ok(Some(Ran::Exited(code))) => Ok(code),
        // Interrupted while booting (`None`) or running.
        Ok(None | Some(Ran::Interrupted { .. })) => Ok(ExitCode::from(INTERRUPTED)),
        Err(e) => not_started(e, json),
    }
}
