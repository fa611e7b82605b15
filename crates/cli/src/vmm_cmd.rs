//! `microagent vmm ...`: boot a kernel directly and probe the host.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use serde_json::json;
use vmm_core::devices::serial::ConsoleSink;
use vmm_core::host::{self, HostProfile};
use vmm_core::machine::{DiskConfig, VsockConfig};
use vmm_core::{CpuTemplate, Machine, MachineConfig};

#[derive(Debug, Subcommand)]
pub enum VmmCommand {
    /// Boot a Linux kernel, stream its serial console, exit 0 when the guest
    /// reboots or powers off.
    Boot(BootArgs),
    /// Measure whether this host's KVM runs guest kernel code natively or emulates it.
    Probe,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TemplateArg {
    /// Pick from the host probe: `compat` on emulating hosts, else `standard`.
    Auto,
    /// CPUID as KVM supports it.
    Standard,
    /// CPUID and command line for hosts that emulate guest kernel mode.
    Compat,
}

#[derive(Debug, clap::Args)]
pub struct BootArgs {
    /// Kernel image: an uncompressed ELF vmlinux (fastest) or a 64-bit bzImage.
    #[arg(long)]
    kernel: PathBuf,
    /// Initial ramdisk (an uncompressed cpio boots fastest).
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// Extra kernel command-line arguments, appended to the defaults
    /// (console=ttyS0 reboot=k panic=1 pci=off nomodule, plus the template's).
    #[arg(long)]
    cmdline: Option<String>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 128)]
    mem_mib: u64,
    /// Number of vCPUs.
    #[arg(long, default_value_t = 1)]
    vcpus: u8,
    /// Where the serial console goes: `stdout` or a file path (appended to).
    /// Repeat to send it to several places.
    #[arg(long, default_values_t = ["stdout".to_string()])]
    console: Vec<String>,
    /// CPUID template.
    #[arg(long, value_enum, default_value_t = TemplateArg::Auto)]
    cpu_template: TemplateArg,
    /// Stop the guest after this many seconds (exit status 124).
    #[arg(long)]
    timeout: Option<u64>,
    /// A virtio-blk disk backed by a raw image file; `:ro` makes it read-only.
    /// Repeatable: the first is /dev/vda, the next /dev/vdb, ...
    #[arg(long = "disk", value_name = "PATH[:ro]")]
    disks: Vec<String>,
    /// A virtio-vsock device. Host programs connect to this Unix socket and
    /// write `CONNECT <port>\n`; guest connections to host port P go to `PATH_P`.
    #[arg(long, value_name = "PATH")]
    vsock: Option<PathBuf>,
    /// The guest's vsock context ID.
    #[arg(long, default_value_t = 3)]
    vsock_cid: u64,
}

/// Parses `PATH[:ro]` (or `PATH:rw`).
fn parse_disk(spec: &str) -> DiskConfig {
    let (path, read_only) = match spec.rsplit_once(':') {
        Some((path, "ro")) => (path, true),
        Some((path, "rw")) => (path, false),
        _ => (spec, false),
    };
    DiskConfig {
        path: resolved(Path::new(path)),
        read_only,
        id: None,
    }
}

/// A path the user named, its symlinks resolved here (the VMM opens files
/// without following them; the asset cache's `current/` names are links).
fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

pub fn run(cmd: VmmCommand, json: bool) -> anyhow::Result<ExitCode> {
    match cmd {
        VmmCommand::Boot(args) => boot(args, json),
        VmmCommand::Probe => probe(json),
    }
}

fn probe_host() -> anyhow::Result<HostProfile> {
    host::probe()
        .context("could not probe the host's KVM (does /dev/kvm exist, and may you open it?)")
}

