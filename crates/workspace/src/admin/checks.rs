//! The doctor's checks (`Report::check_host`): KVM, guest assets, images,
//! the state directory, networking, taps, VMM confinement, the host budget
//! and cgroups. The report's records are `host::doctor`'s.

use std::path::Path;

use vmm_core::host::{self, KvmMode};

use crate::host::doctor::{Check, Report};
use base::store::StateDir;

/// Free space below which the state directory gets a warning / a failure.
const WARN_FREE_BYTES: u64 = 2 << 30;
const FAIL_FREE_BYTES: u64 = 256 << 20;

fn kvm_checks(checks: &mut Vec<Check>) -> Option<KvmMode> {
    if let Err(e) = base::host::kvm_group::open_device() {
        checks.push(Check::fail(
            "kvm_device",
            format!("/dev/kvm cannot be opened: {e}"),
            "enable virtualization (load the kvm module, or enable nested virtualization on a VM) and make /dev/kvm read-writable for this user: add it to the kvm group (`usermod -aG kvm USER`, then log in again); as root, `microagent setup --yes` gives /dev/kvm to that group where no udev rule does",
        ));
        return None;
    }
    checks.push(Check::ok("kvm_device", "/dev/kvm is usable"));
    match vmm_core::vm::Vm::new() {
        Ok(_) => checks.push(Check::ok(
            "kvm_api",
            "KVM API 12 with the capabilities microagent needs",
        )),
        Err(e) => {
            checks.push(Check::fail(
                "kvm_api",
                format!("{e}"),
                "use a host kernel with a standard KVM (Linux 5.10 or newer)",
            ));
            return None;
        }
    }
    match host::probe() {
        Ok(p) if p.mode == KvmMode::Native => {
            checks.push(Check::ok(
                "kvm_speed",
                format!(
                    "guest kernel code runs natively ({:.1} ns per ring-0 loop iteration)",
                    p.ring0_ns_per_iteration
                ),
            ));
            Some(p.mode)
        }
        Ok(p) => {
            checks.push(Check::warn(
                "kvm_speed",
                format!(
                    "this host's KVM emulates guest kernel code: about {:.0}x slower than native ({:.1} ns per ring-0 loop iteration); guest user code runs natively",
                    p.slowdown_vs_native(),
                    p.ring0_ns_per_iteration
                ),
                "expect boots of 20-30 s and slow guest system calls; microagent uses the compat CPUID template and kernel automatically. Use a host with hardware virtualization for sub-second boots",
            ));
            Some(p.mode)
        }
        Err(e) => {
            checks.push(Check::fail(
                "kvm_speed",
                format!("the ring-0 probe guest failed: {e}"),
                "report this with the error above: the probe guest runs 100,000 iterations of a ring-0 loop and should end in HLT",
            ));
            None
        }
    }
}

fn asset_checks(checks: &mut Vec<Check>, assets: Option<&Path>, mode: Option<KvmMode>) {
    let Some(assets) = assets else {
        checks.push(Check::fail(
            "guest_kernel",
            "no asset directory (neither MICROAGENT_CACHE nor HOME is set)",
            "set HOME, then run `microagent setup`",
        ));
        return;
    };
    let variant = match mode {
        Some(KvmMode::Emulated) => "compat",
        _ => "standard",
    };
    let kernel = assets.join(format!("vmlinux-{variant}"));
    checks.push(if kernel.exists() {
        Check::ok(
            "guest_kernel",
            format!("{variant} kernel at {}", kernel.display()),
        )
    } else {
        Check::fail(
            "guest_kernel",
            format!("{} is missing", kernel.display()),
            "build it with `microagent setup --yes`, or install one with `microagent kernel install`",
        )
    });
}

