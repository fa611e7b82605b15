//! `microagent serve mcp`: the MCP server over stdin/stdout, or over
//! Streamable HTTP with `--http` (see docs/mcp.md). Stdout carries
//! JSON-RPC only; logs go to stderr. `microagent serve preview ADDR`:
//! preview URLs alone, without the MCP endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// Serve the workspaces as MCP tools over stdin/stdout until stdin
    /// closes. From a terminal, print how to register it with MCP clients.
    Mcp {
        /// A host directory the tools may copy from and to (copy_in,
        /// copy_out, image_import); repeatable. Default: the server's working
        /// directory, the project the client started it for. Paths outside
        /// every such directory, also through symlinks, are FORBIDDEN.
        #[arg(long = "allow-host-path", value_name = "DIR")]
        allow_host_paths: Vec<PathBuf>,
        /// Let tools apply host changes with a preview's token
        /// (kernel_install, image_build from debian:*,
        /// host_networking_setup). Without it they preview only, and
        /// applying is FORBIDDEN: a client could confirm its own token.
        #[arg(long)]
        allow_host_changes: bool,
        /// Let port_publish listen on non-loopback host addresses
        /// (reachable from other machines). Without it: 127.0.0.1 or ::1.
        #[arg(long)]
        allow_public_ports: bool,
        /// Let egress rules open the host's side of the network: host
        /// ports (`host:PORT`), loopback, link-local (the cloud metadata
        /// address), private, shared and multicast ranges, and ranges wider
        /// than one address. Without it those rules are FORBIDDEN over MCP
        /// (the CLI keeps them).
        #[arg(long)]
        allow_host_egress: bool,
        /// A secret (from `microagent secret set`) tools may give commands
        /// as an environment variable (`secrets: [NAME]`); repeatable.
        /// Others are FORBIDDEN. Values never reach the client: output
        /// shows `***`.
        #[arg(long = "allow-secret", value_name = "NAME")]
        allow_secrets: Vec<String>,
        /// The agent this session is (agent_list shows it; its record goes
        /// when the session ends). Over HTTP each session registers its
        /// own with agent_register.
        #[arg(long, value_name = "NAME", conflicts_with = "http")]
        agent: Option<String>,
        #[command(flatten)]
        http: HttpArgs,
    },
    /// Serve the state directory's preview URLs (`port preview`,
    /// `port_preview`) at http://ADDR/preview/<token>/ until SIGINT or
    /// SIGTERM, without the MCP endpoint: each URL's token is its access.
    Preview {
        /// The address (for example 127.0.0.1:8430; port 0 picks one).
        addr: SocketAddr,
        /// Allow an address other machines reach; it needs --tls-cert and
        /// --tls-key too (the tokens are in the URLs).
        #[arg(long)]
        public: bool,
        /// PEM certificate chain for HTTPS (with --tls-key).
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// PEM private key of --tls-cert.
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// A web origin (scheme://host[:port]) whose pages may call the
        /// previews, besides the server's own; repeatable.
        #[arg(long = "allowed-origin", value_name = "ORIGIN")]
        allowed_origins: Vec<String>,
        /// The DNS domain under which each preview gets a host name, so a
        /// web origin, of its own (`pv<id>.DOMAIN`: a wildcard name that
        /// reaches this server, and with TLS a wildcard certificate).
        /// Default on a loopback address: localhost (browsers and curl
        /// resolve `*.localhost` to loopback); elsewhere previews are
        /// served only on the server's address, where browsers sandbox
        /// their pages.
        #[arg(long, value_name = "DOMAIN")]
        preview_domain: Option<String>,
    },
    /// Wait for an MCP server process to end, then delete its session
    /// workspaces (started detached by the server).
    #[command(hide = true)]
    WatchOwner {
        /// The server's pid.
        pid: u32,
        /// Its start time in clock ticks after boot.
        ticks: u64,
    },
    /// Bring an image's pool of ready workspaces to its size (started
    /// detached by a claim, `pool set` or `pool ls`).
    #[command(hide = true)]
    FillPool {
        /// The image.
        image: String,
        /// Wait this long first (after a claim: the claimed workspace's
        /// first commands come first).
        #[arg(long, default_value_t = 0)]
        after_ms: u64,
    },
}

