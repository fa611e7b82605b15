//! Building a workspace's machine, in the order the steps must run: join
//! its cgroup (so the guest's memory and the network helper count), clear
//! a crashed run's sockets, attach the network (passt stays in the host's
//! namespace), take a mount namespace of its own while this is the only
//! thread, then build the machine or restore it from a snapshot (onto the
//! VM a standby process prepared, when it is one).

use crate::error::{Result, VmmProcessError};
use base::host::cgroup::{self, CgroupLimits, Placement};
use base::host::settings::asset_dir;
use base::images::ImageRegistry;
use base::network::Addressing;
use base::store::console_log::ConsoleLogWriter;
use base::store::spec::WorkspaceSpec;
use base::store::volume_mounts::VOLUME_SLOTS;
use base::store::workspace_dir::WorkspaceDir;
use base::store::StateDir;
use base::vmm::launch::{VmmLaunch, GUEST_CMDLINE};
use base::volumes::VolumeStore;
use vmm_core::devices::serial::ConsoleSink;
use vmm_core::machine::{
    DiskConfig, NetBackendConfig, NetConfig, PreparedVm, RestoreConfig, VsockConfig,
};
use vmm_core::{KernelVariant, Machine, MachineConfig};

/// How long a passt started at a claim is given to leave the mount
/// namespace a standby took ahead (it takes its own as it starts).
const PASST_APART_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The guest's vsock context id (the first one guests get).
const GUEST_CID: u64 = 3;

/// What building left: the machine (or why there is none) and what the
/// run needs besides it.
#[derive(Debug)]
pub(crate) struct Built {
    /// The machine, or why it could not be built.
    pub machine: Result<Machine>,
    /// The `user` network's passt, ended with the run.
    pub passt: Option<base::network::Passt>,
    /// The `user` network's egress filter.
    pub egress: Option<base::network::attach::UserEgress>,
    /// The guest's addresses on a network, if it has one.
    pub guest_net: Option<Addressing>,
    /// The cgroup joined (or why none).
    pub cgroup: Placement,
    /// Its own mount namespace (with the private root a standby made in it
    /// ahead), or why it has none.
    pub mount_ns: std::result::Result<Option<base::host::jail::RootAhead>, String>,
    /// When building began, its steps ended (cgroup joined, network
    /// attached, mount namespace made) and it ended (monotonic ns; 0 for
    /// a step not reached).
    pub began_ns: u64,
    /// See `began_ns`.
    pub cgroup_ns: u64,
    /// See `began_ns`.
    pub network_ns: u64,
    /// See `began_ns`.
    pub unshared_ns: u64,
    /// See `began_ns`.
    pub built_ns: u64,
}