fn probe(json: bool) -> anyhow::Result<ExitCode> {
    let p = probe_host()?;
    if json {
        let v = json!({
            "kvm_mode": p.mode.name(),
            "ring0_ns_per_iteration": p.ring0_ns_per_iteration,
            "slowdown_vs_native": p.slowdown_vs_native(),
            "cpu_template": p.cpu_template().name(),
            "kernel_variant": p.kernel_variant().name(),
            "probe_ms": p.probe_time.as_secs_f64() * 1e3,
        });
        println!("{v}");
    } else {
        println!("kvm mode:        {}", p.mode.name());
        println!(
            "ring-0 loop:     {:.1} ns/iteration (about {:.0}x native)",
            p.ring0_ns_per_iteration,
            p.slowdown_vs_native()
        );
        println!("cpu template:    {}", p.cpu_template());
        println!("kernel variant:  {}", p.kernel_variant());
        if p.mode == host::KvmMode::Emulated {
            println!("note: this host emulates guest kernel mode; guest kernels boot in tens of seconds, not milliseconds, and need the compat kernel");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn console_sink(specs: &[String]) -> anyhow::Result<ConsoleSink> {
    let mut sink = ConsoleSink::new();
    for spec in specs {
        sink = match spec.as_str() {
            "stdout" => sink.with(Box::new(std::io::stdout())),
            path => {
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open console file {path}"))?;
                sink.with(Box::new(file))
            }
        };
    }
    Ok(sink)
}

fn boot(args: BootArgs, json: bool) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let template = match args.cpu_template {
        TemplateArg::Standard => CpuTemplate::Standard,
        TemplateArg::Compat => CpuTemplate::Compat,
        TemplateArg::Auto => {
            let p = probe_host()?;
            tracing::info!(
                mode = p.mode.name(),
                ns = p.ring0_ns_per_iteration,
                "host probed"
            );
            p.cpu_template()
        }
    };
    let config = MachineConfig {
        kernel: resolved(&args.kernel),
        initrd: args.initrd.as_deref().map(resolved),
        extra_cmdline: args.cmdline.clone(),
        mem_mib: args.mem_mib,
        vcpus: args.vcpus,
        template,
        console: console_sink(&args.console)?,
        disks: args.disks.iter().map(|d| parse_disk(d)).collect(),
        vsock: args.vsock.clone().map(|uds_path| VsockConfig {
            guest_cid: args.vsock_cid,
            uds_path,
            routes: Default::default(),
        }),
        net: None,
        balloon: false,
    };
    if args.vsock_cid < 3 {
        anyhow::bail!("--vsock-cid must be 3 or more (0-2 are reserved: hypervisor, local, host)");
    }
    let machine = Machine::build(config).context("could not build the VM")?;
    tracing::info!(cmdline = machine.cmdline(), ?template, "booting");
    let outcome = machine
        .run(args.timeout.map(Duration::from_secs))
        .context("could not run the VM")?;
    let elapsed = started.elapsed();
    if json {
        let v = json!({
            "reason": format!("{:?}", outcome.reason),
            "clean": outcome.reason.is_clean(),
            "cpu_template": template.name(),
            "elapsed_s": elapsed.as_secs_f64(),
            "first_kvm_run_monotonic_ns": outcome.first_run_ns,
            "overhead_rss_kib": outcome.overhead_rss_kib,
            "registers": outcome.registers,
        });
        println!("{v}");
    }
    match outcome.reason {
        r if r.is_clean() => {
            eprintln!(
                "microagent: guest stopped ({r:?}) after {:.1} s",
                elapsed.as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        vmm_core::StopReason::TimedOut => {
            eprintln!(
                "microagent: guest still running after --timeout {} s; stopped it",
                args.timeout.unwrap_or(0)
            );
            Ok(ExitCode::from(124))
        }
        r => {
            let regs = outcome
                .registers
                .unwrap_or_else(|| "registers unavailable".into());
            eprintln!("microagent: error: the guest failed: {r:?}\n  vCPU registers: {regs}");
            if template == CpuTemplate::Standard {
                eprintln!("  hint: if `microagent vmm probe` says this host emulates guest kernel mode, boot the compat kernel with --cpu-template auto");
            }
            Ok(ExitCode::from(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_specs() {
        let d = parse_disk("/img/root.ext4:ro");
        assert_eq!(
            (d.path, d.read_only),
            (PathBuf::from("/img/root.ext4"), true)
        );
        let d = parse_disk("data.img");
        assert_eq!((d.path, d.read_only), (PathBuf::from("data.img"), false));
        let d = parse_disk("odd:name.img:rw");
        assert_eq!(
            (d.path, d.read_only),
            (PathBuf::from("odd:name.img"), false)
        );
        let d = parse_disk("odd:name.img");
        assert_eq!(d.path, PathBuf::from("odd:name.img"));
    }
}
