//! Preview-then-confirm for changes to the host (network setup, kernel
//! install, image builds, setup): asked without a token, an operation
//! changes nothing and returns its exact [`Plan`] with a token bound to it
//! ([`crate::host::confirm`]); asked with the token, it applies that plan:
//! its [`Step`]s run in order here.

use std::io::Write;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where the progress of a long host change goes (the current step, a
/// count): setup, kernel installs and image builds report through it.
pub type ProgressFn = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// Why a plan was not applied.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The host lacks a right the plan needs.
    #[error("applying this plan needs {needs}")]
    Privilege {
        /// The right.
        needs: &'static str,
        /// The plan's action (`network setup`).
        action: String,
        /// The (still valid) token, for a caller that has the right.
        token: String,
    },
    /// A step's program could not be run.
    #[error("step {step} ({what}): running {program}")]
    Spawn {
        /// 1-based step number.
        step: usize,
        /// What the step does.
        what: String,
        /// The program.
        program: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A step's program failed; the steps after it were not run.
    #[error("step {step} ({what}) failed: `{command}` said: {said}")]
    StepFailed {
        /// 1-based step number.
        step: usize,
        /// What the step does.
        what: String,
        /// The command line.
        command: String,
        /// Its stderr (or exit status).
        said: String,
    },
}

impl PlanError {
    /// The stable code front ends report.
    pub fn code(&self) -> crate::code::ErrorCode {
        use crate::code::ErrorCode as C;
        match self {
            Self::Privilege { .. } => C::Forbidden,
            Self::Spawn { .. } | Self::StepFailed { .. } => C::Internal,
        }
    }

    /// What the caller can do about it.
    pub fn remedy(&self) -> Option<crate::remedy::Remedy> {
        match self {
            Self::Privilege { action, token, .. } => Some(crate::remedy::Remedy::ConfirmAsRoot {
                operation: action.clone(),
                token: token.clone(),
            }),
            _ => None,
        }
    }
}

/// One host command of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Step {
    /// What it does, in words.
    pub what: String,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// What it reads on stdin (an nftables ruleset), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// The directory it runs in (a download's destination), if not ours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

impl Step {
    /// A step running `program args...`.
    pub fn new(what: impl Into<String>, program: &str, args: &[&str]) -> Self {
        Self {
            what: what.into(),
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            stdin: None,
            dir: None,
        }
    }

    /// The same step run in `dir`.
    pub fn in_dir(self, dir: &str) -> Self {
        Self {
            dir: Some(dir.to_owned()),
            ..self
        }
    }

    /// The same step fed `stdin`.
    pub fn with_stdin(self, stdin: String) -> Self {
        Self {
            stdin: Some(stdin),
            ..self
        }
    }

    /// The command as a shell would take it.
    pub fn command_line(&self) -> String {
        let command = std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .map(shell_quote)
            .collect::<Vec<_>>()
            .join(" ");
        match &self.dir {
            Some(dir) => format!("cd {} && {command}", shell_quote(dir)),
            None => command,
        }
    }
}

/// `s` as one shell word (quoted only when it needs to be).
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+#".contains(&b));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The exact changes an operation would make.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Plan {
    /// The operation (`network setup`, `kernel install`).
    pub action: String,
    /// The host commands, run in order first (package installs, network
    /// changes).
    pub steps: Vec<Step>,
    /// What else the caller should know (what is left as it is, why, the
    /// work after the steps).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Debian packages the steps install.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// Files and directories it writes (created or replaced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writes: Vec<String>,
    /// Disk space it needs at its peak, in bytes (an estimate).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_bytes: u64,
    /// Roughly how long it takes on this host, in seconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub estimate_seconds: u64,
    /// Applying it needs root (package installs, network changes).
    #[serde(default, skip_serializing_if = "is_false")]
    pub needs_root: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Plan {
    /// A plan of `action` that does nothing yet.
    pub fn new(action: impl Into<String>) -> Self {
        Self {
            action: action.into(),
            ..Self::default()
        }
    }

    /// Whether it changes nothing (no step, nothing written).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.writes.is_empty()
    }

    /// The steps installing the `packages` that are missing (apt-get
    /// update, then install, as root), recorded in [`Plan::packages`]; none
    /// when all are there.
    pub fn install_packages(&mut self, packages: &[String]) {
        if packages.is_empty() {
            return;
        }
        self.steps.push(Step::new(
            "refresh the Debian package lists",
            "apt-get",
            &["update", "-qq"],
        ));
        let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
        args.extend(packages.iter().map(String::as_str));
        self.steps.push(Step::new(
            format!("install Debian packages: {}", packages.join(" ")),
            "apt-get",
            &args,
        ));
        self.packages.extend(packages.iter().cloned());
        self.needs_root = true;
    }

    /// Refuses to apply it without root when it needs root, keeping the
    /// (still valid) token for a caller that has it.
    pub fn check_privilege(&self, token: &str) -> Result<(), PlanError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if self.needs_root && unsafe { libc::geteuid() } != 0 {
            return Err(PlanError::Privilege {
                needs: "root (it installs Debian packages)",
                action: self.action.clone(),
                token: token.to_owned(),
            });
        }
        Ok(())
    }

    /// The digest a token binds to.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("{:x}", Sha256::digest(json))
    }

    /// Runs the steps in order and stops at the first that fails.
    pub fn run(&self) -> Result<(), PlanError> {
        for (i, step) in self.steps.iter().enumerate() {
            run_step(i + 1, step)?;
        }
        Ok(())
    }
}

