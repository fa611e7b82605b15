//! This program's helper processes that outlive their caller: a task's
//! supervisor and the watcher of an MCP server's session workspaces. Each
//! runs detached (its own session, stdin and stdout on /dev/null, stderr
//! to a log) as `<program> ARGS...`, the program being the one the
//! collection was built with (`task_program`) or the running executable.

pub(crate) mod owner_watch;

use std::path::Path;

use super::manager::Workspaces;
use crate::error::{Error, Result};
use base::store::spec::Owner;

impl Workspaces {
    /// Starts `<program> args...` detached, its stderr appended to `log`;
    /// the process it became.
    pub(crate) fn spawn_detached(&self, args: &[String], log: &Path) -> Result<Option<Owner>> {
        use std::os::unix::process::CommandExt;
        let program = match &self.task_program {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(Error::host_io("finding this program's executable"))?,
        };
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(Error::host_io(format!("opening {}", log.display())))?;
        let mut cmd = std::process::Command::new(&program);
        cmd.args(args)
            .env("MICROAGENT_HOME", self.state.root())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log_file);
        if let Some(warm) = &self.warm_dir {
            cmd.env("MICROAGENT_WARM_DIR", warm);
        }
        // SAFETY: setsid is async-signal-safe and touches no memory; it
        // puts the helper in its own session, so the caller's terminal
        // closing or its Ctrl-C does not reach it.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(Error::host_io(format!("starting {}", program.display())))?;
        let pid = child.id();
        // Nobody waits for it here: it is reaped by init once we exit;
        // until then a thread does, so it never lingers as a zombie.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
        Ok(base::store::process::start_ticks(pid).map(|start_ticks| Owner { pid, start_ticks }))
    }
}