/// The built-in images (registered, or built and registered on first use)
/// and any other registered image.
fn image_checks(checks: &mut Vec<Check>, state: &StateDir, assets: Option<&Path>) {
    let registry = state.root().join("images");
    let registered = |name: &str| registry.join(name).join(base::images::registry::IMAGE_FILE);
    for image in base::images::registry::BUILTIN_IMAGES {
        let built = assets.map(|a| a.join(format!("rootfs-{image}.ext4")));
        checks.push(if registered(image).exists() {
            Check::ok(
                "image",
                format!("{image} image registered in {}", registry.display()),
            )
        } else if let Some(path) = built.as_ref().filter(|p| p.exists()) {
            Check::ok(
                "image",
                format!(
                    "{image} image built at {} (registered on first use)",
                    path.display()
                ),
            )
        } else {
            Check::warn(
                "image",
                format!("the {image} image is neither registered nor built"),
                if image == "minimal" {
                    "build it with `microagent setup --yes`".to_string()
                } else {
                    format!("build it with `microagent setup --with {image} --yes`")
                },
            )
        });
    }
    let others = std::fs::read_dir(&registry)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !base::images::registry::BUILTIN_IMAGES.contains(&n.as_str()))
        .filter(|n| registered(n).exists());
    for name in others {
        checks.push(Check::ok("image", format!("{name} image registered")));
    }
}

fn state_checks(checks: &mut Vec<Check>, state: &StateDir) {
    let probe = state.root().join(format!(".doctor-{}", std::process::id()));
    match std::fs::write(&probe, b"ok").and_then(|()| std::fs::remove_file(&probe)) {
        Ok(()) => checks.push(Check::ok(
            "state_dir",
            format!("{} is writable", state.root().display()),
        )),
        Err(e) => checks.push(Check::fail(
            "state_dir",
            format!("cannot write in {}: {e}", state.root().display()),
            "fix its permissions, or point MICROAGENT_HOME elsewhere",
        )),
    }
    // Volumes outlive workspaces: what they hold is part of the picture.
    let volumes = base::volumes::VolumeStore::new(state)
        .list()
        .unwrap_or_default();
    let mut held = match volumes.len() {
        0 => String::new(),
        n => format!(
            "; {n} volume(s) take {} MiB",
            volumes.iter().map(|v| v.used_bytes).sum::<u64>() >> 20
        ),
    };
    // So are outputs kept on the host (a guest chose them).
    if let Ok(kept) = base::store::kept_outputs::KeptOutputs::new(state.root()) {
        let limits = kept.limits();
        held.push_str(&format!(
            "; kept outputs take {} MiB of {} MiB (removed with their workspace or after {} day(s))",
            kept.total_bytes() >> 20,
            limits.max_total_bytes >> 20,
            limits.ttl_secs.div_ceil(24 * 3600)
        ));
    }
    match base::host::settings::free_bytes(state.root()) {
        Ok(free) if free < FAIL_FREE_BYTES => checks.push(Check::fail(
            "free_disk",
            format!("{} MiB free{held}", free >> 20),
            "free some space (volumes you no longer need: `volume rm`): each workspace needs room for its writable disk",
        )),
        Ok(free) if free < WARN_FREE_BYTES => checks.push(Check::warn(
            "free_disk",
            format!("{} MiB free{held}", free >> 20),
            "free some space before creating many workspaces",
        )),
        Ok(free) => checks.push(Check::ok(
            "free_disk",
            format!("{:.1} GiB free{held}", free as f64 / (1u64 << 30) as f64),
        )),
        Err(e) => checks.push(Check::warn(
            "free_disk",
            format!("cannot measure free space: {e}"),
            "check the file system of the state directory",
        )),
    }
}

impl Report {
    /// Runs every check on this host, for the state directory `state` and
    /// the guest assets in `assets`.
    pub fn check_host(state: &StateDir, assets: Option<&Path>) -> Report {
        let mut checks = Vec::new();
        let mode = kvm_checks(&mut checks);
        asset_checks(&mut checks, assets, mode);
        image_checks(&mut checks, state, assets);
        state_checks(&mut checks, state);
        checks.push(network_check());
        checks.push(tap_check(state));
        checks.push(confinement_check(state));
        checks.push(budget_check(state));
        checks.push(cgroup_check());
        Report::new(checks)
    }
}