fn run_step(n: usize, step: &Step) -> Result<(), PlanError> {
    let spawn_err = |source| PlanError::Spawn {
        step: n,
        what: step.what.clone(),
        program: step.program.clone(),
        source,
    };
    let mut command = Command::new(&step.program);
    if let Some(dir) = &step.dir {
        command.current_dir(dir);
    }
    let mut child = command
        .args(&step.args)
        .stdin(if step.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (&step.stdin, child.stdin.take()) {
        // A program that exits early closes the pipe; its status says why.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    Err(PlanError::StepFailed {
        step: n,
        what: step.what.clone(),
        command: step.command_line(),
        said: if stderr.is_empty() {
            out.status.to_string()
        } else {
            stderr.chars().take(2000).collect()
        },
    })
}

/// A plan and the token that confirms it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Preview {
    /// What would be done.
    pub plan: Plan,
    /// Pass it back to apply exactly this plan (none when there is
    /// nothing to do).
    pub token: Option<String>,
    /// When the token expires, Unix ms.
    pub expires_at_ms: Option<u64>,
}

/// Whether this process has CAP_NET_ADMIN in its effective set.
pub fn has_cap_net_admin() -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    crate::host::settings::has_capability(CAP_NET_ADMIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_run_in_order_and_stop_at_the_first_failure() {
        let dir = std::env::temp_dir().join(format!(
            "ma-plan-run-{}",
            crate::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mark = dir.join("mark");
        let p = Plan {
            action: "test".into(),
            steps: vec![
                Step::new("fail", "sh", &["-c", "echo nope >&2; exit 3"]),
                Step::new("mark", "touch", &[mark.to_str().unwrap()]),
            ],
            ..Plan::default()
        };
        let err = p.run().unwrap_err().to_string();
        assert!(
            err.contains("step 1 (fail)") && err.contains("nope"),
            "{err}"
        );
        assert!(!mark.exists(), "a later step ran after a failure");
        let fed = Plan {
            action: "test".into(),
            steps: vec![
                Step::new("copy", "sh", &["-c", &format!("cat > {}", mark.display())])
                    .with_stdin("ruleset".into()),
            ],
            ..Plan::default()
        };
        fed.run().unwrap();
        assert_eq!(std::fs::read_to_string(&mark).unwrap(), "ruleset");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn package_installs_are_one_apt_step_and_need_root() {
        let mut p = Plan::new("test");
        p.install_packages(&[]);
        assert!(p.is_empty() && !p.needs_root);
        p.install_packages(&["flex".into(), "bc".into()]);
        assert_eq!(p.steps.len(), 2);
        assert_eq!(p.steps[0].command_line(), "apt-get update -qq");
        assert_eq!(
            p.steps[1].command_line(),
            "apt-get install -y -qq --no-install-recommends flex bc"
        );
        assert_eq!(p.packages, ["flex", "bc"]);
        assert!(p.needs_root);
        // Fields a plan does not use stay out of its JSON (and digest).
        let json = serde_json::to_value(Plan::new("x")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"action": "x", "steps": [], "notes": []})
        );
    }

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let s = Step::new("x", "nft", &["-f", "-", "a b", "it's"]);
        assert_eq!(s.command_line(), r"nft -f - 'a b' 'it'\''s'");
    }
}
