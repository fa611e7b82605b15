//! `cp` with a workspace on another server: the host side travels as a
//! tar stream over the server's shared SSH connection to a private
//! temporary directory there, and that server's `microagent cp` does the
//! guest side; the temporary directory is removed either way.

use std::path::{Path, PathBuf};
use std::process::{Command as Process, ExitCode, Stdio};

use workspace::servers::{self, ServerSpec};
use workspace::{Error, Workspaces};

use crate::files_cmd::{parse, Place};
use crate::remote_cmd::run_there;
use crate::Command;

/// Runs `cp` when its workspace lives on another server; `None` when here.
pub fn cp_if_remote(
    ws: &Workspaces,
    cmd: &Command,
    json: bool,
) -> workspace::Result<Option<ExitCode>> {
    let Command::Cp {
        src,
        dst,
        overwrite,
        include_git_metadata,
        preview,
    } = cmd
    else {
        return Ok(None);
    };
    let workspace = match (parse(src), parse(dst)) {
        (Place::Guest { workspace, .. }, Place::Host(_))
        | (Place::Host(_), Place::Guest { workspace, .. }) => workspace,
        _ => return Ok(None),
    };
    let Some(placement) = ws.placement_of(&workspace)? else {
        return Ok(None);
    };
    if *preview {
        return Err(Error::InvalidInput(format!(
            "--preview is not available for workspace {workspace} on server {}; run the copy, or preview it there",
            placement.server
        )));
    }
    let spec = ws.servers().get(&placement.server)?;
    let tmp = shell(ws, &spec, "mktemp -d", None, None)?;
    let tmp = String::from_utf8_lossy(&tmp).trim().to_owned();
    if !tmp.starts_with('/') {
        return Err(remote_failed(&spec, "mktemp -d gave no directory"));
    }
    let mut flags = Vec::new();
    if *overwrite {
        flags.push("--overwrite".to_owned());
    }
    if *include_git_metadata {
        flags.push("--include-git-metadata".to_owned());
    }
    if json {
        flags.push("--json".to_owned());
    }
    let staging = Staging {
        ws,
        spec: &spec,
        tmp: &tmp,
        flags: &flags,
    };
    let result = match (parse(src), parse(dst)) {
        (Place::Host(from), Place::Guest { .. }) => staging.copy_in(&from, dst),
        (Place::Guest { .. }, Place::Host(to)) => staging.copy_out(src, &to, *overwrite, json),
        _ => unreachable!("one side is the guest's (checked above)"),
    };
    let quoted = servers::ssh::shell_quote(&tmp);
    let _ = shell(ws, &spec, &format!("rm -rf {quoted}"), None, None);
    result.map(Some)
}

/// A copy through a temporary directory on the server.
struct Staging<'a> {
    ws: &'a Workspaces,
    spec: &'a ServerSpec,
    tmp: &'a str,
    flags: &'a [String],
}

