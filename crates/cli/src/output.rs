//! How commands report: JSON on stdout with `--json`, text otherwise;
//! errors as `{"error": {"code", "message"}}` (JSON) or one line on stderr.

use std::io::IsTerminal;
use std::process::ExitCode;

use serde::Serialize;
use workspace::{Error, ErrorCode, Remedy};

/// Exit status of a command that failed (exec and run use 125).
pub const FAILURE: u8 = 1;
/// Exit status for bad usage.
pub const USAGE: u8 = 2;

/// Prints `value` as one JSON line. A reader that went away (a closed
/// pipe, a caller of a workspace call that hung up) is no panic.
pub fn json<T: Serialize>(value: &T) {
    use std::io::Write;
    match serde_json::to_string(value) {
        Ok(s) => {
            let _ = writeln!(std::io::stdout().lock(), "{s}");
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "microagent: cannot encode the result: {e}"
            );
        }
    }
}

/// Reports an error with its stable code and returns `status`.
pub fn error(e: &Error, as_json: bool, status: u8) -> ExitCode {
    report(e.code(), &message(e), as_json, status)
}

/// The library's message, then what to do next in this CLI's words.
pub fn message(e: &Error) -> String {
    match e.remedy() {
        Some(r) => format!("{}; {}", e.full_message(), remedy(&r)),
        None => e.full_message(),
    }
}