/// Serving over Streamable HTTP instead of stdio.
#[derive(Debug, clap::Args)]
pub struct HttpArgs {
    /// Serve MCP's Streamable HTTP transport on this address (for example
    /// 127.0.0.1:8765; port 0 picks a free one) at the path /mcp, to many
    /// clients at once, until SIGINT or SIGTERM.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// The bearer token clients must send, from this file (its first line).
    /// Default: the state directory's mcp-token, made (0600) and printed
    /// on first use.
    #[arg(long, value_name = "FILE", requires = "http", conflicts_with = "dev")]
    token_file: Option<PathBuf>,
    /// No token: for development, and only on a loopback address.
    #[arg(long, requires = "http")]
    dev: bool,
    /// Allow an address other machines reach; it needs --tls-cert and
    /// --tls-key too.
    #[arg(long, requires = "http")]
    public: bool,
    /// PEM certificate chain for HTTPS (with --tls-key).
    #[arg(long, value_name = "FILE", requires_all = ["http", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires_all = ["http", "tls_cert"])]
    tls_key: Option<PathBuf>,
    /// A web origin (scheme://host[:port]) whose pages may call the server,
    /// besides its own address; repeatable. Requests from other origins,
    /// or naming another Host, get 403.
    #[arg(long = "allowed-origin", value_name = "ORIGIN", requires = "http")]
    allowed_origins: Vec<String>,
    /// The DNS domain under which each preview gets a host name, so a
    /// web origin, of its own (`pv<id>.DOMAIN`: a wildcard name that
    /// reaches this server, and with TLS a wildcard certificate).
    /// Default on a loopback address: localhost (browsers and curl
    /// resolve `*.localhost` to loopback); elsewhere previews are
    /// served only on the server's address, where browsers sandbox
    /// their pages.
    #[arg(long, value_name = "DOMAIN", requires = "http")]
    preview_domain: Option<String>,
    /// Connections open at once. At the limit a new connection closes the
    /// oldest one that has not yet sent a request with the token; when all
    /// have, the new one is closed.
    #[arg(long, value_name = "N", requires = "http",
          default_value_t = mcp::http::limits::DEFAULT_MAX_CONNECTIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,
    /// End a session whose client has sent nothing (and that has no call
    /// running) for this many seconds; its session-scoped workspaces go
    /// with it.
    #[arg(long, value_name = "SECONDS", requires = "http",
          default_value_t = mcp::http::DEFAULT_SESSION_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(2..=86_400))]
    session_timeout: u64,
}