impl Built {
    /// Runs the steps for the workspace `ws` of `spec` as `launch` asks,
    /// with what a standby made `ahead` when it is one.
    pub(crate) fn build(
        state: &StateDir,
        ws: &WorkspaceDir,
        launch: &VmmLaunch,
        spec: &WorkspaceSpec,
        ahead: Option<crate::standby::MadeAhead>,
    ) -> Self {
        let now = vmm_core::vcpu::monotonic_ns;
        let began_ns = now();
        let (prepared, standby_cgroup, mut passt_ahead, root_ahead) = match ahead {
            Some(a) => (Some(a.prepared), Some(a.cgroup), a.passt, a.root),
            None => (None, None, None, None),
        };
        let cgroup = join_cgroup(state, ws, spec, standby_cgroup, &mut passt_ahead);
        ws.remove_sockets();
        let cgroup_ns = now();
        let (mut network_ns, mut unshared_ns) = (0, 0);
        let (mut passt, mut guest_net, mut egress) = (None, None, None);
        let mut mount_ns = Err("the machine was not built".to_owned());
        let machine = base::network::attach::attach(state, ws, spec, launch.user, passt_ahead)
            .map_err(VmmProcessError::from)
            .and_then(|net| {
                network_ns = now();
                let passt_now = net
                    .as_ref()
                    .filter(|a| !a.passt_ahead)
                    .and_then(|a| a.passt.as_ref())
                    .map(base::network::Passt::pid);
                mount_ns = match root_ahead {
                    // Taken ahead: a passt started now (the one ahead did
                    // not serve) shares it until it takes its own; one that
                    // does not is not run beside (the root would move its
                    // root): the VMM ends rather than run without its own.
                    Some(root) => {
                        if let Some(pid) = passt_now {
                            base::host::jail::wait_until_apart(pid, PASST_APART_WAIT)
                                .map_err(VmmProcessError::PasstNotApart)?;
                        }
                        Ok(Some(root))
                    }
                    None => base::host::jail::unshare()
                        .map(|()| None)
                        .map_err(|e| base::error_chain::error_chain(&e)),
                };
                unshared_ns = now();
                let (net, addressing) = match net {
                    Some(a) => {
                        passt = a.passt;
                        egress = a.egress;
                        guest_net = Some(a.addressing);
                        (Some(a.backend), Some(a.addressing))
                    }
                    None => (None, None),
                };
                match &launch.restore {
                    None => build_machine(state, ws, spec, launch.kernel, net, addressing),
                    Some(dir) => {
                        restore_machine(state, ws, spec, launch.kernel, dir, net, prepared)
                    }
                }
            });
        Self {
            machine,
            passt,
            egress,
            guest_net,
            cgroup,
            mount_ns,
            began_ns,
            cgroup_ns,
            network_ns,
            unshared_ns,
            built_ns: now(),
        }
    }
}

/// Joins the workspace's cgroup with its limits and records where. A
/// standby's groups (`standby`), joined ahead with the same limits, are
/// renamed to the workspace's instead; when they cannot be (other limits,
/// a group of that name left), the process joins as usual and they go,
/// with the passt the standby started in them (`passt_ahead`: it would
/// run outside the workspace's groups).
fn join_cgroup(
    state: &StateDir,
    ws: &WorkspaceDir,
    spec: &WorkspaceSpec,
    standby: Option<Placement>,
    passt_ahead: &mut Option<base::network::PasstAhead>,
) -> Placement {
    let limits = CgroupLimits::for_workspace(spec.vcpus, spec.mem_mib);
    let group = cgroup::group_id(state.root(), ws.name());
    let renamed = standby.as_ref().and_then(|made| match made {
        Placement::Joined { limits: l, .. } if *l == limits => cgroup::rename(made, &group),
        _ => None,
    });
    let placed = renamed.unwrap_or_else(|| {
        let placed = cgroup::join(std::path::Path::new(cgroup::CGROUP_ROOT), &group, &limits);
        // The standby's groups, left empty by the join and passt's end.
        if let Some(Placement::Joined { dirs, .. }) = &standby {
            drop(passt_ahead.take());
            for dir in dirs {
                let _ = std::fs::remove_dir(dir);
            }
        }
        placed
    });
    cgroup::record(&placed, ws.path());
    placed
}

fn build_machine(
    state: &StateDir,
    ws: &WorkspaceDir,
    spec: &WorkspaceSpec,
    kernel: KernelVariant,
    net: Option<NetBackendConfig>,
    addressing: Option<Addressing>,
) -> Result<Machine> {
    let images = ImageRegistry::new(state, asset_dir(), kernel);
    let image = images.get(&spec.image)?;
    let console = ConsoleLogWriter::create(ws.path())?;
    let mut cmdline = format!("{GUEST_CMDLINE} microagent_hostname={}", ws.name());
    if let Some(args) = &image.boot_args {
        cmdline.push(' ');
        cmdline.push_str(args);
    }
    if let Some(net) = base::network::guest_cmdline(addressing.as_ref()) {
        cmdline.push(' ');
        cmdline.push_str(&net);
    }
    Machine::build(MachineConfig {
        kernel: image.kernel,
        initrd: None,
        extra_cmdline: Some(cmdline),
        mem_mib: spec.mem_mib,
        vcpus: spec.vcpus,
        template: kernel.cpu_template(),
        console: ConsoleSink::new().with(Box::new(console)),
        disks: workspace_disks(state, image.rootfs, ws, spec)?,
        vsock: Some(VsockConfig {
            guest_cid: GUEST_CID,
            uds_path: ws.vsock(),
            routes: service_routes(ws, spec),
        }),
        net: net.map(|backend| NetConfig {
            mac: base::network::mac_for(ws.name()),
            backend,
        }),
        balloon: true,
    })
    .map_err(|e| start_failed(ws, &e))
}

