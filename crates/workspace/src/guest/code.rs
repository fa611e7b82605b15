//! Running code as a script: `run_code`'s policy, once. The interpreter is
//! looked for in the guest first (a missing one says which image has it),
//! the code is written to a private script file, run by the interpreter as
//! any command is, and removed afterwards.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::guest::files::WriteOptions;
use crate::guest::request::ExecRequest;
use crate::guest::stream::ExecInput;
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::Workspaces;
use base::images::registry::ImageError;
use base::store::spec::WorkspaceSpec;

/// The image that has every [`Language`]'s interpreter; one-shot code runs
/// use it.
pub const CODE_IMAGE: &str = "debian";
/// Guest memory of a one-shot code run's workspace, MiB.
pub const CODE_MEM_MIB: u64 = 512;
/// How long the interpreter probe and the script's removal may take: a
/// guest that stalls them holds the caller two minutes at most. (The
/// first command in a freshly started guest on a host that emulates guest
/// kernel code has taken over 30 s while the host was busy.)
const HOUSEKEEPING_TIMEOUT: Duration = Duration::from_secs(120);
/// What of their output is kept (a path at most).
const HOUSEKEEPING_OUTPUT: u64 = 4096;

/// A language `run_code` runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    /// Python 3 (`python3`).
    #[default]
    Python,
    /// JavaScript (Node.js, `node`); also taken as `nodejs`, as other
    /// sandboxes name it.
    #[serde(alias = "nodejs")]
    Javascript,
    /// A bash script (`bash`).
    Bash,
}

// By hand, so the schema lists the alias a client may send too.
#[cfg(feature = "schemars")]
impl schemars::JsonSchema for Language {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Language".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A language `run_code` runs.",
            "oneOf": [
                {"const": "python", "description": "Python 3 (`python3`).", "type": "string"},
                {"const": "javascript", "description": "JavaScript (Node.js, `node`).", "type": "string"},
                {"const": "nodejs", "description": "The same as `javascript`.", "type": "string"},
                {"const": "bash", "description": "A bash script (`bash`).", "type": "string"}
            ]
        })
    }
}

impl Language {
    /// The interpreter, looked up in the guest's PATH.
    pub fn interpreter(self) -> &'static str {
        match self {
            Self::Python => "python3",
            Self::Javascript => "node",
            Self::Bash => "bash",
        }
    }

    /// The script file's extension.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Python => "py",
            Self::Javascript => "js",
            Self::Bash => "sh",
        }
    }

    /// The spec of a one-shot workspace of `all` that runs code in this
    /// language: the [`CODE_IMAGE`] (which must be on this host, else
    /// [`Error::CodeImageMissing`]), `vcpus`, and `mem_mib` or
    /// [`CODE_MEM_MIB`]; checked as a create would check it.
    pub fn workspace_spec(
        self,
        all: &Workspaces,
        vcpus: u8,
        mem_mib: Option<u64>,
    ) -> Result<WorkspaceSpec> {
        let spec = WorkspaceSpec {
            image: CODE_IMAGE.into(),
            vcpus,
            mem_mib: mem_mib.unwrap_or(CODE_MEM_MIB),
            ..WorkspaceSpec::default()
        };
        spec.validate()?;
        match all.image_registry().get(CODE_IMAGE) {
            Ok(_) => Ok(spec),
            Err(ImageError::NotFound(_)) => Err(Error::CodeImageMissing {
                image: CODE_IMAGE,
                interpreter: self.interpreter(),
            }),
            Err(e) => Err(e.into()),
        }
    }
}

/// Code written to a script in a workspace, ready to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeScript {
    workspace: String,
    path: String,
    language: Language,
}

impl CodeScript {
    /// The command that runs it (add a timeout, an output cap, stdin).
    pub fn request(&self) -> ExecRequest {
        ExecRequest::argv([self.language.interpreter(), self.path.as_str()])
    }

    /// The script's guest path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Removes it from its workspace in `all`, best effort: the workspace
    /// may be gone or stopping.
    pub async fn remove(&self, all: &Workspaces) {
        let rm = housekeeping(&["rm", "-f", &self.path]);
        let _ = all
            .at(&self.workspace)
            .exec_collect(rm, ExecInput::None)
            .await;
    }
}

fn housekeeping(argv: &[&str]) -> ExecRequest {
    ExecRequest::argv(argv.iter().copied())
        .timeout(HOUSEKEEPING_TIMEOUT)
        .output_cap(HOUSEKEEPING_OUTPUT)
}

impl Workspace<'_> {
    /// Writes `code` to a private script in this running workspace
    /// once its image is found to have `language`'s interpreter (else
    /// [`Error::InterpreterMissing`]). Run it with [`CodeScript::request`],
    /// then [`CodeScript::remove`].
    pub async fn write_code_script(self, language: Language, code: &str) -> Result<CodeScript> {
        let name = self.name.as_str();
        let interpreter = language.interpreter();
        let probe = housekeeping(&["/bin/sh", "-c", &format!("command -v {interpreter}")]);
        let found = self.exec_collect(probe, ExecInput::None).await?;
        // Only an answer says the interpreter is missing; a probe that
        // did not finish says nothing about the image.
        if found.timed_out {
            return Err(Error::Timeout(format!(
                "looking for {interpreter} in workspace `{name}` took over {} s",
                HOUSEKEEPING_TIMEOUT.as_secs()
            )));
        }
        if !found.success() {
            return Err(Error::InterpreterMissing {
                workspace: name.to_owned(),
                image: self.get_here()?.spec.image,
                interpreter,
                image_with_it: CODE_IMAGE,
            });
        }
        let path = format!(
            "/tmp/microagent-run-code-{}.{}",
            base::host::settings::unique_id(),
            language.extension()
        );
        let options = WriteOptions {
            append: false,
            perm: Some(0o600),
        };
        self.files()
            .write_file(&path, code.as_bytes(), options)
            .await?;
        Ok(CodeScript {
            workspace: name.to_owned(),
            path,
            language,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodejs_is_javascript() {
        let read = |s: &str| serde_json::from_value::<Language>(serde_json::json!(s)).unwrap();
        assert_eq!(read("nodejs"), Language::Javascript);
        assert_eq!(read("javascript"), Language::Javascript);
        assert_eq!(serde_json::to_value(read("nodejs")).unwrap(), "javascript");
    }

    #[test]
    fn each_language_has_its_interpreter_and_extension() {
        let all = [Language::Python, Language::Javascript, Language::Bash];
        let names: Vec<_> = all
            .iter()
            .map(|l| (l.interpreter(), l.extension()))
            .collect();
        assert_eq!(names, [("python3", "py"), ("node", "js"), ("bash", "sh")]);
        assert_eq!(Language::default(), Language::Python);
        let script = CodeScript {
            workspace: "dev".into(),
            path: "/tmp/x.py".into(),
            language: Language::Python,
        };
        assert_eq!(script.request().describe(), "python3 /tmp/x.py");
    }
}
