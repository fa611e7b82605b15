//! Workspace operations on a remote server for the front ends that call
//! the library (the MCP server): a create there, recorded here once the
//! remote confirmed it with the creating agent as its owner, and a command
//! run there. Each is the remote's own CLI with `--json`, so both hosts
//! apply the same checks; who may use a remote workspace is decided here,
//! before any ssh runs, by the local rule (`Workspaces::placement_of`):
//! the remote runs what it is sent as its host, and knows no agents. And
//! the server's side of a call on a workspace placed there (`answer_call`).

use std::time::Duration;

use crate::error::Error;
use crate::guest::copy::CopyInto;
use crate::guest::exec_control::ExecEnd;
use crate::guest::files::WriteOptions;
use crate::guest::stream::{ExecEvent, ExecInput, PtySize, TerminalInput};
use crate::guest::WorkspaceMetrics;
use crate::host::host_write::Budgeted;
use crate::servers::{
    run_remote_json, CallFrame, CallStreams, CopyFrames, FollowingInput, GivenSizes, InputFrame,
    InputFrames, RemoteCall, ServerError, WorkspaceCall, LOCAL_SERVER,
};
use crate::workspaces::services::ServerPool;
use base::store::spec::{DeleteOptions, Meta, WorkspaceSpec};

/// How long a remote `metrics` may take (it samples CPU for a second).
const METRICS_DEADLINE: Duration = Duration::from_secs(60);
/// How long a remote create may take (a registry pull included).
const CREATE_DEADLINE: Duration = Duration::from_secs(900);

/// `--server local` first: the remote runs it itself, never onward.
fn on_itself(mut args: Vec<String>) -> Vec<String> {
    let mut out = vec!["--server".to_owned(), LOCAL_SERVER.to_owned()];
    out.append(&mut args);
    out
}

/// The remote's `create` arguments for `spec`. What a remote create cannot
/// take yet (ports, volumes, repositories, egress rules, a session owner)
/// is refused rather than dropped.
pub(crate) fn create_args(
    name: &str,
    spec: &WorkspaceSpec,
    given: GivenSizes,
) -> Result<Vec<String>, ServerError> {
    let mut unsupported = Vec::new();
    if !spec.ports.is_empty() {
        unsupported.push("ports");
    }
    if !spec.volumes.is_empty() {
        unsupported.push("volumes");
    }
    if spec.repo.is_some() {
        unsupported.push("repo");
    }
    if spec.egress.is_some() || !spec.allow.is_empty() {
        unsupported.push("egress rules");
    }
    if spec.owner.is_some() || spec.delete_with_owner {
        unsupported.push("session_scoped");
    }
    if !unsupported.is_empty() {
        return Err(ServerError::Invalid(format!(
            "a workspace on a remote server cannot have {} yet; create it without them, or on this host",
            unsupported.join(", ")
        )));
    }
    let mut args = vec![
        "create".to_owned(),
        name.to_owned(),
        "--image".into(),
        spec.image.clone(),
        "--disk".into(),
        spec.disk_mib.to_string(),
        "--network".into(),
        spec.network.clone(),
    ];
    if given.vcpus {
        args.extend(["--vcpus".to_owned(), spec.vcpus.to_string()]);
    }
    if given.mem {
        args.extend(["--mem".to_owned(), spec.mem_mib.to_string()]);
    }
    for (k, v) in &spec.env {
        args.extend(["--env".to_owned(), format!("{k}={v}")]);
    }
    for (k, v) in &spec.labels {
        args.extend(["--label".to_owned(), format!("{k}={v}")]);
    }
    if let Some(ttl) = spec.ttl_secs {
        args.extend(["--ttl".to_owned(), format!("{ttl}s")]);
    }
    Ok(args)
}

