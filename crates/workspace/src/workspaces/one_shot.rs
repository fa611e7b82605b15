//! The one-shot use case behind `microagent run` and MCP's `run_code`: a
//! fresh workspace is created, started, used, and cleaned up whatever
//! happened (deleted, or stopped when kept). Front ends plug in how they
//! show a boot and how they run their command; the order and the cleanup
//! live here once.

use std::future::Future;

use crate::error::{Error, Result};
use crate::workspaces::lifecycle::DEFAULT_STOP_TIMEOUT;
use crate::workspaces::manager::Workspaces;
use base::host::settings::unique_id;
use base::store::spec::WorkspaceSpec;

/// What becomes of a one-shot workspace afterwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Afterwards {
    /// Deleted, with its disk (the default).
    #[default]
    Delete,
    /// Stopped and kept, to be inspected or started again.
    KeepStopped,
}

/// A one-shot run: what to create and what to do with it afterwards.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OneShot {
    /// The workspace's name; `None` picks `PREFIX-ID` with a fresh id.
    pub name: Option<String>,
    /// The prefix of a picked name (`run` for `microagent run`).
    pub prefix: String,
    /// What the workspace is created with.
    pub spec: WorkspaceSpec,
    /// What becomes of it afterwards.
    pub afterwards: Afterwards,
}

/// The TTL a one-shot workspace gets unless its spec has one: a client
/// killed mid-run leaves nothing running longer than this.
pub const ONE_SHOT_TTL_SECS: u64 = 3600;

impl OneShot {
    /// A deleted-afterwards workspace of `spec`, named `PREFIX-ID`, with a
    /// TTL of [`ONE_SHOT_TTL_SECS`] unless `spec` sets one.
    pub fn new(prefix: impl Into<String>, spec: WorkspaceSpec) -> Self {
        Self {
            name: None,
            prefix: prefix.into(),
            spec: WorkspaceSpec {
                ttl_secs: spec.ttl_secs.or(Some(ONE_SHOT_TTL_SECS)),
                owner: base::store::spec::Owner::this_process(),
                ..spec
            },
            afterwards: Afterwards::default(),
        }
    }

    /// Names the workspace instead of picking a name.
    pub fn named(mut self, name: Option<String>) -> Self {
        self.name = name;
        self
    }

    /// Sets what becomes of the workspace afterwards.
    pub fn afterwards(mut self, afterwards: Afterwards) -> Self {
        self.afterwards = afterwards;
        self
    }

    /// The name the workspace gets.
    fn pick_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", self.prefix, unique_id()))
    }
}

/// How a one-shot run went; `E` is the error type of the front end's steps.
#[derive(Debug)]
#[non_exhaustive]
pub struct OneShotEnd<T, E = Error> {
    /// The workspace it used.
    pub workspace: String,
    /// What the work returned; `Ok(None)` when the start step said not to
    /// go on (the boot was cancelled).
    pub outcome: Result<Option<T>, E>,
    /// Whether the cleanup (delete, or stop when kept) failed: the
    /// workspace may then remain.
    pub cleanup: Result<()>,
}

impl Workspaces {
    /// Creates a workspace for `run`, starts it with `start` (which returns
    /// `Ok(false)` when it was cancelled), runs `work` in it, and cleans up
    /// whatever happened. A failed create returns an error and leaves
    /// nothing behind; every later failure is in the returned
    /// [`OneShotEnd`], after the cleanup.
    ///
    /// `start` is given the name and calls [`Workspace::start`](crate::Workspace::start) with the
    /// progress reporting and cancellation its front end wants; `work` runs
    /// the command. Their error type is the front end's own.
    pub async fn run_once<T, E, S, SF, W, WF>(
        &self,
        run: &OneShot,
        start: S,
        work: W,
    ) -> Result<OneShotEnd<T, E>>
    where
        S: FnOnce(String) -> SF,
        SF: Future<Output = Result<bool, E>>,
        W: FnOnce(String) -> WF,
        WF: Future<Output = Result<T, E>>,
    {
        run.spec.validate_within(self.limits())?;
        let name = run.pick_name();
        let spec = run.spec.clone();
        self.blocking({
            let name = name.clone();
            move |ws| ws.create(&name, spec).map(drop)
        })
        .await?;
        let outcome: Result<Option<T>, E> = async {
            if !start(name.clone()).await? {
                return Ok(None);
            }
            work(name.clone()).await.map(Some)
        }
        .await;
        let cleanup = match run.afterwards {
            Afterwards::KeepStopped => self.at(&name).stop(DEFAULT_STOP_TIMEOUT).await.map(drop),
            Afterwards::Delete => {
                let target = name.clone();
                self.blocking(move |ws| {
                    // Its kept outputs stay (until their TTL): its
                    // caller reads them after this.
                    ws.at(&target)
                        .delete(
                            base::store::spec::DeleteOptions::default()
                                .force(true)
                                .keep_outputs(true),
                        )
                        .map(drop)
                })
                .await
            }
        };
        Ok(OneShotEnd {
            workspace: name,
            outcome,
            cleanup,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shots_always_carry_a_ttl() {
        let plain = OneShot::new("run", WorkspaceSpec::default());
        assert_eq!(plain.spec.ttl_secs, Some(ONE_SHOT_TTL_SECS));
        let asked = WorkspaceSpec {
            ttl_secs: Some(60),
            ..WorkspaceSpec::default()
        };
        assert_eq!(OneShot::new("run", asked).spec.ttl_secs, Some(60));
    }

    #[test]
    fn picks_a_fresh_name_unless_given_one() {
        let run = OneShot::new("run", WorkspaceSpec::default());
        let (a, b) = (run.pick_name(), run.pick_name());
        assert!(a.starts_with("run-") && a != b, "{a} {b}");
        assert!(base::store::name::validate_name(&a).is_ok());
        let named = run.clone().named(Some("dev".into()));
        assert_eq!(named.pick_name(), "dev");
        assert_eq!(named.afterwards, Afterwards::Delete);
        assert_eq!(
            named.afterwards(Afterwards::KeepStopped).afterwards,
            Afterwards::KeepStopped
        );
    }
}
