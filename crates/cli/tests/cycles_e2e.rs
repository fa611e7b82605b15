//! 50 create/start/exec/delete cycles through the `microagent` binary on
//! the real guest (each fresh workspace resumes the image's warm snapshot,
//! so a cycle takes seconds), then a look for anything left behind: a VMM
//! or network helper process of this state directory, a workspace
//! directory, a socket, a cgroup, a scratch file (docs/security.md,
//! "Lifetimes").

use std::path::Path;
use std::time::Instant;

use testkit::cli::CliHome;

const CYCLES: usize = 50;

/// Processes whose command line names `home` (VMMs and their passt).
fn processes_of(home: &Path) -> Vec<String> {
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

/// Every path below `dir` but those the state directory keeps for good.
fn leftovers(dir: &Path) -> Vec<String> {
    let kept = ["images", "plan.key", "budget.lock", "events", "networks"];
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
                // A directory that is only a parent of kept things is fine.
                if rel == "workspaces" {
                    continue;
                }
            }
            out.push(rel);
        }
    }
    out.sort();
    out
}

#[test]
fn fifty_cycles_leave_nothing_behind() {
    let test = "fifty_cycles_leave_nothing_behind";
    let Some(_) = testkit::require(test, testkit::guest_assets()) else {
        return;
    };
    let Some(_) = testkit::require(test, testkit::workspace_image("minimal")) else {
        return;
    };
    let cli = CliHome::new(env!("CARGO_BIN_EXE_microagent"), test);
    let began = Instant::now();
    for i in 0..CYCLES {
        let name = format!("c{i}");
        cli.ok_json(&["create", &name, "--json"]);
        let started = cli.ok_json(&["start", &name, "--json"]);
        assert_eq!(started["state"], "running", "cycle {i}: {started}");
        let ran = cli.ok_json(&["exec", &name, "--json", "--", "true"]);
        assert_eq!(ran["exit_code"], 0, "cycle {i}: {ran}");
        cli.ok_json(&["delete", &name, "--yes", "--force", "--json"]);
    }
    eprintln!("{CYCLES} cycles in {:.0} s", began.elapsed().as_secs_f64());
    let listed = cli.ok_json(&["list", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
    let procs = processes_of(cli.home());
    assert!(procs.is_empty(), "processes left: {procs:?}");
    let files = leftovers(cli.home());
    assert!(
        files.is_empty(),
        "files left in the state directory: {files:?}"
    );
    // No cgroup of these workspaces is left under any v1 controller.
    let group = workspace::cgroup::group_id(cli.home(), "c0");
    let suffix = group.rsplit('-').next().unwrap_or_default().to_owned();
    let mut groups = Vec::new();
    for controller in ["memory", "cpu", "pids"] {
        let root = Path::new(workspace::cgroup::CGROUP_ROOT).join(controller);
        find_groups(&root, &format!("-{suffix}"), &mut groups, 6);
    }
    assert!(groups.is_empty(), "cgroups left: {groups:?}");
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