pub fn run(cmd: ServeCommand) -> ExitCode {
    match cmd {
        ServeCommand::FillPool { image, after_ms } => {
            let filled = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(workspace::Error::host_io("starting the async runtime"))
                .and_then(|rt| {
                    rt.block_on(async {
                        crate::open_workspaces()?
                            .pools()
                            .fill(&image, std::time::Duration::from_millis(after_ms))
                            .await
                    })
                });
            match filled {
                Ok(added) => {
                    if added > 0 {
                        eprintln!("microagent: pool of {image}: {added} member(s) added");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!(
                        "microagent: pool of {image} not filled: {}",
                        e.full_message()
                    );
                    ExitCode::FAILURE
                }
            }
        }
        ServeCommand::WatchOwner { pid, ticks } => {
            let owner = workspace::store::spec::Owner {
                pid,
                start_ticks: ticks,
            };
            match crate::open_workspaces().and_then(|ws| ws.delete_when_ended(owner)) {
                Ok(deleted) => {
                    for name in deleted {
                        eprintln!("microagent: deleted workspace {name}: its MCP server (pid {pid}) ended before its session did");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("microagent: error: {}", e.full_message());
                    ExitCode::FAILURE
                }
            }
        }
        ServeCommand::Preview {
            addr,
            public,
            tls_cert,
            tls_key,
            allowed_origins,
            preview_domain,
        } => {
            let runtime = match server_runtime() {
                Ok(rt) => rt,
                Err(failed) => return failed,
            };
            let tls = tls_cert.zip(tls_key);
            runtime.block_on(serve_previews(
                addr,
                public,
                tls,
                allowed_origins,
                preview_domain,
            ))
        }
        ServeCommand::Mcp {
            allow_host_paths,
            allow_host_changes,
            allow_public_ports,
            allow_host_egress,
            allow_secrets,
            agent,
            http,
        } => {
            let mut grants = mcp::Grants::default()
                .host_changes(allow_host_changes)
                .public_ports(allow_public_ports)
                .host_egress(allow_host_egress);
            for name in allow_secrets {
                if let Err(e) = workspace::secrets::validate_secret_name(&name) {
                    eprintln!("microagent: error: --allow-secret: {e}");
                    return ExitCode::FAILURE;
                }
                grants = grants.allow_secret(name);
            }
            let dirs = if allow_host_paths.is_empty() {
                match std::env::current_dir() {
                    Ok(cwd) => vec![cwd],
                    Err(e) => {
                        eprintln!("microagent: error: cannot find the working directory ({e}); pass --allow-host-path DIR");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                allow_host_paths
            };
            let roots = match mcp::HostRoots::new(&dirs) {
                Ok(roots) => roots,
                Err(e) => {
                    eprintln!(
                        "microagent: error: {}; pass existing directories to --allow-host-path",
                        workspace::error_chain(&e)
                    );
                    return ExitCode::FAILURE;
                }
            };
            let runtime = match server_runtime() {
                Ok(rt) => rt,
                Err(failed) => return failed,
            };
            if http.http.is_some() {
                return runtime.block_on(serve_http(http, roots, grants));
            }
            let served = runtime.block_on(mcp::serve_stdio(
                crate::open_workspaces,
                roots,
                grants,
                agent.as_deref(),
            ));
            // Tool calls still running past the shutdown grace are not
            // waited for.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("microagent: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `serve mcp --http`: checks the options, finds the token, serves until a
/// signal.
async fn serve_http(args: HttpArgs, roots: mcp::HostRoots, grants: mcp::Grants) -> ExitCode {
    let fail = |what: String| {
        eprintln!("microagent: error: {what}");
        ExitCode::FAILURE
    };
    let Some(bind) = args.http else {
        return fail("--http needs an address".into());
    };
    if let Err(why) = public_allowed(bind, args.public) {
        return fail(why);
    }
    // Before a token is made: a start refused anyway leaves nothing.
    if let Err(e) = mcp::http::check_exposure(bind, !args.dev, args.tls_cert.is_some()) {
        return fail(http_error(&e));
    }
    let ws = match store_to_serve() {
        Ok(ws) => ws,
        Err(why) => return fail(why),
    };
    let token = if args.dev {
        None
    } else if let Some(file) = &args.token_file {
        match mcp::http::token::read(file) {
            Ok(token) => Some(token),
            Err(e) => return fail(format!("--token-file: {}", workspace::error_chain(&e))),
        }
    } else {
        let path = ws.state_dir().root().join("mcp-token");
        match mcp::http::token::read_or_make(&path) {
            Ok((token, made)) => {
                if made {
                    eprintln!(
                        "microagent: made the MCP bearer token (kept in {}; shown this once):\n{token}",
                        path.display()
                    );
                }
                Some(token)
            }
            Err(e) => return fail(workspace::error_chain(&e)),
        }
    };
    let options = mcp::http::HttpOptions {
        bind,
        token,
        tls: args.tls_cert.zip(args.tls_key),
        allowed_origins: args.allowed_origins,
        max_connections: args.max_connections as usize,
        session_timeout: std::time::Duration::from_secs(args.session_timeout),
        previews_only: false,
        preview_domain: args.preview_domain,
    };
    raise_open_file_limit(args.max_connections as usize);
    let server = mcp::MicroagentServer::new(ws, roots).with_grants(grants);
    let http = match mcp::http::HttpServer::bind(server, options).await {
        Ok(http) => http,
        Err(e) => return fail(http_error(&e)),
    };
    let auth = if args.dev {
        "no token: with --dev any user or program on this machine can use it"
    } else {
        "send Authorization: Bearer <token>"
    };
    eprintln!(
        "microagent: serving MCP at {} ({auth}); stop with Ctrl-C",
        http.url()
    );
    http.run(stop_signal()).await;
    ExitCode::SUCCESS
}

/// The runtime a server runs on; when it cannot start, what was said
/// and the exit status.
fn server_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("microagent: error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// Refuses an address other machines reach unless `--public` says so.
fn public_allowed(bind: SocketAddr, public: bool) -> Result<(), String> {
    if bind.ip().is_loopback() || public {
        return Ok(());
    }
    Err(format!(
        "{bind} is reachable from other machines; pass --public (with --tls-cert and --tls-key) to serve it, or use 127.0.0.1"
    ))
}

/// The workspace store a server serves, or what failed.
fn store_to_serve() -> Result<workspace::Workspaces, String> {
    crate::open_workspaces()
        .map_err(|e| format!("cannot open the workspace store: {}", e.full_message()))
}

/// `serve preview`: preview URLs alone, until a signal.
async fn serve_previews(
    bind: SocketAddr,
    public: bool,
    tls: Option<(PathBuf, PathBuf)>,
    allowed_origins: Vec<String>,
    preview_domain: Option<String>,
) -> ExitCode {
    let fail = |what: String| {
        eprintln!("microagent: error: {what}");
        ExitCode::FAILURE
    };
    if let Err(why) = public_allowed(bind, public) {
        return fail(why);
    }
    let ws = match store_to_serve() {
        Ok(ws) => ws,
        Err(why) => return fail(why),
    };
    let roots = match mcp::HostRoots::new(&[]) {
        Ok(roots) => roots,
        Err(e) => return fail(workspace::error_chain(&e)),
    };
    let options = mcp::http::HttpOptions {
        bind,
        token: None,
        tls,
        allowed_origins,
        max_connections: mcp::http::limits::DEFAULT_MAX_CONNECTIONS,
        session_timeout: mcp::http::DEFAULT_SESSION_TIMEOUT,
        previews_only: true,
        preview_domain,
    };
    let server = mcp::MicroagentServer::new(ws, roots);
    let http = match mcp::http::HttpServer::bind(server, options).await {
        Ok(http) => http,
        Err(e) => return fail(http_error(&e)),
    };
    let base = http.url();
    let own = match http.preview_origins() {
        Some(own) => format!("{own}/preview/<token>/ on its own origin, and "),
        None => String::new(),
    };
    eprintln!(
        "microagent: serving preview URLs at {base} (each at {own}{base}<token>/ sandboxed; make one with `microagent port preview NAME PORT`); stop with Ctrl-C"
    );
    http.run(stop_signal()).await;
    ExitCode::SUCCESS
}

/// Raises the soft limit on open files toward the hard one, so `max`
/// connections (and the descriptors workspaces use) fit; past the hard
/// limit the accept loop backs off instead (see `mcp::http::limits`).
fn raise_open_file_limit(max: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    // Room for the connections plus the server's own files and VMs.
    let wanted = (max as libc::rlim_t)
        .saturating_mul(2)
        .saturating_add(1024)
        .min(limit.rlim_max);
    if wanted > limit.rlim_cur {
        limit.rlim_cur = wanted;
        // SAFETY: setrlimit reads the struct we own; failing leaves the
        // limit as it was, which the accept loop copes with.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            tracing::debug!("could not raise the open-file limit");
        }
    }
}

/// What failed and what to do next.
fn http_error(e: &mcp::http::HttpError) -> String {
    let next = match e {
        mcp::http::HttpError::NoTokenOffLoopback(_) => {
            "; --dev (no token) serves loopback addresses only"
        }
        mcp::http::HttpError::NoTlsOffLoopback(_) => "; pass --tls-cert and --tls-key",
        mcp::http::HttpError::Bind { .. } => "; pick another address or port",
        mcp::http::HttpError::PreviewDomain(_) => {
            "; give a DNS name such as previews.example.com, whose wildcard *.previews.example.com reaches this server"
        }
        _ => "",
    };
    format!("{}{next}", workspace::error_chain(e))
}

/// SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