/// Whether each VMM can get a cgroup of its own (memory, CPU, pids).
fn cgroup_check() -> Check {
    let root = Path::new(base::host::cgroup::CGROUP_ROOT);
    let writable = |dir: &Path| {
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: c is NUL-terminated; access only reads it.
        unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
    };
    if let Some(v1) = base::host::cgroup::v1_controllers(root) {
        if v1.iter().all(|d| writable(d)) {
            return Check::ok(
                "cgroups",
                "cgroup v1 memory, cpu and pids: each VMM gets a group with its limits",
            );
        }
        return Check::warn(
            "cgroups",
            "cgroup v1 memory, cpu and pids are mounted but not writable by this user: VMMs run without limits of their own",
            "run as root, or delegate the controllers to this user",
        );
    }
    if root.join("cgroup.controllers").exists() {
        return Check::ok(
            "cgroups",
            "cgroup v2: each VMM gets a group where its own group delegates memory, cpu and pids (inspect says which)",
        );
    }
    Check::warn(
        "cgroups",
        "no cgroup hierarchy: VMMs run without memory, CPU and pids limits of their own",
        "mount the cgroup v1 controllers or a cgroup v2 hierarchy",
    )
}

/// The host budget (`budget.json`) and where the disk stands against it.
fn budget_check(state: &StateDir) -> Check {
    use crate::host::budget::{HostBudget, BUDGET_FILE};
    let budget = match HostBudget::load(state.root()) {
        Ok(b) => b,
        Err(e) => {
            return Check::fail(
                "host_budget",
                base::error_chain::error_chain(&e),
                format!("fix or remove {}", state.root().join(BUDGET_FILE).display()),
            )
        }
    };
    let limit =
        |v: Option<u64>, unit: &str| v.map_or("no limit".to_owned(), |n| format!("{n}{unit}"));
    let detail = format!(
        "running workspaces: {}; guest memory: {}; free-disk floor: {} MiB ({})",
        limit(budget.max_running.map(u64::from), ""),
        limit(budget.max_guest_mem_mib, " MiB"),
        budget.min_free_disk_mib,
        state.root().join(BUDGET_FILE).display()
    );
    match base::host::settings::free_bytes(state.root()).map(|b| b >> 20) {
        Ok(free) if free < budget.min_free_disk_mib => Check::fail(
            "host_budget",
            format!("{detail}; only {free} MiB free: creates and starts are refused"),
            "free some disk space, or lower min_free_disk_mib",
        ),
        _ => Check::ok("host_budget", detail),
    }
}

/// Whether `tap` networks can work here: TAP devices, nftables, dnsmasq,
/// the right to use them, and whether the host setup matches the networks.
fn tap_check(state: &StateDir) -> Check {
    use crate::network::setup;
    use base::network::{Backend, NetworkStore};
    let mut missing: Vec<&str> = ["ip", "nft", "dnsmasq"]
        .into_iter()
        .filter(|t| base::host::settings::host_tool(t).is_none())
        .collect();
    if !Path::new("/dev/net/tun").exists() {
        missing.push("/dev/net/tun");
    }
    let admin = base::host::plan::has_cap_net_admin();
    let nets = NetworkStore::new(state).list().unwrap_or_default();
    let taps: Vec<String> = nets
        .iter()
        .filter(|n| n.backend == Some(Backend::Tap))
        .map(|n| n.name.clone())
        .collect();
    let usable = if missing.is_empty() {
        format!(
            "TAP, nftables and dnsmasq are here{}",
            if admin {
                ""
            } else {
                "; this user lacks CAP_NET_ADMIN, which tap networks need"
            }
        )
    } else {
        format!("missing: {}", missing.join(", "))
    };
    if taps.is_empty() {
        return Check::ok("tap_networks", format!("no tap networks ({usable})"));
    }
    if !missing.is_empty() {
        return Check::fail(
            "tap_networks",
            format!("tap networks {} cannot work: {usable}", taps.join(", ")),
            "apt-get install iproute2 nftables dnsmasq-base, and load the tun module",
        );
    }
    let dir = state.root().join(base::network::objects::NETWORKS_DIR);
    let want = setup::Desired::of(&nets, &dir, &setup::host_resolvers());
    if want.is_applied(&setup::probe(&dir)) {
        Check::ok(
            "tap_networks",
            format!("host setup applied for {} ({usable})", taps.join(", ")),
        )
    } else {
        Check::warn(
            "tap_networks",
            format!(
                "the host setup does not match tap networks {}: their workspaces cannot start or are filtered by old rules",
                taps.join(", ")
            ),
            "preview the host setup of the tap networks, then apply it with its confirm token (as root)",
        )
    }
}

