//! `microagent doctor`: host checks with what to do about each problem.

use std::process::ExitCode;

use anyhow::Context;
use workspace::host::doctor::{Report, Status};
use workspace::StateDir;

pub fn run(json: bool) -> anyhow::Result<ExitCode> {
    let state = StateDir::from_env().context("cannot open the state directory")?;
    let report = Report::check_host(&state, workspace::host::settings::asset_dir().as_deref());
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