impl ServerPool<'_> {
    /// Answers a call this host's client sent for one of its workspaces
    /// (the server's side of [`Workspace::remote`]): the handle's call of
    /// the same name, its answer as JSON.
    pub async fn answer_call(
        &self,
        call: RemoteCall,
        streams: CallStreams<'_>,
    ) -> crate::error::Result<serde_json::Value> {
        if let Some(placed) = self.all.servers().placement(&call.workspace)? {
            return Err(ServerError::PlacedAgain {
                workspace: call.workspace,
                server: placed.server,
            }
            .into());
        }
        let dev = self.all.workspace(&call.workspace)?;
        // Held to the deadline its caller waits, so a guest that stops
        // reading or answering cannot keep this process for ever.
        let deadline = call.call.deadline();
        match tokio::time::timeout(deadline, self.answer(dev, call.call, streams)).await {
            Ok(answer) => answer,
            Err(_) => Err(ServerError::Deadline {
                server: LOCAL_SERVER.to_owned(),
                secs: deadline.as_secs(),
            }
            .into()),
        }
    }

    /// [`Self::answer_call`]'s call on `dev`.
    async fn answer(
        &self,
        dev: crate::workspaces::handle::Workspace<'_>,
        call: WorkspaceCall,
        streams: CallStreams<'_>,
    ) -> crate::error::Result<serde_json::Value> {
        let CallStreams {
            stdin: rest,
            frames,
        } = streams;
        let mut started = |p: crate::workspaces::lifecycle::StartProgress| {
            let elapsed_ms = crate::servers::millis(p.elapsed);
            frames(CallFrame::start_progress(elapsed_ms, p.console));
        };
        let ms = Duration::from_millis;
        let json = |v: serde_json::Result<serde_json::Value>| Ok(v.map_err(ServerError::Encode)?);
        use WorkspaceCall as C;
        match call {
            C::Start {
                cold: false,
                timeout_ms,
            } => json(serde_json::to_value(
                dev.start(ms(timeout_ms), &mut started).await?,
            )),
            C::Start {
                cold: true,
                timeout_ms,
            } => json(serde_json::to_value(
                dev.start_cold(ms(timeout_ms), &mut started).await?,
            )),
            C::Stop { timeout_ms } => json(serde_json::to_value(dev.stop(ms(timeout_ms)).await?)),
            C::Halt {} => json(serde_json::to_value(dev.halt()?)),
            C::Hibernate { timeout_ms } => {
                json(serde_json::to_value(dev.hibernate(ms(timeout_ms)).await?))
            }
            C::Delete { force } => json(serde_json::to_value(
                dev.delete(DeleteOptions::default().force(force))?,
            )),
            C::Inspect {} => json(serde_json::to_value(dev.inspect()?)),
            C::SetTtl { ttl_secs } => json(serde_json::to_value(dev.set_ttl(ttl_secs)?)),
            C::ExtendTtl { by_secs } => json(serde_json::to_value(dev.extend_ttl(by_secs)?)),
            C::Logs { lines } => json(serde_json::to_value(dev.logs(lines)?)),
            C::LogsFrom { offset } => json(serde_json::to_value(dev.logs_from(offset)?)),
            C::Events { after, wait_ms } => {
                json(serde_json::to_value(dev.events(after, ms(wait_ms)).await?))
            }
            C::SnapshotTake { snapshot } => json(serde_json::to_value(
                dev.snapshot_take(snapshot.as_deref())?,
            )),
            C::SnapshotList {} => {
                // Of this workspace only, not of an earlier one of its name
                // (the host that asks knows who owns which).
                let born = dev.get_here()?.created_at_ms;
                let mut snapshots = self.all.snapshots().list(Some(dev.name()), true)?;
                snapshots.retain(|s| s.created_at_ms >= born);
                json(serde_json::to_value(snapshots))
            }
            C::Fork {
                new_name,
                snapshot,
                timeout_ms,
            } => {
                if let Some(snapshot) = &snapshot {
                    self.check_snapshot_of(snapshot, dev.name())?;
                }
                json(serde_json::to_value(
                    dev.fork(&new_name, snapshot.as_deref(), ms(timeout_ms), |_| {})
                        .await?,
                ))
            }
            C::PublishPort { mapping } => json(serde_json::to_value(dev.ports().publish(mapping)?)),
            C::UnpublishPort { host_ip, host_port } => json(serde_json::to_value(
                dev.ports().unpublish(host_ip, host_port)?,
            )),
            C::Metrics {} => {
                let mut one = self.all.metrics().figures(Some(dev.name())).await?;
                json(serde_json::to_value(one.pop()))
            }
            C::Exec {
                request,
                stdin,
                stdin_follows,
                terminal_follows,
                wait_ms,
            } => {
                let bad = |e: serde_json::Error| Error::InvalidInput(format!("a command: {e}"));
                let request = serde_json::from_value(request).map_err(bad)?;
                let follows = match (terminal_follows, stdin_follows) {
                    (true, _) => Follows::Terminal,
                    (false, true) => Follows::Stdin,
                    (false, false) => Follows::Nothing,
                };
                let command = Command {
                    request,
                    stdin,
                    follows,
                    wait: ms(wait_ms),
                };
                let exited = answer_exec(dev, command, rest, frames).await?;
                json(serde_json::to_value(exited))
            }
            C::SignalExec { exec_id, signal } => {
                dev.signal_exec(&exec_id, signal).await?;
                json(Ok(serde_json::json!({})))
            }
            C::ProcessStart { request, options } => {
                let bad =
                    |e: serde_json::Error| Error::InvalidInput(format!("a process start: {e}"));
                let request = serde_json::from_value(request).map_err(bad)?;
                let options = serde_json::from_value(options).map_err(bad)?;
                json(serde_json::to_value(
                    dev.processes().process_start(request, options).await?,
                ))
            }
            C::ProcessList {} => json(serde_json::to_value(dev.processes().process_list().await?)),
            C::ProcessOutput {
                id,
                cursors,
                max_bytes,
                wait_ms,
            } => json(serde_json::to_value(
                dev.processes()
                    .process_output(&id, cursors, max_bytes, ms(wait_ms))
                    .await?,
            )),
            C::ProcessWriteStdin { id, data, close } => json(serde_json::to_value(
                dev.processes()
                    .process_write_stdin(&id, &data, close)
                    .await?,
            )),
            C::ProcessSignal { id, signal } => json(serde_json::to_value(
                dev.processes().process_signal(&id, &signal).await?,
            )),
            C::ProcessWait { id, timeout_ms } => json(serde_json::to_value(
                dev.processes().process_wait(&id, ms(timeout_ms)).await?,
            )),
            C::ProcessRemove { id } => json(serde_json::to_value(
                dev.processes().process_remove(&id).await?,
            )),
            C::ReadFile {
                path,
                offset,
                length,
            } => json(serde_json::to_value(
                dev.files().read_file(&path, offset, length).await?,
            )),
            C::WriteFile {
                path,
                data,
                append,
                perm,
            } => {
                let options = WriteOptions { append, perm };
                json(serde_json::to_value(
                    dev.files().write_file(&path, &data, options).await?,
                ))
            }
            C::ListDir { path } => json(serde_json::to_value(dev.files().list_dir(&path).await?)),
            C::Stat { path } => json(serde_json::to_value(dev.files().stat(&path).await?)),
            C::Mkdir { path } => json(serde_json::to_value(dev.files().mkdir(&path).await?)),
            C::Remove {
                path,
                recursive,
                preview,
            } => json(serde_json::to_value(
                dev.files().remove(&path, recursive, preview).await?,
            )),
            C::Rename { from, to } => {
                json(serde_json::to_value(dev.files().rename(&from, &to).await?))
            }
            C::EditFile {
                path,
                old,
                new,
                expected,
                preview,
            } => json(serde_json::to_value(
                (dev.files().edit_file(&path, &old, &new, expected, preview)).await?,
            )),
            C::ReadLines {
                path,
                start_line,
                end_line,
            } => json(serde_json::to_value(
                dev.files().read_lines(&path, start_line, end_line).await?,
            )),
            C::Find { dir, pattern } => json(serde_json::to_value(
                dev.files().find(&dir, &pattern).await?,
            )),
            C::CopyIn {
                guest_path,
                dir,
                perm,
                owners,
                bytes,
            } => {
                let into = CopyInto {
                    guest_path: &guest_path,
                    dir,
                    perm,
                    owners,
                    bytes,
                };
                let mut input = FollowingInput::new(rest, bytes);
                json(serde_json::to_value(
                    dev.files().receive(into, &mut input).await?,
                ))
            }
            call @ (C::BrowserOpen { .. }
            | C::BrowserSnapshot { .. }
            | C::BrowserAct { .. }
            | C::BrowserClose { .. }
            | C::BrowserScreenshot { .. }
            | C::BrowserEvents { .. }) => Ok(dev.browser().answer(call).await?),
            C::CopyOut {
                guest_path,
                dir,
                max_bytes,
            } => {
                let mut out = Budgeted::new(CopyFrames::new(frames), max_bytes);
                json(serde_json::to_value(
                    dev.files().send(&guest_path, dir, &mut out).await?,
                ))
            }
        }
    }

    /// FORBIDDEN unless snapshot `snapshot` was taken of `workspace` as it
    /// is (not of an earlier one of that name): the host that sent a call
    /// checked who may use that workspace only, and here, where it knows no
    /// agents, every snapshot is the host's, so a fork through a
    /// workspace's call takes only that workspace's own.
    fn check_snapshot_of(&self, snapshot: &str, workspace: &str) -> crate::error::Result<()> {
        let info = self.all.snapshots().get(snapshot)?;
        let born = self.all.at(workspace).get_here()?.created_at_ms;
        if info.workspace != workspace || info.created_at_ms < born {
            return Err(ServerError::SnapshotOfAnother {
                snapshot: info.name,
                workspace: workspace.to_owned(),
            }
            .into());
        }
        Ok(())
    }

    /// Where a new workspace of `image` goes when its creator names no
    /// server: `None` (this host) until servers are configured, then the
    /// one with most room ([`Self::pick_server`], `local` among them).
    pub async fn place_by_score(&self, image: &str) -> crate::error::Result<Option<String>> {
        if self.all.servers().list()?.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.pick_server(image).await?))
    }

    /// Creates workspace `name` of `spec` on server `server` and records
    /// that it lives there, owned by this view's agent, once the remote
    /// confirmed it; its record as the remote keeps it.
    pub async fn create_on_server(
        &self,
        server: &str,
        name: &str,
        spec: &WorkspaceSpec,
        given: GivenSizes,
    ) -> crate::error::Result<Meta> {
        // Its full name, outside the pool's namespace, and free here and
        // among the placements (another agent's included) before any ssh.
        let full = self.all.full_name(name)?;
        let name = full.as_str();
        let registry = self.all.servers();
        let target = registry.get(server)?;
        let args = on_itself(create_args(name, spec, given)?);
        let make = async {
            let value = run_remote_json(&registry, &target, &args, CREATE_DEADLINE).await?;
            let meta: Meta = serde_json::from_value(value).map_err(|e| ServerError::Garbled {
                server: server.to_owned(),
                detail: format!("its create answer: {e}"),
            })?;
            Ok(meta)
        };
        self.all.make_placed(server, name, make).await
    }

    /// The figures of workspace `name` on server `server`, or of every
    /// workspace there this view may use (its microagent's `metrics`).
    pub async fn metrics_on_server(
        &self,
        server: &str,
        name: Option<&str>,
    ) -> crate::error::Result<Vec<WorkspaceMetrics>> {
        if let Some(name) = name {
            self.all.check_forward(server, name)?;
        }
        let registry = self.all.servers();
        let target = registry.get(server)?;
        let mut args = vec!["metrics".to_owned()];
        args.extend(name.map(str::to_owned));
        let value = run_remote_json(&registry, &target, &on_itself(args), METRICS_DEADLINE).await?;
        // One workspace's figures come as an object, every one's as a list.
        let value = match value {
            serde_json::Value::Array(_) => value,
            one => serde_json::Value::Array(vec![one]),
        };
        let mut all: Vec<WorkspaceMetrics> =
            serde_json::from_value(value).map_err(|e| ServerError::Garbled {
                server: server.to_owned(),
                detail: format!("its metrics answer: {e}"),
            })?;
        all.retain(|m| self.all.check_forward(server, &m.name).is_ok());
        Ok(all)
    }
}

