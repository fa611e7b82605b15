//! `microagent secret set | ls | rm`: values go in from stdin or a file and
//! are never printed; commands get them with `--secret NAME`.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use workspace::secrets::{SecretValue, MAX_SECRET_VALUE};
use workspace::{Error, Workspaces};

use crate::output::{self, age};

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Set a secret (replacing it): its value from stdin (one trailing
    /// newline dropped) or from --from-file (as is). Commands get it as the
    /// environment variable NAME with `exec|run|process start --secret NAME`.
    Set {
        /// Secret name: an environment variable's (`[A-Za-z_][A-Za-z0-9_]*`,
        /// at most 64 characters).
        name: String,
        /// Read the value from this file instead of stdin.
        #[arg(long, value_name = "FILE")]
        from_file: Option<PathBuf>,
    },
    /// List the secrets' names (never their values).
    #[command(visible_alias = "list")]
    Ls,
    /// Remove a secret.
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Secret name.
        name: String,
    },
}

/// At most one byte more than a value may have, so that too large is told.
fn read_limited(from: impl Read) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    from.take(MAX_SECRET_VALUE as u64 + 2)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn read_file(path: &Path) -> Result<Vec<u8>, Error> {
    let file =
        std::fs::File::open(path).map_err(Error::host_io(format!("reading {}", path.display())))?;
    read_limited(file).map_err(Error::host_io(format!("reading {}", path.display())))
}

fn read_stdin() -> Result<Vec<u8>, Error> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        // Typed at a terminal it would be echoed and kept in scrollback.
        return Err(Error::InvalidInput(
            "secret set reads the value from stdin, which is a terminal; pipe it in (`printf %s \"$TOKEN\" | microagent secret set NAME`) or pass --from-file FILE".into(),
        ));
    }
    let mut bytes = read_limited(stdin.lock()).map_err(Error::host_io("reading stdin"))?;
    strip_one_newline(&mut bytes);
    Ok(bytes)
}

/// Drops exactly one trailing `\n` (what `echo` adds).
fn strip_one_newline(bytes: &mut Vec<u8>) {
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
}

pub fn run(ws: &Workspaces, cmd: &SecretCommand, json: bool) -> Result<ExitCode, Error> {
    let store = ws.secrets();
    match cmd {
        SecretCommand::Set { name, from_file } => {
            workspace::secrets::validate_secret_name(name)?;
            let bytes = match from_file {
                Some(path) => read_file(path)?,
                None => read_stdin()?,
            };
            let value = SecretValue::new(name, bytes)?;
            let info = store.set(name, &value)?;
            if json {
                output::json(&info);
            } else {
                println!(
                    "set secret {}; give it to a command with `--secret {}`",
                    info.name, info.name
                );
            }
        }
        SecretCommand::Ls => {
            let all = store.list()?;
            if json {
                output::json(&all);
            } else {
                let now = workspace::host::settings::now_ms();
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|s| {
                        let ago = age(now.saturating_sub(s.updated_at_ms));
                        vec![s.name.clone(), format!("{ago} ago")]
                    })
                    .collect();
                output::table(&["NAME", "UPDATED"], &rows);
            }
        }
        SecretCommand::Rm { name } => {
            let info = store.remove(name)?;
            if json {
                output::json(&serde_json::json!({ "removed": true, "secret": info }));
            } else {
                println!("removed secret {}", info.name);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_newline_is_dropped() {
        for (given, kept) in [
            (&b"tok\n"[..], &b"tok"[..]),
            (b"tok\n\n", b"tok\n"),
            (b"tok", b"tok"),
            (b"tok\r\n", b"tok\r"),
        ] {
            let mut bytes = given.to_vec();
            strip_one_newline(&mut bytes);
            assert_eq!(bytes, kept);
        }
    }

    #[test]
    fn reading_stops_past_the_limit() {
        let big = vec![b'a'; MAX_SECRET_VALUE * 2];
        let read = read_limited(&big[..]).unwrap();
        assert_eq!(read.len(), MAX_SECRET_VALUE + 2);
        assert!(SecretValue::new("K", read).is_err());
    }
}
