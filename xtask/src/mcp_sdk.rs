//! The official MCP Python SDK, which the HTTP tests drive `serve mcp
//! --http` with (a real client, not one of ours): a virtual environment in
//! the asset cache, made once per SDK version.

use std::process::Command;

use anyhow::Context;

/// Makes sure the SDK's environment exists; its directory.
pub fn ensure() -> anyhow::Result<std::path::PathBuf> {
    let env = testkit::mcp_python_env().context("no asset cache directory")?;
    if env.join("bin/python").exists() {
        return Ok(env);
    }
    let building = env.with_extension("partial");
    let _ = std::fs::remove_dir_all(&building);
    eprintln!(
        "xtask: installing the MCP Python SDK {} in {}",
        testkit::MCP_PYTHON_SDK,
        env.display()
    );
    let venv = |python: &str| {
        Command::new(python)
            .args(["-m", "venv"])
            .arg(&building)
            .status()
            .is_ok_and(|s| s.success())
    };
    // Debian's own Python has venv only with python3-venv.
    if !venv("python3") {
        crate::sh::ensure_debs(&["python3-venv"])?;
        let _ = std::fs::remove_dir_all(&building);
        anyhow::ensure!(venv("/usr/bin/python3"), "python3 -m venv failed");
    }
    crate::sh::run(
        Command::new(building.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check"])
            .arg(format!("mcp=={}", testkit::MCP_PYTHON_SDK)),
    )
    .context("installing the MCP Python SDK from PyPI")?;
    // Made aside and moved whole, so a broken install is never taken for
    // a done one. (Only the scripts in bin/ keep the old path; the tests
    // run bin/python, which finds its environment wherever it is.)
    std::fs::rename(&building, &env)?;
    Ok(env)
}