/// A command of a call, its output sent as frames as it comes. It is
/// killed when the caller goes away (a frame it cannot take, the end of a
/// stdin that was not the command's, a hang-up) or its call's wait is up.
async fn answer_exec(
    dev: crate::workspaces::handle::Workspace<'_>,
    command: Command,
    mut rest: tokio::sync::mpsc::Receiver<Vec<u8>>,
    frames: &mut (dyn FnMut(CallFrame) -> bool + Send),
) -> crate::error::Result<crate::guest::request::Exited> {
    let Command {
        request,
        stdin,
        follows,
        wait,
    } = command;
    let (mut hung_up, mut watched) = (None, None);
    let input = match follows {
        Follows::Stdin | Follows::Terminal => {
            let (input, ended) = following_input(rest, follows == Follows::Terminal);
            hung_up = Some(ended);
            input
        }
        Follows::Nothing => {
            watched = Some(&mut rest);
            stdin.map_or(ExecInput::None, ExecInput::Bytes)
        }
    };
    let gone = tokio::sync::Notify::new();
    let on_event = |event: ExecEvent| {
        let sent = match event {
            ExecEvent::Started { exec_id, pid } => vec![CallFrame::ExecStarted { exec_id, pid }],
            ExecEvent::Stdout(data) => CallFrame::output(false, &data),
            ExecEvent::Stderr(data) => CallFrame::output(true, &data),
        };
        for frame in sent {
            if !frames(frame) {
                gone.notify_one();
                return;
            }
        }
    };
    let caller_gone = async {
        let stdin_ended = async {
            match (watched, hung_up) {
                (Some(rest), _) => while rest.recv().await.is_some() {},
                (None, Some(ended)) => {
                    // Its input ended as it should: nothing to wait for.
                    if ended.await == Ok(false) {
                        std::future::pending::<()>().await;
                    }
                }
                (None, None) => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stdin_ended => {}
            () = gone.notified() => {}
            // Killed before the server's own deadline drops it.
            () = tokio::time::sleep(wait) => {}
        }
    };
    match dev
        .exec_cancellable(request, input, on_event, caller_gone)
        .await?
    {
        ExecEnd::Exited(exited) => Ok(exited),
        ExecEnd::Cancelled { exec_id, killed } => {
            Err(ServerError::CallerGone { exec_id, killed }.into())
        }
    }
}

/// A command as its call sent it.
struct Command {
    request: crate::guest::request::ExecRequest,
    stdin: Option<Vec<u8>>,
    follows: Follows,
    wait: Duration,
}

/// What follows a command's call on the server's stdin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Follows {
    /// Nothing: its end means the caller went away.
    Nothing,
    /// The command's stdin, as input frames ending with `end`.
    Stdin,
    /// A terminal's keys and sizes, as input frames.
    Terminal,
}

