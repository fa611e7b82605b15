//! A server as this host knows it: its name, how ssh reaches it
//! (`USER@HOST[:PORT]`, parsed as [`SshTarget`]), and where its microagent
//! keeps its state.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ServerError;

/// The name of this host as a server.
pub const LOCAL_SERVER: &str = "local";

/// A server: how to reach it and where its microagent keeps its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ServerSpec {
    /// Its name (lowercase letters, digits and `-`; not `local`).
    pub name: String,
    /// `USER@HOST[:PORT]`, as `ssh` is given it.
    pub ssh: String,
    /// The private key ssh uses (else ssh's own choice: the agent, the
    /// defaults of `~/.ssh/config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<PathBuf>,
    /// The remote's state directory (`MICROAGENT_HOME` there); else its
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    /// The `microagent` to run there (else the one on its `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_binary: Option<String>,
    /// Extra `ssh -o` options, `Key=Value` each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_options: Vec<String>,
}

impl ServerSpec {
    /// A server reached as `ssh` (`USER@HOST[:PORT]`).
    pub fn new(name: impl Into<String>, ssh: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ssh: ssh.into(),
            identity: None,
            state_dir: None,
            remote_binary: None,
            ssh_options: Vec::new(),
        }
    }

    /// With this private key.
    pub fn identity(mut self, file: impl Into<PathBuf>) -> Self {
        self.identity = Some(file.into());
        self
    }

    /// With this remote state directory.
    pub fn state_dir(mut self, dir: impl Into<String>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// With this remote `microagent`.
    pub fn remote_binary(mut self, path: impl Into<String>) -> Self {
        self.remote_binary = Some(path.into());
        self
    }

    /// With an extra `ssh -o` option.
    pub fn ssh_option(mut self, option: impl Into<String>) -> Self {
        self.ssh_options.push(option.into());
        self
    }

    /// Checks every field.
    pub fn check(&self) -> Result<(), ServerError> {
        check_server_name(&self.name)?;
        SshTarget::parse(&self.ssh)?;
        for option in &self.ssh_options {
            let ok = option.split_once('=').is_some_and(|(k, v)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()) && !v.is_empty()
            }) && !option.contains(['\n', '\0']);
            if !ok {
                return Err(ServerError::Invalid(format!(
                    "ssh option {option:?}: use Key=Value, as `ssh -o` takes it"
                )));
            }
        }
        for (what, value) in [
            ("state directory", &self.state_dir),
            ("remote binary", &self.remote_binary),
        ] {
            if value
                .as_ref()
                .is_some_and(|v| v.is_empty() || v.contains(['\n', '\0']))
            {
                return Err(ServerError::Invalid(format!(
                    "the {what} must be a non-empty path"
                )));
            }
        }
        Ok(())
    }
}

/// Checks a server name: 1-32 of `a-z 0-9 -`, starting with a letter,
/// and not `local` (this host).
pub fn check_server_name(name: &str) -> Result<(), ServerError> {
    let ok = (1..=32).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        return Err(ServerError::Invalid(format!(
            "server name {name:?}: use 1-32 lowercase letters, digits and '-', starting with a letter"
        )));
    }
    if name == LOCAL_SERVER {
        return Err(ServerError::Invalid(format!(
            "`{LOCAL_SERVER}` is this host; choose another name"
        )));
    }
    Ok(())
}

/// `USER@HOST[:PORT]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshTarget {
    /// The login user (else ssh's default).
    pub user: Option<String>,
    /// The host name or address (`[v6]` brackets removed).
    pub host: String,
    /// The port (else ssh's default).
    pub port: Option<u16>,
}

impl SshTarget {
    /// Parses `USER@HOST[:PORT]` (`HOST` may be `[::1]`).
    pub fn parse(text: &str) -> Result<Self, ServerError> {
        let bad = |why: &str| {
            ServerError::Invalid(format!(
                "ssh target {text:?}: {why}; use USER@HOST or USER@HOST:PORT"
            ))
        };
        let (user, rest) = match text.rsplit_once('@') {
            Some((u, r)) => (Some(u.to_owned()), r),
            None => (None, text),
        };
        if user.as_ref().is_some_and(|u| {
            u.is_empty() || u.starts_with('-') || !u.chars().all(|c| c.is_ascii_graphic())
        }) {
            return Err(bad("bad user"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            match after.strip_prefix(':') {
                Some(p) => (host, Some(p)),
                None if after.is_empty() => (host, None),
                None => return Err(bad("junk after ]")),
            }
        } else {
            match rest.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        let host_ok = !host.is_empty()
            && !host.starts_with('-')
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c));
        if !host_ok {
            return Err(bad("bad host"));
        }
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("bad port"))?,
            ),
            None => None,
        };
        Ok(Self {
            user,
            host: host.to_owned(),
            port,
        })
    }
}

/// Which sizes the caller of a create on a server gave: the server gives
/// the rest from its own image's defaults, as a create on this host does
/// from this host's, so a size not given is never sent as this host's
/// default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GivenSizes {
    /// The vCPUs were given.
    pub vcpus: bool,
    /// The memory was given.
    pub mem: bool,
}

impl GivenSizes {
    /// Both given.
    pub const ALL: GivenSizes = GivenSizes {
        vcpus: true,
        mem: true,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_user_host_and_port() {
        let t = SshTarget::parse("ci@box-1.lan:2222").unwrap();
        assert_eq!(
            (t.user.as_deref(), t.host.as_str(), t.port),
            (Some("ci"), "box-1.lan", Some(2222))
        );
        let t = SshTarget::parse("root@[::1]:22").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", Some(22)));
        let t = SshTarget::parse("host").unwrap();
        assert_eq!((t.user, t.port), (None, None));
        for bad in [
            "",
            "u@",
            "@h",
            "u@h:0",
            "u@h:x",
            "u@-oProxyCommand=x",
            "-l@h",
            "u@h;rm",
            "u@[::1",
        ] {
            assert!(SshTarget::parse(bad).is_err(), "{bad:?}");
        }
    }
}
