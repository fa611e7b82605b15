//! What a host setup did: its plan and token, and what it made. The setup
//! itself (what this host lacks, the plan, applying it) is an operation of
//! the collection (`Workspaces::setup`).

use serde::Serialize;

use base::host::plan::Preview;

/// A setup: the plan, its token, and what was made.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Setup {
    /// The plan and its token (none when the host has everything).
    #[serde(flatten)]
    pub preview: Preview,
    /// It was applied (false: a preview).
    pub applied: bool,
    /// What was made, in order (`kernel`, `minimal`, `debian`).
    pub made: Vec<String>,
}
