//! Who may use what: an MCP session is a [`Caller`], whose agent (once it
//! has one) owns what it creates. Another agent's workspace or snapshot is
//! FORBIDDEN to it unless the owner shared it; a session without an agent
//! may use only what no agent owns. A view without a caller (the CLI, a
//! human on the host) may use everything. Agents are told apart by name,
//! so an agent that reconnects (`serve mcp --agent NAME`) owns what it
//! owned; names are what a session says it is, so this keeps agents from
//! each other's work by mistake, not from a client that lies.

use std::sync::RwLock;

/// The session a view of the workspaces acts for.
#[derive(Debug, Default)]
pub struct Caller {
    agent: RwLock<Option<String>>,
}

impl Caller {
    /// A session with no agent yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session's agent is `name` from now on.
    pub fn set_agent(&self, name: &str) {
        *self.agent.write().unwrap_or_else(|p| p.into_inner()) = Some(name.to_owned());
    }

    /// The session's agent, if it has one.
    pub fn agent(&self) -> Option<String> {
        self.agent.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Whether `caller` (none: the host) may use a thing its owner (none: no
/// agent) shared with `shared_with`.
pub fn may_use(caller: Option<&Caller>, owner: Option<&str>, shared_with: &[String]) -> bool {
    let Some(caller) = caller else {
        return true;
    };
    match (owner, caller.agent()) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(owner), Some(me)) => owner == me || shared_with.contains(&me),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_and_shares_decide() {
        let shared = vec!["b".to_owned()];
        assert!(may_use(None, Some("a"), &[]), "the host uses everything");
        let anonymous = Caller::new();
        assert!(may_use(Some(&anonymous), None, &[]));
        assert!(!may_use(Some(&anonymous), Some("a"), &shared));
        let b = Caller::new();
        b.set_agent("b");
        assert!(may_use(Some(&b), Some("b"), &[]));
        assert!(may_use(Some(&b), Some("a"), &shared));
        assert!(!may_use(Some(&b), Some("a"), &[]));
        assert!(may_use(Some(&b), None, &[]));
    }
}
