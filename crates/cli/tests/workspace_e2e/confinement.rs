//! How a running workspace's VMM is confined, read from outside it
//! (docs/security.md): what `inspect` says, its threads' capability sets,
//! account, PID and network namespaces in /proc, and `doctor`'s check.

use testkit::cli::CliHome;

/// Checks the VMM of the running workspace `ws`.
pub fn check(cli: &CliHome, ws: &str) {
    let inspected = cli.ok_json(&["inspect", ws, "--json"]);
    let protections = &inspected["runtime"]["protections"];
    let has = |p: &str| protections.as_array().unwrap().iter().any(|v| v == p);
    // SAFETY: geteuid takes nothing. As root the VMM has a private root.
    let root = unsafe { libc::geteuid() } == 0;
    let private_root = if root { "private_root" } else { "rlimits" };
    for p in [
        "seccomp",
        "no_new_privs",
        "rlimits",
        "inherited_fds_closed",
        "no_capabilities",
        private_root,
    ] {
        assert!(has(p), "{p} missing: {protections}");
    }
    // Its files and sockets are confined by Landlock where the kernel has it.
    let landlock_abi = workspace::host::settings::landlock_abi().unwrap_or(0);
    if landlock_abi >= 6 {
        assert!(has("landlock"), "{protections}");
    }
    // Every thread of it holds no capability, root or not, and (as root)
    // it is in an empty network namespace of its own.
    let pid = inspected["runtime"]["pid"].as_u64().unwrap();
    if root {
        assert!(has("network_namespace"), "{protections}");
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
        assert_ne!(ns(&pid.to_string()), ns("self"));
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> Vec<u32> {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line[name.len()..]
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect()
    };
    if root {
        // Its own account (the one setup makes), in every id, and a PID
        // namespace of its own where it is process 1.
        let account = workspace::vmm::user::lookup(workspace::vmm::user::DEFAULT_VMM_USER)
            .expect("the VMMs' account exists (cargo xtask setup makes it)");
        assert_eq!(field("Uid:"), [account.uid; 4], "{status}");
        assert_eq!(field("Gid:"), [account.gid; 4], "{status}");
        assert!(
            has(&format!("uid:{}:{}", account.uid, account.gid)),
            "{protections}"
        );
        assert_eq!(field("NSpid:"), [pid as u32, 1], "{status}");
        assert!(has("pid_namespace"), "{protections}");
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).unwrap();
        assert_ne!(ns(&pid.to_string()), ns("self"));
    } else {
        // SAFETY: getuid takes nothing.
        let me = unsafe { libc::getuid() };
        assert_eq!(field("Uid:")[0], me, "{status}");
    }
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
            let line = status.lines().find(|l| l.starts_with(set)).unwrap();
            assert!(line.ends_with("0000000000000000"), "{line}\n{status}");
        }
        if root {
            let bounding = status.lines().find(|l| l.starts_with("CapBnd")).unwrap();
            assert!(bounding.ends_with("0000000000000000"), "{bounding}");
        }
    }
    let doctor = cli.run(&["doctor", "--json"]).json();
    let confinement = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "vmm_confinement")
        .cloned()
        .unwrap_or_default();
    // Without root it depends on the host's user namespaces.
    if root {
        assert_eq!(confinement["status"], "ok", "{doctor}");
    } else {
        assert_ne!(confinement["status"], "fail", "{doctor}");
    }
}
