//! Applying an image build: the Debian bootstrap, the steps in a booted
//! throwaway workspace, the saved root filesystem, the registration. Work
//! happens in a scratch directory of the registry, removed afterwards.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::guest::request::ExecRequest;
use crate::guest::stream::ExecInput;
use crate::images::build::{debian, guest_commands, BuildBase, ImageBuildError, ImageBuildRequest};
use crate::workspaces::manager::Workspaces;
use crate::workspaces::one_shot::OneShot;
use base::host::plan::Plan;
use base::host::plan::ProgressFn;
use base::host::settings::unique_id;
use base::images::registry::ImageInfo;
use base::store::spec::WorkspaceSpec;

/// How long one build command may run.
const STEP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long the boot may take (cold: ~30 s on an emulating host).
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
/// Bytes of stderr a failure shows.
const STDERR_TAIL: usize = 2000;

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::from(ImageBuildError::Io { what, source })
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let start = text.len().saturating_sub(STDERR_TAIL);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].trim().to_owned()
}

/// Applies `plan` (already confirmed) for `req`.
pub(crate) async fn apply(
    ws: &Workspaces,
    req: &ImageBuildRequest,
    plan: &Plan,
    minimal: &ImageInfo,
    base: Option<ImageInfo>,
    progress: ProgressFn,
) -> Result<ImageInfo> {
    let work = ws.image_registry().scratch_dir("build")?;
    let built = build(ws, req, plan, minimal, base, &work, progress).await;
    let _ = std::fs::remove_dir_all(&work);
    built
}

async fn build(
    ws: &Workspaces,
    req: &ImageBuildRequest,
    plan: &Plan,
    minimal: &ImageInfo,
    base: Option<ImageInfo>,
    work: &Path,
    progress: ProgressFn,
) -> Result<ImageInfo> {
    let boots = !guest_commands(req).is_empty() || !req.copy.is_empty();
    let base = match (&req.from, base) {
        (Some(BuildBase::Image(_)), Some(base)) => base,
        (Some(BuildBase::Debian(suite)), _) => {
            let rootfs = bootstrap(ws, suite, req, plan, minimal, work, &progress).await?;
            let source = PathBuf::from(format!("debian:{suite}"));
            if !boots {
                return Ok(ws.image_registry().register_converted(
                    &req.name,
                    &minimal.kernel,
                    &rootfs,
                    req.sized(Default::default()),
                    source,
                    req.description.clone(),
                )?);
            }
            // The steps run on the bootstrapped tree, registered for the
            // boot under a name of its own and removed afterwards.
            let stage = format!("build-stage-{}", unique_id());
            let info = ws.image_registry().register_converted(
                &stage,
                &minimal.kernel,
                &rootfs,
                Default::default(),
                source,
                None,
            )?;
            let _ = std::fs::remove_file(&rootfs);
            let result = in_workspace(ws, req, &info, minimal, work, &progress).await;
            let _ = ws.image_registry().remove(&stage, Vec::new());
            return result;
        }
        _ => {
            return Err(ImageBuildError::Request("say what to build from".into()).into());
        }
    };
    in_workspace(ws, req, &base, minimal, work, &progress).await
}

/// mmdebstrap (after the plan's host package installs) and the conversion
/// of its tree; returns the root filesystem file.
async fn bootstrap(
    ws: &Workspaces,
    suite: &str,
    req: &ImageBuildRequest,
    plan: &Plan,
    minimal: &ImageInfo,
    work: &Path,
    progress: &ProgressFn,
) -> Result<PathBuf> {
    let (suite, packages, plan) = (suite.to_owned(), req.packages.clone(), plan.clone());
    let (work, base_rootfs, progress) = (work.to_owned(), minimal.rootfs.clone(), progress.clone());
    ws.blocking(move |ws| {
        if !plan.steps.is_empty() {
            progress("installing mmdebstrap");
            plan.run()?;
        }
        progress(&format!(
            "mmdebstrap {suite} (downloading and unpacking packages)"
        ));
        let budget = ws.image_registry().budget();
        Ok(debian::bootstrap_rootfs(
            &suite,
            &packages,
            &work,
            &base_rootfs,
            budget,
        )?)
    })
    .await
}

