//! `microagent image ls | inspect | import | pull | rm` and `kernel ls`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Subcommand;
use workspace::oci::pull::{PullEvent, PullRequest};
use workspace::oci::rootfs::Step;
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
    /// Pull an image from an OCI or Docker registry and convert it into a
    /// workspace image: `image pull alpine`, `image pull python:3.12-slim`,
    /// `image pull ghcr.io/org/tool:1`. Credentials come from
    /// ~/.docker/config.json; layers are cached, so pulling an image again
    /// downloads only what changed
    Pull {
        /// The image reference.
        reference: String,
        /// Name to register it under (default: from the reference,
        /// `python:3.12-slim` is `python-3-12-slim`).
        #[arg(long)]
        name: Option<String>,
        /// Speak plain HTTP to the registry (a local or test registry).
        #[arg(long)]
        insecure: bool,
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

#[derive(Debug, Subcommand)]
pub enum KernelCommand {
    /// List guest kernels: the built ones (which variant this host boots)
    /// and those only imported images carry, with versions and users.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl KernelCommand {
    pub fn json(&self) -> bool {
        match self {
            Self::Ls { json } => *json,
        }
    }
}

pub fn run_kernel(ws: &Workspaces, cmd: &KernelCommand) -> Result<ExitCode, Error> {
    match cmd {
        KernelCommand::Ls { json } => {
            let kernels = workspace::kernels::list(ws.images())?;
            if *json {
                output::json(&kernels);
            } else if kernels.is_empty() {
                println!("no guest kernels (build them: cargo xtask setup)");
            } else {
                for k in &kernels {
                    println!(
                        "{:<9} {:>6.1} MiB  {}{}",
                        k.variant.as_deref().unwrap_or("imported"),
                        k.bytes as f64 / (1 << 20) as f64,
                        k.version.as_deref().unwrap_or("(no version banner)"),
                        if k.this_host { "  [this host]" } else { "" }
                    );
                    println!("          {}", k.path.display());
                    if !k.used_by.is_empty() {
                        println!("          used by {}", k.used_by.join(", "));
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

impl ImageCommand {
    pub fn json(&self) -> bool {
        match self {
            Self::Ls { json }
            | Self::Inspect { json, .. }
            | Self::Import { json, .. }
            | Self::Pull { json, .. }
            | Self::Rm { json, .. } => *json,
        }
    }
}

pub async fn run(ws: &Workspaces, cmd: &ImageCommand) -> Result<ExitCode, Error> {
    let images = ws.images();
    match cmd {
        ImageCommand::Pull {
            reference,
            name,
            insecure,
            json,
        } => {
            let req = PullRequest {
                reference: reference.clone(),
                name: name.clone(),
                insecure: *insecure,
            };
            let shown = Arc::new(Mutex::new(pull_progress(output::interactive())));
            let pulled = workspace::oci::pull::pull(images, &req, shown).await?;
            if *json {
                output::json(&pulled);
            } else if pulled.unchanged {
                println!("{} is up to date ({})", pulled.image.name, reference);
            } else {
                println!(
                    "pulled {} as {} ({} MiB downloaded, {} layer(s) cached)",
                    reference,
                    pulled.image.name,
                    pulled.downloaded_bytes.div_ceil(1 << 20),
                    pulled.cached_layers
                );
            }
        }
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

/// Pull progress on stderr: one line per step; on a terminal the download
/// of a layer updates its line in place.
fn pull_progress(terminal: bool) -> impl FnMut(PullEvent) + Send {
    let mut last_line = String::new();
    move |event| {
        let line = match event {
            PullEvent::Resolved { layers, bytes } => {
                format!(
                    "{layers} layer(s), {:.1} MiB",
                    bytes as f64 / (1 << 20) as f64
                )
            }
            PullEvent::Cached { index } => format!("layer {index}: cached"),
            PullEvent::Downloading { index, done, size } => {
                if !terminal && done < size {
                    return;
                }
                let percent = (done * 100).checked_div(size).unwrap_or(100);
                format!(
                    "layer {index}: {:.1} of {:.1} MiB ({percent}%)",
                    done as f64 / (1 << 20) as f64,
                    size as f64 / (1 << 20) as f64
                )
            }
            PullEvent::Convert(Step::Layer { index, count }) => {
                format!("applying layer {index} of {count}")
            }
            PullEvent::Convert(Step::Filesystem) => "writing the root filesystem".into(),
        };
        let same_layer =
            terminal && last_line.split(':').next() == line.split(':').next() && line.contains('%');
        if same_layer {
            eprint!("\r{line}\x1b[K");
        } else {
            if terminal && last_line.contains('%') {
                eprintln!();
            }
            eprint!("{line}");
            if !(terminal && line.contains('%')) {
                eprintln!();
            }
        }
        last_line = line;
    }
}
