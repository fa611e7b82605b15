//! How a workspace's VMM process is started: the program to run and the
//! arguments that name the workspace, turned into argv in this one place.
//! The `microagent` binary runs VMM processes as its hidden `vmm
//! serve-workspace` command; a program that embeds the library and runs
//! [`crate::vmm_host::VmmProcess`] itself accepts the same arguments.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The subcommand words before the options.
pub const VMM_SUBCOMMAND: [&str; 2] = ["vmm", "serve-workspace"];

/// One VMM process to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmmLaunch {
    /// The program (by default the running executable).
    pub program: PathBuf,
    /// The state directory.
    pub home: PathBuf,
    /// The workspace.
    pub workspace: String,
}

impl VmmLaunch {
    /// The process for `workspace` of the state directory `home`, run by
    /// `program`.
    pub fn new(program: &Path, home: &Path, workspace: &str) -> Self {
        Self {
            program: program.to_path_buf(),
            home: home.to_path_buf(),
            workspace: workspace.to_owned(),
        }
    }

    /// The arguments after the program name:
    /// `vmm serve-workspace --home HOME WORKSPACE`.
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = VMM_SUBCOMMAND.iter().map(OsString::from).collect();
        args.push("--home".into());
        args.push(self.home.clone().into_os_string());
        args.push(self.workspace.clone().into());
        args
    }

    /// Reads this program's own arguments (`args` after the program name):
    /// `Some` when they ask it to be a VMM process, as [`VmmLaunch::args`]
    /// writes them. For programs that embed the library and are their
    /// workspaces' VMM program; the `microagent` binary parses them with
    /// its command-line parser instead.
    pub fn from_args(args: impl IntoIterator<Item = OsString>) -> Option<Self> {
        let program = std::env::current_exe().ok()?;
        let args: Vec<OsString> = args.into_iter().collect();
        match args.as_slice() {
            [a, b, flag, home, workspace]
                if *a == VMM_SUBCOMMAND[0] && *b == VMM_SUBCOMMAND[1] && flag == "--home" =>
            {
                Some(Self {
                    program,
                    home: PathBuf::from(home),
                    workspace: workspace.to_str()?.to_owned(),
                })
            }
            _ => None,
        }
    }

    /// The command that starts the process (stdio not yet set).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(self.args());
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_names_the_home_and_workspace() {
        let l = VmmLaunch::new(Path::new("/bin/prog"), Path::new("/tmp/h"), "dev");
        assert_eq!(
            l.args(),
            ["vmm", "serve-workspace", "--home", "/tmp/h", "dev"]
                .map(OsString::from)
                .to_vec()
        );
        assert_eq!(l.command().get_program(), "/bin/prog");
        let back = VmmLaunch::from_args(l.args()).unwrap();
        assert_eq!((back.home, back.workspace), (l.home, l.workspace));
        assert!(VmmLaunch::from_args(["list".into()]).is_none());
        assert!(
            VmmLaunch::from_args(["vmm", "serve-workspace", "--home"].map(OsString::from))
                .is_none()
        );
    }
}
