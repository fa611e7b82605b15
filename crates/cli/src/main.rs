//! The `microagent` command.

mod browser_cmd;
mod code_cmd;
mod doctor_cmd;
mod exec_cmd;
mod files_cmd;
mod first_need;
mod fs_cmd;
mod image_cmd;
mod kernel_cmd;
mod logs_cmd;
mod network_cmd;
mod output;
mod plan_out;
mod pool_cmd;
mod port_cmd;
mod process_cmd;
mod remote_cmd;
mod repo_cmd;
mod secret_cmd;
mod serve_cmd;
mod server_cmd;
mod snapshot_cmd;
mod task_cmd;
mod terminal_cmd;
mod vmm_cmd;
mod volume_cmd;
mod watch_cmd;
mod workspace_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use workspace::EXEC_FAILURE_EXIT_CODE;
use workspace::{ErrorCode, ListFilter, State, Workspaces};
use workspace::{DEFAULT_START_TIMEOUT, DEFAULT_STOP_TIMEOUT};

/// The first commands people type, under the top-level help.
const EXAMPLES: &str = "\
Examples:
  microagent run -- uname -a            a command in a fresh workspace, deleted after
  microagent create dev -m 1g --cpus 2  a workspace to keep (`--image debian` for python3, git)
  microagent start dev
  microagent exec dev -w /tmp -- ls     a command in it
  microagent shell dev                  a shell on this terminal
  microagent cp ./src dev:/work         copy in (dev:/path ./here copies out)
  microagent ls                         the workspaces
  microagent rm -yf dev                 delete it without asking, running or not
  microagent serve mcp                  the MCP server agents register (stdio)
  microagent doctor                     what this host can run";

/// Disposable Linux workspaces as KVM microVMs.
#[derive(Debug, Parser)]
#[command(name = "microagent", version, about, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Run the command on this server (`server ls`), not where its
    /// workspace lives; `create --server NAME` places a workspace there.
    #[arg(long, global = true, value_name = "NAME")]
    server: Option<String>,
    /// Print results (and errors) as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// The namespace names are in and listings show (`*`: every one, for
    /// listings); a full name `NAME.NAMESPACE` works from any.
    #[arg(
        short = 'n',
        long,
        global = true,
        env = "MICROAGENT_NAMESPACE",
        default_value = workspace::store::name::DEFAULT_NAMESPACE
    )]
    namespace: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One-shot: create, start, run a command, delete; exits with its status.
    #[command(after_help = "\
Examples:
  microagent run -- uname -a
  microagent run --image debian -m 1g -- python3 -c 'print(1 + 1)'
  microagent run --shell -- 'cd /tmp && ls -la'")]
    Run(exec_cmd::RunArgs),
    /// Create a workspace (stopped; `start` boots it).
    #[command(after_help = "\
Examples:
  microagent create dev
  microagent create py --image debian -m 1g --cpus 2 --disk 10g
  microagent create web -p 8080:80 --ttl 2h
  microagent create ci --image python:3.12-slim     (pulled from a registry)")]
    Create {
        /// Name: lowercase letters, digits and '-', starting with a letter.
        name: String,
        #[command(flatten)]
        spec: workspace_cmd::SpecArgs,
    },
    /// Boot a workspace and wait until its agent answers. A workspace never
    /// started before resumes its image's warm snapshot when there is one.
    Start {
        /// Workspace names (each in turn).
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Boot the kernel even when a warm snapshot could be used.
        #[arg(long)]
        cold: bool,
        /// Seconds to wait for the boot.
        #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_START_TIMEOUT.as_secs())]
        timeout: u64,
    },
    /// Run a command in a running workspace; exits with the command's status.
    #[command(after_help = "\
