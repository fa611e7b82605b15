//! What the operator who started the server allowed its tools beyond the
//! defaults. An MCP client is not a human: it can preview a host change
//! and confirm the token itself, or be steered by a prompt it read. So a
//! host change is applied over MCP only when `serve mcp` was started with
//! `--allow-host-changes`, and a published port listens beyond loopback
//! only with `--allow-public-ports`. Previews change nothing and stay open.

use std::collections::BTreeSet;

use crate::ToolError;

/// The rights a server's operator granted its tools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grants {
    /// Tools may apply host changes (kernel_install, image_build from
    /// `debian:*`, host_networking_setup) with a preview's token.
    pub host_changes: bool,
    /// port_publish may listen on a non-loopback host address.
    pub public_ports: bool,
    /// Egress rules may open the host's side: host ports, loopback,
    /// link-local, private, shared and multicast ranges, and ranges wider
    /// than one address (`--allow-host-egress`).
    pub host_egress: bool,
    /// The secrets tools may give commands (`--allow-secret NAME`).
    pub secrets: BTreeSet<String>,
}

impl Grants {
    /// Sets [`Grants::host_changes`].
    pub fn host_changes(mut self, allowed: bool) -> Self {
        self.host_changes = allowed;
        self
    }

    /// Sets [`Grants::public_ports`].
    pub fn public_ports(mut self, allowed: bool) -> Self {
        self.public_ports = allowed;
        self
    }

    /// Sets [`Grants::host_egress`].
    pub fn host_egress(mut self, allowed: bool) -> Self {
        self.host_egress = allowed;
        self
    }

    /// Adds secret `name` to those tools may give commands.
    pub fn allow_secret(mut self, name: impl Into<String>) -> Self {
        self.secrets.insert(name.into());
        self
    }

    /// Refuses secrets the operator did not allow, naming the flag that
    /// would: an agent asks for a secret by name, and the user decides
    /// which of theirs it may use.
    pub(crate) fn check_secrets(&self, names: &[String]) -> Result<(), ToolError> {
        let refused: Vec<&str> = names
            .iter()
            .filter(|n| !self.secrets.contains(*n))
            .map(String::as_str)
            .collect();
        if refused.is_empty() {
            return Ok(());
        }
        let flags: Vec<String> = refused
            .iter()
            .map(|n| format!("--allow-secret {n}"))
            .collect();
        Err(ToolError::Forbidden(format!(
            "secret(s) {} not allowed: this server was started without {}; \
             ask the user to restart it with `microagent serve mcp {}` (secrets themselves are set with `microagent secret set NAME`)",
            refused.join(", "),
            flags.join(" "),
            flags.join(" ")
        )))
    }

    /// Refuses applying a host change (a call with a confirm token) unless
    /// granted; `cli` is the terminal command that applies the same plan.
    pub(crate) fn check_host_change(
        &self,
        confirming: bool,
        tool: &str,
        cli: &str,
    ) -> Result<(), ToolError> {
        if !confirming || self.host_changes {
            return Ok(());
        }
        Err(ToolError::Forbidden(format!(
            "{tool} with a token changes the host, and this server was started without --allow-host-changes; \
             show the user the preview: they can apply it in a terminal (`microagent {cli}`, then its --confirm token) \
             or restart the server with `microagent serve mcp --allow-host-changes`"
        )))
    }

    /// Refuses egress rules that open the host (the library's
    /// `opens_host`) unless granted: a prompt-injected agent must not open
    /// the host's services or the cloud metadata address to its guest.
    pub(crate) fn check_egress_rules(
        &self,
        rules: &[workspace::network::AllowEntry],
    ) -> Result<(), ToolError> {
        if self.host_egress {
            return Ok(());
        }
        let refused: Vec<String> = rules
            .iter()
            .filter(|r| workspace::network::user_filter::opens_host(r))
            .map(ToString::to_string)
            .collect();
        if refused.is_empty() {
            return Ok(());
        }
        Err(ToolError::Forbidden(format!(
            "rule(s) {} open the host's side of the network (a host port, loopback, link-local, private, shared or multicast addresses, or a range wider than one address), \
             and this server was started without --allow-host-egress; allow names or single public addresses instead, \
             or ask the user to add the rule in a terminal (`microagent network policy WORKSPACE --allow RULE`) or restart the server with `microagent serve mcp --allow-host-egress`",
            refused.join(", ")
        )))
    }

