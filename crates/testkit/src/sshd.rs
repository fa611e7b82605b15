//! Debian's OpenSSH server on a loopback port, for the tests of servers
//! reached over SSH: its own host key, a client key made for the test, its
//! own known_hosts, all in a private directory; stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where Debian installs the server.
const SSHD: &str = "/usr/sbin/sshd";

/// A running sshd.
#[derive(Debug)]
pub struct Sshd {
    dir: PathBuf,
    child: Option<Child>,
    /// Its loopback port.
    pub port: u16,
}

/// Why not: sshd is missing.
pub fn missing() -> Option<String> {
    (!Path::new(SSHD).exists())
        .then(|| format!("{SSHD} is not installed (apt-get install openssh-server)"))
}

fn keygen(file: &Path) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(file)
        .status()
        .expect("running ssh-keygen")
        .success();
    assert!(ok, "ssh-keygen failed");
}

impl Sshd {
    /// Starts one serving from `dir` (created) on a free loopback port,
    /// letting in the current user with the key [`Sshd::client_key`].
    pub fn start(dir: &Path) -> Self {
        let _ = std::fs::remove_dir_all(dir);
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .expect("making the sshd directory");
        keygen(&dir.join("host_key"));
        keygen(&dir.join("client_key"));
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).unwrap();
        // Privilege separation needs this directory (systemd makes it).
        let _ = std::fs::create_dir_all("/run/sshd");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).unwrap();
        std::fs::write(
            dir.join("known_hosts"),
            format!("[127.0.0.1]:{port} {host_pub}"),
        )
        .unwrap();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
             AuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd.pid\n\
             StrictModes no\nUsePAM no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
             PrintMotd no\nMaxSessions 64\nMaxStartups 64\nLogLevel ERROR\n",
            d = dir.display()
        );
        std::fs::write(dir.join("sshd_config"), config).unwrap();
        let mut sshd = Self {
            dir: dir.to_owned(),
            child: None,
            port,
        };
        sshd.resume();
        sshd
    }

    /// Starts it again after [`Sshd::stop`], on the same port.
    pub fn resume(&mut self) {
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(self.dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("sshd.log"))
                    .unwrap(),
            )
            .spawn()
            .expect("starting sshd");
        self.child = Some(child);
        let up = crate::wait_until(Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
        });
        assert!(up, "sshd did not listen: {}", self.log());
    }

    /// Stops it and ends the sessions it serves, as a host going down
    /// would: the server is then unreachable.
    pub fn stop(&mut self) {
        self.kill_sessions();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the processes serving its connections (each session's sshd),
    /// as a network cut would end them.
    pub fn kill_sessions(&self) {
        let Some(daemon) = self.child.as_ref().map(Child::id) else {
            return;
        };
        for pid in children_of(daemon) {
            // SAFETY: kill only sends a signal.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }

    /// The client's private key.
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client_key")
    }

    /// `ssh -o` options that trust this server's host key only.
    pub fn client_options(&self) -> Vec<String> {
        vec![
            format!(
                "UserKnownHostsFile={}",
                self.dir.join("known_hosts").display()
            ),
            "StrictHostKeyChecking=yes".into(),
        ]
    }

    /// `USER@127.0.0.1:PORT` for the current user.
    pub fn target(&self) -> String {
        let user = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| {
                let out = Command::new("id").arg("-un").output().unwrap();
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            });
        format!("{user}@127.0.0.1:{}", self.port)
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // The fields after the command name's closing paren.
                    let rest = stat.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}
