//! Preview-then-confirm for changes to the host (network setup, kernel
//! install, image builds, setup): asked without a token, an
//! operation changes nothing and returns its exact [`Plan`] with a token
//! bound to it; asked with the token, it applies that plan. A token is
//! refused when it is malformed or forged ([`PlanError::TokenWrong`]),
//! older than [`TOKEN_TTL_MS`] ([`PlanError::TokenExpired`]), or issued for
//! a plan other than the one the operation would apply now
//! ([`PlanError::PlanChanged`]: the host or the request changed since).
//!
//! Tokens are `EXPIRES-PLANDIGEST-MAC`: the MAC is keyed with a random
//! key kept in the state directory ([`KEY_FILE`], mode 0600), so only
//! this state directory's previews can be confirmed.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where the progress of a long host change goes (the current step, a
/// count): setup, kernel installs and image builds report through it.
pub type ProgressFn = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// How long a preview's token can be confirmed.
pub const TOKEN_TTL_MS: u64 = 5 * 60 * 1000;
/// The key that signs tokens, in the state directory.
pub const KEY_FILE: &str = "plan.key";
/// Hex digits of the plan digest a token carries.
const DIGEST_HEX: usize = 16;
/// Bytes of the key.
const KEY_LEN: usize = 32;

/// Why a plan was not previewed or applied.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The token is not one this state directory issued.
    #[error("the confirm token is not valid")]
    TokenWrong,
    /// The token is older than five minutes.
    #[error("the confirm token expired")]
    TokenExpired,
    /// What would be applied now differs from what the token was issued
    /// for.
    #[error("the plan changed since the preview (the host or the request changed)")]
    PlanChanged,
    /// The signing key could not be read or made.
    #[error("the plan key {}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
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
    pub fn code(&self) -> crate::ErrorCode {
        use crate::ErrorCode as C;
        match self {
            Self::TokenWrong | Self::TokenExpired => C::InvalidInput,
            Self::PlanChanged => C::Conflict,
            Self::Privilege { .. } => C::Forbidden,
            Self::Key { .. } | Self::Spawn { .. } | Self::StepFailed { .. } => C::Internal,
        }
    }

    /// What the caller can do about it.
    pub fn remedy(&self) -> Option<crate::Remedy> {
        match self {
            Self::TokenWrong | Self::TokenExpired | Self::PlanChanged => {
                Some(crate::Remedy::PreviewAgain)
            }
            Self::Privilege { action, token, .. } => Some(crate::Remedy::ConfirmAsRoot {
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
}

impl Step {
    /// A step running `program args...`.
    pub fn new(what: impl Into<String>, program: &str, args: &[&str]) -> Self {
        Self {
            what: what.into(),
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            stdin: None,
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
        std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .map(shell_quote)
            .collect::<Vec<_>>()
            .join(" ")
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
    let mut child = Command::new(&step.program)
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

/// Issues and checks tokens with the state directory's key.
#[derive(Clone)]
pub struct Confirmer {
    key: [u8; KEY_LEN],
}

impl std::fmt::Debug for Confirmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Confirmer { .. }")
    }
}

impl Confirmer {
    /// The confirmer of the state directory at `root` (its key is made on
    /// first use).
    pub fn open(root: &Path) -> Result<Self, PlanError> {
        let path = root.join(KEY_FILE);
        let err = |source| PlanError::Key {
            path: path.clone(),
            source,
        };
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() == KEY_LEN => {
                let mut key = [0; KEY_LEN];
                key.copy_from_slice(&bytes);
                return Ok(Self { key });
            }
            Ok(_) => {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("it is not {KEY_LEN} bytes; remove it and preview again"),
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        let mut key = [0u8; KEY_LEN];
        // SAFETY: getrandom writes at most `key.len()` bytes into it.
        let got = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
        if got != KEY_LEN as isize {
            return Err(err(std::io::Error::last_os_error()));
        }
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(&key).and_then(|()| f.sync_all()));
        match made {
            Ok(()) => Ok(Self { key }),
            // Another process made it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::open(root),
            Err(e) => Err(err(e)),
        }
    }

    /// Checks that a token could be this state directory's at all (a key
    /// exists: some preview was made) without making anything, so a
    /// stray token changes nothing.
    pub fn expect_issued(root: &Path, token: &str) -> Result<(), PlanError> {
        let well_formed = token.trim().splitn(3, '-').count() == 3;
        if well_formed && root.join(KEY_FILE).exists() {
            Ok(())
        } else {
            Err(PlanError::TokenWrong)
        }
    }

    /// A confirmer with a given key (tests).
    pub fn with_key(key: [u8; KEY_LEN]) -> Self {
        Self { key }
    }

    fn mac(&self, message: &str) -> String {
        let inner = Sha256::new()
            .chain_update(self.key)
            .chain_update(message.as_bytes())
            .finalize();
        let outer = Sha256::new()
            .chain_update(self.key)
            .chain_update(inner)
            .finalize();
        format!("{outer:x}")
    }

    /// The preview of `plan` at `now_ms`: with a token unless it is empty.
    pub fn preview(&self, plan: Plan, now_ms: u64) -> Preview {
        if plan.is_empty() {
            return Preview {
                plan,
                token: None,
                expires_at_ms: None,
            };
        }
        let expires = now_ms + TOKEN_TTL_MS;
        let digest = &plan.digest()[..DIGEST_HEX];
        let message = format!("{expires}-{digest}");
        let token = format!("{message}-{}", self.mac(&message));
        Preview {
            plan,
            token: Some(token),
            expires_at_ms: Some(expires),
        }
    }

    /// Checks that `token` confirms `plan` at `now_ms`.
    pub fn check(&self, plan: &Plan, token: &str, now_ms: u64) -> Result<(), PlanError> {
        let mut parts = token.trim().splitn(3, '-');
        let (Some(expires), Some(digest), Some(mac)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(PlanError::TokenWrong);
        };
        let message = format!("{expires}-{digest}");
        // Both are hex of one length: comparing all bytes costs the same
        // whatever matches.
        let want = self.mac(&message);
        let same = want.len() == mac.len()
            && want
                .bytes()
                .zip(mac.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(PlanError::TokenWrong);
        }
        let expires: u64 = expires.parse().map_err(|_| PlanError::TokenWrong)?;
        if now_ms > expires {
            return Err(PlanError::TokenExpired);
        }
        if plan.digest()[..DIGEST_HEX] != *digest {
            return Err(PlanError::PlanChanged);
        }
        Ok(())
    }
}

/// Whether this process has CAP_NET_ADMIN in its effective set.
pub fn has_cap_net_admin() -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    crate::host::settings::has_capability(CAP_NET_ADMIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(arg: &str) -> Plan {
        Plan {
            action: "test".into(),
            steps: vec![Step::new("say it", "true", &[arg])],
            ..Plan::default()
        }
    }

    #[test]
    fn a_token_confirms_its_own_plan_only_and_only_in_time() {
        let c = Confirmer::with_key([7; KEY_LEN]);
        let p = plan("a");
        let preview = c.preview(p.clone(), 1_000);
        let token = preview.token.unwrap();
        assert_eq!(preview.expires_at_ms, Some(1_000 + TOKEN_TTL_MS));
        c.check(&p, &token, 1_000).unwrap();
        c.check(&p, &token, 1_000 + TOKEN_TTL_MS).unwrap();
        assert!(matches!(
            c.check(&p, &token, 1_001 + TOKEN_TTL_MS),
            Err(PlanError::TokenExpired)
        ));
        assert!(matches!(
            c.check(&plan("b"), &token, 2_000),
            Err(PlanError::PlanChanged)
        ));
    }

    #[test]
    fn forged_and_malformed_tokens_are_wrong() {
        let c = Confirmer::with_key([7; KEY_LEN]);
        let p = plan("a");
        let token = c.preview(p.clone(), 1_000).token.unwrap();
        let other = Confirmer::with_key([8; KEY_LEN]);
        assert!(matches!(
            other.check(&p, &token, 1_000),
            Err(PlanError::TokenWrong)
        ));
        // A later expiry with the old MAC.
        let (_, rest) = token.split_once('-').unwrap();
        let extended = format!("{}-{rest}", 1_000 + 10 * TOKEN_TTL_MS);
        assert!(matches!(
            c.check(&p, &extended, 1_000),
            Err(PlanError::TokenWrong)
        ));
        for bad in ["", "x", "1-2", "1-2-3", "--", &token[..token.len() - 1]] {
            assert!(
                matches!(c.check(&p, bad, 1_000), Err(PlanError::TokenWrong)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_empty_plan_needs_no_token() {
        let c = Confirmer::with_key([7; KEY_LEN]);
        let empty = Plan {
            action: "test".into(),
            steps: vec![],
            ..Plan::default()
        };
        assert_eq!(c.preview(empty, 1).token, None);
        let writes = Plan {
            writes: vec!["/x".into()],
            ..Plan::new("test")
        };
        assert!(c.preview(writes, 1).token.is_some());
    }

    #[test]
    fn the_key_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("ma-plan-{}", crate::host::settings::unique_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = Confirmer::open(&dir).unwrap();
        let b = Confirmer::open(&dir).unwrap();
        assert_eq!(a.key, b.key);
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = a.preview(plan("a"), 5).token.unwrap();
        b.check(&plan("a"), &token, 5).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

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
