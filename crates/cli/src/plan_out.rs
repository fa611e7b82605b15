//! How a preview-then-confirm plan reads on a terminal (network setup,
//! kernel install, image build, setup): the steps with their commands,
//! what is written, disk and time, and the command that applies it.

use std::future::Future;

use serde::Serialize;
use workspace::host::plan::Preview;
use workspace::images::build::ImageBuild;
use workspace::kernels::KernelInstall;
use workspace::Error;

use crate::output;

/// The flags of every preview-then-confirm command.
#[derive(Debug, clap::Args)]
pub struct ConfirmFlags {
    /// Apply the plan a preview printed (its token).
    #[arg(long, value_name = "TOKEN", conflicts_with = "yes")]
    pub confirm: Option<String>,
    /// Preview and apply at once.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// Progress lines on stderr, so stdout stays the result (escaped: a
/// build's steps can carry what its guest printed).
pub fn stderr_progress(prefix: &'static str) -> std::sync::Arc<dyn Fn(&str) + Send + Sync> {
    std::sync::Arc::new(move |step: &str| eprintln!("{prefix}: {}", output::field(step)))
}

/// A library result that carries a plan.
pub trait Change: Serialize {
    /// The plan and its token.
    fn preview(&self) -> &Preview;
    /// Whether it was applied.
    fn applied(&self) -> bool;
}

impl Change for KernelInstall {
    fn preview(&self) -> &Preview {
        &self.preview
    }
    fn applied(&self) -> bool {
        self.applied
    }
}

impl Change for workspace::host::setup::Setup {
    fn preview(&self) -> &Preview {
        &self.preview
    }
    fn applied(&self) -> bool {
        self.applied
    }
}

impl Change for ImageBuild {
    fn preview(&self) -> &Preview {
        &self.preview
    }
    fn applied(&self) -> bool {
        self.applied
    }
}

/// Runs a preview-then-confirm operation as the flags say: `call(None)`
/// previews, `call(Some(token))` applies. A preview is printed (JSON or
/// text with the command that applies it, `rerun`); an applied result is
/// returned for the caller to report (printed here only as JSON).
pub async fn run_change<T, F, Fut>(
    flags: &ConfirmFlags,
    json: bool,
    rerun: &str,
    call: F,
) -> Result<T, Error>
where
    T: Change,
    F: Fn(Option<String>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut token = flags.confirm.clone();
    if flags.yes {
        let preview = call(None).await?;
        match &preview.preview().token {
            Some(t) => token = Some(t.clone()),
            None => {
                // Nothing to do.
                show(&preview, json, rerun);
                return Ok(preview);
            }
        }
        if !json {
            print(preview.preview(), false, None);
        }
    }
    let done = call(token).await?;
    show(&done, json, rerun);
    Ok(done)
}

fn show<T: Change>(change: &T, json: bool, rerun: &str) {
    if json {
        output::json(change);
    } else if !change.applied() {
        print(change.preview(), false, Some(rerun));
    }
}

/// Prints `preview` (applied or not); `rerun` is the command line that
/// applies it when given the token (none: it is being applied now).
pub fn print(preview: &Preview, applied: bool, rerun: Option<&str>) {
    let mut out = std::io::stdout().lock();
    let _ = write_plan(&mut out, preview, applied, rerun);
}

/// [`print`] into `out` (stderr where stdout is another command's).
pub fn write_plan(
    out: &mut dyn std::io::Write,
    preview: &Preview,
    applied: bool,
    rerun: Option<&str>,
) -> std::io::Result<()> {
    let plan = &preview.plan;
    if plan.is_empty() {
        writeln!(out, "{}: nothing to do", plan.action)?;
        for note in &plan.notes {
            writeln!(out, "{note}")?;
        }
        return Ok(());
    }
    let what = if applied { "applied" } else { "plan" };
    writeln!(out, "{} {what}:", plan.action)?;
    // Steps name packages, scripts and files an image build was given
    // (from an MCP client too): escaped like any outside text.
    let f = output::field;
    for (i, step) in plan.steps.iter().enumerate() {
        writeln!(out, "  {}. {}", i + 1, f(&step.what))?;
        writeln!(out, "     $ {}", f(&step.command_line()))?;
        if let Some(stdin) = &step.stdin {
            for line in stdin.lines() {
                writeln!(out, "     | {}", f(line))?;
            }
        }
    }
    for note in &plan.notes {
        writeln!(out, "  - {}", f(note))?;
    }
    if !plan.writes.is_empty() {
        writeln!(out, "  writes:")?;
        for path in &plan.writes {
            writeln!(out, "    {}", f(path))?;
        }
    }
    if plan.disk_bytes > 0 {
        writeln!(
            out,
            "  disk: about {:.1} GiB at its peak",
            plan.disk_bytes as f64 / f64::from(1 << 30)
        )?;
    }
    if plan.estimate_seconds > 0 {
        writeln!(out, "  time: about {}", minutes(plan.estimate_seconds))?;
    }
    if let (Some(token), Some(rerun)) = (&preview.token, rerun) {
        writeln!(out)?;
        let who = if plan.needs_root { ", as root" } else { "" };
        writeln!(
            out,
            "nothing was changed. To apply exactly this plan within 5 minutes{who}, run:"
        )?;
        writeln!(out, "  {rerun} --confirm {token}")?;
        if plan.needs_root {
            writeln!(out, "(as another user, keep the same state directory: sudo MICROAGENT_HOME=\"$MICROAGENT_HOME\" ... or sudo -E)")?;
        }
    }
    Ok(())
}

/// `90` -> `2 min`, `30` -> `30 s`.
fn minutes(secs: u64) -> String {
    if secs < 90 {
        format!("{secs} s")
    } else {
        format!("{} min", secs.div_ceil(60))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_in_minutes_past_ninety_seconds() {
        assert_eq!(super::minutes(30), "30 s");
        assert_eq!(super::minutes(89), "89 s");
        assert_eq!(super::minutes(360), "6 min");
        assert_eq!(super::minutes(361), "7 min");
    }
}
