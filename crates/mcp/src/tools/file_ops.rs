//! File tools beyond read/write/list: file_stat, file_mkdir, file_remove
//! (preview), file_move, file_edit, file_find. Each parses, makes one
//! library call and returns.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::guest::copy::kind_name;

use super::{guest_path, would_or_did};
use crate::output::{Out, ToolResult};
use crate::schema::file_ops::*;
use crate::MicroagentServer;

#[tool_router(router = file_ops_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// What is at a guest path: kind, size, mode, owner, modification
    /// time. A missing path is exists: false, not an error.
    #[tool(
        output_schema = crate::output::schema::<StatResult>(),
        annotations(
        title = "Stat a path in a workspace",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn file_stat(&self, Parameters(p): Parameters<PathParams>) -> ToolResult<StatResult> {
        guest_path("path", &p.path)?;
        let stat = self
            .ws
            .workspace(&p.name)?
            .files()
            .stat_if_exists(&p.path)
            .await?;
        Ok(Out(StatResult {
            path: p.path,
            exists: stat.is_some(),
            owner: stat.as_ref().map(|s| FileOwner {
                uid: s.uid,
                gid: s.gid,
            }),
            stat: stat.map(Into::into),
        }))
    }

    /// Make a guest directory and its missing parents (an existing
    /// directory is fine).
    #[tool(
        output_schema = crate::output::schema::<PathResult>(),
        annotations(
        title = "Make a directory in a workspace",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn file_mkdir(&self, Parameters(p): Parameters<PathParams>) -> ToolResult<PathResult> {
        guest_path("path", &p.path)?;
        self.ws.workspace(&p.name)?.files().mkdir(&p.path).await?;
        Ok(Out(PathResult {
            preview: false,
            action: format!("made the directory {}", p.path),
            path: p.path,
        }))
    }

    /// Remove a guest file, link or empty directory; recursive: true
    /// removes a directory with its contents. preview: true says what
    /// would be removed.
    #[tool(
        output_schema = crate::output::schema::<PathResult>(),
        annotations(
        title = "Remove a path in a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn file_remove(&self, Parameters(p): Parameters<RemoveParams>) -> ToolResult<PathResult> {
        guest_path("path", &p.path)?;
        let removal = self
            .ws
            .workspace(&p.name)?
            .files()
            .remove(&p.path, p.recursive, p.preview)
            .await?;
        let what = format!(
            "remove the {} {}{}",
            kind_name(removal.kind),
            removal.path,
            if p.recursive {
                " and what it holds"
            } else {
                ""
            }
        );
        Ok(Out(PathResult {
            preview: p.preview,
            action: would_or_did(p.preview, &what),
            path: removal.path,
        }))
    }

    /// Move (rename) a guest path; a file at the destination is replaced.
    /// preview: true says what would move and what it would replace.
    #[tool(
        output_schema = crate::output::schema::<PathResult>(),
        annotations(
        title = "Move a path in a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn file_move(&self, Parameters(p): Parameters<MoveParams>) -> ToolResult<PathResult> {
        guest_path("from", &p.from)?;
        guest_path("to", &p.to)?;
        let files = self.ws.workspace(&p.name)?.files();
        if p.preview {
            let from = files.stat(&p.from).await?;
            let replaced = match files.stat(&p.to).await {
                Ok(to) => format!(", replacing the {} there", kind_word(to.kind)),
                Err(e) if e.code() == workspace::ErrorCode::NotFound => String::new(),
                Err(e) => return Err(e.into()),
            };
            return Ok(Out(PathResult {
                preview: true,
                action: format!(
                    "would move {} {} to {}{replaced}",
                    kind_word(from.kind),
                    p.from,
                    p.to
                ),
                path: p.to,
            }));
        }
        files.rename(&p.from, &p.to).await?;
        Ok(Out(PathResult {
            preview: false,
            action: format!("moved {} to {}", p.from, p.to),
            path: p.to,
        }))
    }

    /// Replace exact text in a guest text file: old_text must occur
    /// expected_replacements times (default 1), else nothing changes and
    /// the CONFLICT error says how many times it occurs. preview: true
    /// checks the same and writes nothing.
    #[tool(
        output_schema = crate::output::schema::<EditResult>(),
        annotations(
        title = "Edit a file in a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn file_edit(&self, Parameters(p): Parameters<EditParams>) -> ToolResult<EditResult> {
        guest_path("path", &p.path)?;
        let edited = self
            .ws
            .workspace(&p.name)?
            .files()
            .edit_file(
                &p.path,
                &p.old_text,
                &p.new_text,
                p.expected_replacements.unwrap_or(1),
                p.preview,
            )
            .await?;
        Ok(Out(EditResult {
            path: p.path,
            replacements: edited.replacements,
            size: edited.size,
            preview: p.preview,
        }))
    }

    /// Find paths under a guest directory by a glob (`*.png` matches names
    /// at any depth; `src/**/*.rs` matches paths). At most 1000 matches.
    #[tool(
        output_schema = crate::output::schema::<FindResult>(),
        annotations(
        title = "Find files in a workspace",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn file_find(&self, Parameters(p): Parameters<FindParams>) -> ToolResult<FindResult> {
        guest_path("path", &p.path)?;
        let found = self
            .ws
            .workspace(&p.name)?
            .files()
            .find(&p.path, &p.pattern)
            .await?;
        Ok(Out(FindResult {
            path: p.path,
            pattern: p.pattern,
            matches: found.paths,
            truncated: found.truncated,
        }))
    }
}

/// What a guest path is, in a sentence.
fn kind_word(kind: workspace::guest::FileKind) -> &'static str {
    use workspace::guest::FileKind;
    match kind {
        FileKind::File => "file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symbolic link",
        FileKind::Other => "special file",
    }
}
