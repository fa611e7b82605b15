//! A running workspace's egress filter as its control socket reaches it:
//! a new policy for new connections, and what the filter refused.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};

use base::network::attach::UserEgress;
use base::network::user_filter::{filter_policy, maps_host};
use base::network::{AllowEntry, Egress};
use base::store::egress::EgressDenial;
use base::vmm::control::ControlResponse;
use vmm_core::devices::virtio::net::egress::EgressFilter;

/// The filter and what passt was started with.
#[derive(Debug)]
pub(crate) struct EgressControl {
    filter: Arc<Mutex<EgressFilter>>,
    maps_host: bool,
}

impl EgressControl {
    pub(crate) fn new(egress: UserEgress) -> Self {
        Self {
            filter: egress.filter,
            maps_host: egress.maps_host,
        }
    }

    fn filter(&self) -> MutexGuard<'_, EgressFilter> {
        self.filter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `egress` and `allow` in force for new connections.
    pub(crate) fn set(&self, egress: Egress, allow: &[AllowEntry]) -> ControlResponse {
        if maps_host(allow) && !self.maps_host {
            return ControlResponse::Error {
                message: "this workspace started without host ports, so its network cannot reach the host; a host:PORT rule takes effect at its next start".into(),
            };
        }
        self.filter().set_policy(filter_policy(egress, allow));
        ControlResponse::Ok {
            ttl_deadline_ms: None,
        }
    }

    /// The refusals so far and the last ones.
    pub(crate) fn denials(&self) -> ControlResponse {
        let (denied, kept) = self.filter().denials();
        ControlResponse::EgressDenials {
            denied,
            denials: kept.into_iter().map(record).collect(),
        }
    }

    /// A channel that holds a message once a refusal came after the last
    /// receive (one message however many came).
    pub(crate) fn refusals_signal(&self) -> Receiver<()> {
        let (to, from) = mpsc::sync_channel(1);
        self.filter().notify_refusals(to);
        from
    }

    /// The kept refusals numbered after `seen`, which moves past them.
    pub(crate) fn new_denials(&self, seen: &mut u64) -> Vec<EgressDenial> {
        let (denied, kept) = self.filter().denials();
        let fresh = kept
            .into_iter()
            .filter(|d| d.seq > *seen)
            .map(record)
            .collect();
        *seen = denied;
        fresh
    }
}

/// A refusal as the workspace's records keep it.
fn record(d: vmm_core::devices::virtio::net::egress::Denial) -> EgressDenial {
    EgressDenial {
        dst: d.dst,
        port: d.port,
        protocol: d.protocol.to_owned(),
        name: d.name,
        reason: d.reason.as_str().to_owned(),
        at_ms: d.at_ms,
    }
}