/// Boots `base`, copies, runs the commands, saves the root filesystem and
/// registers it as the new image.
async fn in_workspace(
    ws: &Workspaces,
    req: &ImageBuildRequest,
    base: &ImageInfo,
    minimal: &ImageInfo,
    work: &Path,
    progress: &ProgressFn,
) -> Result<ImageInfo> {
    // Default sizes, so the image's warm snapshot (if any) starts it.
    let mut spec = WorkspaceSpec {
        image: base.name.clone(),
        ..WorkspaceSpec::default()
    }
    .with_image(base.clone());
    // Steps run as root, as a Dockerfile's RUN does unless told otherwise;
    // the image keeps its own user for workspaces.
    spec.user = None;
    let one_shot = OneShot::new("image-build", spec);
    let archive = work.join("rootfs.tar");
    let ended = ws
        .run_once(
            &one_shot,
            |name| async move {
                progress(&format!("booting {}", base.name));
                ws.at(&name).start(BOOT_TIMEOUT, |_| {}).await.map(|_| true)
            },
            |name| async move {
                run_steps(ws, &name, req, progress).await?;
                progress("saving the root filesystem");
                save(ws, &name, &archive).await
            },
        )
        .await?;
    let digest = match ended.outcome {
        Ok(Some(digest)) => digest,
        Ok(None) => return Err(Error::InvalidInput("the build's boot was cancelled".into())),
        Err(e) => return Err(e),
    };
    progress("writing the root filesystem");
    let (archive, convert, base_rootfs, cwd) = (
        work.join("rootfs.tar"),
        work.join("convert"),
        minimal.rootfs.clone(),
        base.defaults.cwd.clone(),
    );
    let budget = base::images::oci::unpack::Budget::of(ws.limits());
    let rootfs = ws
        .blocking(move |_| {
            std::fs::create_dir_all(&convert)
                .map_err(io(format!("creating {}", convert.display())))?;
            let rootfs = base::images::oci::rootfs::convert_archive(
                &archive,
                &format!("sha256:{digest}"),
                &convert,
                &base_rootfs,
                cwd.as_deref(),
                budget,
            )
            .map_err(ImageBuildError::from)?;
            let _ = std::fs::remove_file(&archive);
            Ok(rootfs)
        })
        .await?;
    Ok(ws.image_registry().register_converted(
        &req.name,
        &base.kernel,
        &rootfs,
        req.sized(base.defaults.clone()),
        PathBuf::from(format!("image build from {}", base.name)),
        req.description.clone(),
    )?)
}

/// The copies, then the commands; the first failure stops the build.
async fn run_steps(
    ws: &Workspaces,
    name: &str,
    req: &ImageBuildRequest,
    progress: &ProgressFn,
) -> Result<()> {
    for copy in &req.copy {
        progress(&format!("copying {} to {}", copy.from.display(), copy.to));
        // As a Dockerfile's COPY does: the destination's parents are made.
        if let Some(parent) = Path::new(&copy.to).parent().and_then(Path::to_str) {
            let made = ws
                .at(name)
                .exec_collect(ExecRequest::argv(["mkdir", "-p", parent]), ExecInput::None)
                .await?;
            if !made.success() {
                return Err(ImageBuildError::StepFailed {
                    step: 0,
                    command: format!("mkdir -p {parent}"),
                    how: format!("exit code {:?}", made.exit_code),
                    stderr: tail(made.stderr.as_bytes()),
                }
                .into());
            }
        }
        ws.at(name).files().copy_in(&copy.from, &copy.to).await?;
    }
    for (i, command) in guest_commands(req).into_iter().enumerate() {
        progress(&format!("running `{command}`"));
        let result = ws
            .at(name)
            .exec_collect(
                ExecRequest::shell(command.clone()).timeout(STEP_TIMEOUT),
                ExecInput::None,
            )
            .await?;
        if result.success() {
            continue;
        }
        let how = if result.timed_out {
            "timed out".to_owned()
        } else if let Some(signal) = result.signal {
            format!("signal {signal}")
        } else {
            format!("exit code {}", result.exit_code.unwrap_or(-1))
        };
        return Err(ImageBuildError::StepFailed {
            step: i + 1,
            command,
            how,
            stderr: tail(result.stderr.as_bytes()),
        }
        .into());
    }
    Ok(())
}

/// Streams the guest's root filesystem into `archive` (the agent's tar of
/// `/` on its own filesystem: mount points such as /proc and /tmp come
/// empty); returns its sha256.
async fn save(ws: &Workspaces, name: &str, archive: &Path) -> Result<String> {
    let file = tokio::fs::File::create(archive)
        .await
        .map_err(io(format!("creating {}", archive.display())))?;
    // A guest that streams without end stops at the image's byte limit.
    let limit = ws.limits().max_image_bytes;
    let mut budgeted = crate::host::host_write::Budgeted::new(file, limit);
    let sent = ws
        .at(name)
        .agent()
        .await?
        .tar_out_with("/", true, &mut budgeted)
        .await;
    match sent {
        Ok(_) => {}
        Err(_) if budgeted.exhausted() => {
            return Err(
                ImageBuildError::from(base::images::oci::OciError::OverLimit {
                    what: "bytes saved from the guest",
                    limit,
                })
                .into(),
            )
        }
        Err(e) => return Err(Error::agent("tar_out")(e)),
    }
    let file = budgeted.into_inner();
    file.sync_all()
        .await
        .map_err(io(format!("writing {}", archive.display())))?;
    drop(file);
    let archive = archive.to_owned();
    ws.blocking(move |_| {
        let digest =
            base::images::oci::layout::file_digest(&archive).map_err(ImageBuildError::from)?;
        Ok(digest.trim_start_matches("sha256:").to_owned())
    })
    .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn tails_keep_the_end_on_a_char_boundary() {
        let long = format!("{}é{}", "a".repeat(super::STDERR_TAIL), "b".repeat(10));
        let t = super::tail(long.as_bytes());
        assert!(t.ends_with("bbbbbbbbbb") && t.len() <= super::STDERR_TAIL + 1);
        assert_eq!(super::tail(b" short \n"), "short");
    }
}
