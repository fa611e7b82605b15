//! Inputs and outputs of the file tools beyond read/write/list:
//! `file_stat`, `file_mkdir`, `file_remove`, `file_move`, `file_edit`,
//! `file_find`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::files::StatView;
use crate::output::Render;

/// `file_stat`, `file_mkdir`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path in the guest.
    pub path: String,
}

/// `file_remove`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoveParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path in the guest (a file, link or directory).
    pub path: String,
    /// Remove a directory with everything in it; without it only an
    /// empty directory is removed.
    #[serde(default)]
    pub recursive: bool,
    /// Only report what would be removed; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `file_move`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute guest path to move.
    pub from: String,
    /// Absolute guest path it becomes (a file there is replaced; its
    /// directory must exist).
    pub to: String,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `file_edit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path of a UTF-8 text file in the guest (at most 4 MiB).
    pub path: String,
    /// The exact text to replace (not a pattern; whitespace counts).
    pub old_text: String,
    /// What replaces each occurrence.
    pub new_text: String,
    /// How many times `old_text` must occur (default 1). Any other count
    /// changes nothing and is a CONFLICT saying how many there are.
    pub expected_replacements: Option<usize>,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `file_find`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path of the directory to search under.
    pub path: String,
    /// A glob: without `/` it matches names at any depth (`*.png`,
    /// `test_?.py`); with `/` it matches paths under `path`
    /// (`src/**/*.rs`). `*`, `?`, `[abc]`, `**`.
    pub pattern: String,
}

/// `file_stat`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct StatResult {
    /// The path.
    pub path: String,
    /// Whether anything is there (a missing path is not an error).
    pub exists: bool,
    /// What is there, when it exists.
    pub stat: Option<StatView>,
    /// Its owner's uid and gid, when it exists.
    pub owner: Option<FileOwner>,
}

/// A file's owner.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileOwner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Render for StatResult {
    fn render(&self) -> String {
        match (&self.stat, &self.owner) {
            (Some(s), Some(o)) => format!(
                "{}: {}, {} bytes, mode {}, owner {}:{}, modified {}",
                self.path, s.kind, s.size, s.mode, o.uid, o.gid, s.mtime_s
            ),
            _ => format!("{}: does not exist", self.path),
        }
    }
}

/// What a path tool did.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PathResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The path acted on.
    pub path: String,
}

impl Render for PathResult {
    fn render(&self) -> String {
        self.action.clone()
    }
}

/// `file_edit`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EditResult {
    /// The file.
    pub path: String,
    /// Occurrences replaced.
    pub replacements: usize,
    /// The file's size in bytes after the edit (for a preview: would be).
    pub size: u64,
    /// Only a preview: the file was not written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preview: bool,
}

impl Render for EditResult {
    fn render(&self) -> String {
        let (done, now) = if self.preview {
            ("would make ", "would be")
        } else {
            ("", "now")
        };
        format!(
            "{}: {done}{} replacement(s), {now} {} bytes",
            self.path, self.replacements, self.size
        )
    }
}

/// `file_find`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FindResult {
    /// The directory searched.
    pub path: String,
    /// The pattern.
    pub pattern: String,
    /// Matching absolute paths (at most 1000).
    pub matches: Vec<String>,
    /// The search stopped early (1000 matches, 20000 entries looked at, or
    /// a directory too large to list whole).
    pub truncated: bool,
}

impl Render for FindResult {
    fn render(&self) -> String {
        let mut out = format!(
            "{} match(es) of {} under {}{}",
            self.matches.len(),
            self.pattern,
            self.path,
            if self.truncated {
                " (stopped early)"
            } else {
                ""
            }
        );
        for m in &self.matches {
            out.push('\n');
            out.push_str(m);
        }
        out
    }
}
