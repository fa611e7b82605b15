//! `microagent doctor`: host checks with what to do about each problem.

use std::process::ExitCode;

use anyhow::Context;
use workspace::host::doctor::{Report, Status};

pub fn run(json: bool) -> anyhow::Result<ExitCode> {
    // Opened as every command opens it, so a release bundle's kernels and
    // image are in the cache before they are checked.
    let ws = crate::open_workspaces().context("cannot open the state directory")?;
    let report = Report::check_host(ws.state_dir(), ws.assets());
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for c in &report.checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{tag}  {:<13} {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("      {:<13} -> {fix}", "");
            }
        }
    }
    Ok(if report.status == Status::Fail {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
