//! `microagent image ls | inspect | import | rm`.

use std::path::PathBuf;

use std::process::ExitCode;
use workspace::oci::rootfs::Step;

use clap::Subcommand;
use workspace::{Error, Workspaces};

use crate::output::{self, age};

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// List images (built images from `cargo xtask setup` are registered on first use).
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one image: its files, sizes and build manifest.
    Inspect {
        /// Image name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import an image: a container image (an OCI image layout directory,
    /// a tar of one, or a `docker save` tarball) converted to a workspace
    /// image, or a directory holding `vmlinux` and `rootfs.ext4` (and
    /// optionally `manifest.json`)
    Import {
        /// The directory or tarball.
        path: PathBuf,
        /// Name to register it under (a container image's defaults to its
        /// tag: `python:3.12-slim` is `python-3-12-slim`).
        #[arg(long)]
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image (refused while a workspace uses it).
    Rm {
        /// Image name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl ImageCommand {
    pub fn json(&self) -> bool {
        match self {
            Self::Ls { json }
            | Self::Inspect { json, .. }
            | Self::Import { json, .. }
            | Self::Rm { json, .. } => *json,
        }
    }
}

pub fn run(ws: &Workspaces, cmd: &ImageCommand) -> Result<ExitCode, Error> {
    let images = ws.images();
    match cmd {
        ImageCommand::Ls { json } => {
            let all = images.list()?;
            if *json {
                output::json(&all);
            } else {
                let now = workspace::settings::now_ms();
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|i| {
                        vec![
                            i.name.clone(),
                            format!("{} MiB", i.rootfs_bytes >> 20),
                            format!("{} MiB", i.kernel_bytes >> 20),
                            age(now.saturating_sub(i.imported_at_ms)),
                        ]
                    })
                    .collect();
                output::table(&["NAME", "ROOTFS", "KERNEL", "IMPORTED"], &rows);
            }
        }
        ImageCommand::Inspect { name, json } => {
            let info = images.get(name)?;
            let users = ws.image_users(name)?;
            if *json {
                let mut v = serde_json::to_value(&info).unwrap_or_default();
                v["used_by"] = serde_json::json!(users);
                output::json(&v);
            } else {
                println!("{}", info.name);
                println!(
                    "  kernel   {} ({} bytes)",
                    info.kernel.display(),
                    info.kernel_bytes
                );
                println!(
                    "  rootfs   {} ({} bytes)",
                    info.rootfs.display(),
                    info.rootfs_bytes
                );
                println!("  source   {}", info.source.display());
                println!(
                    "  used by  {}",
                    if users.is_empty() {
                        "-".into()
                    } else {
                        users.join(", ")
                    }
                );
                if let Some(m) = &info.manifest {
                    println!("  manifest {m}");
                }
                if let Some(origin) = &info.origin {
                    println!(
                        "  image    {} ({})",
                        origin.reference, origin.manifest_digest
                    );
                }
                if let Some(args) = &info.boot_args {
                    println!("  boots    {args}");
                }
                let d = &info.defaults;
                if let Some(user) = &d.user {
                    println!(
                        "  user     {user} ({}:{})",
                        d.uid.unwrap_or(0),
                        d.gid.unwrap_or(0)
                    );
                }
                if let Some(cwd) = &d.cwd {
                    println!("  workdir  {cwd}");
                }
                for (k, v) in &d.env {
                    println!("  env      {k}={}", output::inert(v));
                }
                if let Some(command) = &d.command {
                    println!("  command  {}", output::inert(&command.join(" ")));
                }
            }
        }
        ImageCommand::Import { path, name, json } => {
            let mut progress = |step: Step| match step {
                Step::Layer { index, count } => eprintln!("applying layer {index} of {count}"),
                Step::Filesystem => eprintln!("writing the root filesystem"),
            };
            let info = images.import_path(name.as_deref(), path, &mut progress)?;
            if *json {
                output::json(&info);
            } else {
                println!("imported {} from {}", info.name, path.display());
            }
        }
        ImageCommand::Rm { name, json } => {
            ws.remove_image(name)?;
            if *json {
                output::json(&serde_json::json!({ "removed": name }));
            } else {
                println!("removed image {name}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