    /// Refuses a `tap` network under egress `all` unless granted: its
    /// guests reach the host itself, the metadata address and the LAN
    /// with no rule at all (a `user` network guards them).
    pub(crate) fn check_network(
        &self,
        backend: workspace::network::Backend,
        egress: workspace::network::Egress,
        rules: &[workspace::network::AllowEntry],
    ) -> Result<(), ToolError> {
        use workspace::network::{Backend, Egress};
        if backend == Backend::Tap && egress == Egress::All && !self.host_egress {
            return Err(ToolError::Forbidden(
                "a tap network with egress all reaches the host itself, the cloud metadata address and the LAN, \
                 and this server was started without --allow-host-egress; create it with egress allowlist (and its rules) or none, \
                 or ask the user to create it in a terminal (`microagent network create NAME --backend tap`) or restart the server with `microagent serve mcp --allow-host-egress`"
                    .into(),
            ));
        }
        self.check_egress_rules(rules)
    }

    /// The grants as the contract lists them: each flag, whether this
    /// server has it, and what it lets tools do.
    pub fn listing(&self) -> Vec<(&'static str, bool, &'static str)> {
        vec![
            (
                "--allow-host-changes",
                self.host_changes,
                "apply host changes (kernel_install, image_build from debian:*, host_networking_setup) with a preview's token",
            ),
            (
                "--allow-public-ports",
                self.public_ports,
                "port_publish on a non-loopback host address",
            ),
            (
                "--allow-host-egress",
                self.host_egress,
                "egress rules that open host ports, loopback, link-local, private, shared or multicast ranges, or ranges wider than one address",
            ),
            (
                "--allow-secret",
                !self.secrets.is_empty(),
                "give commands the named secrets",
            ),
            (
                "--allow-host-path",
                true,
                "copy files to and from the host directories named (default: the working directory)",
            ),
        ]
    }

    /// Refuses a published port on a non-loopback address unless granted.
    pub(crate) fn check_port_address(&self, addr: std::net::IpAddr) -> Result<(), ToolError> {
        if addr.is_loopback() || self.public_ports {
            return Ok(());
        }
        Err(ToolError::Forbidden(format!(
            "host address {addr} is reachable from other machines, and this server was started without --allow-public-ports; \
             leave host_ip out (127.0.0.1), or ask the user to restart the server with `microagent serve mcp --allow-public-ports`"
        )))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn egress_rules_that_open_the_host_need_the_grant() {
        use workspace::network::AllowEntry;
        let rules: Vec<AllowEntry> = ["pypi.org", "host:6379", "169.254.169.254/32", "0.0.0.0/0"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        let refused = super::Grants::default()
            .check_egress_rules(&rules)
            .unwrap_err();
        let text = refused.to_string();
        assert!(
            text.contains("host:6379")
                && text.contains("169.254.169.254/32")
                && text.contains("0.0.0.0/0"),
            "{text}"
        );
        assert!(!text.contains("pypi.org,") && text.contains("--allow-host-egress"));
        let safe: Vec<AllowEntry> = vec![
            "pypi.org".parse().unwrap(),
            "93.184.216.34/32:443".parse().unwrap(),
        ];
        assert!(super::Grants::default().check_egress_rules(&safe).is_ok());
        assert!(super::Grants::default()
            .host_egress(true)
            .check_egress_rules(&rules)
            .is_ok());
    }

    use super::*;

    #[test]
    fn host_changes_and_public_ports_need_their_grant() {
        let none = Grants::default();
        assert!(none
            .check_host_change(false, "kernel_install", "kernel install")
            .is_ok());
        let refused = none
            .check_host_change(true, "kernel_install", "kernel install")
            .unwrap_err();
        assert_eq!(refused.code(), workspace::ErrorCode::Forbidden);
        assert!(refused.to_string().contains("--allow-host-changes"));
        let all = none.clone().host_changes(true).public_ports(true);
        assert!(all
            .check_host_change(true, "kernel_install", "kernel install")
            .is_ok());
        let public: std::net::IpAddr = "0.0.0.0".parse().unwrap();
        let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        assert!(none.check_port_address(local).is_ok());
        assert_eq!(
            none.check_port_address(public).unwrap_err().code(),
            workspace::ErrorCode::Forbidden
        );
        assert!(all.check_port_address(public).is_ok());
        assert!(none.check_port_address("::1".parse().unwrap()).is_ok());
    }

    #[test]
    fn secrets_need_their_grant() {
        let grants = Grants::default().allow_secret("API_TOKEN");
        assert!(grants.check_secrets(&[]).is_ok());
        assert!(grants.check_secrets(&["API_TOKEN".into()]).is_ok());
        let refused = grants
            .check_secrets(&["API_TOKEN".into(), "DB_PASSWORD".into()])
            .unwrap_err();
        assert_eq!(refused.code(), workspace::ErrorCode::Forbidden);
        let text = refused.to_string();
        assert!(text.contains("--allow-secret DB_PASSWORD"), "{text}");
        assert!(!text.contains("--allow-secret API_TOKEN"), "{text}");
    }
}
