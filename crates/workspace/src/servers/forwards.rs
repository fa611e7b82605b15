//! SSH local forwards to the ports a server publishes for its workspaces:
//! asked for with `port add --forward`, one background `ssh -N -L` each,
//! recorded as `<state>/servers/forwards/<workspace>-<port>.pid` so `port
//! rm` and `delete` end it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::registry::ServerRegistry;
use super::spec::ServerSpec;
use super::ServerError;
use base::store::ports::PortMapping;

/// How long a new forward may take to listen.
const LISTEN_DEADLINE: Duration = Duration::from_secs(15);

/// Whether process `pid` holds a socket listening on 127.0.0.1:`port`.
fn listens_on(pid: u32, port: u16) -> bool {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let inodes = listening_inodes(&table, port);
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let target = target.to_string_lossy();
            inodes.iter().any(|i| target == format!("socket:[{i}]"))
        })
    })
}

/// The inodes of the sockets listening on 127.0.0.1:`port` in a
/// `/proc/net/tcp` table.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    const LISTEN: &str = "0A";
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (addr, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            (*addr == local && *state == LISTEN).then(|| (*inode).to_owned())
        })
        .collect()
}

impl ServerRegistry {
    fn forwards_dir(&self) -> PathBuf {
        self.control_dir().with_file_name("forwards")
    }

    fn forward_file(&self, workspace: &str, port: u16) -> PathBuf {
        self.forwards_dir().join(format!("{workspace}-{port}.pid"))
    }

    /// Forwards this host's 127.0.0.1:`port` to `remote_ip`:`port` on
    /// `spec`'s host, where it publishes a port of `workspace`; returns once
    /// the forward listens. A port taken here is refused by ssh
    /// (`ExitOnForwardFailure`) and reported.
    pub fn forward_port(
        &self,
        spec: &ServerSpec,
        workspace: &str,
        port: u16,
        remote_ip: &str,
    ) -> Result<(), ServerError> {
        base::store::make_private_dir(&self.forwards_dir())?;
        let log = self.forwards_dir().join(format!("{workspace}-{port}.log"));
        let log_file = std::fs::File::create(&log).map_err(|source| ServerError::Io {
            what: format!("creating {}", log.display()),
            source,
        })?;
        let mut cmd = super::ssh::forward_command(spec, port, remote_ip);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(ServerError::Spawn)?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(ServerError::Unreachable {
                    server: spec.name.clone(),
                    detail: format!(
                        "the forward of port {port} ended ({status}): {}",
                        said.trim()
                    ),
                });
            }
            // Not a test connection: it would reach the workspace's server
            // as a spurious empty request.
            if listens_on(child.id(), port) {
                break;
            }
            if started.elapsed() > LISTEN_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ServerError::Deadline {
                    server: spec.name.clone(),
                    secs: LISTEN_DEADLINE.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let file = self.forward_file(workspace, port);
        std::fs::write(&file, child.id().to_string()).map_err(|source| ServerError::Io {
            what: format!("writing {}", file.display()),
            source,
        })
    }

    /// Ends the forward of `workspace`'s `port`; false when there was none.
    pub fn unforward_port(&self, workspace: &str, port: u16) -> Result<bool, ServerError> {
        let file = self.forward_file(workspace, port);
        let Ok(pid) = std::fs::read_to_string(&file) else {
            return Ok(false);
        };
        if let Ok(pid) = pid.trim().parse::<i32>() {
            // Only an ssh we started: the pid may have been reused.
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "ssh" {
                // SAFETY: kill only sends a signal.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let _ = std::fs::remove_file(self.forwards_dir().join(format!("{workspace}-{port}.log")));
        std::fs::remove_file(&file).map_err(|source| ServerError::Io {
            what: format!("removing {}", file.display()),
            source,
        })?;
        Ok(true)
    }

    /// Ends every forward of `workspace`.
    pub fn unforward_all(&self, workspace: &str) -> Result<(), ServerError> {
        let Ok(entries) = std::fs::read_dir(self.forwards_dir()) else {
            return Ok(());
        };
        let prefix = format!("{workspace}-");
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let port = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".pid"))
                .and_then(|p| p.parse::<u16>().ok());
            if let Some(port) = port {
                self.unforward_port(workspace, port)?;
            }
        }
        Ok(())
    }
}

impl super::calls::RemoteWorkspace {
    /// Forwards this host's 127.0.0.1:`mapping.host_port` to the port the
    /// workspace publishes with `mapping` on its server (a wildcard there is
    /// reached on its loopback); returns once the forward listens.
    pub fn forward_port(&self, mapping: &PortMapping) -> Result<(), ServerError> {
        let ip = match mapping.host_ip {
            ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        self.registry()
            .forward_port(self.spec(), self.workspace(), mapping.host_port, &ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listening_socket_on_the_port_counts() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
   3: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4545 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listening_inodes(table, 8080), ["4242"]);
        assert!(listening_inodes(table, 80).is_empty());
        assert!(listening_inodes("", 8080).is_empty());
    }

    #[test]
    fn a_process_listening_is_seen_and_one_that_is_not_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port));
        drop(listener);
        assert!(!listens_on(std::process::id(), port));
    }
}
