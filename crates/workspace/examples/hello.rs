//! Use microagent from Rust: create a workspace, run a command in it, read a
//! file it wrote, delete it. `cargo run -p workspace --example hello` (needs
//! /dev/kvm and the images of `cargo xtask setup`; state goes to
//! `$MICROAGENT_HOME`, else `~/.microagent`).
//!
//! Each running workspace is a VMM process. By default it is this very
//! program, started again with the arguments `VmmLaunch` writes, so `main`
//! first checks whether it was started as one.

use std::process::ExitCode;
use std::time::Duration;

use vmm_host::VmmProcess;
use workspace::vmm::launch::VmmLaunch;
use workspace::{DeleteOptions, ExecInput, ExecRequest, WorkspaceSpec, Workspaces};

fn main() -> ExitCode {
    if let Some(launch) = VmmLaunch::from_args(std::env::args_os().skip(1)) {
        return serve_vmm(&launch);
    }
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match rt.block_on(hello()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello: {}", e.full_message());
            ExitCode::FAILURE
        }
    }
}

async fn hello() -> workspace::Result<()> {
    let ws = Workspaces::builder().build()?;
    let name = format!("hello-{}", workspace::host::settings::unique_id());
    ws.create(&name, WorkspaceSpec::default())?;
    let dev = ws.workspace(&name)?;
    let result = async {
        dev.start(Duration::from_secs(300), |p| {
            eprintln!("booting {name}: {} s", p.elapsed.as_secs())
        })
        .await?;
        let out = dev
            .exec_collect(
                ExecRequest::shell("uname -a > /root/uname.txt"),
                ExecInput::None,
            )
            .await?;
        eprintln!("exec ended: {:?}", out.exit_code);
        let file = dev.files().read_file("/root/uname.txt", None, None).await?;
        print!("{}", String::from_utf8_lossy(&file.data));
        Ok(())
    }
    .await;
    // Deleted whatever happened (force: it may still run).
    dev.delete(DeleteOptions::default().force(true))?;
    result
}

/// This process is the VMM of one workspace: run it until the guest ends.
fn serve_vmm(launch: &VmmLaunch) -> ExitCode {
    let ran = workspace::StateDir::at(&launch.home)
        .map_err(vmm_host::VmmProcessError::from)
        .and_then(|state| VmmProcess::prepare(state, launch))
        // This example handles no signals of its own.
        .and_then(|vmm| vmm.run(|_| {}));
    match ran {
        Ok(end) if !end.crashed => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("hello (vmm): {}", e.full_message());
            ExitCode::FAILURE
        }
    }
}
