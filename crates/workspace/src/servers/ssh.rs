//! The transport to a server: the system's OpenSSH client, so the user's
//! `~/.ssh/config`, agent and known_hosts apply. Never a prompt
//! (`BatchMode`), one shared connection per server (`ControlMaster`, so an
//! operation costs no new handshake), keepalives so a dead peer is noticed
//! in seconds, and `microagent` run there with its arguments quoted for
//! the remote shell.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::spec::{ServerSpec, SshTarget};

/// How long ssh may take to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Keepalive interval; the connection is dropped after
/// [`KEEPALIVE_MISSES`] unanswered ones.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered keepalives before ssh gives up.
pub const KEEPALIVE_MISSES: u32 = 2;
/// How long a shared connection outlives its last use.
pub const CONTROL_PERSIST: Duration = Duration::from_secs(300);
/// ssh's own failure status (the remote command's is passed through).
pub const SSH_FAILED: i32 = 255;

/// Quotes `arg` for a POSIX shell (the remote's login shell reads the
/// command line ssh sends).
pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:@,+%".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The line the remote shell runs for `microagent ARGS`.
pub fn remote_line(spec: &ServerSpec, args: &[String]) -> String {
    let mut words = Vec::new();
    if let Some(dir) = &spec.state_dir {
        words.push("env".to_owned());
        words.push(shell_quote(&format!("MICROAGENT_HOME={dir}")));
    }
    words.push(shell_quote(
        spec.remote_binary.as_deref().unwrap_or("microagent"),
    ));
    words.extend(args.iter().map(|a| shell_quote(a)));
    words.join(" ")
}

/// `ssh` to `spec` with what every use shares: never a prompt, a bounded
/// connect, keepalives, its key, options, port and user. `control` is the
/// shared connection's option set, or the options of a connection alone.
fn base(spec: &ServerSpec, control: &[String]) -> (Command, String) {
    let target = SshTarget::parse(&spec.ssh).ok();
    let mut cmd = Command::new("ssh");
    let mut options = vec![
        "BatchMode=yes".to_owned(),
        format!("ConnectTimeout={}", CONNECT_TIMEOUT.as_secs()),
        format!("ServerAliveInterval={}", KEEPALIVE_INTERVAL.as_secs()),
        format!("ServerAliveCountMax={KEEPALIVE_MISSES}"),
    ];
    options.extend(control.iter().cloned());
    if spec.identity.is_some() {
        options.push("IdentitiesOnly=yes".into());
    }
    options.extend(spec.ssh_options.iter().cloned());
    for option in options {
        cmd.arg("-o").arg(option);
    }
    if let Some(identity) = &spec.identity {
        cmd.arg("-i").arg(identity);
    }
    if let Some(target) = &target {
        if let Some(port) = target.port {
            cmd.arg("-p").arg(port.to_string());
        }
        if let Some(user) = &target.user {
            cmd.arg("-l").arg(user);
        }
    }
    let host = target.map_or_else(|| spec.ssh.clone(), |t| t.host);
    (cmd, host)
}

/// `ssh` for `spec` running `remote` (a shell line), sharing one
/// connection per server under `control_dir`; `tty` asks for a terminal.
pub fn command(spec: &ServerSpec, control_dir: &Path, remote: &str, tty: bool) -> Command {
    let shared = [
        "ControlMaster=auto".to_owned(),
        format!("ControlPath={}/%C", control_dir.display()),
        format!("ControlPersist={}", CONTROL_PERSIST.as_secs()),
    ];
    let (mut cmd, host) = base(spec, &shared);
    cmd.arg(if tty { "-tt" } else { "-T" });
    cmd.arg("--").arg(host).arg(remote);
    cmd
}

/// `ssh` for `spec` that only forwards this host's 127.0.0.1:`port` to
/// `remote_ip`:`port` on the server, on a connection of its own (it lives
/// as long as the forward), and fails if it cannot listen.
pub fn forward_command(spec: &ServerSpec, port: u16, remote_ip: &str) -> Command {
    let alone = [
        "ControlMaster=no".to_owned(),
        "ControlPath=none".to_owned(),
        "ExitOnForwardFailure=yes".to_owned(),
    ];
    let (mut cmd, host) = base(spec, &alone);
    cmd.arg("-N")
        .arg("-L")
        .arg(format!("127.0.0.1:{port}:{remote_ip}:{port}"));
    cmd.arg("--").arg(host);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remote_line_quotes_every_word() {
        assert_eq!(shell_quote("exec"), "exec");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
        let spec = ServerSpec::new("box", "u@h")
            .state_dir("/srv/ma state")
            .remote_binary("/opt/microagent");
        let line = remote_line(&spec, &["exec".into(), "dev".into(), "echo $HOME".into()]);
        assert_eq!(
            line,
            "env 'MICROAGENT_HOME=/srv/ma state' /opt/microagent exec dev 'echo $HOME'"
        );
    }

    #[test]
    fn ssh_never_prompts_and_shares_its_connection() {
        let spec = ServerSpec::new("box", "ci@h:2222")
            .identity("/k/id")
            .ssh_option("UserKnownHostsFile=/k/known");
        let cmd = command(&spec, Path::new("/s/ssh"), "microagent list", false);
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        for want in [
            "-o BatchMode=yes",
            "-o ControlMaster=auto",
            "-o ControlPath=/s/ssh/%C",
            "-o ServerAliveInterval=5",
            "-i /k/id",
            "-o UserKnownHostsFile=/k/known",
            "-p 2222",
            "-l ci",
            "-T -- h microagent list",
        ] {
            assert!(joined.contains(want), "{want}: {joined}");
        }
    }
}
