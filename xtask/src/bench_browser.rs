//! `cargo xtask bench browser [--runs N]`: the browser tools through the
//! CLI on a workspace of the `browser` image (built from Debian's packages
//! if this state directory has none): the first `browser open` (Chromium's
//! start included), then `browser snapshot` of the loaded page, beside
//! `exec WS -- true` on the same workspace in the same run. The page comes
//! from a server of this bench on the host's loopback.

use std::io::{Read, Write};
use std::net::TcpListener;

use anyhow::{bail, Context};

use crate::bench_servers::{home, microagent, timed};
use crate::{dist, images, kernel};

const PAGE: &str = "<!doctype html><title>Bench</title><h1>Bench</h1>\
    <form><label for=q>Query</label><input id=q><button>Go</button></form>";

fn serve(listener: TcpListener) {
    for mut conn in listener.incoming().flatten() {
        let mut buf = [0; 4096];
        let _ = conn.read(&mut buf);
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PAGE}",
            PAGE.len()
        );
    }
}

/// The median, least and most of `v`.
pub(crate) fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let runs: usize = match args {
        [] => 10,
        [flag, n] if flag == "--runs" => n.parse().context("--runs takes a number")?,
        _ => bail!("usage: cargo xtask bench browser [--runs N]"),
    };
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = dist::build()?;
    let state = home("browser")?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || serve(listener));
    let packages = workspace::browser::IMAGE_PACKAGES.join(",");
    let build = timed(
        &bin,
        &state,
        &[
            "image",
            "build",
            workspace::browser::IMAGE,
            "--from",
            "debian:bookworm",
            "--packages",
            &packages,
            "--yes",
        ],
    )?;
    let allow = format!("host:{port}");
    microagent(
        &bin,
        &state,
        &[
            "create", "bw", "--image", "browser", "--mem", "2048", "--vcpus", "2", "--allow",
            &allow,
        ],
    )?;
    let start = timed(&bin, &state, &["start", "bw"])?;
    let url = format!("http://host.microagent.internal:{port}/");
    let open = timed(&bin, &state, &["browser", "open", "bw", &url])?;
    let (mut snapshots, mut execs) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        snapshots.push(timed(&bin, &state, &["browser", "snapshot", "bw"])?);
        execs.push(timed(&bin, &state, &["exec", "bw", "--", "true"])?);
    }
    microagent(&bin, &state, &["delete", "bw", "--yes", "--force"])?;
    let _ = std::fs::remove_dir_all(&state);
    let (exec, exec_min, exec_max) = median(execs);
    let (snap, snap_min, snap_max) = median(snapshots);
    println!("browser tools through the CLI (each command started afresh)");
    println!("  image build browser (mmdebstrap)        {build:>8.1} s");
    println!("  start of the workspace (cold boot)      {start:>8.1} s");
    println!(
        "  first browser open (Chromium's start)   {open:>8.1} s  ({:.0}x exec)",
        open / exec
    );
    println!(
        "  browser snapshot of the loaded page     {:>8.1} s  (min {:.1}, max {:.1}, {runs} runs; {:.1}x exec)",
        snap,
        snap_min,
        snap_max,
        snap / exec
    );
    println!(
        "  exec WS -- true, reference              {:>8.1} s  (min {:.1}, max {:.1})",
        exec, exec_min, exec_max
    );
    Ok(())
}
