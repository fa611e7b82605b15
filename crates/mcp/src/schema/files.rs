//! Inputs and outputs of the file tools: `file_read`, `file_write`,
//! `file_list`, `copy_in`, `copy_out`.

use std::path::PathBuf;

use rmcp::model::{ContentBlock, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::guest::copy::kind_name;
use workspace::guest::FileStat;

use crate::output::Render;

/// Default bytes one `file_read` returns.
pub const DEFAULT_READ_LENGTH: u64 = 64 << 10;
/// Most bytes one `file_read` returns.
pub const MAX_READ_LENGTH: u64 = 4 << 20;
/// Most bytes one `file_write` writes.
pub const MAX_WRITE_BYTES: usize = 16 << 20;

/// How file content is carried in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Text (UTF-8).
    Utf8,
    /// Base64 of the raw bytes (any content).
    Base64,
}

/// `file_read`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileReadParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path of a file in the guest.
    pub path: String,
    /// First byte to read; default 0.
    pub offset: Option<u64>,
    /// Most bytes to read, 1 to 4194304; default 65536. Read a larger file
    /// in parts with `offset` (each result says `next_offset`).
    #[schemars(range(min = 1, max = MAX_READ_LENGTH))]
    pub length: Option<u64>,
    /// utf8 or base64. Default: utf8 when the bytes are valid UTF-8, else
    /// base64. Asking utf8 replaces invalid bytes.
    pub encoding: Option<Encoding>,
    /// Read by lines instead of bytes: the first line (from 1). Not with
    /// `offset` or `length`; the file must be UTF-8 text of at most 4 MiB.
    #[schemars(range(min = 1))]
    pub start_line: Option<usize>,
    /// The last line read by lines (default: to the end; past the end is
    /// the end).
    #[schemars(range(min = 1))]
    pub end_line: Option<usize>,
}

