//! `microagent volume create | ls | inspect | rm | export`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use workspace::volumes::{VolumeInfo, VolumeSource};
use workspace::{Error, Workspaces};

use crate::output::{self, age};

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Make a named volume: a persistent ext4 disk that outlives
    /// workspaces (sparse: it takes the host space its files use). Mount it
    /// with `create WS --volume NAME:/data[:ro]`.
    Create {
        /// Volume name.
        name: String,
        /// Its size: 512M, 10G, or MiB as a number (default 1G, or what
        /// --from needs).
        #[arg(long)]
        size: Option<String>,
        /// Fill it with a host directory's files (owned by the guest's
        /// `user`, modes kept).
        #[arg(long, conflicts_with = "from_tar", value_name = "DIR")]
        from: Option<PathBuf>,
        /// Fill it with a tar file's files (plain or gzip; owners kept).
        #[arg(long, value_name = "FILE")]
        from_tar: Option<PathBuf>,
    },
    /// List volumes and the workspaces that mount them.
    #[command(visible_alias = "list")]
    Ls,
    /// Show one volume.
    Inspect {
        /// Volume name.
        name: String,
    },
    /// Remove a volume (refused while a workspace mounts it).
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Volume name.
        name: String,
        /// Only say what would be removed.
        #[arg(long)]
        preview: bool,
    },
    /// Write a volume's files to a new tar file (refused while a running
    /// workspace mounts it read-write).
    Export {
        /// Volume name.
        name: String,
        /// The tar file to write (must not exist).
        file: PathBuf,
    },
}

/// `512M`, `10G`, `1T` or a number of MiB.
fn parse_size(text: &str) -> Result<u64, Error> {
    workspace::sizes::parse_mib(text).map_err(|e| Error::InvalidInput(e.to_string()))
}

/// How long ago `ms` (Unix ms) was.
fn ago(ms: u64) -> String {
    let now = workspace::host::settings::now_ms();
    format!("{} ago", age(now.saturating_sub(ms)))
}

fn holders(v: &VolumeInfo) -> String {
    if v.holders.is_empty() {
        return "-".into();
    }
    v.holders
        .iter()
        .map(|h| {
            let ro = if h.read_only { ":ro" } else { "" };
            let on = if h.active { "" } else { " (stopped)" };
            format!("{}:{}{ro}{on}", h.workspace, h.path)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub async fn run(ws: &Workspaces, cmd: &VolumeCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        VolumeCommand::Create {
            name,
            size,
            from,
            from_tar,
        } => {
            let size_mib = size.as_deref().map(parse_size).transpose()?;
            let source = match (from, from_tar) {
                (Some(dir), _) => VolumeSource::Dir(dir.clone()),
                (None, Some(tar)) => VolumeSource::Tar(tar.clone()),
                (None, None) => VolumeSource::Empty,
            };
            let info = ws.volumes().create(name, size_mib, &source)?;
            if json {
                output::json(&info);
            } else {
                println!(
                    "created volume {} ({} MiB); mount it with `microagent create WS --volume {}:/data`",
                    info.name, info.size_mib, info.name
                );
            }
        }
        VolumeCommand::Ls => {
            let all = ws.volumes().list(true)?;
            if json {
                output::json(&all);
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|v| {
                        vec![
                            v.name.clone(),
                            output::owner(v.agent.as_deref()),
                            format!("{} MiB", v.size_mib),
                            format!("{} MiB", v.used_bytes >> 20),
                            ago(v.created_at_ms),
                            holders(v),
                        ]
                    })
                    .collect();
                output::table(
                    &["NAME", "OWNER", "SIZE", "USED", "CREATED", "MOUNTED BY"],
                    &rows,
                );
            }
        }
        VolumeCommand::Inspect { name } => {
            let v = ws.volumes().inspect(name)?;
            if json {
                output::json(&v);
            } else {
                println!("name:       {}", v.name);
                println!("size:       {} MiB", v.size_mib);
                println!("used:       {} MiB on the host", v.used_bytes >> 20);
                println!("created:    {}", ago(v.created_at_ms));
                if let Some(source) = &v.source {
                    println!("filled from: {}", output::field(&source.to_string()));
                }
                println!("mounted by: {}", holders(&v));
            }
        }
        VolumeCommand::Rm { name, preview } => {
            let v = ws.volumes().delete(name, *preview)?;
            if json {
                output::json(&serde_json::json!({ "removed": !preview, "volume": v }));
            } else if *preview {
                println!(
                    "would remove volume {} ({} MiB used); run without --preview to remove it",
                    v.name,
                    v.used_bytes >> 20
                );
            } else {
                println!("removed volume {}", v.name);
            }
        }
        VolumeCommand::Export { name, file } => {
            let done = ws.volumes().export(name, file)?;
            if json {
                output::json(&done);
            } else {
                println!(
                    "wrote {} ({} entries, {} bytes)",
                    done.path.display(),
                    done.entries,
                    done.bytes
                );
                if done.refused_entries > 0 {
                    // The volume's own names: a guest's, shown escaped.
                    println!("left out {} entries of the volume:", done.refused_entries);
                    for r in &done.refused {
                        println!("  {}: {}", r.path.escape_debug(), r.why);
                    }
                    let more = done.refused_entries - done.refused.len() as u64;
                    if more > 0 {
                        println!("  and {more} more");
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("512M").unwrap(), 512);
        assert_eq!(parse_size("10G").unwrap(), 10240);
        assert_eq!(parse_size("1GiB").unwrap(), 1024);
        assert_eq!(parse_size("1t").unwrap(), 1 << 20);
        for bad in ["", "G", "10X", "-1", "1.5G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
