//! `cargo xtask bench code [--runs N]`: code sessions on a workspace of
//! the `code` image (built from Debian's packages here): `code_run` of
//! `1+1` on a warm session beside a bare exec round trip, both through the
//! library in one process (what the MCP server does per call) and through
//! the CLI (each command started afresh), same run; then the time from a
//! session's start to its first result on a workspace from a pool. The
//! image's kernels are made ahead once (`code prepare`), so every session
//! here takes one made ahead; that once is measured too.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use workspace::code_sessions::{CodeLanguage, CodeRunLimits};
use workspace::{ExecInput, ExecRequest, Workspaces};

use crate::bench_browser::median;
use crate::bench_servers::{home, microagent, timed};
use crate::{dist, images, kernel};

fn line(label: &str, (median, min, max): (f64, f64, f64), reference: Option<f64>) {
    let ratio = reference.map_or(String::new(), |r| format!("  {:.2}x exec", median / r));
    println!(
        "  {label:<44} {:>8.1} ms  (min {:.1}, max {:.1}){ratio}",
        median * 1e3,
        min * 1e3,
        max * 1e3
    );
}

/// `1+1` in session `id` of `dev`, checked to give 2.
async fn one_plus_one(dev: workspace::Workspace<'_>, id: &str) -> anyhow::Result<()> {
    let ran = dev
        .code()
        .run(
            id,
            "1+1",
            Duration::from_secs(60),
            CodeRunLimits::default(),
            std::future::pending(),
            |_, _| {},
        )
        .await?;
    if ran.result.as_deref() != Some("2") {
        bail!("1+1 gave {ran:?}");
    }
    Ok(())
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let runs: usize = match args {
        [] => 10,
        [flag, n] if flag == "--runs" => n.parse().context("--runs takes a number")?,
        _ => bail!("usage: cargo xtask bench code [--runs N]"),
    };
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = dist::build()?;
    let state = home("code")?;
    let packages = workspace::code_sessions::IMAGE_PACKAGES.join(",");
    let build = timed(
        &bin,
        &state,
        &[
            "image",
            "build",
            workspace::code_sessions::IMAGE,
            "--from",
            "debian:bookworm",
            "--packages",
            &packages,
            "--mem",
            "1g",
            "--yes",
        ],
    )?;
    let prepare = timed(&bin, &state, &["code", "prepare", "code"])?;
    microagent(&bin, &state, &["create", "cb", "--image", "code"])?;
    let start = timed(&bin, &state, &["start", "cb"])?;
    let first = timed(&bin, &state, &["code", "run", "cb", "--", "1+1"])?;

    // In one process, as the MCP server runs each call.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // It starts nothing: the CLI started the workspaces it uses.
    let ws = Workspaces::builder()
        .state_dir(&state)
        .assets(None)
        .vmm_program(&bin)
        .build()?;
    let (library_runs, library_execs) = rt.block_on(async {
        let dev = ws.workspace("cb")?;
        let (mut code, mut exec) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let began = Instant::now();
            one_plus_one(dev, "code-1").await?;
            code.push(began.elapsed().as_secs_f64());
            let began = Instant::now();
            dev.exec_collect(ExecRequest::argv(["true"]), ExecInput::None)
                .await?;
            exec.push(began.elapsed().as_secs_f64());
        }
        anyhow::Ok((code, exec))
    })?;
    let (mut cli_runs, mut cli_execs) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        cli_runs.push(timed(
            &bin,
            &state,
            &["code", "run", "cb", "--session", "code-1", "--", "1+1"],
        )?);
        cli_execs.push(timed(&bin, &state, &["exec", "cb", "--", "true"])?);
    }
    microagent(&bin, &state, &["delete", "cb", "--yes", "--force"])?;

    // A workspace from a pool: its session's start and first result.
    microagent(&bin, &state, &["pool", "set", "code", "1"])?;
    let deadline = Instant::now() + Duration::from_secs(900);
    while !microagent(&bin, &state, &["pool", "ls", "--json"])?.contains("\"ready\":1") {
        if Instant::now() > deadline {
            bail!("the pool of `code` was not ready in 15 minutes");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    microagent(&bin, &state, &["create", "cp", "--image", "code"])?;
    let pooled_start = timed(&bin, &state, &["start", "cp"])?;
    let pooled = rt.block_on(async {
        let dev = ws.workspace("cp")?;
        let began = Instant::now();
        let session = dev.code().start(CodeLanguage::Python).await?;
        one_plus_one(dev, &session.id).await?;
        anyhow::Ok(began.elapsed().as_secs_f64())
    })?;
    microagent(&bin, &state, &["pool", "set", "code", "0"])?;
    microagent(&bin, &state, &["delete", "cp", "--yes", "--force"])?;
    let _ = std::fs::remove_dir_all(&state);

    let exec_library = median(library_execs);
    let exec_cli = median(cli_execs);
    println!("code sessions ({runs} runs each, same run)");
    println!("  image build code (mmdebstrap)                {build:>8.1} s");
    println!("  kernels made ahead, once (code prepare)      {prepare:>8.1} s");
    println!("  start of the workspace (warm, kernels in it) {start:>8.1} s");
    println!("  first `code run` (takes the kernel made ahead) {first:>6.1} s");
    line(
        "code_run 1+1, warm session (library)",
        median(library_runs),
        Some(exec_library.0),
    );
    line("exec true, reference (library)", exec_library, None);
    line(
        "code run 1+1, warm session (CLI)",
        median(cli_runs),
        Some(exec_cli.0),
    );
    line("exec -- true, reference (CLI)", exec_cli, None);
    println!(
        "  pooled workspace: start                      {:>8.1} ms",
        pooled_start * 1e3
    );
    println!("  pooled workspace: session start to 1st result {pooled:>7.1} s");
    Ok(())
}