/// `file_write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileWriteParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path of the file in the guest; its directory must exist.
    pub path: String,
    /// The content (at most 16 MiB once decoded).
    pub content: String,
    /// How `content` is encoded: utf8 (default) or base64.
    pub encoding: Option<Encoding>,
    /// Append to the file instead of replacing it (it is created if
    /// missing). A replace is atomic.
    #[serde(default)]
    pub append: bool,
    /// Permission bits of a new file as an octal string, e.g. "0755";
    /// default 0644 (a replaced file keeps its own).
    pub mode: Option<String>,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `file_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileListParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path of a directory in the guest.
    pub path: String,
}

/// `copy_in`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyInParams {
    /// Workspace name (running).
    pub name: String,
    /// A file or directory on the host (relative paths are from the
    /// server's working directory).
    pub host_path: String,
    /// Absolute guest path it becomes. A file replaces a file there; a
    /// directory is copied as this directory (created if missing, merged
    /// into if present).
    pub guest_path: String,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `copy_out`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyOutParams {
    /// Workspace name (running).
    pub name: String,
    /// Absolute path of a file or directory in the guest.
    pub guest_path: String,
    /// Host path it becomes (relative paths are from the server's working
    /// directory); its parent directory must exist.
    pub host_path: String,
    /// Replace (file) or merge into (directory) an existing host path;
    /// without it an existing host path is refused with CONFLICT.
    #[serde(default)]
    pub overwrite: bool,
    /// Also write git metadata (paths through a `.git`, whose hooks and
    /// config run code at the host's next git command). Only when the user
    /// asked for it: by default a directory's `.git` is left out (see
    /// `left_out`) and a host path through a `.git` is refused (FORBIDDEN).
    #[serde(default)]
    pub include_git_metadata: bool,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// What a guest path is.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct StatView {
    /// file, dir, symlink or other.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits, octal.
    pub mode: String,
    /// Modification time, Unix seconds.
    pub mtime_s: i64,
}

impl From<FileStat> for StatView {
    fn from(s: FileStat) -> Self {
        Self {
            kind: kind_name(s.kind).into(),
            size: s.size,
            mode: format!("{:04o}", s.mode),
            mtime_s: s.mtime_s,
        }
    }
}

/// `file_read`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileReadResult {
    /// The file.
    pub path: String,
    /// The whole file's size in bytes.
    pub size: u64,
    /// Where this part starts.
    pub offset: u64,
    /// Bytes in this part.
    pub length: u64,
    /// How `content` is encoded.
    pub encoding: Encoding,
    /// The bytes read.
    pub content: String,
    /// True when this part reaches the end of the file.
    pub eof: bool,
    /// Where the next part starts, when there is more.
    pub next_offset: Option<u64>,
    /// Which lines, when read by lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lines: Option<LineRange>,
    /// The whole file as a resource, when this part is not all of it
    /// (given as a resource link beside the text).
    #[serde(skip)]
    #[schemars(skip)]
    pub whole: Option<String>,
}

/// The lines a `file_read` by lines returned.
#[derive(Debug, Serialize, JsonSchema)]
pub struct LineRange {
    /// The first line returned (from 1).
    pub start_line: usize,
    /// The last line returned (0 when none was: start_line is past the end).
    pub end_line: usize,
    /// Lines in the file.
    pub total_lines: usize,
}

impl Render for FileReadResult {
    fn render(&self) -> String {
        if let Some(l) = &self.lines {
            return format!(
                "{}: lines {}..{} of {}\n{}",
                self.path, l.start_line, l.end_line, l.total_lines, self.content
            );
        }
        let mut head = format!(
            "{}: bytes {}..{} of {}",
            self.path,
            self.offset,
            self.offset + self.length,
            self.size
        );
        if let Some(next) = self.next_offset {
            head.push_str(&format!(" (more: read again with offset {next})"));
        }
        match self.encoding {
            Encoding::Utf8 => format!("{head}\n{}", self.content),
            Encoding::Base64 => format!("{head}, base64:\n{}", self.content),
        }
    }

    fn blocks(&self) -> Vec<ContentBlock> {
        let Some(uri) = &self.whole else {
            return Vec::new();
        };
        let link = Resource::new(uri.clone(), self.path.clone())
            .with_size(self.size)
            .with_description("the whole file, as a resource (at most its first 4 MiB)");
        vec![ContentBlock::resource_link(link)]
    }
}

/// `file_write`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileWriteResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The file.
    pub path: String,
    /// Bytes written (or that would be).
    pub bytes: u64,
    /// What was at the path before, if anything.
    pub existing: Option<StatView>,
}

impl Render for FileWriteResult {
    fn render(&self) -> String {
        let tag = if self.preview { "preview: " } else { "" };
        format!("{tag}{}", self.action)
    }
}

/// One directory entry.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DirEntryView {
    /// File name.
    pub name: String,
    /// file, dir, symlink or other (symlinks are not followed).
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
}

/// `file_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileListResult {
    /// The directory.
    pub path: String,
    /// Its entries, by name.
    pub entries: Vec<DirEntryView>,
    /// True when the list was cut short (at 10000 entries).
    pub truncated: bool,
}

impl Render for FileListResult {
    fn render(&self) -> String {
        let n = self.entries.len();
        let mut text = format!(
            "{}: {n} {}",
            self.path,
            if n == 1 { "entry" } else { "entries" }
        );
        for e in &self.entries {
            let suffix = if e.kind == "dir" { "/" } else { "" };
            text.push_str(&format!("\n{:>10}  {}{suffix}", e.size, e.name));
        }
        if self.truncated {
            text.push_str("\n(cut short)");
        }
        text
    }
}

/// `copy_in`'s and `copy_out`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CopyResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The host path (absolute).
    pub host_path: PathBuf,
    /// The guest path.
    pub guest_path: String,
    /// What was copied: file or dir.
    pub kind: String,
    /// Bytes copied: file bytes; for a directory, copy_in counts entries
    /// and copy_out counts archive bytes (see `unit`). 0 for a preview.
    pub transferred: u64,
    /// bytes or entries.
    pub unit: String,
    /// Git metadata a copy out did not write (`.git` paths relative to
    /// host_path; include_git_metadata: true writes it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// How many archive entries `left_out` held.
    #[serde(skip_serializing_if = "is_zero")]
    pub left_out_entries: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Render for CopyResult {
    fn render(&self) -> String {
        if self.preview {
            format!("preview: {}", self.action)
        } else {
            let mut text = format!("{} ({} {})", self.action, self.transferred, self.unit);
            if !self.left_out.is_empty() {
                text.push_str(&format!(
                    "\nleft out git metadata ({} entries): {}",
                    self.left_out_entries,
                    self.left_out.join(", ")
                ));
            }
            text
        }
    }
}
