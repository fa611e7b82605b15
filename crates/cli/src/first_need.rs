//! The library's own images (`debian`, `browser`, `code`) built when a
//! command first needs one: on a terminal the command shows the plan (on
//! stderr: stdout is the command's) and asks; confirmed, it builds with
//! progress and goes on. Asked only when the plan is the image's build
//! alone (no packages, nothing as root: those are `setup`'s to show),
//! and after the command's own cheap checks. Elsewhere, or declined,
//! nothing changes and the command fails as before, its remedy naming
//! `setup --with IMAGE`.

use std::io::{IsTerminal, Write};

use workspace::host::plan::Plan;
use workspace::{Error, Workspaces};

use crate::kernel_cmd::SetupExtra;
use crate::plan_out::{stderr_progress, write_plan, Change};

/// What the command needs of the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Any image.
    Any,
    /// An image with git (a repository's checkout, a task): only
    /// `debian` of the library's has it.
    Git,
}

/// Builds `image` first if it is one of the library's, missing, and the
/// person at the terminal says so.
pub async fn build_if_missing(
    ws: &Workspaces,
    image: &str,
    need: Need,
    json: bool,
) -> Result<(), Error> {
    let Some(extra) = SetupExtra::for_image(image) else {
        return Ok(());
    };
    if need == Need::Git && extra != SetupExtra::Debian {
        return Ok(());
    }
    let asking = !json && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    if !asking || ws.image_registry().find(image)?.is_some() {
        return Ok(());
    }
    match extra.image_request() {
        None => {
            let progress = stderr_progress("setup");
            let call = |token: Option<String>| {
                let progress = progress.clone();
                async move {
                    ws.host_setup()
                        .setup(true, token.as_deref(), progress)
                        .await
                }
            };
            ask_then_apply(ws, image, call).await
        }
        Some(req) => {
            let progress = stderr_progress("image build");
            let call = |token: Option<String>| {
                let (progress, req) = (progress.clone(), &req);
                async move { ws.images().build(req, token.as_deref(), progress).await }
            };
            ask_then_apply(ws, image, call).await
        }
    }
}

/// Whether a plan is only an image's build, which the person at the
/// terminal may start: no step (packages, anything as root).
fn only_the_build(plan: &Plan) -> bool {
    plan.steps.is_empty() && !plan.needs_root
}

/// Previews with `call(None)`, shows the plan and asks; on yes previews
/// again (the first token may have expired while the person read) and
/// applies that plan if it is the one shown. Any failure before the build
/// is said and left to the command's own error.
async fn ask_then_apply<T, F, Fut>(ws: &Workspaces, image: &str, call: F) -> Result<(), Error>
where
    T: Change,
    F: Fn(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let remedy = format!("`microagent setup --with {image} --yes` builds it");
    let shown = match call(None).await {
        Ok(preview) if preview.preview().token.is_some() => preview,
        Ok(_) => return Ok(()),
        Err(e) => {
            eprintln!(
                "the image `{image}` is not built, and its build cannot be planned here: {}",
                crate::output::field(&e.full_message())
            );
            return Ok(());
        }
    };
    let plan = &shown.preview().plan;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "the image `{image}` is not built on this host yet.");
    let _ = write_plan(&mut err, shown.preview(), false, None);
    if !only_the_build(plan) {
        let _ = writeln!(
            err,
            "this needs more than the image's build (the host's setup{}): not built; {remedy}",
            if plan.needs_root { ", as root" } else { "" }
        );
        return Ok(());
    }
    let _ = write!(err, "build `{image}` now? [y/N] ");
    let _ = err.flush();
    drop(err);
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    if !is_yes(&answer) {
        eprintln!("not built ({remedy})");
        return Ok(());
    }
    // Built meanwhile (another terminal said yes first).
    if ws.image_registry().find(image)?.is_some() {
        return Ok(());
    }
    let fresh = call(None).await?;
    let Some(token) = fresh.preview().token.clone() else {
        return Ok(());
    };
    if fresh.preview().plan != *plan {
        eprintln!("the plan changed while you answered: not built; run the command again");
        return Ok(());
    }
    call(Some(token)).await?;
    eprintln!("built {image}");
    Ok(())
}

/// Whether a prompt's answer is yes (`y`, `yes`, any case).
fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_y_or_yes_builds() {
        for yes in ["y\n", "Y", " yes ", "YES\n"] {
            assert!(is_yes(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yess", "y y", "ja"] {
            assert!(!is_yes(no), "{no:?}");
        }
    }

    #[test]
    fn every_setup_image_has_its_extra() {
        for extra in [SetupExtra::Debian, SetupExtra::Browser, SetupExtra::Code] {
            assert_eq!(SetupExtra::for_image(extra.image()), Some(extra));
            // All but debian (setup's own) are image builds of that name.
            if let Some(req) = extra.image_request() {
                assert_eq!(req.name, extra.image());
            }
        }
        assert_eq!(SetupExtra::for_image("minimal"), None);
        assert_eq!(SetupExtra::for_image("Debian"), None);
        assert_eq!(SetupExtra::for_image("debian:bookworm"), None);
        assert_eq!(SetupExtra::image(SetupExtra::Debian), "debian");
    }

    #[test]
    fn only_a_plan_of_the_build_alone_is_asked() {
        let mut plan = Plan::new("setup");
        plan.notes.push("builds the `debian` image".into());
        assert!(only_the_build(&plan));
        let mut packages = plan.clone();
        packages.install_packages(&["mmdebstrap".to_owned()]);
        assert!(!only_the_build(&packages));
        let mut root = plan.clone();
        root.needs_root = true;
        assert!(!only_the_build(&root));
    }
}
