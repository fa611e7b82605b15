//! Our `passt` (docs/networking.md, "passt for one guest"): the product's
//! setup builds it (`workspace::network::passt_build`); this task runs the
//! same steps for a developer's host.

use anyhow::Context;
use workspace::network::passt_build;

/// Makes sure the passt microagent will run is ours: nothing to do when it
/// is installed, else build and install it.
pub fn ensure_fixed() -> anyhow::Result<()> {
    if !passt_build::needed(passt_build::in_use()) {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Not fatal: workspaces run with another passt, at more memory
        // (and, before 2023-03-27, with long uploads reset).
        eprintln!(
            "xtask: warning: the installed passt is not microagent's (docs/networking.md, \"passt for one guest\"); run `cargo xtask setup` as root to build and install it in {}",
            passt_build::INSTALL_DIR
        );
        return Ok(());
    }
    // Its build's tools (`patch` among them) on a host that has none yet.
    crate::sh::ensure_debs(passt_build::BUILD_PACKAGES)?;
    let mut plan = workspace::host::plan::Plan::new("passt build");
    plan.steps = passt_build::steps(&crate::cache::root()?);
    for step in &plan.steps {
        eprintln!("xtask: passt: {}", step.what);
    }
    plan.run().context("building passt")?;
    eprintln!(
        "xtask: installed passt {} (Debian 13's source, patched) in {}",
        passt_build::VERSION,
        passt_build::INSTALL_DIR
    );
    Ok(())
}
