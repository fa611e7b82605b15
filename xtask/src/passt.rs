//! A `passt` without the bulk-upload reset (docs/networking.md, "passt
//! versions"): the product's setup builds it (`workspace::network::
//! passt_build`); this task runs the same steps for a developer's host.

use anyhow::Context;
use workspace::network::passt_build;

/// Makes sure the passt microagent will run has the fix: nothing to do when
/// the installed one is new enough, else build and install ours.
pub fn ensure_fixed() -> anyhow::Result<()> {
    let snapshot = passt_build::snapshot_in_use();
    if !passt_build::needed(snapshot) {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Not fatal: everything but long uploads works with the old one.
        eprintln!(
            "xtask: warning: the installed passt resets uploads longer than ~24 s (docs/networking.md); run `cargo xtask setup` as root to build and install a fixed one in {}",
            passt_build::INSTALL_DIR
        );
        return Ok(());
    }
    let mut plan = workspace::host::plan::Plan::new("passt build");
    plan.steps = passt_build::steps(&crate::cache::root()?);
    for step in &plan.steps {
        eprintln!("xtask: passt: {}", step.what);
    }
    plan.run().context("building passt")?;
    eprintln!(
        "xtask: installed passt {} (Debian 13's source) in {}",
        passt_build::VERSION,
        passt_build::INSTALL_DIR
    );
    Ok(())
}
