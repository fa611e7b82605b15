//! The library's own images (`debian`, `browser`, `code`) built when a
//! command first needs one: on a terminal the command shows the plan (on
//! stderr: stdout is the command's) and asks; confirmed, it builds with
//! progress and goes on. Elsewhere, or declined, nothing changes and the
//! command fails as before, its remedy naming `setup --with IMAGE`.

use std::io::{IsTerminal, Write};

use workspace::{Error, Workspaces};

use crate::kernel_cmd::SetupExtra;
use crate::plan_out::{stderr_progress, write_plan, Change};

/// Builds `image` first if it is one of the library's, missing, and the
/// person at the terminal says so.
pub async fn build_if_missing(ws: &Workspaces, image: &str, json: bool) -> Result<(), Error> {
    let Some(extra) = SetupExtra::for_image(image) else {
        return Ok(());
    };
    let asking = !json && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    if !asking || ws.image_registry().find(image)?.is_some() {
        return Ok(());
    }
    let progress = stderr_progress("image build");
    match extra.image_request() {
        None => {
            let call = |token: Option<String>| {
                let progress = progress.clone();
                async move {
                    ws.host_setup()
                        .setup(true, token.as_deref(), progress)
                        .await
                }
            };
            ask_then_apply(image, call).await
        }
        Some(req) => {
            let call = |token: Option<String>| {
                let (progress, req) = (progress.clone(), &req);
                async move { ws.images().build(req, token.as_deref(), progress).await }
            };
            ask_then_apply(image, call).await
        }
    }
}

/// Previews with `call(None)`, shows the plan and asks; applies with
/// `call(Some(token))` on yes.
async fn ask_then_apply<T, F, Fut>(image: &str, call: F) -> Result<(), Error>
where
    T: Change,
    F: Fn(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let preview = call(None).await?;
    let Some(token) = preview.preview().token.clone() else {
        return Ok(());
    };
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "the image `{image}` is not built on this host yet.");
    let _ = write_plan(&mut err, preview.preview(), false, None);
    let _ = write!(err, "build `{image}` now? [y/N] ");
    let _ = err.flush();
    drop(err);
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    if !is_yes(&answer) {
        eprintln!("not built (`microagent setup --with {image} --yes` builds it)");
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
        assert_eq!(SetupExtra::for_image("debian:bookworm"), None);
        assert_eq!(SetupExtra::image(SetupExtra::Debian), "debian");
    }
}
