//! Commands run in a workspace: the handle's calls that run an
//! [`ExecRequest`] through the guest agent (or, for a workspace on a
//! server, through `exec_remote`), with its secrets masked in what comes
//! back. The agent's wire format stays behind this module and `request`.

use crate::error::{Error, Result};
use crate::guest::request::{
    ExecRequest, ExecResult, Exited, OutputCollector, EXEC_DEADLINE_GRACE,
};
use crate::guest::stream::{ExecEvent, ExecInput};
use crate::secrets::{MaskStream, SecretMask};
use crate::workspaces::handle::Workspace;
use base::store::events::EventKind;

/// A command's output events with its secrets masked, stdout and stderr
/// each as one stream (a value split across chunks is still masked).
struct MaskedEvents {
    /// None when the command has no secrets: events pass as they are.
    streams: Option<[MaskStream; 2]>,
}

impl MaskedEvents {
    fn new(mask: &SecretMask) -> Self {
        Self {
            streams: (!mask.is_empty()).then(|| [mask.stream(), mask.stream()]),
        }
    }

    fn on_event(&mut self, event: ExecEvent, on_event: &mut impl FnMut(ExecEvent)) {
        let Some(streams) = &mut self.streams else {
            return on_event(event);
        };
        let event = match event {
            ExecEvent::Stdout(b) => ExecEvent::Stdout(streams[0].push(&b)),
            ExecEvent::Stderr(b) => ExecEvent::Stderr(streams[1].push(&b)),
            started => started,
        };
        if !matches!(&event, ExecEvent::Stdout(b) | ExecEvent::Stderr(b) if b.is_empty()) {
            on_event(event)
        }
    }

    /// Gives out what each stream held back, at the command's end.
    fn finish(&mut self, on_event: &mut impl FnMut(ExecEvent)) {
        let Some([out, err]) = &mut self.streams else {
            return;
        };
        for event in [
            ExecEvent::Stdout(out.finish()),
            ExecEvent::Stderr(err.finish()),
        ] {
            if !matches!(&event, ExecEvent::Stdout(b) | ExecEvent::Stderr(b) if b.is_empty()) {
                on_event(event)
            }
        }
    }
}

impl Workspace<'_> {
    /// Runs a command, streaming its output to `on_event`; the workspace's
    /// env is added under the request's own. Logs exec started/finished.
    pub async fn exec<F>(
        self,
        req: ExecRequest,
        input: ExecInput,
        mut on_event: F,
    ) -> Result<Exited>
    where
        F: FnMut(ExecEvent) + Send,
    {
        req.check()?;
        if let Some(remote) = self.remote()? {
            return self.exec_there(&remote, req, input, on_event).await;
        }
        let (all, name) = (self.all, self.name.as_str());
        let (ws, meta) = all.awake(name).await?;
        let command = req.describe();
        // The agent ends a command at its timeout and reports it; past that
        // and a grace the host stops waiting (an agent that stopped
        // answering). Without a timeout the caller chose to wait.
        let deadline = req.timeout.map(|t| t.saturating_add(EXEC_DEADLINE_GRACE));
        let (values, mask) = all.resolve_secrets(&req.secret_names())?;
        let req = req.into_wire(&meta.spec, &values);
        drop(values);
        let mut masked = MaskedEvents::new(&mask);
        let events = ws.events();
        let client = crate::guest::connect_awake(all, name, &ws).await?;
        let running = client.exec(req, input.into_agent(), |update| {
            let event = ExecEvent::from(update);
            if let ExecEvent::Started { exec_id, .. } = &event {
                let _ = events.append(EventKind::ExecStarted {
                    exec_id: exec_id.clone(),
                    command: command.clone(),
                });
            }
            masked.on_event(event, &mut on_event)
        });
        let exited = match deadline {
            Some(deadline) => tokio::time::timeout(deadline, running).await.map_err(|_| {
                Error::Timeout(format!(
                    "the agent did not report the end of `{command}` within {} s of its timeout",
                    EXEC_DEADLINE_GRACE.as_secs()
                ))
            })?,
            None => running.await,
        }
        .map_err(Error::agent("exec"))?;
        masked.finish(&mut on_event);
        events.append(EventKind::ExecFinished {
            exec_id: exited.exec_id.clone(),
            code: exited.code,
            signal: exited.signal,
        })?;
        Ok(exited.into())
    }
}

impl Workspace<'_> {
    /// Runs a command to its end and collects its output (up to the
    /// request's output cap).
    pub async fn exec_collect(self, req: ExecRequest, input: ExecInput) -> Result<ExecResult> {
        let mut collector = OutputCollector::new(req.output_cap);
        let exited = self
            .exec(req, input, |event| collector.on_event(event))
            .await?;
        Ok(collector.finish(exited))
    }

    /// Runs `true`: a restored guest's first command pays for what it
    /// loads (the shell, the agent's exec path), so whoever warms one up
    /// pays it instead of its first user.
    pub(crate) async fn exec_true(self) -> Result<ExecResult> {
        self.exec_collect(ExecRequest::argv(["true"]), ExecInput::None)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretValue;
    #[test]
    fn streamed_output_is_masked_across_chunks() {
        let value = SecretValue::new("T", b"hunter2".to_vec()).unwrap();
        let mut masked = MaskedEvents::new(&SecretMask::new([&value]));
        let mut seen = Vec::new();
        let mut sink = |e: ExecEvent| seen.push(e);
        for event in [
            ExecEvent::Started {
                exec_id: "e".into(),
                pid: 1,
            },
            ExecEvent::Stdout(b"pw=hun".to_vec()),
            ExecEvent::Stderr(b"hunter2".to_vec()),
            ExecEvent::Stdout(b"ter2\nend hunt".to_vec()),
        ] {
            masked.on_event(event, &mut sink);
        }
        masked.finish(&mut sink);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for e in &seen {
            match e {
                ExecEvent::Stdout(b) => out.extend_from_slice(b),
                ExecEvent::Stderr(b) => err.extend_from_slice(b),
                ExecEvent::Started { .. } => {}
            }
        }
        assert_eq!(out, b"pw=***\nend hunt");
        assert_eq!(err, b"***");
        assert!(matches!(seen[0], ExecEvent::Started { .. }));
    }
}
