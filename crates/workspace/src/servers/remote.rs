//! Running `microagent` on a server over SSH with a deadline, reading its
//! JSON answer or its JSON error, and what is built on that: each server's
//! report and the choice of a server for a new workspace.

use std::process::Stdio;
use std::time::Duration;

use super::registry::{ServerRegistry, ServerSpec, LOCAL_SERVER};
use super::ssh::{self, SSH_FAILED};
use super::status::{self, Availability, ServerReport, ServerStatus};
use super::ServerError;
use crate::{ErrorCode, Workspaces};

/// How long a remote operation may take unless its caller says.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);
/// How long a status probe may take.
const PROBE_DEADLINE: Duration = Duration::from_secs(30);

/// What a remote `microagent` printed and how it ended.
#[derive(Clone, Debug)]
pub struct RemoteOutput {
    /// Its exit status.
    pub status: i32,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `microagent ARGS` on `spec`, its output collected. ssh's own
/// failure is [`ServerError::Unreachable`]; past `deadline` ssh is killed
/// and it is [`ServerError::Deadline`].
pub async fn run_remote(
    registry: &ServerRegistry,
    spec: &ServerSpec,
    args: &[String],
    deadline: Duration,
) -> Result<RemoteOutput, ServerError> {
    crate::store::make_private_dir(&registry.control_dir())?;
    let line = ssh::remote_line(spec, args);
    let mut cmd =
        tokio::process::Command::from(ssh::command(spec, &registry.control_dir(), &line, false));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(ServerError::Spawn)?;
    let out = match tokio::time::timeout(deadline, child.wait_with_output()).await {
        Ok(out) => out.map_err(ServerError::Spawn)?,
        Err(_) => {
            return Err(ServerError::Deadline {
                server: spec.name.clone(),
                secs: deadline.as_secs(),
            })
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let status = out.status.code().unwrap_or(SSH_FAILED);
    if status == SSH_FAILED && out.stdout.is_empty() {
        return Err(ServerError::Unreachable {
            server: spec.name.clone(),
            detail: last_line(&stderr),
        });
    }
    Ok(RemoteOutput {
        status,
        stdout: out.stdout,
        stderr,
    })
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("ssh failed")
        .trim()
        .to_owned()
}

/// Runs `microagent ARGS --json` on `spec` and returns its JSON answer; its
/// JSON error becomes [`ServerError::Remote`] with the remote's code.
pub async fn run_remote_json(
    registry: &ServerRegistry,
    spec: &ServerSpec,
    args: &[String],
    deadline: Duration,
) -> Result<serde_json::Value, ServerError> {
    let mut args = args.to_vec();
    args.push("--json".into());
    let out = run_remote(registry, spec, &args, deadline).await?;
    let garbled = |detail: String| ServerError::Garbled {
        server: spec.name.clone(),
        detail,
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // One JSON document, or one per line (the last one says how it ended).
    let value: serde_json::Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(_) => match text.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(last) => serde_json::from_str(last)
                .map_err(|e| garbled(format!("{e}; its stderr: {}", last_line(&out.stderr))))?,
            None => {
                return Err(garbled(format!(
                    "nothing on stdout, exit {}; its stderr: {}",
                    out.status,
                    last_line(&out.stderr)
                )))
            }
        },
    };
    if let Some(error) = value.get("error").filter(|_| out.status != 0) {
        let code: ErrorCode = serde_json::from_value(error["code"].clone())
            .map_err(|e| garbled(format!("an error without a known code: {e}")))?;
        return Err(ServerError::Remote {
            server: spec.name.clone(),
            code,
            message: error["message"].as_str().unwrap_or("").to_owned(),
        });
    }
    Ok(value)
}

/// Server `name`'s report: this host's measured here, a remote's asked of
/// it (offline, with the reason, when it cannot be reached).
pub async fn report(all: &Workspaces, name: &str) -> Result<ServerReport, ServerError> {
    if name == LOCAL_SERVER {
        return status::local_report(all).await;
    }
    let registry = all.servers();
    let spec = registry.get(name)?;
    let args = ["server", "status", LOCAL_SERVER].map(String::from);
    match run_remote_json(&registry, &spec, &args, PROBE_DEADLINE).await {
        Ok(value) => match serde_json::from_value::<ServerReport>(value) {
            Ok(report) => Ok(status::remote_status(&spec, report)),
            Err(e) => Ok(status::offline(
                &spec,
                format!("its microagent answered `server status` in another shape ({e}); install this version there"),
            )),
        },
        Err(e @ (ServerError::Unreachable { .. } | ServerError::Deadline { .. })) => {
            Ok(status::offline(&spec, e.to_string()))
        }
        Err(e @ (ServerError::Remote { .. } | ServerError::Garbled { .. })) => {
            Ok(status::offline(&spec, e.to_string()))
        }
        Err(e) => Err(e),
    }
}

/// Every server's report, `local` first.
pub async fn reports(all: &Workspaces) -> Result<Vec<ServerReport>, ServerError> {
    let mut out = vec![status::local_report(all).await?];
    for spec in all.servers().list()? {
        out.push(report(all, &spec.name).await?);
    }
    Ok(out)
}

/// The server a new workspace of `image` goes to: of the online servers
/// that have the image (or can pull it: a registry reference), the one
/// with the best available score; `local` wins a tie.
pub async fn pick_server(all: &Workspaces, image: &str) -> Result<String, ServerError> {
    let pullable = image.contains('/') || image.contains(':');
    let mut best: Option<(u32, String)> = None;
    for report in reports(all).await? {
        let ServerStatus {
            name,
            status,
            resources,
            ..
        } = report.server;
        let Some(resources) = resources else { continue };
        if status != Availability::Online {
            continue;
        }
        if !pullable && !report.images.iter().any(|i| i == image) {
            continue;
        }
        if best
            .as_ref()
            .is_none_or(|(score, _)| resources.available_score > *score)
        {
            best = Some((resources.available_score, name));
        }
    }
    best.map(|(_, name)| name).ok_or_else(|| {
        ServerError::Invalid(format!(
            "no online server has image {image}; add it to one (`microagent image`), or name a server"
        ))
    })
}
