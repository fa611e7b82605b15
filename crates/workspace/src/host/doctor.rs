//! `doctor`: can this host run workspaces, and how well? Each check is ok,
//! warn or fail, with what to do about anything but ok. The checks
//! themselves read every concern of the crate, so they sit above it
//! ([`Report::check_host`]).

use serde::Serialize;

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Fine.
    Ok,
    /// Works, with a caveat.
    Warn,
    /// Workspaces cannot run until this is fixed.
    Fail,
}

impl Status {
    /// Its stable name, as in the JSON report.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Check {
    /// Stable check name.
    pub name: &'static str,
    /// Verdict.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do (warn and fail only; absent for ok).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A check that passed.
    pub fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }
    /// A check that passed with a caveat, and what to do about it.
    pub fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
    /// A check that failed, and what to do about it.
    pub fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// All checks, in order.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Report {
    /// The worst status of any check.
    pub status: Status,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// The report of `checks`, whose status is the worst of theirs.
    pub fn new(checks: Vec<Check>) -> Self {
        let status = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
        Self { status, checks }
    }
}