Examples:
  microagent exec dev -- ls -la /
  microagent exec dev -w /work -e DEBUG=1 -- make test
  microagent exec dev --shell -- 'ps | grep sleep'
  microagent exec dev -d -- python3 -m http.server 8000   (in the background: `ps dev`)
  microagent exec -it dev -- top                          (on a terminal)")]
    Exec {
        /// Workspace name.
        name: String,
        #[command(flatten)]
        args: exec_cmd::ExecArgs,
    },
    /// Open a login shell in a running workspace on this terminal (bash if
    /// the image has it, else sh); exits with the shell's status.
    Shell {
        /// Workspace name.
        name: String,
        /// Environment variable (repeatable).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE", value_parser = output::key_value)]
        env: Vec<(String, String)>,
    },
    /// Copy a file or directory in or out: `cp ./src dev:/work`,
    /// `cp dev:/etc/os-release ./os-release`. A file replaces a guest file
    /// and a directory merges into a guest directory; on the host an
    /// existing path is replaced (file) or merged into (directory) only with
    /// --overwrite.
    Cp {
        /// Source (host path, or NAME:/path).
        src: String,
        /// Destination (host path, or NAME:/path).
        dst: String,
        /// Replace an existing host file, or merge into an existing host
        /// directory.
        #[arg(long)]
        overwrite: bool,
        /// Copy git metadata out too (paths through a `.git`: its hooks and
        /// config run code at your next git command). Left out by default.
        #[arg(long)]
        include_git_metadata: bool,
        /// Only say what the copy would do (nothing is copied).
        #[arg(long)]
        preview: bool,
    },
    /// List workspaces.
    #[command(visible_alias = "ls")]
    List {
        /// Only workspaces in this state.
        #[arg(long, value_parser = workspace_cmd::parse_state)]
        state: Option<State>,
        /// Only workspaces of this image.
        #[arg(long)]
        image: Option<String>,
        /// Only workspaces with this label (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = output::key_value)]
        labels: Vec<(String, String)>,
        /// Only workspaces this agent owns (made by its MCP session).
        #[arg(long, value_name = "AGENT")]
        agent: Option<String>,
    },
    /// Show a workspace: state, VMM, resources, ages, last exit.
    Inspect {
        /// Workspace name.
        name: String,
    },
    /// Show a workspace's serial console, or with --service the output of
    /// one of its services.
    Logs {
        /// Workspace name.
        name: String,
        /// Only the last N lines (`-n` is the namespace here, as in
        /// kubectl: `--tail N` or `-l N`).
        #[arg(
            short = 'l',
            long = "lines",
            visible_alias = "tail",
            conflicts_with = "service"
        )]
        lines: Option<usize>,
        /// Keep printing new output.
        #[arg(short = 'f', long)]
        follow: bool,
        /// A service's command's output (stdout, then stderr) instead.
        #[arg(long, value_name = "SERVICE")]
        service: Option<String>,
    },
    /// Shut a workspace down cleanly; tear it down after the timeout.
    Stop {
        /// Workspace names (each in turn).
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Seconds the guest gets to shut down.
        #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_STOP_TIMEOUT.as_secs())]
        timeout: u64,
    },
    /// Delete a workspace and its disk.
    #[command(visible_aliases = ["rm", "remove"])]
    Delete {
        /// Workspace names (each in turn).
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
        /// Halt it first if it is running.
        #[arg(long, short = 'f')]
        force: bool,
    },
    /// Start a new workspace as a fork of a running one (memory included),
    /// or of one of its snapshots.
    Fork {
        /// The workspace to fork.
        workspace: String,
        /// The new workspace's name.
        new_name: String,
        /// Fork from this snapshot instead of the live workspace.
        #[arg(long)]
        snapshot: Option<String>,
        /// Seconds to wait for the fork's agent.
        #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_START_TIMEOUT.as_secs())]
        timeout: u64,
    },
    /// Write a running workspace's whole machine into its directory and end
    /// its VMM: it then costs no memory and no CPU, and the next command,
    /// copy, terminal or `resume` restores it as it was (processes, open
    /// files, /tmp). `stop` discards it.
    Hibernate {
        /// Workspace name.
        name: String,
        /// Seconds the machine may take to be written.
        #[arg(long, value_name = "SECONDS", default_value_t = workspace::DEFAULT_HIBERNATE_TIMEOUT.as_secs())]
        timeout: u64,
    },
    /// Restore a hibernated workspace now, or run a paused one again.
    Resume {
        /// Workspace name.
        name: String,
    },
    /// Tear a workspace's VM down at once (unsynced guest writes are lost).
    Halt {
        /// Workspace names (each in turn).
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
    /// Set a workspace's TTL in seconds (from now if running), or `off`.
    Ttl {
        /// Workspace name.
        name: String,
        /// Seconds or a duration (`30m`, `1h`, `1h30m`, `2d`), or `off`.
        ttl: String,
        /// Add TTL to what is left instead of setting it.
        #[arg(long)]
        extend: bool,
    },
    /// Show a workspace's events (created, started, exec, stopped, crashed, ...).
    Events {
        /// Workspace name.
        name: String,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Keep printing new events.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Wait up to this many seconds for an event when none is there yet.
        #[arg(long, value_name = "SECONDS")]
        wait: Option<u64>,
    },
    /// What a workspace (or every workspace) uses now: guest CPU over a 1 s
    /// sample, guest memory, the VMM's host memory, disk, uptime, network.
    Metrics {
        /// Workspace name (default: all).
        name: Option<String>,
    },
    /// Print each change under a guest path as it comes (created,
    /// modified, deleted, moved) until Ctrl-C: `watch dev /work -r`.
    Watch {
        /// Workspace name (running).
        name: String,
        /// Absolute guest path: a directory, or a file.
        path: String,
        /// Every directory below it too (those made later included).
        #[arg(short, long)]
        recursive: bool,
    },
    /// List a workspace's background processes (`exec --detach`).
    Ps {
        /// Workspace name.
        name: String,
    },
    /// Background processes: `process output dev proc-1 --follow`,
    /// `process wait`, `process signal`, `process stdin`, `process rm`.
    #[command(subcommand)]
    Process(process_cmd::ProcessCommand),
    /// File operations in a running workspace: `fs stat dev /etc/hosts`,
    /// `fs mkdir`, `fs rm [-r] [--preview]`, `fs mv`, `fs edit --old T
    /// --new T [--count N]`, `fs find dev /src '*.rs'`.
    #[command(subcommand)]
    Fs(fs_cmd::FsCommand),
    /// A headless browser in the workspace, driven by accessibility
    /// snapshots: `browser open dev http://...`, `browser click dev e3`,
    /// `browser fill dev e2 --value x`, `browser screenshot dev page.png`.
    #[command(subcommand)]
    Browser(browser_cmd::BrowserCommand),
    /// Code sessions (a Jupyter kernel that keeps variables between runs):
    /// `code dev` is a REPL, `code run dev -- 'x + 1'` one run, `code ls
    /// dev`, `code restart dev code-1`, `code stop dev code-1`.
    Code(code_cmd::CodeArgs),
    /// Manage snapshots of workspaces.
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCommand),
    /// Published ports: `port add dev 8080:80`, `port ls dev`, `port rm dev 8080`.
    #[command(subcommand)]
    Port(port_cmd::PortCommand),
    /// Manage images (kernel + root filesystem pairs).
    #[command(subcommand)]
    Image(image_cmd::ImageCommand),
    /// Named volumes: persistent disks workspaces mount (`volume create
    /// cache`, then `create WS --volume cache:/data`).
    #[command(subcommand)]
    Volume(volume_cmd::VolumeCommand),
    /// Host repositories workspaces may clone: `repo allow` (the
    /// allowlist), `create WS --repo ALIAS`, then `repo pull WS` / `repo
    /// diff WS` to see and bring back its commits.
    #[command(subcommand)]
    Repo(repo_cmd::RepoCommand),
    /// Coding-agent tasks on allowlisted repositories, each in its own
    /// workspace, their commits merged back: `task run --repo ALIAS
    /// "DESCRIPTION"`, `task ls|info|logs|wait|rm|slots`.
    #[command(subcommand)]
    Task(task_cmd::TaskCommand),
    /// Secrets: `secret set NAME` (value from stdin or --from-file, never
    /// printed), `secret ls`, `secret rm NAME`; commands get them with
    /// `--secret NAME` as an environment variable, their output masked.
    #[command(subcommand)]
    Secret(secret_cmd::SecretCommand),
    /// Pools of ready workspaces: `pool set IMAGE N` keeps N of IMAGE
    /// restored and paused, so a start of a fresh one of that image takes
    /// one (`inspect` says `start: pooled`); `pool ls`, `pool events`.
    #[command(subcommand)]
    Pool(pool_cmd::PoolCommand),
    /// Networks: `network create corp --backend tap --egress allowlist
    /// --allow pypi.org`, `network ls`, `network setup` (host changes for tap
    /// networks, by preview and --confirm token).
    #[command(subcommand)]
    Network(network_cmd::NetworkCommand),
    /// Servers: other hosts with microagent, reached over SSH (`server
    /// add box --ssh me@box`, `server ls`, `server status box`); `create
    /// --server box` puts a workspace there, and every command on it runs
    /// there.
    #[command(subcommand)]
    Server(server_cmd::ServerCommand),
    /// Guest kernels: `kernel ls` (built ones and those images carry),
    /// `kernel install` (from Debian's source or a file; preview, then confirm).
    #[command(subcommand)]
    Kernel(kernel_cmd::KernelCommand),
    /// Check that this host can run workspaces: KVM, its speed, guest
    /// kernel and images, state directory, free disk. Exit 1 on any failure.
    Doctor,
    /// Make this host ready: install the packages, build the guest kernel
    /// it needs and the `minimal` image, leaving what is there (`--with
    /// debian,browser` for more). Without --yes or --confirm it only shows
    /// the plan (packages, disk, time, files) and a token.
    Setup {
        #[command(flatten)]
        flags: plan_out::ConfirmFlags,
        /// Also build optional images: `debian` (python3, nodejs, git;
        /// in the same plan) and `browser` (Debian with headless Chromium,
        /// for `microagent browser`; previewed and confirmed as its own
        /// plan). Repeat or separate with commas.
        #[arg(long = "with", value_name = "IMAGE", value_delimiter = ',')]
        with: Vec<kernel_cmd::SetupExtra>,
    },
    /// Print the runtime contract (states, error codes, limits) as JSON.
    Contract,
    /// Serve microagent to other programs: `serve mcp` is the MCP server
    /// over stdin/stdout.
    #[command(subcommand)]
    Serve(serve_cmd::ServeCommand),
    /// Print a completion script for a shell: `source <(microagent
    /// completion bash)`, or save it where the shell loads completions
    /// (`/usr/share/bash-completion/completions/microagent`,
    /// `~/.zfunc/_microagent`, `~/.config/fish/completions/microagent.fish`).
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages (microagent.1 and one a subcommand) into a
    /// directory; a release bundle's are made with it.
    #[command(hide = true)]
    Man {
        /// The directory (made if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Low-level VMM commands: boot a kernel directly, probe the host's KVM.
    #[command(subcommand)]
    Vmm(vmm_cmd::VmmCommand),
    /// The server side of a workspace another host placed here: one call
    /// as JSON on stdin, its answer as JSON (hosts speak it over ssh).
    #[command(name = "workspace-call", hide = true)]
    WorkspaceCall,
}

