//! `microagent kernel ls | install` and `microagent setup` (the kernel
//! and the built images).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use workspace::kernels::KernelSource;
use workspace::{Error, Workspaces};

use crate::output;
use crate::plan_out::{run_change, stderr_progress, ConfirmFlags};

#[derive(Debug, Subcommand)]
pub enum KernelCommand {
    /// List guest kernels: the built ones (which variant this host boots)
    /// and those only imported images carry, with versions and users.
    #[command(visible_alias = "list")]
    Ls,
    /// Install the guest kernel this host needs: build it from Debian's
    /// kernel source (the default), or install a kernel file after checking
    /// that it boots the `minimal` image. Without --confirm or --yes it only
    /// shows the plan (packages, disk, time, files) and a token.
    Install {
        /// Build from Debian's linux-source-6.1 with our config and patches.
        #[arg(long, conflicts_with = "file")]
        from_source: bool,
        /// Install this kernel (ELF vmlinux or bzImage) instead.
        #[arg(long, value_name = "VMLINUX")]
        file: Option<PathBuf>,
        /// The variant to install (default: the one this host needs).
        #[arg(long, value_parser = ["standard", "compat"])]
        variant: Option<String>,
        #[command(flatten)]
        flags: ConfirmFlags,
    },
}

pub async fn run(ws: &Workspaces, cmd: &KernelCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        KernelCommand::Ls => list(ws, json)?,
        KernelCommand::Install {
            from_source: _,
            file,
            variant,
            flags,
        } => {
            let source = match file {
                Some(f) => KernelSource::File(f.clone()),
                None => KernelSource::FromSource,
            };
            let variant = variant
                .as_deref()
                .and_then(workspace::KernelVariant::from_name);
            let mut rerun = String::from("microagent kernel install");
            if let Some(f) = file {
                rerun.push_str(&format!(" --file {}", f.display()));
            }
            if let Some(v) = variant {
                rerun.push_str(&format!(" --variant {v}"));
            }
            let progress = stderr_progress("kernel install");
            let done = run_change(flags, json, &rerun, |token| {
                let (source, progress) = (&source, progress.clone());
                async move {
                    ws.kernels()
                        .install(source, variant, token.as_deref(), progress)
                        .await
                }
            })
            .await?;
            if done.applied && !json {
                println!(
                    "installed {} ({})",
                    done.kernel
                        .as_ref()
                        .map_or_else(String::new, |k| k.display().to_string()),
                    // The banner is read from the kernel file.
                    output::field(done.version.as_deref().unwrap_or("no version banner"))
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `microagent setup`.
/// An optional image `setup --with` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SetupExtra {
    /// Debian bookworm with python3, nodejs, git and ssh (`--image
    /// debian`, the default image of tasks and repositories).
    Debian,
    /// Debian with headless Chromium, for the browser tools.
    Browser,
    /// Debian with Jupyter's Python kernel, numpy, pandas, matplotlib and
    /// Node.js, for code sessions.
    Code,
}

impl SetupExtra {
    /// The image this builds.
    pub fn image(self) -> &'static str {
        match self {
            Self::Debian => workspace::images::build::debian::IMAGE,
            Self::Browser => workspace::browser::IMAGE,
            Self::Code => workspace::code_sessions::IMAGE,
        }
    }

    /// The extra that builds `image`, if the library has its recipe.
    pub fn for_image(image: &str) -> Option<Self> {
        [Self::Debian, Self::Browser, Self::Code]
            .into_iter()
            .find(|extra| extra.image() == image)
    }

    /// The build request of an image made by `image build` (all but
    /// `debian`, which setup makes).
    pub fn image_request(self) -> Option<workspace::images::build::ImageBuildRequest> {
        match self {
            Self::Debian => None,
            Self::Browser => Some(workspace::browser::image_request()),
            Self::Code => Some(workspace::code_sessions::image_request()),
        }
    }
}

pub async fn setup(
    ws: &Workspaces,
    flags: &ConfirmFlags,
    with: &[SetupExtra],
    json: bool,
) -> Result<ExitCode, Error> {
    let progress = stderr_progress("setup");
    let done = run_change(flags, json, "microagent setup", |token| {
        let progress = progress.clone();
        let debian = with.contains(&SetupExtra::Debian);
        async move {
            ws.host_setup()
                .setup(debian, token.as_deref(), progress)
                .await
        }
    })
    .await?;
    if done.applied && !json {
        if done.made.is_empty() {
            println!("nothing to do: this host has everything");
        } else {
            println!("made: {}", done.made.join(", "));
        }
        println!("try it: microagent run -- uname -a");
    }
    for extra in with {
        let Some(req) = extra.image_request() else {
            continue;
        };
        if ws.image_registry().find(&req.name)?.is_some() {
            if !json {
                println!("image {}: already built", req.name);
            }
        } else {
            // Its own plan: a setup token does not confirm it.
            let image_flags = ConfirmFlags {
                confirm: None,
                yes: flags.yes,
            };
            crate::image_cmd::build(ws, &req, &image_flags, json).await?;
        }
    }
    if with.contains(&SetupExtra::Code) {
        code_kernels(ws, flags.yes, json).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The `code` image's kernels made ahead in its warm snapshot (with
/// `yes`, as its build), unless they are there or the image is not built
/// (a fresh workspace's first session then takes one).
async fn code_kernels(ws: &Workspaces, yes: bool, json: bool) -> Result<(), Error> {
    use workspace::code_sessions::{self, CodeLanguage};
    let image = code_sessions::IMAGE;
    if ws.image_registry().get(image).is_err() {
        return Ok(());
    }
    let spec = workspace::pool::member_spec(image, &ws.image_defaults(image));
    let all = [CodeLanguage::Python, CodeLanguage::JavaScript];
    let ready = code_sessions::ready_for(ws, &spec);
    if all.iter().all(|l| ready.contains(l)) {
        if !json {
            println!("image {image}: kernels made ahead in its warm snapshot");
        }
        return Ok(());
    }
    if !yes {
        if !json {
            println!(
                "image {image}: no kernels made ahead yet; with --yes setup makes them \
                 (`microagent code prepare`: minutes here, once)"
            );
        }
        return Ok(());
    }
    let names: Vec<String> = all.iter().map(|l| l.as_str().to_owned()).collect();
    crate::code_cmd::prepare(ws, image, &names, json).await
}

fn list(ws: &Workspaces, json: bool) -> Result<(), Error> {
    let kernels = workspace::images::kernels::list(ws.image_registry())?;
    if json {
        output::json(&kernels);
    } else if kernels.is_empty() {
        println!("no guest kernels (install one: microagent kernel install)");
    } else {
        for k in &kernels {
            println!(
                "{:<9} {:>6.1} MiB  {}{}",
                k.variant.as_deref().unwrap_or("imported"),
                k.bytes as f64 / (1 << 20) as f64,
                output::field(k.version.as_deref().unwrap_or("(no version banner)")),
                if k.this_host { "  [this host]" } else { "" }
            );
            println!("          {}", k.path.display());
            if !k.used_by.is_empty() {
                println!("          used by {}", k.used_by.join(", "));
            }
        }
    }
    Ok(())
}
