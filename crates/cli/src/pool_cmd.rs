//! `microagent pool set | ls | events`: pools of ready workspaces per
//! image, which a `start` (or `run`) of a fresh workspace of that image
//! claims instead of restoring or booting one.

use std::process::ExitCode;

use clap::Subcommand;
use workspace::{Error, Workspaces};

use crate::output;

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Keep N ready workspaces of IMAGE (0: none). They fill in the
    /// background; `pool ls` shows how many are ready.
    Set {
        /// The image.
        image: String,
        /// How many (at most 32).
        size: usize,
    },
    /// Each image's pool: its size and how many members are ready.
    #[command(visible_alias = "list")]
    Ls,
    /// What the pools gave back, and why (an image or kernel changed, or a
    /// start needed the memory).
    Events,
}

pub fn run(ws: &Workspaces, cmd: &PoolCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        PoolCommand::Set { image, size } => {
            let status = ws.pools().set_size(image, *size)?;
            if json {
                output::json(&status);
            } else if *size == 0 {
                println!("pool of {} removed", status.image);
            } else {
                println!(
                    "pool of {} set to {}; {} ready, the rest fill in the background (`microagent pool ls`)",
                    status.image, status.size, status.ready
                );
            }
        }
        PoolCommand::Ls => {
            let all = ws.pools().status()?;
            if json {
                output::json(&all);
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|p| {
                        vec![
                            p.image.clone(),
                            p.size.to_string(),
                            p.ready.to_string(),
                            p.starting.to_string(),
                        ]
                    })
                    .collect();
                output::table(&["IMAGE", "SIZE", "READY", "STARTING"], &rows);
            }
        }
        PoolCommand::Events => {
            let events = ws.pools().events().read_after(0)?;
            if json {
                output::json(&events);
            } else {
                let now = workspace::host::settings::now_ms();
                for e in events {
                    if let workspace::store::events::EventKind::PoolDrained {
                        image,
                        members,
                        reason,
                    } = &e.kind
                    {
                        let ago = output::age(now.saturating_sub(e.at_ms));
                        let reason = output::field(reason);
                        println!("{ago} ago: pool of {image}: {members} drained: {reason}");
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
