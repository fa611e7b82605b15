//! Docs held to what the code says, checked as tests (`cargo test -p
//! xtask`): docs/mcp.md's count of read-only tools and its list of
//! open-world tools match the annotations in `tools_list.json`, its list
//! of previews the tools whose input has `preview`, and the event kinds
//! docs/mcp.md and docs/cli.md list are the ones `EventKind` has.

#[cfg(test)]
mod tests {
    use crate::cache::repo_root;

    fn read(path: &str) -> String {
        std::fs::read_to_string(repo_root().join(path)).unwrap()
    }

    /// The names of the tools of `tools_list.json` that `keep` keeps.
    fn tools_where(keep: impl Fn(&serde_json::Value) -> bool) -> Vec<String> {
        let list: serde_json::Value =
            serde_json::from_str(&read("crates/mcp/tests/tools_list.json")).unwrap();
        let tools = list
            .get("tools")
            .unwrap_or(&list)
            .as_array()
            .unwrap()
            .clone();
        let mut names: Vec<String> = tools
            .iter()
            .filter(|t| keep(t))
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }

    /// The tools whose annotation `hint` is true.
    fn tools_with(hint: &str) -> Vec<String> {
        tools_where(|t| t["annotations"][hint] == true)
    }

    #[test]
    fn the_mcp_docs_list_every_tool_that_previews() {
        let doc = read("docs/mcp.md");
        let mut listed = quoted(between(&doc, "**Previews.**", "The result says"));
        listed.retain(|t| t != "preview: true");
        listed.sort();
        let previews = tools_where(|t| !t["inputSchema"]["properties"]["preview"].is_null());
        assert!(previews.len() >= 19, "{previews:?}");
        assert_eq!(listed, previews, "docs/mcp.md's list of previews");
    }

    /// The doc's text from `start` to the next `end`, on one line.
    fn between<'a>(doc: &'a str, start: &str, end: &str) -> &'a str {
        let from = doc.find(start).unwrap_or_else(|| panic!("no `{start}`"));
        let rest = &doc[from..];
        &rest[..rest.find(end).unwrap_or(rest.len())]
    }

    /// The names written in backticks in `text`.
    fn quoted(text: &str) -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_mcp_docs_count_and_list_the_annotations() {
        let doc = read("docs/mcp.md");
        let read_only = tools_with("readOnlyHint").len();
        let said = format!("`readOnlyHint` for the {read_only} tools");
        assert!(doc.contains(&said), "docs/mcp.md should say {said:?}");
        let sentence = between(&doc, "everywhere but", "(the others");
        let mut listed = quoted(sentence);
        listed.sort();
        assert_eq!(
            listed,
            tools_with("openWorldHint"),
            "docs/mcp.md's openWorldHint list"
        );
    }

    /// `EventKind`'s variants in snake_case, as events spell them.
    fn event_kinds() -> Vec<String> {
        let code = read("crates/base/src/store/events.rs");
        let body = between(&code, "pub enum EventKind {", "\n}");
        body.lines()
            .filter_map(|l| {
                let name = l.strip_prefix("    ")?;
                let name = name.split([' ', ',']).next()?;
                name.starts_with(|c: char| c.is_ascii_uppercase())
                    .then_some(name)
            })
            .map(|name| {
                let mut out = String::new();
                for (i, c) in name.chars().enumerate() {
                    if c.is_ascii_uppercase() && i > 0 {
                        out.push('_');
                    }
                    out.push(c.to_ascii_lowercase());
                }
                out
            })
            .collect()
    }

    #[test]
    fn the_docs_list_every_event_kind() {
        let kinds = event_kinds();
        assert!(kinds.len() >= 15, "{kinds:?}");
        for (path, start, end) in [
            (
                "docs/mcp.md",
                "when there is none yet. Kinds:",
                "each event has",
            ),
            ("docs/cli.md", "the event log:", "each with"),
        ] {
            let doc = read(path);
            let listed = quoted(between(&doc, start, end));
            let missing: Vec<&String> = kinds.iter().filter(|k| !listed.contains(k)).collect();
            assert!(missing.is_empty(), "{path} does not list {missing:?}");
        }
    }
}
