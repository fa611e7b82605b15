//! `cargo xtask run [-- COMMAND...]`: the first-run path in one command:
//! build the guest kernel and the `minimal` image (cached), build
//! `microagent`, then `microagent run -- COMMAND` (default `uname -a`) in a
//! fresh workspace, which is deleted afterwards.

use std::process::Command;

use anyhow::bail;

use crate::{cache, images, kernel};

/// What microagent itself runs on the host: `passt` for the `user`
/// network.
const RUNTIME_PACKAGES: &[&str] = &["passt"];

/// What `tap` networks run on the host (bridges and taps, the nftables
/// table, a resolver per network); `setup` installs them for their tests.
pub const TAP_NETWORK_PACKAGES: &[&str] = &["iproute2", "nftables", "dnsmasq-base"];

/// Installs the host programs microagent runs (as `cargo xtask setup` and
/// `run` do for a newcomer).
pub fn ensure_runtime_debs() -> anyhow::Result<()> {
    crate::sh::ensure_debs(RUNTIME_PACKAGES)
}

/// Creates the account root's VMM processes run as, with the product's
/// own step (`workspace::vmm::user`); nothing to do for other users.
pub fn ensure_vmm_account() -> anyhow::Result<()> {
    use workspace::vmm::user;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || user::lookup(user::DEFAULT_VMM_USER).is_some() {
        return Ok(());
    }
    let mut plan = workspace::host::plan::Plan::new("vmm account");
    plan.steps = vec![user::account_step()];
    eprintln!("xtask: {}", plan.steps[0].what);
    plan.run()?;
    Ok(())
}

/// As root, gives /dev/kvm to the `kvm` group where no udev rule did
/// (the product's setup plans the same steps), so tests can run
/// workspaces as a user of that group.
pub fn ensure_kvm_group() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let Some(steps) = workspace::host::kvm_group::missing_steps() else {
        return Ok(());
    };
    let mut plan = workspace::host::plan::Plan::new("kvm group");
    for step in &steps {
        eprintln!("xtask: {}", step.what);
    }
    plan.steps = steps;
    plan.run()?;
    Ok(())
}

pub fn run(command: &[String]) -> anyhow::Result<()> {
    ensure_runtime_debs()?;
    ensure_vmm_account()?;
    crate::passt::ensure_fixed()?;
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = cache::build_microagent()?;
    let default = ["uname".to_string(), "-a".to_string()];
    let command = if command.is_empty() {
        &default[..]
    } else {
        command
    };
    eprintln!(
        "xtask: microagent run -- {} (on a host that emulates guest kernel mode the boot takes ~25 s)",
        command.join(" ")
    );
    let status = Command::new(bin)
        .arg("run")
        .arg("--")
        .args(command)
        .status()?;
    if !status.success() {
        bail!("microagent run exited with {status}");
    }
    Ok(())
}
