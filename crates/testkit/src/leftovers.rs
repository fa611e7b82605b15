//! What a state directory's workspaces may have left behind: processes,
//! files, cgroups. The cycle and kill -9 suites check that nothing is
//! (docs/security.md, "Lifetimes").

use std::path::Path;

/// Processes whose command line names `home` (VMMs and their passt).
pub fn processes_of(home: &Path) -> Vec<String> {
    let needle = home.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            out.push(format!("{pid}: {cmdline}"));
        }
    }
    out
}

/// Every path below the state directory `dir` but those it keeps for good.
pub fn files_of(dir: &Path) -> Vec<String> {
    let kept = [
        "images",
        "plan.key",
        "budget.lock",
        "events",
        "networks",
        "owner-watch.log",
        "previews.lock",
        "mcp-token",
    ];
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            if kept
                .iter()
                .any(|k| rel == *k || rel.starts_with(&format!("{k}/")))
            {
                continue;
            }
            if path.is_dir() {
                stack.push(path.clone());
                // A directory that is only a parent of what is checked.
                if ["workspaces", "snapshots", "previews"].contains(&rel.as_str()) {
                    continue;
                }
            }
            out.push(rel);
        }
    }
    out.sort();
    out
}

/// The cgroups (under every v1 controller) of the workspaces of the state
/// directory `home`: their names end in the same hash of it.
pub fn cgroups_of(home: &Path) -> Vec<String> {
    let group = workspace::host::cgroup::group_id(home, "any");
    let suffix = format!("-{}", group.rsplit('-').next().unwrap_or_default());
    let mut groups = Vec::new();
    for controller in ["memory", "cpu", "pids"] {
        let root = Path::new(workspace::host::cgroup::CGROUP_ROOT).join(controller);
        find_groups(&root, &suffix, &mut groups, 6);
    }
    groups
}

/// Directories under `dir` (to `depth` levels) whose name ends in `suffix`.
fn find_groups(dir: &Path, suffix: &str, out: &mut Vec<String>, depth: usize) {
    if depth == 0 {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.to_string_lossy().ends_with(suffix) {
            out.push(path.display().to_string());
        }
        find_groups(&path, suffix, out, depth - 1);
    }
}

/// Fails the test when anything of `home`'s workspaces is left.
pub fn assert_none(home: &Path) {
    let procs = processes_of(home);
    assert!(procs.is_empty(), "processes left: {procs:?}");
    let files = files_of(home);
    assert!(
        files.is_empty(),
        "files left in the state directory: {files:?}"
    );
    let groups = cgroups_of(home);
    assert!(groups.is_empty(), "cgroups left: {groups:?}");
}
