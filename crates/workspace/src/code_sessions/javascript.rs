//! JavaScript sessions: Debian packages no Jupyter kernel for JavaScript,
//! so the host writes its own into the guest at each start, a small
//! `ipykernel` kernel (`kernels/javascript_kernel.py`) that runs each cell
//! in one long-lived `node` (`kernels/javascript_runner.js`: one global
//! context, so what a cell defines the next sees; an interrupt stops the
//! running cell through vm's `breakOnSigint`). The guest runs them; the
//! host only speaks Jupyter's protocol to the kernel, as for Python.

use crate::error::Result;
use crate::guest::files::WriteOptions;
use crate::workspaces::handle::Workspace;

/// The kernel, run by the guest's python3 with ipykernel.
const KERNEL: &str = include_str!("kernels/javascript_kernel.py");
/// The runner the kernel starts with `node`.
const RUNNER: &str = include_str!("kernels/javascript_runner.js");
/// The variable that names the runner to the kernel.
pub(super) const RUNNER_VAR: &str = "MICROAGENT_JS_RUNNER";
/// What the kernel says when the guest has no node.
pub(super) const NO_NODE: &str = "no node on PATH";

/// The guest paths of session `id`'s kernel and runner.
pub(super) fn paths(id: &str, nonce: &str) -> (String, String) {
    (
        format!("/tmp/.microagent-{id}-{nonce}-kernel.py"),
        format!("/tmp/.microagent-{id}-{nonce}-runner.js"),
    )
}

/// Writes the kernel and its runner at `paths`' places.
pub(super) async fn install(ws: Workspace<'_>, kernel: &str, runner: &str) -> Result<()> {
    for (path, text) in [(kernel, KERNEL), (runner, RUNNER)] {
        ws.files()
            .write_file(
                path,
                text.as_bytes(),
                WriteOptions {
                    append: false,
                    perm: Some(0o644),
                },
            )
            .await?;
    }
    Ok(())
}
