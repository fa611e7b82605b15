//! microagent-agent: the guest agent. Serves the protocol of
//! docs/guest-agent-protocol.md on a vsock port (in a guest) or a Unix
//! socket (tests), one thread per connection. It may run as PID 1: it
//! reaps every child, never exits on its own, and retries listening
//! rather than exiting (which would panic the kernel).

/// Logs a line to stderr (the guest console when PID 1).
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("microagent-agent: {}", format_args!($($arg)*))
    };
}

mod agent;

use std::path::PathBuf;
use std::time::Duration;

use agent::listen::Listener;
use agent::Config;
use guest_agent::protocol::{DEFAULT_VSOCK_PORT, IDLE_TIMEOUT};

const USAGE: &str = "\
usage: microagent-agent [--vsock-port PORT | --unix PATH] [options]

  --vsock-port PORT        listen on AF_VSOCK port PORT, any CID (default 1024)
  --unix PATH              listen on the Unix socket PATH instead
  --idle-timeout-ms MS     drop a client silent this long (default 60000)
  --max-connections N      connections served at once (default 1024)
  --verbose                log every request to stderr
  --warm-up                run one `true` through the exec path before serving
                           (always as PID 1)
  --version, --help";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Listen {
    Vsock(u32),
    Unix(PathBuf),
}

#[derive(Debug)]
struct Args {
    listen: Listen,
    idle_timeout: Duration,
    max_connections: usize,
    verbose: bool,
    warm_up: bool,
}

enum Parsed {
    Run(Args),
    Exit(&'static str),
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Parsed, String> {
    let mut parsed = Args {
        listen: Listen::Vsock(DEFAULT_VSOCK_PORT),
        idle_timeout: IDLE_TIMEOUT,
        max_connections: 1024,
        verbose: false,
        warm_up: false,
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--vsock-port" => {
                let v = value("--vsock-port")?;
                let port = v.parse().map_err(|_| format!("bad port {v:?}"))?;
                parsed.listen = Listen::Vsock(port);
            }
            "--unix" => parsed.listen = Listen::Unix(PathBuf::from(value("--unix")?)),
            "--idle-timeout-ms" => {
                let v = value("--idle-timeout-ms")?;
                let ms: u64 = v.parse().map_err(|_| format!("bad timeout {v:?}"))?;
                parsed.idle_timeout = Duration::from_millis(ms.max(1));
            }
            "--max-connections" => {
                let v = value("--max-connections")?;
                parsed.max_connections = v.parse().map_err(|_| format!("bad count {v:?}"))?;
            }
            "--verbose" => parsed.verbose = true,
            "--warm-up" => parsed.warm_up = true,
            "--help" | "-h" => return Ok(Parsed::Exit(USAGE)),
            "--version" => {
                return Ok(Parsed::Exit(concat!(
                    "microagent-agent ",
                    env!("CARGO_PKG_VERSION")
                )))
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Parsed::Run(parsed))
}

fn main() {
    let pid1 = std::process::id() == 1;
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Exit(text)) => {
            println!("{text}");
            return;
        }
        Err(e) if pid1 => {
            log!("{e}; using the defaults");
            match parse_args(std::iter::empty()) {
                Ok(Parsed::Run(args)) => args,
                _ => unreachable!("no arguments parse to the defaults"),
            }
        }
        Err(e) => {
            eprintln!("microagent-agent: {e}\n{USAGE}");
            #[allow(clippy::exit)] // the binary's main decides
            std::process::exit(2);
        }
    };
    // Orphans of exec'd processes are re-parented to us and reaped by the
    // reaper (PID 1 gets them anyway).
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        log!(
            "cannot become a child subreaper: {}",
            std::io::Error::last_os_error()
        );
    }
    if pid1 {
        // Before serving, so the first command already has its network.
        agent::net::configure_from_cmdline();
    }
    // Processes start in `/` unless asked otherwise, by inheriting it.
    if let Err(e) = std::env::set_current_dir("/") {
        log!("cannot change to /: {e}; commands without a cwd start where the agent is");
    }
    let config = Config {
        idle_timeout: args.idle_timeout,
        max_connections: args.max_connections,
        verbose: args.verbose,
        // In a guest the warm snapshot keeps it; a test's agent on the host
        // only when asked (it would run the host's `true`).
        warm_up: args.warm_up || pid1,
        dial: match &args.listen {
            Listen::Vsock(_) => agent::forward::Dial::Vsock,
            Listen::Unix(path) => agent::forward::Dial::Unix(path.clone()),
        },
    };
    loop {
        let listener = match &args.listen {
            Listen::Vsock(port) => Listener::vsock(*port),
            Listen::Unix(path) => Listener::unix(path),
        };
        let failure = match listener {
            Ok(listener) => {
                log!(
                    "listening on {:?} (pid {})",
                    args.listen,
                    std::process::id()
                );
                let e = agent::serve(listener, config.clone());
                format!("starting the reaper thread: {e}")
            }
            Err(e) => agent::error_chain(&e),
        };
        if !pid1 {
            log!("{failure}");
            #[allow(clippy::exit)] // the binary's main decides
            std::process::exit(1);
        }
        // As PID 1, exiting would panic the kernel: keep trying.
        log!("{failure}; retrying in 1 s");
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_parse() {
        let Ok(Parsed::Run(a)) = parse(&[]) else {
            panic!()
        };
        assert_eq!(a.listen, Listen::Vsock(1024));
        assert_eq!(a.idle_timeout, Duration::from_secs(60));
        let Ok(Parsed::Run(a)) = parse(&["--unix", "/tmp/s", "--idle-timeout-ms", "500"]) else {
            panic!()
        };
        assert_eq!(a.listen, Listen::Unix("/tmp/s".into()));
        assert_eq!(a.idle_timeout, Duration::from_millis(500));
        assert!(parse(&["--vsock-port"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        let Ok(Parsed::Run(a)) = parse(&["--warm-up"]) else {
            panic!()
        };
        assert!(a.warm_up);
        assert!(matches!(parse(&["--help"]), Ok(Parsed::Exit(_))));
    }
}