/// The protections VMM processes run under on this host (docs/security.md).
fn confinement_check(state: &StateDir) -> Check {
    if base::host::settings::proc_self_status("Seccomp").is_none() {
        return Check::fail(
            "vmm_confinement",
            "this kernel has no seccomp: VMM processes refuse to run unconfined",
            "use a kernel built with CONFIG_SECCOMP_FILTER",
        );
    }
    if std::env::var_os(base::vmm::confinement::NO_SECCOMP_VAR).is_some_and(|v| v == "1") {
        return Check::warn(
            "vmm_confinement",
            format!(
                "{} is set: VMM processes started from here run without seccomp filters",
                base::vmm::confinement::NO_SECCOMP_VAR
            ),
            format!(
                "unset {} unless you are debugging a filter",
                base::vmm::confinement::NO_SECCOMP_VAR
            ),
        );
    }
    let filters = "VMM processes run with seccomp filters per thread role (vcpu, devices, control; ioctl requests, socket families and clone flags checked), no_new_privs and rlimits";
    let account = match base::vmm::user::for_state(state.root()) {
        Ok(Some(user)) => format!(
            "; root's run as the account {} (uid {}) in a PID namespace of their own",
            user.name, user.uid
        ),
        // SAFETY: geteuid has no preconditions.
        Ok(None) if unsafe { libc::geteuid() } == 0 => {
            let missing = base::vmm::user::account_missing(state.root());
            return Check::warn(
                "vmm_confinement",
                format!(
                    "{filters}, but root's stay root once their machine is built{}",
                    if missing {
                        format!(
                            " (the account {} does not exist)",
                            base::vmm::user::DEFAULT_VMM_USER
                        )
                    } else {
                        " (config.json sets vmm_user to root)".to_owned()
                    }
                ),
                if missing {
                    "run the host setup as root: it creates the account".to_owned()
                } else {
                    format!(
                        "remove vmm_user from config.json to use {}",
                        base::vmm::user::DEFAULT_VMM_USER
                    )
                },
            );
        }
        Ok(None) => String::new(),
        Err(e) => {
            return Check::fail(
                "vmm_confinement",
                format!(
                    "VMM processes cannot start: {}",
                    base::error_chain::error_chain(&e)
                ),
                "set vmm_user in config.json to an existing account, or remove it",
            )
        }
    };
    match base::host::jail::availability() {
        Ok(how) => Check::ok(
            "vmm_confinement",
            format!(
                "{filters}, and see only their own files (a private root through {how}){account}"
            ),
        ),
        Err(blocked) => {
            let landlock = match base::host::settings::landlock_abi() {
                Some(abi) => format!("; Landlock (ABI {abi}) still confines their files"),
                None => "; this kernel has no Landlock either, so they see the host's files".into(),
            };
            Check::warn(
                "vmm_confinement",
                format!(
                    "{filters}, but get no private root: {}{landlock}",
                    blocked.why
                ),
                format!(
                    "allow user namespaces ({}), or run microagent as root",
                    blocked.enable
                ),
            )
        }
    }
}

