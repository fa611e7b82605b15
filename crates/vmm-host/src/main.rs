//! `microagent-vmm`: the detached VMM process of one workspace, a program
//! of its own so that it carries only the VMM: no async runtime, command
//! line parser or MCP server in its resident memory. `microagent start`
//! runs it with the arguments `base::vmm::launch::VmmLaunch` writes; it owns
//! the process's signals, logging and exit status, and the library runs the
//! VM.

use std::process::ExitCode;

use base::vmm::launch::VmmLaunch;
use vmm_host::{VmmProcess, VmmStopper};

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(standby) = base::vmm::standby::standby_from_args(&args) {
        init_logging();
        return match vmm_host::standby::wait_for_claim(&standby) {
            Ok(Some(claimed)) => run(&claimed.launch, Some(claimed.ahead)),
            Ok(None) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("microagent-vmm: standby: {}", e.full_message());
                ExitCode::FAILURE
            }
        };
    }
    let Some(launch) = VmmLaunch::from_args(args) else {
        eprintln!(
            "microagent-vmm: runs one workspace's VM and is started by `microagent start`; it takes the arguments `{} {} --home DIR --kernel VARIANT [--restore DIR] NAME`",
            base::vmm::launch::VMM_SUBCOMMAND[0],
            base::vmm::launch::VMM_SUBCOMMAND[1]
        );
        return ExitCode::from(2);
    };
    init_logging();
    run(&launch, None)
}

/// Runs the workspace `launch` names until it ends (onto what a standby
/// made ahead for it, when given).
fn run(launch: &VmmLaunch, ahead: Option<vmm_host::standby::MadeAhead>) -> ExitCode {
    // Before any thread exists, so every thread inherits the mask and only
    // the signal thread below receives these.
    let signals = block_termination_signals();
    let ran = base::store::StateDir::at(&launch.home)
        .map_err(vmm_host::VmmProcessError::from)
        .and_then(|state| match ahead {
            Some(ahead) => VmmProcess::prepare_claimed(state, launch, ahead),
            None => VmmProcess::prepare(state, launch),
        })
        .and_then(|vmm| {
            vmm.run(|stopper| {
                std::thread::spawn(move || stop_on_signals(&stopper, signals));
            })
        });
    match ran {
        Ok(end) if !end.crashed => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("microagent-vmm: {}", e.full_message());
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, which is the workspace's `vmm.log`: how each run went
/// (info, or the level `MICROAGENT_LOG` names).
fn init_logging() {
    let level = std::env::var("MICROAGENT_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (and in every
/// thread it starts later); returns the set for [`stop_on_signals`].
fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; an all-zero value is then initialised
    // by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the calls only
    // write to it and to this thread's signal mask.
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// Turns SIGTERM/SIGINT/SIGHUP into a graceful stop (as `microagent stop`
/// does, so a host shutdown syncs the guest's disk); another one while
/// stopping tears the VM down at once.
fn stop_on_signals(stopper: &VmmStopper, set: libc::sigset_t) {
    loop {
        let mut signal = 0;
        // SAFETY: `set` was initialised by block_termination_signals and
        // `signal` is a valid place for the result.
        if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
            continue;
        }
        stopper.stop(match signal {
            libc::SIGTERM => "stopped by SIGTERM",
            libc::SIGINT => "stopped by SIGINT",
            _ => "stopped by SIGHUP",
        });
    }
}