/// A remedy as the commands of this CLI.
pub fn remedy(r: &Remedy) -> String {
    match r {
        Remedy::ListWorkspaces => {
            "list the workspaces (`microagent list`) to see their names".into()
        }
        Remedy::ChooseAnotherName { workspace } => {
            format!("pick another name, or delete it first (`microagent delete {workspace}`)")
        }
        Remedy::StartWorkspace { workspace } => {
            format!("start it first (`microagent start {workspace}`)")
        }
        Remedy::WaitOrHalt { workspace } => {
            format!("wait for it to settle, or halt it (`microagent halt {workspace}`)")
        }
        Remedy::StopOrForce { workspace } => {
            format!("stop it first (`microagent stop {workspace}`), or delete it with `--force`")
        }
        Remedy::ReadConsole { workspace } => {
            format!("its console (`microagent logs {workspace}`) shows why")
        }
        Remedy::StopOrForceRestore { workspace, snapshot } => format!(
            "stop it first (`microagent stop {workspace}`), or pass --force (`microagent snapshot restore {snapshot} --force`), which halts it"
        ),
        Remedy::ListSnapshots => "list them with `microagent snapshot ls`".into(),
        Remedy::ChooseAnotherSnapshotName { snapshot } => {
            format!("pick another name, or delete it first (`microagent snapshot rm {snapshot}`)")
        }
        Remedy::ListImages => {
            "list the images (`microagent image ls`); `microagent setup --yes` builds minimal, `microagent setup --with debian --yes` debian (`--with browser`, `--with code` the others); at a terminal, create, run and task run offer to build those three"
                .into()
        }
        Remedy::RemoveImage { image } => format!("remove it first (`microagent image rm {image}`)"),
        Remedy::PullImage { reference } => format!(
            "pull it (`microagent image pull {reference}`), or pass --pull missing"
        ),
        Remedy::ChooseAnotherPort { addr } => format!(
            "choose another host port, or stop what listens on {addr} (`ss -ltnp 'sport = :{}'` shows it)",
            addr.port()
        ),
        Remedy::ListPorts { workspace } => {
            format!("see its published ports with `microagent port ls {workspace}`")
        }
        Remedy::ListNetworks => "list the networks (`microagent network ls`)".into(),
        Remedy::DeleteWorkspacesFirst { workspaces } => format!(
            "delete the workspaces on it first (`microagent delete {}`)",
            workspaces.join(" ")
        ),
        Remedy::SetUpNetworks => {
            "run `microagent network setup` to see the host changes, then apply them with its --confirm token (as root)".into()
        }
        Remedy::ConfirmAsRoot { operation, token } => format!(
            "run it as root with the same state directory: sudo MICROAGENT_HOME=\"${{MICROAGENT_HOME:-$HOME/.microagent}}\" microagent {operation} --confirm {token}"
        ),
        Remedy::PreviewAgain => {
            "run the command again without --confirm for a fresh plan and token".into()
        }
        Remedy::GrantSubordinateIds { user, free } => format!("as root, give {user} subordinate ids once, a range no other user has: `usermod --add-subuids {free} --add-subgids {free} {user}` (and `apt-get install uidmap`), or run the build as root"),
        Remedy::UseKernelImage => "use a workspace of an image with Jupyter's kernels: build it once with `microagent setup --with code --yes`, then `microagent create NAME --image code`".into(),
        Remedy::UseBrowserImage => "use a workspace of an image with Chromium: build it once with `microagent setup --with browser --yes`, then `microagent create NAME --image browser --mem 2048`".into(),
        Remedy::TakeBrowserSnapshot { workspace, page } => format!(
            "take a new snapshot (`microagent browser snapshot {workspace} --page {page}`) and use one of its refs, or pass --selector"
        ),
        Remedy::OpenBrowserPage { workspace, page } => format!(
            "open it first (`microagent browser open {workspace} URL --page {page}`)"
        ),
        Remedy::UseCodeImage { image } => format!(
            "use a workspace of the `{image}` image, which has it (`microagent create NAME --image {image}`)"
        ),
        Remedy::BuildCodeImage { image, .. } => {
            format!("build it with `microagent setup --yes` (it builds {image})")
        }
        Remedy::Overwrite { .. } => {
            "pass --overwrite to replace it (a directory is merged into), or name another host path"
                .into()
        }
        Remedy::IncludeGitMetadata => {
            "pass --include-git-metadata once you trust what the guest wrote there (its hooks and config run on your next git command), or name a host path outside any .git"
                .into()
        }
        Remedy::ListVolumes => "list the volumes (`microagent volume ls`)".into(),
        Remedy::SetSecret { secret } => format!(
            "set it (`microagent secret set {secret}`, value on stdin), or list them (`microagent secret ls`)"
        ),
        Remedy::ChooseAnotherVolumeName { volume } => {
            format!("pick another name, or remove it first (`microagent volume rm {volume}`)")
        }
        Remedy::StopVolumeHolder { volume, workspace } => format!(
            "stop it first (`microagent stop {workspace}`), or mount it read-only (`--volume {volume}:PATH:ro`) if both only read it"
        ),
        Remedy::AllowRepo { repo } => format!(
            "allow it first (`microagent repo allow PATH --alias {repo}`), or list the allowed ones (`microagent repo ls`)"
        ),
        Remedy::ChooseAnotherAlias { alias } => format!(
            "pick another alias (`--alias`), or take the other one off first (`microagent repo rm {alias}`)"
        ),
        Remedy::UseImageWithGit { image } => format!(
            "use an image with git instead of `{image}` (`--image debian`, which `microagent setup --with debian` builds)"
        ),
        // A remedy added to the library later still reads sensibly.
        other => format!("{other:?}"),
    }
}

/// Reports a failure given as a code and a message.
pub fn report(code: ErrorCode, message: &str, as_json: bool, status: u8) -> ExitCode {
    if as_json {
        json(&serde_json::json!({ "error": { "code": code, "message": message } }));
    }
    // A message can carry a guest's or a registry's words; stderr may be
    // gone with the caller.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("microagent: error [{code}]: {}\n", field(message)),
    );
    ExitCode::from(status)
}

/// Prints rows as left-aligned columns under `header`.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    print!("{}", table_text(header, rows));
}

/// The text of [`table`]: every cell goes through [`field`] (names,
/// commands and descriptions come from guests and clients), so a cell can
/// neither drive the terminal nor start a row of its own.
fn table_text(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| field(cell).into_owned()).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// A duration for people: `42s`, `5m`, `3h`, `2d`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// Whether progress lines make sense (a person is watching stderr).
pub fn interactive() -> bool {
    std::io::stderr().is_terminal()
}

