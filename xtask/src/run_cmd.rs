//! `cargo xtask run [-- COMMAND...]`: the first-run path in one command:
//! build the guest kernel and the `minimal` image (cached), build
//! `microagent`, then `microagent run -- COMMAND` (default `uname -a`) in a
//! fresh workspace, which is deleted afterwards.

use std::process::Command;

use anyhow::bail;

use crate::{cache, images, kernel, sh};

pub fn run(command: &[String]) -> anyhow::Result<()> {
    kernel::build(kernel::Variant::for_host()?)?;
    images::run(&["minimal".to_string()])?;
    sh::run(
        Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "microagent"])
            .current_dir(cache::repo_root()),
    )?;
    let bin = cache::repo_root().join("target/debug/microagent");
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