/// The `user` network (every workspace's default) needs `passt`, one
/// without the bulk-upload reset, best ours (an idle workspace's network at
/// about 0.5 MiB).
fn network_check() -> Check {
    use base::network::{passt_snapshot, PASST_FIXED_SNAPSHOT, PASST_OVERRIDE_VAR};
    let binary = base::network::passt_binary();
    let snapshot = binary.as_deref().and_then(passt_snapshot);
    match binary {
        Some(path) if snapshot.is_some_and(|d| d < PASST_FIXED_SNAPSHOT) => Check::warn(
            "user_network",
            format!(
                "passt at {} is a snapshot of {}: it resets a workspace's TCP connection once the far end has sent nothing for about 24 s (long uploads)",
                path.display(),
                snapshot.unwrap_or_default()
            ),
            format!(
                "run the host setup as root: it builds Debian 13's passt into /usr/local/bin (or set {PASST_OVERRIDE_VAR} to a passt from 2023-03-27 or later)"
            ),
        ),
        Some(path) if !crate::network::passt_build::is_ours(&path) => Check::warn(
            "user_network",
            format!(
                "passt at {} is not microagent's build: each running workspace's network takes about 14 MiB of memory instead of 0.5 MiB",
                path.display()
            ),
            "run the host setup as root: it builds microagent's passt into /usr/local/bin",
        ),
        Some(path) => Check::ok(
            "user_network",
            format!("passt at {} (the user network)", path.display()),
        ),
        None => Check::warn(
            "user_network",
            "passt is not installed: workspaces on the default `user` network cannot start",
            "install it (apt-get install passt), or create workspaces with --network none",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::doctor::Status;

    #[test]
    fn asset_and_state_checks_report_what_is_missing() {
        let root = std::env::temp_dir().join(format!("microagent-doctor-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let state = StateDir::at(root.join("state")).unwrap();
        let assets = root.join("assets");
        std::fs::create_dir_all(&assets).unwrap();
        std::fs::write(assets.join("vmlinux-compat"), b"").unwrap();
        std::fs::write(assets.join("rootfs-minimal.ext4"), b"").unwrap();
        let mut checks = Vec::new();
        asset_checks(&mut checks, Some(&assets), Some(KvmMode::Emulated));
        image_checks(&mut checks, &state, Some(&assets));
        state_checks(&mut checks, &state);
        let by = |name: &str, detail: &str| {
            checks
                .iter()
                .find(|c| c.name == name && c.detail.contains(detail))
                .map(|c| c.status)
        };
        assert_eq!(by("guest_kernel", "compat"), Some(Status::Ok));
        assert_eq!(by("image", "minimal"), Some(Status::Ok));
        assert_eq!(by("image", "debian"), Some(Status::Warn));
        assert_eq!(by("state_dir", "writable"), Some(Status::Ok));
        assert!(
            checks
                .iter()
                .all(|c| c.status == Status::Ok || c.fix.is_some()),
            "every problem says what to do"
        );
        // A registered image counts even when the asset cache lacks it.
        for name in ["debian", "custom"] {
            let dir = state.root().join("images").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(base::images::registry::IMAGE_FILE), b"{}").unwrap();
        }
        let mut checks = Vec::new();
        image_checks(&mut checks, &state, None);
        let statuses: Vec<(String, Status)> = checks
            .iter()
            .map(|c| (c.detail.clone(), c.status))
            .collect();
        assert_eq!(statuses.len(), 3, "{statuses:?}");
        assert_eq!(
            statuses[0].1,
            Status::Warn,
            "minimal: neither registered nor built"
        );
        assert!(statuses[1].0.contains("debian image registered") && statuses[1].1 == Status::Ok);
        assert!(statuses[2].0.contains("custom") && statuses[2].1 == Status::Ok);
        let mut checks = Vec::new();
        asset_checks(&mut checks, Some(&assets), Some(KvmMode::Native));
        assert_eq!(
            checks[0].status,
            Status::Fail,
            "the standard kernel is missing"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn report_json_uses_stable_names() {
        let report = Report {
            status: Status::Warn,
            checks: vec![Check::warn(
                "kvm_speed",
                "slow",
                "use hardware virtualization",
            )],
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["status"], "warn");
        for status in [Status::Ok, Status::Warn, Status::Fail] {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
        assert_eq!(json["checks"][0]["name"], "kvm_speed");
        assert_eq!(json["checks"][0]["fix"], "use hardware virtualization");
    }
}