/// The command's input read from the frames that follow a call, and what
/// their end was: `false` for a stdin's `end`, `true` for a hang-up (the
/// input stopped without it, or brought what is not a frame).
fn following_input(
    rest: tokio::sync::mpsc::Receiver<Vec<u8>>,
    terminal: bool,
) -> (ExecInput, tokio::sync::oneshot::Receiver<bool>) {
    let (ended, hung_up) = tokio::sync::oneshot::channel();
    let (keys, typed) = tokio::sync::mpsc::channel(16);
    let (bytes, piped) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut frames = InputFrames::new(FollowingInput::new(rest, None));
        let hang_up = loop {
            let Ok(Some(frame)) = frames.next().await else {
                break true;
            };
            let sent = match frame {
                InputFrame::End {} => break false,
                InputFrame::Data { data } if terminal => {
                    keys.send(TerminalInput::Data(data)).await.is_ok()
                }
                InputFrame::Data { data } => bytes.send(data).await.is_ok(),
                InputFrame::Resize { rows, cols } => {
                    let size = TerminalInput::Resize(PtySize { rows, cols });
                    !terminal || keys.send(size).await.is_ok()
                }
            };
            // The command no longer takes input: it is ending.
            if !sent {
                break false;
            }
        };
        let _ = ended.send(hang_up);
    });
    let input = match terminal {
        true => ExecInput::Terminal(typed),
        false => ExecInput::Channel(piped),
    };
    (input, hung_up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stdin_cut_before_its_end_is_a_hang_up_not_an_end() {
        for (with_end, hang_up) in [(true, false), (false, true)] {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let mut wire = InputFrame::Data {
                data: b"rm -rf /tmp/x; echo ".to_vec(),
            }
            .to_line();
            if with_end {
                wire.extend(InputFrame::End {}.to_line());
            }
            tx.send(wire).await.unwrap();
            drop(tx);
            let (input, ended) = following_input(rx, false);
            let ExecInput::Channel(mut piped) = input else {
                panic!("a stdin is a channel")
            };
            assert_eq!(piped.recv().await.unwrap(), b"rm -rf /tmp/x; echo ");
            assert_eq!(ended.await, Ok(hang_up), "with end: {with_end}");
            assert_eq!(piped.recv().await, None);
        }
    }

    #[test]
    fn a_create_becomes_the_remote_command_line() {
        let spec = WorkspaceSpec {
            image: "debian".into(),
            ..WorkspaceSpec::default()
        };
        let args = create_args("w", &spec, GivenSizes::default()).unwrap();
        assert_eq!(&args[..4], ["create", "w", "--image", "debian"]);
        // Sizes not given are the server's image's: none is sent.
        assert!(!args.iter().any(|a| a == "--vcpus" || a == "--mem"));
        let given = GivenSizes {
            vcpus: false,
            mem: true,
        };
        let args = create_args("w", &spec, given).unwrap();
        let mem = args.iter().position(|a| a == "--mem").unwrap();
        assert_eq!(args[mem + 1], spec.mem_mib.to_string());
        assert!(!args.iter().any(|a| a == "--vcpus"));
        let with_ports = WorkspaceSpec {
            ports: vec![serde_json::from_value(
                serde_json::json!({"host_port": 8080, "guest_port": 80}),
            )
            .unwrap()],
            ..spec
        };
        assert_eq!(
            create_args("w", &with_ports, GivenSizes::ALL)
                .unwrap_err()
                .code(),
            base::code::ErrorCode::InvalidInput
        );
    }

    #[tokio::test]
    async fn a_remote_exec_by_another_agent_is_forbidden() {
        use crate::guest::request::{ExecRequest, ExecResult};
        use crate::servers::ServerSpec;
        use crate::workspaces::manager::tests::fixture;
        use crate::workspaces::manager::Workspaces;
        use base::code::ErrorCode;

        /// `id` in workspace `name` through the handle, as a front end runs it.
        async fn exec_in(view: &Workspaces, name: &str) -> crate::error::Result<ExecResult> {
            view.workspace(name)?
                .exec_collect(ExecRequest::shell("id"), ExecInput::None)
                .await
        }

        let f = fixture("remote-owner", "/nonexistent");
        let session = |agent| crate::workspaces::manager::tests::session(&f.ws, agent);
        let (a, b, anonymous) = (session(Some("a")), session(Some("b")), session(None));
        // Nothing listens on port 1: an ssh that runs fails to connect, so
        // FORBIDDEN can only come from the check before it.
        let servers = f.ws.servers();
        servers
            .add(&ServerSpec::new("box", "nobody@127.0.0.1:1"))
            .unwrap();
        // What a's `workspace_create` on the server records once the
        // remote confirmed it; and one of an older version, nobody's.
        servers.place("dev", "box", Some("a")).unwrap();
        servers.place("old", "box", None).unwrap();

        for other in [&b, &anonymous] {
            let refused = exec_in(other, "dev").await.unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
            let refused = other
                .server_pool()
                .metrics_on_server("box", Some("dev"))
                .await
                .unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
            let refused = other.placement_of("dev").unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
        }
        // A session reaches only what was placed from here, where it was.
        let unknown = exec_in(&b, "never-placed").await;
        assert_eq!(unknown.unwrap_err().code(), ErrorCode::NotFound);
        let elsewhere = a
            .server_pool()
            .metrics_on_server("other-box", Some("dev"))
            .await;
        assert_eq!(elsewhere.unwrap_err().code(), ErrorCode::NotFound);

        // The owner, a nobody's workspace and the host pass the check and
        // meet the unreachable server.
        let unreachable = [
            exec_in(&a, "dev").await.unwrap_err(),
            exec_in(&b, "old").await.unwrap_err(),
            exec_in(&f.ws, "dev").await.unwrap_err(),
            a.server_pool()
                .metrics_on_server("box", Some("dev"))
                .await
                .unwrap_err(),
        ];
        for e in unreachable {
            assert_eq!(e.code(), ErrorCode::HostUnsupported, "{e}");
        }
        let placed = a.placement_of("dev").unwrap().unwrap();
        assert_eq!(
            (placed.server.as_str(), placed.agent.as_deref()),
            ("box", Some("a"))
        );
        assert!(f.ws.placement_of("dev").unwrap().is_some(), "the host's");
        assert!(b.placement_of("old").unwrap().is_some(), "nobody's");
    }

    #[tokio::test]
    async fn a_fork_through_a_call_takes_only_its_own_workspaces_snapshots() {
        use crate::workspaces::manager::tests::{fixture, have_mkfs, spec};
        use base::code::ErrorCode;

        let test = "a_fork_through_a_call_takes_only_its_own_workspaces_snapshots";
        if !have_mkfs(test) {
            return;
        }
        // The server's side: it knows no agents, every snapshot is its
        // host's; the calling host checked who may use `mine` only.
        let f = fixture("remote-fork-snapshot", "/nonexistent");
        for name in ["mine", "theirs"] {
            f.ws.create(name, spec()).unwrap();
        }
        f.ws.at("theirs").snapshot_take(Some("s-theirs")).unwrap();
        f.ws.at("mine").snapshot_take(Some("s-old")).unwrap();
        // `mine` deleted and made again: an earlier one's snapshot is not
        // the new one's.
        f.ws.at("mine")
            .delete(DeleteOptions::default().force(true))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        f.ws.create("mine", spec()).unwrap();
        f.ws.at("mine").snapshot_take(Some("s-mine")).unwrap();
        let fork = |snapshot: &str| RemoteCall {
            workspace: "mine".into(),
            call: WorkspaceCall::Fork {
                new_name: "copy".into(),
                snapshot: Some(snapshot.into()),
                timeout_ms: 1000,
            },
        };
        let mut sink = |_: CallFrame| true;
        for other in ["s-theirs", "s-old"] {
            let streams = CallStreams {
                stdin: tokio::sync::mpsc::channel(1).1,
                frames: &mut sink,
            };
            let refused =
                f.ws.server_pool()
                    .answer_call(fork(other), streams)
                    .await
                    .unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{other}: {refused}");
        }
        let copy = f.ws.workspace("copy").unwrap();
        assert!(copy.get().is_err(), "no fork made");
        // Its own passes the check (and fails further on: no VMM here).
        let streams = CallStreams {
            stdin: tokio::sync::mpsc::channel(1).1,
            frames: &mut sink,
        };
        let own =
            f.ws.server_pool()
                .answer_call(fork("s-mine"), streams)
                .await
                .unwrap_err();
        assert_ne!(own.code(), ErrorCode::Forbidden, "{own}");
        // Its snapshots listed through a call: its own only, not the
        // earlier `mine`'s nor another workspace's.
        let streams = CallStreams {
            stdin: tokio::sync::mpsc::channel(1).1,
            frames: &mut sink,
        };
        let list = RemoteCall {
            workspace: "mine".into(),
            call: WorkspaceCall::SnapshotList {},
        };
        let listed = f.ws.server_pool().answer_call(list, streams).await.unwrap();
        let names: Vec<_> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].clone())
            .collect();
        assert_eq!(names, ["s-mine"], "{listed}");
    }
}
