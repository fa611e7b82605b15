//! `microagent image ls | inspect | import | pull | rm`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Subcommand;
use workspace::images::build::{BuildBase, ImageBuildRequest};
use workspace::images::oci::rootfs::ConversionStep;
use workspace::images::pull::{PullEvent, PullRequest};
use workspace::{Error, Workspaces};

use crate::output::{self, age};

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// List images (the ones `microagent setup` built are registered on first use).
    #[command(visible_alias = "list")]
    Ls,
    /// Show one image: its files, sizes and build manifest.
    Inspect {
        /// Image name.
        name: String,
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
    },
    /// Pull an image from an OCI or Docker registry as a workspace image:
    /// `image pull alpine`, `image pull python:3.12-slim`, `image pull
    /// ghcr.io/org/tool:1`. Its layers are downloaded and checked; its root
    /// filesystem is made when a workspace first uses it (`--convert`: now).
    /// Credentials come from ~/.docker/config.json; layers are cached, so
    /// pulling an image again downloads only what changed
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
        /// Make its root filesystem now, not at its first use.
        #[arg(long)]
        convert: bool,
    },
    /// Build an image: from Debian packages (`--from debian:bookworm`,
    /// mmdebstrap, as root) or on top of an image (booted in a throwaway
    /// workspace; files copied in, commands run, its root filesystem saved
    /// as the new image). Without --confirm or --yes it only shows the plan.
    Build {
        /// The new image's name.
        name: String,
        /// `debian:SUITE` or an image name.
        #[arg(long)]
        from: String,
        /// Debian packages to install (comma-separated or repeated).
        #[arg(long, value_delimiter = ',')]
        packages: Vec<String>,
        /// A command to run in the guest, as root (repeat for more; in order).
        #[arg(long = "run", value_name = "CMD")]
        run: Vec<String>,
        /// A host file or directory to copy in first: SRC:DST (repeat for more).
        #[arg(long = "copy", value_name = "SRC:DST")]
        copy: Vec<String>,
        /// What the image is (one line), for `image search`.
        #[arg(long)]
        description: Option<String>,
        /// vCPUs a workspace of it gets when its create names none.
        #[arg(long)]
        vcpus: Option<u8>,
        /// Guest memory a workspace of it gets when its create names none:
        /// MiB, or with a unit (`2g`).
        #[arg(long = "mem", value_name = "MIB", value_parser = crate::output::mib)]
        mem_mib: Option<u64>,
        #[command(flatten)]
        flags: crate::plan_out::ConfirmFlags,
    },
    /// Find images by name or description: the ones here (and the
    /// built-in ones not built yet), and the repositories of registries
    /// that list theirs (config.json `search_registries`, and --registry)
    Search {
        /// Text to look for (any case; empty lists everything).
        #[arg(default_value = "")]
        query: String,
        /// A registry to search too: host or host:port (repeatable).
        #[arg(long = "registry", value_name = "HOST[:PORT]")]
        registries: Vec<String>,
    },
    /// Remove an image (refused while a workspace uses it).
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Image name.
        name: String,
    },
}