/// Text from outside (a guest, an image, a registry, an MCP client) made
/// safe to show on a terminal: the one place the CLI escapes. Control
/// characters (C0, DEL, C1) are shown in caret notation (ESC as `^[`, DEL
/// as `^?`) or as `\u{..}`, and so are the Unicode marks that reorder
/// text (bidi overrides and isolates), so what is shown cannot move the
/// cursor, retitle the window, rewrite earlier lines or read back as
/// something else. With `keep_lines` newlines and tabs stay and carriage
/// returns go (console and log text); without, they are escaped too (one
/// field of a line or a table).
pub fn escape(text: &str, keep_lines: bool) -> std::borrow::Cow<'_, str> {
    let kept = |c: char| keep_lines && (c == '\n' || c == '\t');
    let unsafe_char = |c: char| (c.is_control() || reorders(c)) && !kept(c);
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\r' if keep_lines => {}
            c if !unsafe_char(c) => out.push(c),
            c if (c as u32) < 0x20 => {
                out.push('^');
                out.push(char::from(b'@' + c as u8));
            }
            '\u{7f}' => out.push_str("^?"),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Marks that reorder how text reads (Trojan Source): bidi embeddings,
/// overrides, isolates and the invisible direction marks.
fn reorders(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Console or log text from a guest, for a terminal (lines kept).
pub fn inert(text: &str) -> std::borrow::Cow<'_, str> {
    escape(text, true)
}

/// One value from outside (a name, a summary, a reason, an error) for a
/// line or a table cell.
pub fn field(text: &str) -> std::borrow::Cow<'_, str> {
    escape(text, false)
}

/// Guest text for stdout: inert when stdout is a terminal, as it is when
/// piped (a file or another program gets the console as it was).
pub fn guest_text(text: &str) -> std::borrow::Cow<'_, str> {
    if std::io::stdout().is_terminal() {
        inert(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Splits `KEY=VALUE`.
pub fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// A size in MiB as a flag takes it: `512`, `512m`, `1g`, `2GiB`.
pub fn mib(s: &str) -> Result<u64, String> {
    workspace::sizes::parse_mib(s).map_err(|e| e.to_string())
}

/// Whose a thing is, for a table: the owning agent, or `-`.
pub fn owner(agent: Option<&str>) -> String {
    agent.unwrap_or("-").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_text_cannot_drive_the_terminal() {
        assert_eq!(inert("plain line\twith tab\n"), "plain line\twith tab\n");
        assert_eq!(
            inert("\x1b[2J\x1b]0;owned\x07boot\r\n"),
            "^[[2J^[]0;owned^Gboot\n"
        );
        assert_eq!(inert("del\x7f c1\u{9b}"), "del^? c1\\u{9b}");
        assert!(matches!(inert("plain"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn a_field_escapes_every_control_and_reordering_mark() {
        assert_eq!(field("done: all tests pass"), "done: all tests pass");
        assert_eq!(field("ok\x1b[31m red"), "ok^[[31m red");
        // A fake second line or row, an erased line, a tab.
        assert_eq!(field("a\nb\r\x1b[2Kc\td"), "a^Jb^M^[[2Kc^Id");
        // C0 NUL and BEL, DEL, C1 CSI and OSC, NEL.
        assert_eq!(
            field("\0\x07\x7f\u{9b}\u{9d}\u{85}"),
            "^@^G^?\\u{9b}\\u{9d}\\u{85}"
        );
        // Trojan Source: a right-to-left override and an isolate.
        assert_eq!(field("x\u{202e}y\u{2066}"), "x\\u{202e}y\\u{2066}");
        // Text in other scripts is shown as it is.
        assert_eq!(field("задача 完成 ✓"), "задача 完成 ✓");
    }

    #[test]
    fn a_table_cell_from_a_guest_stays_in_its_cell() {
        let rows = vec![
            vec!["p1".to_string(), "sleep\x1b[2K\nFAKE ROW".to_string()],
            vec!["p2".to_string(), "ok".to_string()],
        ];
        let text = table_text(&["ID", "COMMAND"], &rows);
        assert_eq!(text, "ID  COMMAND\np1  sleep^[[2K^JFAKE ROW\np2  ok\n");
    }

    #[test]
    fn ages_and_pairs() {
        assert_eq!(age(5_000), "5s");
        assert_eq!(age(600_000), "10m");
        assert_eq!(age(3 * 86_400_000), "3d");
        assert_eq!(key_value("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(key_value("=x").is_err() && key_value("nokey").is_err());
    }
}
