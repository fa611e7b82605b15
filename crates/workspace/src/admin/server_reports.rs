//! Each server's report and the choice of a server for a new workspace:
//! this host measures itself (its workspaces, budget and doctor), a remote
//! server is asked for its own report over SSH.

use std::time::Duration;

use crate::error::Result;
use crate::host::budget::HostBudget;
use crate::host::doctor::Status;
use crate::servers::{
    self, Availability, Health, Resources, ServerError, ServerReport, ServerSpec, ServerStatus,
    WorkspaceFigures, WorkspaceUsage, LOCAL_SERVER, VERSION,
};
use crate::workspaces::manager::ListFilter;
use crate::workspaces::services::ServerPool;
use base::store::state::State;

/// How long CPU use is sampled.
const CPU_SAMPLE: Duration = Duration::from_millis(250);
/// The longest a report samples its workspaces' guests for their usage:
/// a guest whose agent does not answer costs the report its figures, not
/// its time (a server's probe runs within `servers::PROBE_DEADLINE`).
pub const USAGE_BOUND: Duration = Duration::from_secs(10);

impl ServerPool<'_> {
    /// Server `name`'s report: this host's (`local`) measured here, a
    /// remote's asked of it (offline, with the reason, when it cannot be
    /// reached or answers in another shape); with `usage`, each workspace
    /// with what it uses now (its guest sampled, within [`USAGE_BOUND`]).
    pub async fn server_report(&self, name: &str, usage: bool) -> Result<ServerReport> {
        if name == LOCAL_SERVER {
            return self.local_server_report(usage).await;
        }
        self.remote_server_report(&self.all.servers().get(name)?, usage)
            .await
    }

    /// `spec`'s own report, asked of it.
    async fn remote_server_report(&self, spec: &ServerSpec, usage: bool) -> Result<ServerReport> {
        let registry = &self.all.servers();
        let probe = |usage: bool| {
            let mut args = ["server", "status", LOCAL_SERVER]
                .map(String::from)
                .to_vec();
            if usage {
                args.push("--usage".into());
            }
            async move { servers::run_remote_json(registry, spec, &args, servers::PROBE_DEADLINE).await }
        };
        let mut probed = probe(usage).await;
        // A server from before `--usage` refuses it (its microagent
        // answers with an error): asked again without. One that cannot be
        // reached is not asked twice.
        if usage && matches!(probed, Err(ServerError::Remote { .. })) {
            probed = probe(false).await;
        }
        Ok(match probed {
            Ok(value) => match serde_json::from_value::<ServerReport>(value) {
                Ok(report) => self.figures_it_may_see(spec, servers::remote_status(spec, report)),
                Err(e) => servers::offline(
                    spec,
                    format!("its microagent answered the status probe in another shape ({e}); install this version there"),
                ),
            },
            Err(
                e @ (ServerError::Unreachable { .. }
                | ServerError::Deadline { .. }
                | ServerError::Remote { .. }
                | ServerError::Garbled { .. }),
            ) => servers::offline(spec, e.to_string()),
            Err(e) => return Err(e.into()),
        })
    }

    /// `report` of server `spec` with the figures of only the workspaces
    /// this view may use: a server measures every workspace it has, and a
    /// session may use only those placed there from here for it.
    fn figures_it_may_see(&self, spec: &ServerSpec, mut report: ServerReport) -> ServerReport {
        if self.all.caller().is_some() {
            for w in &mut report.workspaces {
                if self.all.check_forward(&spec.name, &w.name).is_err() {
                    w.usage = None;
                }
            }
        }
        report
    }

    /// Every server's report, `local` first.
    pub async fn server_reports(&self) -> Result<Vec<ServerReport>> {
        let mut out = vec![self.local_server_report(false).await?];
        for spec in self.all.servers().list()? {
            out.push(self.remote_server_report(&spec, false).await?);
        }
        Ok(out)
    }

    /// The server a new workspace of `image` goes to: of the online
    /// servers that have the image (or can pull it: a registry reference)
    /// and room (a score above 0), the one with the best available score;
    /// `local` wins a tie.
    pub async fn pick_server(&self, image: &str) -> Result<String> {
        let pullable = image.contains('/') || image.contains(':');
        let mut best: Option<(u32, String)> = None;
        for report in self.server_reports().await? {
            let ServerStatus {
                name,
                status,
                resources,
                ..
            } = report.server;
            let Some(resources) = resources else { continue };
            let has_image = pullable || report.images.iter().any(|i| i == image);
            if status != Availability::Online || resources.available_score == 0 || !has_image {
                continue;
            }
            if best
                .as_ref()
                .is_none_or(|(score, _)| resources.available_score > *score)
            {
                best = Some((resources.available_score, name));
            }
        }
        best.map(|(_, name)| name)
            .ok_or_else(|| ServerError::NoRoom(image.to_owned()).into())
    }

    /// This host as the server `local`, measured now (CPU over a short
    /// sample); with `figures`, each workspace this view may use with what
    /// it uses (its guest sampled over the same time).
    async fn local_server_report(&self, figures: bool) -> Result<ServerReport> {
        let metas = self.all.list(&ListFilter {
            all_agents: true,
            ..ListFilter::default()
        })?;
        let running: Vec<_> = metas.iter().filter(|m| m.state == State::Running).collect();
        let running_mem_mib: u64 = running.iter().map(|m| m.spec.mem_mib).sum();
        let before = servers::cpu_times();
        tokio::time::sleep(CPU_SAMPLE).await;
        let after = servers::cpu_times();
        let cpu_used_percent = match (before, after) {
            (Some((busy0, total0)), Some((busy1, total1))) if total1 > total0 => {
                100.0 * busy1.saturating_sub(busy0) as f64 / (total1 - total0) as f64
            }
            _ => 0.0,
        };
        let (total_memory_bytes, available_memory) = servers::memory();
        let (total_disk_bytes, free_disk) =
            base::host::settings::disk_bytes(self.all.state_dir().root()).unwrap_or((0, 0));
        let budget = HostBudget::load(self.all.state_dir().root()).unwrap_or_default();
        let mut resources = Resources {
            total_cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            cpu_used_percent: (cpu_used_percent * 10.0).round() / 10.0,
            total_memory_bytes,
            used_memory_bytes: total_memory_bytes.saturating_sub(available_memory),
            total_disk_bytes,
            used_disk_bytes: total_disk_bytes.saturating_sub(free_disk),
            running_workspaces: running.len() as u32,
            available_score: 0,
        };
        resources.available_score = servers::available_score(&resources, &budget, running_mem_mib);
        let doctor = crate::host::doctor::Report::check_host(
            self.all.state_dir(),
            base::host::settings::asset_dir().as_deref(),
        );
        // The doctor opened /dev/kvm already.
        let kvm = doctor
            .checks
            .iter()
            .any(|c| c.name == "kvm_device" && c.status == Status::Ok);
        let images = self
            .all
            .image_registry()
            .list()
            .map(|list| list.into_iter().map(|i| i.name).collect())
            .unwrap_or_default();
        let mut usage: std::collections::BTreeMap<String, WorkspaceFigures> = Default::default();
        if figures {
            // A workspace that went meanwhile, or an agent that does not
            // answer (in time: a guest may never), leaves its figures out;
            // never the report.
            let sampled = tokio::time::timeout(USAGE_BOUND, self.all.metrics().figures(None)).await;
            for m in sampled.ok().and_then(|m| m.ok()).unwrap_or_default() {
                let f = WorkspaceFigures {
                    cpu_percent: m.cpu_percent,
                    memory_used_bytes: m.memory_used_bytes,
                    host_rss_bytes: m.host_rss_bytes,
                    disk_used_bytes: m.disk_used_bytes,
                    disk_allocated_bytes: m.disk_allocated_bytes,
                    net_rx_bytes: m.net_rx_bytes,
                    net_tx_bytes: m.net_tx_bytes,
                };
                usage.insert(m.name, f);
            }
        }
        let workspaces = metas
            .into_iter()
            .map(|m| WorkspaceUsage {
                usage: usage.remove(&m.name),
                name: m.name,
                state: m.state.as_str().to_owned(),
                image: m.spec.image,
                vcpus: m.spec.vcpus,
                mem_mib: m.spec.mem_mib,
            })
            .collect();
        Ok(ServerReport {
            server: ServerStatus {
                name: LOCAL_SERVER.to_owned(),
                host: servers::this_host(),
                status: Availability::Online,
                reason: None,
                health: Some(Health {
                    ssh: true,
                    kvm,
                    microagent: VERSION.to_owned(),
                    doctor: doctor.status.as_str().to_owned(),
                }),
                resources: Some(resources),
            },
            workspaces,
            images,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agents::access::Caller;
    use crate::servers::WorkspaceFigures;
    use crate::workspaces::manager::tests::fixture;

    #[test]
    fn a_session_sees_the_figures_of_only_its_own_remote_workspaces() {
        let f = fixture("server-figures", "/nonexistent");
        let spec = ServerSpec::new("box", "u@127.0.0.1:1");
        let registry = f.ws.servers();
        registry.add(&spec).unwrap();
        registry.place("mine", "box", Some("a")).unwrap();
        registry.place("theirs", "box", Some("b")).unwrap();
        let usage = |name: &str| WorkspaceUsage {
            name: name.into(),
            state: "running".into(),
            image: "minimal".into(),
            vcpus: 1,
            mem_mib: 256,
            usage: Some(WorkspaceFigures::default()),
        };
        let report = ServerReport {
            server: servers::offline(&spec, "measured".into()).server,
            workspaces: vec![usage("mine"), usage("theirs"), usage("made-there")],
            images: Vec::new(),
        };
        let a = f.ws.for_caller(Arc::new(Caller::new()));
        a.caller().unwrap().set_agent("a");
        let seen = a.server_pool().figures_it_may_see(&spec, report.clone());
        let has: Vec<bool> = seen.workspaces.iter().map(|w| w.usage.is_some()).collect();
        assert_eq!(has, [true, false, false]);
        // The host's human sees every one.
        let host = f.ws.server_pool().figures_it_may_see(&spec, report);
        assert!(host.workspaces.iter().all(|w| w.usage.is_some()));
    }
}