pub async fn run(ws: &Workspaces, cmd: &ImageCommand, json: bool) -> Result<ExitCode, Error> {
    let images = ws.image_registry();
    match cmd {
        ImageCommand::Search { query, registries } => {
            let found = ws.images().search(query, registries).await?;
            if json {
                output::json(&found);
                return Ok(ExitCode::SUCCESS);
            }
            let mut rows: Vec<Vec<String>> = found
                .local
                .iter()
                .map(|i| {
                    let place = if i.registered {
                        "here"
                    } else {
                        "built-in (not built yet)"
                    };
                    let about = i.description.clone().unwrap_or_default();
                    vec![i.name.clone(), place.into(), about]
                })
                .collect();
            rows.extend(found.remote.iter().map(|r| {
                let place = format!("registry {}", r.registry);
                vec![r.reference.clone(), place, String::new()]
            }));
            output::table(&["IMAGE", "WHERE", "DESCRIPTION"], &rows);
            for p in &found.unreachable {
                eprintln!(
                    "microagent: could not search {}: {}",
                    output::field(&p.registry),
                    output::field(&p.message)
                );
            }
        }
        ImageCommand::Build {
            name,
            from,
            packages,
            run,
            copy,
            description,
            vcpus,
            mem_mib,
            flags,
        } => {
            let req = ImageBuildRequest {
                vcpus: *vcpus,
                mem_mib: *mem_mib,
                ..build_request(name, from, packages, run, copy, description.as_deref())?
            };
            build(ws, &req, flags, json).await?;
        }
        ImageCommand::Pull {
            reference,
            name,
            insecure,
            convert,
        } => {
            let req = PullRequest {
                reference: reference.clone(),
                name: name.clone(),
                insecure: *insecure,
                convert: *convert,
            };
            let shown = Arc::new(Mutex::new(pull_progress(output::interactive())));
            let pulled = workspace::images::pull::pull(images, &req, shown).await?;
            if json {
                output::json(&pulled);
            } else if pulled.unchanged {
                println!("{} is up to date ({})", pulled.image.name, reference);
            } else {
                println!(
                    "pulled {} as {} ({} MiB downloaded, {} layer(s) cached){}",
                    reference,
                    pulled.image.name,
                    pulled.downloaded_bytes.div_ceil(1 << 20),
                    pulled.cached_layers,
                    if pulled.image.awaiting_conversion {
                        "; its root filesystem is made at its first use"
                    } else {
                        ""
                    }
                );
            }
        }
        ImageCommand::Ls => {
            let all = images.list()?;
            if json {
                output::json(&all);
            } else {
                let now = workspace::host::settings::now_ms();
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|i| {
                        vec![
                            i.name.clone(),
                            if i.awaiting_conversion {
                                "at first use".into()
                            } else {
                                format!("{} MiB", i.rootfs_bytes >> 20)
                            },
                            format!("{} MiB", i.kernel_bytes >> 20),
                            age(now.saturating_sub(i.imported_at_ms)),
                            sizes(&i.defaults),
                        ]
                    })
                    .collect();
                output::table(&["NAME", "ROOTFS", "KERNEL", "IMPORTED", "SIZES"], &rows);
            }
        }
        ImageCommand::Inspect { name } => {
            let info = images
                .find(name)?
                .ok_or_else(|| workspace::images::ImageError::NotFound(name.clone()))?;
            let users = ws.images().users(name)?;
            if json {
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
                if info.awaiting_conversion {
                    println!("  rootfs   made at its first use (pulled, not converted yet)");
                } else {
                    println!(
                        "  rootfs   {} ({} bytes)",
                        info.rootfs.display(),
                        info.rootfs_bytes
                    );
                }
                println!(
                    "  source   {}",
                    output::field(&info.source.display().to_string())
                );
                println!(
                    "  used by  {}",
                    if users.is_empty() {
                        "-".into()
                    } else {
                        users.join(", ")
                    }
                );
                // What follows comes from the image's manifest and
                // config, as its registry served them.
                let f = output::field;
                if let Some(m) = &info.manifest {
                    println!("  manifest {}", f(&m.to_string()));
                }
                if let Some(origin) = &info.origin {
                    println!(
                        "  image    {} ({})",
                        f(&origin.reference),
                        f(&origin.manifest_digest)
                    );
                }
                if let Some(args) = &info.boot_args {
                    println!("  boots    {}", f(args));
                }
                let d = &info.defaults;
                if let Some(user) = &d.user {
                    println!(
                        "  user     {} ({}:{})",
                        f(user),
                        d.uid.unwrap_or(0),
                        d.gid.unwrap_or(0)
                    );
                }
                if let Some(cwd) = &d.cwd {
                    println!("  workdir  {}", f(cwd));
                }
                for (k, v) in &d.env {
                    println!("  env      {}={}", f(k), f(v));
                }
                if let Some(command) = &d.command {
                    println!("  command  {}", f(&command.join(" ")));
                }
            }
        }
        ImageCommand::Import { path, name } => {
            let mut progress = |step: ConversionStep| match step {
                ConversionStep::Layer { index, count } => {
                    eprintln!("applying layer {index} of {count}")
                }
                ConversionStep::Filesystem => eprintln!("writing the root filesystem"),
            };
            let info = images.import_path(name.as_deref(), path, &mut progress)?;
            if json {
                output::json(&info);
            } else {
                println!("imported {} from {}", info.name, path.display());
            }
        }
        ImageCommand::Rm { name } => {
            ws.images().remove(name)?;
            if json {
                output::json(&serde_json::json!({ "removed": name }));
            } else {
                println!("removed image {name}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Pull progress on stderr. On a terminal, one bar a layer (layers
/// download three at a time) with its rate and time left; elsewhere one
/// line a step: the layer count and size, each layer once it is in, each
/// conversion step.
pub(crate) fn pull_progress(terminal: bool) -> impl FnMut(PullEvent) + Send {
    let mut bars = terminal.then(LayerBars::default);
    move |event| {
        if let Some(bars) = bars.as_mut() {
            bars.show(event);
            return;
        }
        let line = match event {
            PullEvent::Resolved { layers, bytes } => format!(
                "{layers} layer(s), {:.1} MiB",
                bytes as f64 / (1 << 20) as f64
            ),
            PullEvent::Cached { index } => format!("layer {index}: cached"),
            PullEvent::Downloading { index, done, size } if done >= size => format!(
                "layer {index}: {:.1} MiB downloaded",
                size as f64 / (1 << 20) as f64
            ),
            PullEvent::Downloading { .. } => return,
            PullEvent::Convert(step) => conversion_line(step),
        };
        eprintln!("{line}");
    }
}

fn conversion_line(step: ConversionStep) -> String {
    match step {
        ConversionStep::Layer { index, count } => format!("applying layer {index} of {count}"),
        ConversionStep::Filesystem => "writing the root filesystem".into(),
    }
}

/// The bars of a pull on a terminal, by layer.
#[derive(Default)]
struct LayerBars {
    all: indicatif::MultiProgress,
    layers: std::collections::BTreeMap<usize, indicatif::ProgressBar>,
}

impl LayerBars {
    fn bar(&mut self, index: usize, size: u64) -> &indicatif::ProgressBar {
        let all = &self.all;
        self.layers.entry(index).or_insert_with(|| {
            let style = indicatif::ProgressStyle::with_template(
                "layer {prefix:>3} [{bar:30}] {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
            let bar = all.add(indicatif::ProgressBar::new(size).with_style(style));
            bar.set_prefix(index.to_string());
            bar
        })
    }

    fn show(&mut self, event: PullEvent) {
        match event {
            PullEvent::Resolved { layers, bytes } => {
                let _ = self.all.println(format!(
                    "{layers} layer(s), {:.1} MiB",
                    bytes as f64 / (1 << 20) as f64
                ));
            }
            PullEvent::Cached { index } => {
                let bar = self.bar(index, 0);
                bar.finish_with_message("cached");
            }
            PullEvent::Downloading { index, done, size } => {
                let bar = self.bar(index, size);
                bar.set_position(done);
                if done >= size {
                    bar.finish_with_message("done");
                } else {
                    bar.set_message(format!("eta {}", indicatif::HumanDuration(bar.eta())));
                }
            }
            PullEvent::Convert(step) => {
                let _ = self.all.println(conversion_line(step));
            }
        }
    }
}

/// The sizes an image gives its workspaces, for `image ls`: `2 vCPU,
/// 2048 MiB (at least 1024)`, or `-` for the defaults.
fn sizes(d: &workspace::images::oci::config::ImageDefaults) -> String {
    let mut parts = Vec::new();
    if let Some(n) = d.vcpus {
        parts.push(format!("{n} vCPU"));
    }
    if let Some(mib) = d.mem_mib {
        parts.push(format!("{mib} MiB"));
    }
    let mut text = parts.join(", ");
    if let Some(least) = d.min_mem_mib {
        text.push_str(&format!(" (at least {least} MiB)"));
    }
    match text.trim() {
        "" => "-".into(),
        t => t.to_owned(),
    }
}

/// The library's request from the command line.
fn build_request(
    name: &str,
    from: &str,
    packages: &[String],
    run: &[String],
    copy: &[String],
    description: Option<&str>,
) -> Result<workspace::images::build::ImageBuildRequest, Error> {
    use workspace::images::build::CopyStep;
    let from = BuildBase::parse(from).map_err(Error::from)?;
    let copy = copy
        .iter()
        .map(|c| CopyStep::parse(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::from)?;
    Ok(ImageBuildRequest {
        name: name.to_owned(),
        from: Some(from),
        packages: packages
            .iter()
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect(),
        run: run.to_vec(),
        copy,
        description: description.map(str::to_owned),
        ..ImageBuildRequest::default()
    })
}

/// The `image build` command line that makes `req` (what a preview says to
/// run with its token).
fn rerun_line(req: &ImageBuildRequest) -> String {
    let from = match &req.from {
        Some(BuildBase::Debian(suite)) => format!("debian:{suite}"),
        Some(BuildBase::Image(image)) => image.clone(),
        None => String::new(),
    };
    let mut rerun = format!("microagent image build {} --from {from}", req.name);
    if let Some(d) = &req.description {
        rerun.push_str(&format!(" --description {d:?}"));
    }
    if let Some(n) = req.vcpus {
        rerun.push_str(&format!(" --vcpus {n}"));
    }
    if let Some(mib) = req.mem_mib {
        rerun.push_str(&format!(" --mem {mib}"));
    }
    if !req.packages.is_empty() {
        rerun.push_str(&format!(" --packages {}", req.packages.join(",")));
    }
    for command in &req.run {
        rerun.push_str(&format!(
            " --run {}",
            workspace::host::plan::shell_quote(command)
        ));
    }
    for c in &req.copy {
        rerun.push_str(&format!(
            " --copy {}",
            workspace::host::plan::shell_quote(&format!("{}:{}", c.from.display(), c.to))
        ));
    }
    rerun
}

/// Previews or applies the build of `req` as `flags` say.
pub async fn build(
    ws: &Workspaces,
    req: &ImageBuildRequest,
    flags: &crate::plan_out::ConfirmFlags,
    json: bool,
) -> Result<(), Error> {
    let progress = crate::plan_out::stderr_progress("image build");
    let done = crate::plan_out::run_change(flags, json, &rerun_line(req), |token| {
        let progress = progress.clone();
        async move { ws.images().build(req, token.as_deref(), progress).await }
    })
    .await?;
    if let (Some(image), false) = (&done.image, json) {
        println!(
            "built {} ({} MiB root filesystem)",
            image.name,
            image.rootfs_bytes.div_ceil(1 << 20)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use workspace::images::oci::config::ImageDefaults;

    #[test]
    fn image_sizes_read_in_a_table_cell() {
        assert_eq!(sizes(&ImageDefaults::default()), "-");
        let browser = ImageDefaults {
            vcpus: Some(2),
            mem_mib: Some(2048),
            min_mem_mib: Some(1024),
            ..ImageDefaults::default()
        };
        assert_eq!(sizes(&browser), "2 vCPU, 2048 MiB (at least 1024 MiB)");
        let debian = ImageDefaults {
            mem_mib: Some(512),
            ..ImageDefaults::default()
        };
        assert_eq!(sizes(&debian), "512 MiB");
    }
}
