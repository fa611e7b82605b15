//! `cargo xtask boot`: the whole first-run path in one command: build the
//! guest assets (cached), build `microagent`, boot the guest and show its
//! console, which ends with `uname -a` printed from inside the guest.

use std::process::Command;

use anyhow::bail;

use crate::{cache, initramfs, kernel};

/// Guest memory the demo boot uses.
const MEM_MIB: &str = "128";

pub fn run(extra: &[String]) -> anyhow::Result<()> {
    let vmlinux = kernel::build(kernel::variant_for_host()?)?;
    let initrd = initramfs::build()?;
    let bin = cache::build_microagent()?;
    eprintln!("xtask: booting (on a host that emulates guest kernel mode this takes ~20-30 s)");
    let status = Command::new(bin)
        .args(["vmm", "boot", "--mem-mib", MEM_MIB, "--kernel"])
        .arg(&vmlinux)
        .arg("--initrd")
        .arg(&initrd)
        .args(extra)
        .status()?;
    if !status.success() {
        bail!("microagent vmm boot failed ({status})");
    }
    Ok(())
}
