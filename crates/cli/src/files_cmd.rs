//! `microagent cp`: files and directories between the host and a workspace.

use std::path::PathBuf;
use std::process::ExitCode;

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

pub async fn cp(ws: &Workspaces, src: &str, dst: &str, json: bool) -> Result<ExitCode, Error> {
    let (bytes, direction) =
        match (parse(src), parse(dst)) {
            (Place::Host(from), Place::Guest { workspace, path }) => {
                (ws.copy_in(&workspace, &from, &path).await?, "in")
            }
            (Place::Guest { workspace, path }, Place::Host(to)) => {
                (ws.copy_out(&workspace, &path, &to).await?, "out")
            }
            _ => return Err(Error::InvalidInput(
                "one side of cp must be a workspace path (NAME:/path) and the other a host path"
                    .into(),
            )),
        };
    if json {
        output::json(&serde_json::json!({
            "from": src, "to": dst, "direction": direction, "bytes": bytes
        }));
    } else {
        println!("copied {src} -> {dst}");
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
