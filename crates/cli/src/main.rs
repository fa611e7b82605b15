//! The `microagent` command.

mod doctor_cmd;
mod vmm_cmd;

use clap::{Parser, Subcommand};

/// Disposable Linux workspaces as KVM microVMs.
#[derive(Debug, Parser)]
#[command(name = "microagent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check that this host can run workspaces: KVM, its speed, guest
    /// kernel and images, state directory, free disk. Exit 1 on any failure.
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Low-level VMM commands: boot a kernel directly, probe the host's KVM.
    #[command(subcommand)]
    Vmm(vmm_cmd::VmmCommand),
}

fn init_logging() {
    // Logs go to stderr only: stdout carries the guest console or JSON.
    let filter = tracing_subscriber::EnvFilter::try_from_env("MICROAGENT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> std::process::ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Doctor { json } => doctor_cmd::run(json),
        Command::Vmm(cmd) => vmm_cmd::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("microagent: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
