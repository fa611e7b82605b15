//! What a running command's caller sends ([`ExecInput`], [`TerminalInput`])
//! and receives ([`ExecEvent`]) while it runs, and a terminal's size
//! ([`PtySize`]): the library's own types. The guest agent client's
//! counterparts stay behind this module.

use guest_agent::client as agent;
use guest_agent::protocol as wire;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

/// What a command reports while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// The process was spawned.
    Started {
        /// The exec id (for signals and cancelling).
        exec_id: String,
        /// The guest process id.
        pid: u32,
    },
    /// A chunk of stdout (at most 64 KiB).
    Stdout(Vec<u8>),
    /// A chunk of stderr (at most 64 KiB).
    Stderr(Vec<u8>),
}

impl From<agent::ExecUpdate> for ExecEvent {
    fn from(update: agent::ExecUpdate) -> Self {
        match update {
            agent::ExecUpdate::Started { exec_id, pid } => Self::Started { exec_id, pid },
            agent::ExecUpdate::Stdout(b) => Self::Stdout(b),
            agent::ExecUpdate::Stderr(b) => Self::Stderr(b),
        }
    }
}

/// A command's stdin.
pub enum ExecInput {
    /// /dev/null.
    None,
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
    /// Each message as it comes; end of file when every sender is dropped.
    Channel(mpsc::Receiver<Vec<u8>>),
    /// Everything the reader yields, then end of file.
    Reader(Box<dyn AsyncRead + Send + Unpin>),
    /// Keystrokes and size changes for a command on a terminal
    /// ([`crate::ExecRequest::terminal`]), as they come.
    Terminal(mpsc::Receiver<TerminalInput>),
}

impl std::fmt::Debug for ExecInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Self::Channel(_) => f.write_str("Channel"),
            Self::Reader(_) => f.write_str("Reader"),
            Self::Terminal(_) => f.write_str("Terminal"),
        }
    }
}

impl ExecInput {
    /// The agent client's stdin. Terminal input is relayed by a task that
    /// ends when the caller's senders are dropped (so does the relay's
    /// sender, which ends the command's input).
    pub(crate) fn into_agent(self) -> agent::ExecStdin {
        match self {
            Self::None => agent::ExecStdin::None,
            Self::Bytes(b) => agent::ExecStdin::Bytes(b),
            Self::Channel(rx) => agent::ExecStdin::Channel(rx),
            Self::Reader(r) => agent::ExecStdin::Reader(r),
            Self::Terminal(mut rx) => {
                let (tx, relayed) = mpsc::channel(16);
                tokio::spawn(async move {
                    while let Some(input) = rx.recv().await {
                        if tx.send(input.into_agent()).await.is_err() {
                            break;
                        }
                    }
                });
                agent::ExecStdin::Terminal(relayed)
            }
        }
    }
}

/// What a terminal sends to a command on a pseudo-terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalInput {
    /// Bytes typed.
    Data(Vec<u8>),
    /// The terminal's new size.
    Resize(PtySize),
}

impl TerminalInput {
    fn into_agent(self) -> agent::PtyInput {
        match self {
            Self::Data(b) => agent::PtyInput::Data(b),
            Self::Resize(size) => agent::PtyInput::Resize(size.into()),
        }
    }
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PtySize {
    /// Rows (lines).
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for PtySize {
    /// 24 x 80, what a terminal that says nothing is taken to be.
    fn default() -> Self {
        let wire::WinSize { rows, cols } = wire::WinSize::default();
        Self { rows, cols }
    }
}

impl From<PtySize> for wire::WinSize {
    fn from(PtySize { rows, cols }: PtySize) -> Self {
        Self { rows, cols }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn terminal_input_is_relayed_in_order_and_ends_with_its_senders() {
        let (tx, rx) = mpsc::channel(4);
        let agent::ExecStdin::Terminal(mut relayed) = ExecInput::Terminal(rx).into_agent() else {
            panic!("terminal input stays terminal input");
        };
        tx.send(TerminalInput::Data(b"ls\n".to_vec()))
            .await
            .unwrap();
        tx.send(TerminalInput::Resize(PtySize { rows: 30, cols: 90 }))
            .await
            .unwrap();
        drop(tx);
        assert_eq!(
            relayed.recv().await,
            Some(agent::PtyInput::Data(b"ls\n".to_vec()))
        );
        assert_eq!(
            relayed.recv().await,
            Some(agent::PtyInput::Resize(wire::WinSize {
                rows: 30,
                cols: 90
            }))
        );
        assert_eq!(relayed.recv().await, None);
    }

    #[test]
    fn the_default_terminal_is_the_agents() {
        assert_eq!(PtySize::default(), PtySize { rows: 24, cols: 80 });
    }
}