impl Command {
    fn failure_status(&self) -> u8 {
        match self {
            Command::Exec { .. } | Command::Run(_) | Command::Shell { .. } => {
                EXEC_FAILURE_EXIT_CODE
            }
            _ => output::FAILURE,
        }
    }
}

/// The program beside this one that runs each workspace's VM.
const VMM_PROGRAM: &str = "microagent-vmm";

/// The namespace `--namespace` names (set once, before any store opens).
static NAMESPACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The namespace this command's names are in (`--namespace`, or
/// `MICROAGENT_NAMESPACE`, else the default).
pub(crate) fn namespace() -> &'static str {
    NAMESPACE
        .get()
        .map_or(workspace::store::name::DEFAULT_NAMESPACE, String::as_str)
}

/// The workspaces of `$MICROAGENT_HOME` seen from `--namespace`, whose VMM
/// processes run as the `microagent-vmm` installed beside this binary.
pub(crate) fn open_workspaces() -> workspace::Result<Workspaces> {
    let mut builder = Workspaces::builder();
    if let Ok(me) = std::env::current_exe() {
        builder = builder
            .vmm_program(me.with_file_name(VMM_PROGRAM))
            .standby_vmms(true);
    }
    builder.build()?.in_namespace(namespace())
}

fn init_logging() {
    // Logs go to stderr only: stdout carries results, JSON or the console;
    // commands people run say only what went wrong.
    let filter = tracing_subscriber::EnvFilter::try_from_env("MICROAGENT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run_workspace_command(
    ws: &Workspaces,
    command: &Command,
    json: bool,
) -> workspace::Result<ExitCode> {
    use workspace_cmd as w;
    match command {
        Command::Image(cmd) => image_cmd::run(ws, cmd, json).await,
        Command::Volume(cmd) => volume_cmd::run(ws, cmd, json).await,
        Command::Repo(cmd) => repo_cmd::run(ws, cmd, json).await,
        Command::Task(cmd) => task_cmd::run(ws, cmd, json).await,
        Command::Secret(cmd) => secret_cmd::run(ws, cmd, json),
        Command::Pool(cmd) => pool_cmd::run(ws, cmd, json),
        Command::Kernel(cmd) => kernel_cmd::run(ws, cmd, json).await,
        Command::Setup { flags, with } => kernel_cmd::setup(ws, flags, with, json).await,
        Command::Snapshot(cmd) => snapshot_cmd::run(ws, cmd, json).await,
        Command::Port(cmd) => port_cmd::run(ws, cmd, json),
        Command::Network(cmd) => network_cmd::run(ws, cmd, json),
        Command::Server(cmd) => server_cmd::run(ws, cmd, json).await,
        Command::Fork {
            workspace,
            new_name,
            snapshot,
            timeout,
        } => {
            snapshot_cmd::fork(
                ws,
                workspace,
                new_name,
                snapshot.as_deref(),
                std::time::Duration::from_secs(*timeout),
                json,
            )
            .await
        }
        Command::Create { name, spec } => w::create(ws, name, spec, json).await,
        Command::Start {
            names,
            cold,
            timeout,
        } => {
            w::each(names, json, |n| async move {
                w::start(ws, &n, *cold, *timeout, json).await
            })
            .await
        }
        Command::Stop { names, timeout } => {
            w::each(names, json, |n| async move {
                w::stop(ws, &n, *timeout, json).await
            })
            .await
        }
        Command::Hibernate { name, timeout } => w::hibernate(ws, name, *timeout, json).await,
        Command::Resume { name } => w::resume(ws, name, json).await,
        Command::Halt { names } => {
            w::each(names, json, |n| async move { w::halt(ws, &n, json) }).await
        }
        Command::Delete { names, yes, force } => {
            w::each(names, json, |n| async move {
                w::delete(ws, &n, *yes, *force, json)
            })
            .await
        }
        Command::List {
            state,
            image,
            labels,
            agent,
        } => {
            let filter = ListFilter {
                state: *state,
                image: image.clone(),
                labels: labels.clone(),
                // The host's human sees every agent's.
                all_agents: true,
                agent: agent.clone(),
            };
            remote_cmd::list_everywhere(ws, &filter, json).await
        }
        Command::Inspect { name } => w::inspect(ws, name, json),
        Command::Ttl { name, ttl, extend } => w::ttl(ws, name, ttl, *extend, json),
        Command::Exec { name, args } => {
            exec_cmd::check_modes(args, json)?;
            if args.detach {
                process_cmd::detach(ws, name, args, json).await
            } else if args.tty {
                let req = args.command.request(&args.env)?;
                terminal_cmd::run(ws, name, req, args.command.stdin).await
            } else {
                exec_cmd::exec(ws, name, args, json).await
            }
        }
        Command::Shell { name, env } => {
            let req = terminal_cmd::login_shell().envs(env.iter().cloned());
            terminal_cmd::run(ws, name, req, true).await
        }
        Command::Ps { name } => process_cmd::ps(ws, name, json).await,
        Command::Watch {
            name,
            path,
            recursive,
        } => watch_cmd::run(ws, name, path, *recursive, json).await,
        Command::Metrics { name } => w::metrics(ws, name.as_deref(), json).await,
        Command::Process(cmd) => process_cmd::run(ws, cmd, json).await,
        Command::Browser(cmd) => browser_cmd::run(ws, cmd, json).await,
        Command::Code(args) => code_cmd::run(ws, args, json).await,
        Command::Fs(cmd) => fs_cmd::run(ws, cmd, json).await,
        Command::Cp {
            src,
            dst,
            overwrite,
            include_git_metadata,
            preview,
        } => {
            let options = workspace::guest::copy::CopyOptions::default()
                .overwrite(*overwrite)
                .include_git_metadata(*include_git_metadata);
            files_cmd::cp(ws, src, dst, options, *preview, json).await
        }
        Command::Logs {
            name,
            lines,
            follow,
            service: Some(service),
        } => {
            debug_assert!(lines.is_none());
            process_cmd::service_logs(ws, name, service, *follow, json).await
        }
        Command::Logs {
            name,
            lines,
            follow,
            service: None,
        } => logs_cmd::logs(ws, name, *lines, *follow, json).await,
        Command::Events {
            name,
            after,
            follow,
            wait,
        } => logs_cmd::events(ws, name, *after, *follow, *wait, json).await,
        Command::Run(args) => exec_cmd::run(ws, args, json).await,
        Command::WorkspaceCall => server_cmd::answer_call(ws).await,
        Command::Doctor
        | Command::Contract
        | Command::Vmm(_)
        | Command::Serve(_)
        | Command::Completion { .. }
        | Command::Man { .. } => {
            unreachable!("handled before the workspace store is opened, or forwarded")
        }
    }
}

fn main() -> ExitCode {
    init_logging();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if std::env::args().any(|a| a == "--json") {
                let message = e.render().to_string();
                let first = message
                    .lines()
                    .next()
                    .unwrap_or("bad usage")
                    .trim_start_matches("error: ");
                return output::report(ErrorCode::InvalidInput, first, true, output::USAGE);
            }
            let _ = e.print();
            return ExitCode::from(output::USAGE);
        }
    };
    let json = cli.json;
    let _ = NAMESPACE.set(cli.namespace.clone());
    if json {
        // These commands have no JSON output: --json is a usage error, as
        // it was when each command declared its own.
        let without = match cli.command {
            Command::Shell { .. } => Some("shell"),
            Command::Serve(_) => Some("serve"),
            Command::Completion { .. } => Some("completion"),
            Command::Man { .. } => Some("man"),
            _ => None,
        };
        if let Some(command) = without {
            return output::report(
                ErrorCode::InvalidInput,
                &format!("--json does not apply to {command}"),
                true,
                output::USAGE,
            );
        }
    }
    // `doctor` and `contract` with `--server` run there (forwarded below).
    let elsewhere = cli
        .server
        .as_deref()
        .is_some_and(|s| s != workspace::servers::LOCAL_SERVER);
    match cli.command {
        Command::Vmm(_) | Command::Serve(_) | Command::Completion { .. } | Command::Man { .. }
            if elsewhere =>
        {
            return output::report(
                ErrorCode::InvalidInput,
                "--server does not apply to vmm, serve and completion: they run on this host; run them on the server itself",
                json,
                output::USAGE,
            );
        }
        Command::Doctor if !elsewhere => return anyhow_exit(doctor_cmd::run(json)),
        Command::Vmm(cmd) => return anyhow_exit(vmm_cmd::run(cmd, json)),
        Command::Serve(cmd) => return serve_cmd::run(cmd),
        Command::Completion { shell } => {
            use clap::CommandFactory;
            // Written whole afterwards: a reader that closes early (`| head`)
            // ends it quietly rather than in a panic.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "microagent", &mut script);
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            return ExitCode::SUCCESS;
        }
        Command::Man { out } => {
            use clap::CommandFactory;
            let written = std::fs::create_dir_all(&out)
                .and_then(|()| clap_mangen::generate_to(Cli::command(), &out));
            return match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => output::report(
                    ErrorCode::Internal,
                    &format!("writing the manual pages into {}: {e}", out.display()),
                    false,
                    output::FAILURE,
                ),
            };
        }
        Command::Contract if !elsewhere => {
            output::json(&workspace::contract());
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let status = cli.command.failure_status();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return output::report(
                ErrorCode::Internal,
                &format!("cannot start the async runtime: {e}"),
                json,
                status,
            )
        }
    };
    let result = runtime.block_on(async {
        let ws = open_workspaces()?;
        let server = cli.server.as_deref();
        let forwarded = match cli.command {
            Command::Server(_) => None,
            _ => remote_cmd::forward_if_remote(&ws, &cli.command, server, json).await?,
        };
        if let Some(code) = forwarded {
            return Ok(code);
        }
        run_workspace_command(&ws, &cli.command, json).await
    });
    match result {
        Ok(code) => code,
        Err(e) => output::error(&e, json, status),
    }
}

fn anyhow_exit(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("microagent: error: {}", output::field(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        // Catches clashing flags (e.g. two `--env` in `run`) before a user does.
        Cli::command().debug_assert();
    }

    #[test]
    fn json_is_one_global_flag() {
        let parsed = |args: &[&str]| Cli::try_parse_from(args).unwrap().json;
        assert!(parsed(&["microagent", "list", "--json"]));
        assert!(parsed(&["microagent", "--json", "image", "ls"]));
        assert!(parsed(&["microagent", "image", "ls", "--json"]));
        assert!(!parsed(&["microagent", "list"]));
    }
}