fn start_failed(ws: &WorkspaceDir, e: &vmm_core::machine::MachineError) -> VmmProcessError {
    VmmProcessError::StartFailed {
        name: ws.name().to_owned(),
        reason: base::error_chain::error_chain(e),
    }
}

/// The disks of a workspace's machine: the image's read-only root, the
/// workspace's own writable disk, then its volume slots (an empty file
/// where no volume fills one, attached writable so a volume given at a
/// restore can be either).
fn workspace_disks(
    state: &StateDir,
    rootfs: std::path::PathBuf,
    ws: &WorkspaceDir,
    spec: &WorkspaceSpec,
) -> Result<Vec<DiskConfig>> {
    let mut disks = vec![
        DiskConfig {
            path: rootfs,
            read_only: true,
            id: None,
        },
        DiskConfig {
            path: ws.disk(),
            read_only: false,
            id: None,
        },
    ];
    let volumes = VolumeStore::new(state);
    for slot in 0..VOLUME_SLOTS {
        disks.push(match spec.volumes.get(slot) {
            Some(mount) => DiskConfig {
                path: volumes.mount_disk(ws, slot, mount)?,
                read_only: mount.read_only,
                id: Some(mount.serial()),
            },
            None => {
                let empty = ws.empty_slot();
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&empty)
                    .map_err(VmmProcessError::host_io(format!(
                        "creating {}",
                        empty.display()
                    )))?;
                DiskConfig {
                    path: empty,
                    read_only: false,
                    id: Some(format!("empty-slot-{slot}")),
                }
            }
        });
    }
    Ok(disks)
}

/// The workspace's machine from the snapshot in `dir`: the image's root
/// disk, the workspace's own disk (already a copy of the snapshot's), new
/// sockets.
fn restore_machine(
    state: &StateDir,
    ws: &WorkspaceDir,
    spec: &WorkspaceSpec,
    kernel: KernelVariant,
    dir: &std::path::Path,
    net: Option<NetBackendConfig>,
    prepared: Option<PreparedVm>,
) -> Result<Machine> {
    let images = ImageRegistry::new(state, asset_dir(), kernel);
    let image = images.get(&spec.image)?;
    let console = ConsoleLogWriter::create(ws.path())?;
    let cfg = RestoreConfig {
        snapshot: dir.to_path_buf(),
        console: ConsoleSink::new().with(Box::new(console)),
        disks: workspace_disks(state, image.rootfs, ws, spec)?,
        vsock_uds: Some(ws.vsock()),
        vsock_routes: service_routes(ws, spec),
        net,
    };
    match prepared {
        Some(prepared) => Machine::restore_into(prepared, cfg),
        None => Machine::restore(cfg),
    }
    .map_err(|e| start_failed(ws, &e))
}

/// Where the guest's connections to its services' host vsock ports go:
/// the relay sockets their VMMs serve in this workspace's directory.
fn service_routes(
    ws: &WorkspaceDir,
    spec: &WorkspaceSpec,
) -> std::collections::BTreeMap<u32, std::path::PathBuf> {
    base::store::spec::services::routes(&spec.services)
        .map(|(_, _, _, vsock_port)| (vsock_port, ws.service_relay(vsock_port)))
        .collect()
}
