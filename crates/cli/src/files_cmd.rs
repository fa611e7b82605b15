//! `microagent cp`: files and directories between the host and a workspace.

use std::path::PathBuf;
use std::process::ExitCode;

use workspace::guest::copy::{CopyDirection, CopyOptions};
use workspace::{Error, Workspaces};

use crate::output;

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    Host(PathBuf),
    Guest { workspace: String, path: String },
}

/// `NAME:/path` is a guest path; anything else is a host path (write
/// `./a:b` for a host file whose name has a colon).
fn parse(arg: &str) -> Place {
    match arg.split_once(':') {
        Some((ws, path)) if !ws.is_empty() && !ws.contains('/') => Place::Guest {
            workspace: ws.to_owned(),
            path: path.to_owned(),
        },
        _ => Place::Host(PathBuf::from(arg)),
    }
}

/// Copies `src` to `dst` as the library plans it (or, with `preview`,
/// only says what it would do).
pub async fn cp(
    ws: &Workspaces,
    src: &str,
    dst: &str,
    options: CopyOptions,
    preview: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    let plan =
        match (parse(src), parse(dst)) {
            (Place::Host(from), Place::Guest { workspace, path }) => {
                ws.workspace(&workspace)?
                    .files()
                    .plan_copy_in(&from, &path)
                    .await?
            }
            (Place::Guest { workspace, path }, Place::Host(to)) => {
                ws.workspace(&workspace)?
                    .files()
                    .plan_copy_out(&path, &to, options)
                    .await?
            }
            _ => return Err(Error::InvalidInput(
                "one side of cp must be a workspace path (NAME:/path) and the other a host path"
                    .into(),
            )),
        };
    let direction = match plan.direction {
        CopyDirection::In => "in",
        CopyDirection::Out => "out",
    };
    if preview {
        if json {
            output::json(&serde_json::json!({
                "from": src, "to": dst, "direction": direction, "bytes": 0,
                "preview": true, "action": format!("would {}", plan.action)
            }));
        } else {
            println!("would {}", output::field(&plan.action));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let copied = plan.carry_out(ws).await?;
    if json {
        output::json(&serde_json::json!({
            "from": src, "to": dst, "direction": direction, "bytes": copied.count,
            "left_out": copied.left_out, "left_out_entries": copied.left_out_entries
        }));
    } else {
        println!("copied {src} -> {dst}");
        if !copied.left_out.is_empty() {
            println!(
                "left out git metadata ({} entries): {}; --include-git-metadata copies it",
                copied.left_out_entries,
                output::field(&copied.left_out.join(", "))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides() {
        assert_eq!(
            parse("dev:/etc/hosts"),
            Place::Guest {
                workspace: "dev".into(),
                path: "/etc/hosts".into()
            }
        );
        assert_eq!(parse("./a:b"), Place::Host("./a:b".into()));
        assert_eq!(parse("/tmp/x"), Place::Host("/tmp/x".into()));
        assert_eq!(parse(":x"), Place::Host(":x".into()));
    }
}
