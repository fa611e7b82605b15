//! 50 create/start/exec/delete cycles through the `microagent` binary on
//! the real guest (each fresh workspace resumes the image's warm snapshot,
//! so a cycle takes seconds), then a look for anything left behind: a VMM
//! or network helper process of this state directory, a workspace
//! directory, a socket, a cgroup, a scratch file (docs/security.md,
//! "Lifetimes").

use std::time::Instant;

use testkit::cli::CliHome;

const CYCLES: usize = 50;

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
    testkit::leftovers::assert_none(cli.home());
}