impl Staging<'_> {
    fn copy_in(&self, from: &Path, dst: &str) -> workspace::Result<ExitCode> {
        let Self {
            ws,
            spec,
            tmp,
            flags,
        } = *self;
        let (parent, base) = split(from)?;
        let mut tar = Process::new("tar")
            .arg("-C")
            .arg(&parent)
            .arg("-cf")
            .arg("-")
            .arg("--")
            .arg(&base)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(Error::host_io("running tar".to_owned()))?;
        let line = format!("tar -C {} -xf -", servers::ssh::shell_quote(tmp));
        let sent = shell(ws, spec, &line, tar.stdout.take().map(Stdio::from), None);
        let _ = tar.wait();
        sent?;
        let staged = format!("{tmp}/{}", base.to_string_lossy());
        let mut args = vec!["cp".to_owned(), staged, dst.to_owned()];
        args.extend(flags.iter().cloned());
        exit(run_there(ws, spec, &args, false)?)
    }

    fn copy_out(
        &self,
        src: &str,
        to: &Path,
        overwrite: bool,
        json: bool,
    ) -> workspace::Result<ExitCode> {
        let Self {
            ws,
            spec,
            tmp,
            flags,
        } = *self;
        if to.exists() && !overwrite {
            return Err(Error::InvalidInput(format!(
                "{} exists on this host; pass --overwrite to replace or merge into it",
                to.display()
            )));
        }
        let staged = format!("{tmp}/out");
        let mut args = vec!["cp".to_owned(), src.to_owned(), staged];
        args.extend(flags.iter().filter(|f| *f != "--json").cloned());
        let status = run_there(ws, spec, &args, false)?;
        if status != 0 {
            return exit(status);
        }
        let (parent, _) = split(to)?;
        let landing = parent.join(format!(".microagent-cp-{}", std::process::id()));
        std::fs::create_dir(&landing)
            .map_err(Error::host_io(format!("making {}", landing.display())))?;
        let line = format!("tar -C {} -cf - out", servers::ssh::shell_quote(tmp));
        let mut tar = Process::new("tar")
            .arg("-C")
            .arg(&landing)
            .arg("-xf")
            .arg("-")
            .stdin(Stdio::piped())
            .spawn()
            .map_err(Error::host_io("running tar".to_owned()))?;
        let received = shell(ws, spec, &line, None, tar.stdin.take().map(Stdio::from));
        let extracted = tar.wait().map(|s| s.success()).unwrap_or(false);
        let received = received.and_then(|_| {
            if extracted {
                Ok(())
            } else {
                Err(remote_failed(spec, "the copy did not arrive whole"))
            }
        });
        let placed = received.and_then(|_| {
            let got = landing.join("out");
            let moved = if got.is_dir() && to.is_dir() {
                // Merge into the existing directory (--overwrite).
                Process::new("cp")
                    .arg("-a")
                    .arg(format!("{}/.", got.display()))
                    .arg(to)
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false)
            } else {
                let _ = std::fs::remove_file(to);
                std::fs::rename(&got, to).is_ok()
            };
            if moved {
                Ok(())
            } else {
                Err(Error::InvalidInput(format!(
                    "could not place the copy at {}",
                    to.display()
                )))
            }
        });
        let _ = std::fs::remove_dir_all(&landing);
        placed?;
        if json {
            crate::output::json(&serde_json::json!({
                "from": src, "to": to, "direction": "out", "server": spec.name
            }));
        }
        exit(0)
    }
}

/// Runs a plain shell `line` on `spec` (no microagent) over the shared
/// connection; its stdout.
fn shell(
    ws: &Workspaces,
    spec: &ServerSpec,
    line: &str,
    stdin: Option<Stdio>,
    stdout: Option<Stdio>,
) -> workspace::Result<Vec<u8>> {
    let mut cmd = ws.servers().ssh_command(spec, line, false)?;
    cmd.stdin(stdin.unwrap_or(Stdio::null()));
    let capture = stdout.is_none();
    cmd.stdout(stdout.unwrap_or(Stdio::piped()));
    let out = cmd
        .output()
        .map_err(|e| Error::from(servers::ServerError::Spawn(e)))?;
    if !out.status.success() {
        return Err(remote_failed(
            spec,
            &format!(
                "`{line}` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(if capture { out.stdout } else { Vec::new() })
}

fn remote_failed(spec: &ServerSpec, detail: &str) -> Error {
    servers::ServerError::Unreachable {
        server: spec.name.clone(),
        detail: detail.to_owned(),
    }
    .into()
}

fn split(path: &Path) -> workspace::Result<(PathBuf, std::ffi::OsString)> {
    let absolute = std::path::absolute(path)
        .map_err(Error::host_io(format!("resolving {}", path.display())))?;
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(base)) => Ok((parent.to_owned(), base.to_owned())),
        _ => Err(Error::InvalidInput(format!(
            "{} names no file or directory",
            path.display()
        ))),
    }
}

fn exit(status: i32) -> workspace::Result<ExitCode> {
    Ok(ExitCode::from(u8::try_from(status).unwrap_or(1)))
}
