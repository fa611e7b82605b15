//! The accessibility tree Chromium reports (`Accessibility.getFullAXTree`)
//! rendered as YAML in the shape of Playwright's `ariaSnapshot`: one
//! `- role "name" [attributes]` line per node, children indented under it,
//! text as `- text: ...`; each interactive node gets `[ref=eN]`, which
//! click and fill take until the next snapshot.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;

/// Roles an agent acts on: these get refs.
const INTERACTIVE: &[&str] = &[
    "button",
    "checkbox",
    "combobox",
    "link",
    "listbox",
    "menuitem",
    "menuitemcheckbox",
    "menuitemradio",
    "option",
    "radio",
    "searchbox",
    "slider",
    "spinbutton",
    "switch",
    "tab",
    "textbox",
    "treeitem",
];

/// Chromium's internal roles that are containers without meaning of their
/// own: their children take their place.
const TRANSPARENT: &[&str] = &[
    "generic",
    "none",
    "presentation",
    "GenericContainer",
    "LabelText",
    "Section",
    "Div",
    "Canvas",
    "IframePresentational",
];

/// Chromium's roles that render nothing.
const SKIPPED: &[&str] = &["InlineTextBox", "LineBreak", "ListMarker"];

/// One node of `Accessibility.getFullAXTree`'s answer (the fields used).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AxNode {
    node_id: String,
    #[serde(default)]
    ignored: bool,
    #[serde(default)]
    role: Option<AxValue>,
    #[serde(default)]
    name: Option<AxValue>,
    #[serde(default)]
    value: Option<AxValue>,
    #[serde(default)]
    properties: Vec<AxProperty>,
    #[serde(default)]
    child_ids: Vec<String>,
    #[serde(default)]
    parent_id: Option<String>,
    #[serde(rename = "backendDOMNodeId", default)]
    backend_dom_node_id: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct AxValue {
    #[serde(default)]
    value: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct AxProperty {
    name: String,
    value: AxValue,
}

impl AxValue {
    fn text(&self) -> String {
        match &self.value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => String::new(),
            other => other.to_string(),
        }
    }
}

impl AxNode {
    fn role(&self) -> String {
        self.role.as_ref().map(AxValue::text).unwrap_or_default()
    }

    fn name(&self) -> String {
        self.name
            .as_ref()
            .map(|n| collapse(&n.text()))
            .unwrap_or_default()
    }

    fn property(&self, name: &str) -> Option<&serde_json::Value> {
        self.properties
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.value.value)
    }
}

/// A rendered snapshot.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The YAML text (cut at the size cap, with a note).
    pub yaml: String,
    /// `e1` -> the DOM node (backendNodeId) it stands for.
    pub refs: BTreeMap<String, i64>,
    /// Lines left out past the cap.
    pub truncated_lines: usize,
}

/// The refs of a snapshot in the order they were given (`e2` before
/// `e10`).
pub fn ref_order(refs: &BTreeMap<String, i64>) -> Vec<String> {
    let mut ids: Vec<String> = refs.keys().cloned().collect();
    ids.sort_by_key(|r| {
        (
            r.trim_start_matches('e').parse::<u64>().unwrap_or(u64::MAX),
            r.clone(),
        )
    });
    ids
}

/// Renders `nodes`, at most `cap` bytes of YAML.
pub fn render(nodes: &[AxNode], cap: usize) -> Rendered {
    let by_id: HashMap<&str, &AxNode> = nodes.iter().map(|n| (n.node_id.as_str(), n)).collect();
    let root = nodes
        .iter()
        .find(|n| n.parent_id.is_none())
        .or_else(|| nodes.first());
    let mut out = Out::default();
    if let Some(root) = root {
        // The document itself is the snapshot: its children are the top.
        for child in &root.child_ids {
            walk(&by_id, child, (0, 0), &mut out);
        }
    }
    let mut rendered = Rendered {
        refs: out.refs,
        ..Rendered::default()
    };
    let note = |lines: usize| {
        format!("# truncated: {lines} more lines past the snapshot cap of {cap} bytes\n")
    };
    // What is cut leaves room for the note, so the whole stays within the
    // cap (a server's snapshot is held to it).
    let whole: usize = out.lines.iter().map(|l| l.len() + 1).sum();
    let room = match whole <= cap {
        true => cap,
        false => cap.saturating_sub(note(out.lines.len()).len()),
    };
    for line in &out.lines {
        if rendered.yaml.len() + line.len() + 1 > room {
            rendered.truncated_lines += 1;
            continue;
        }
        rendered.yaml.push_str(line);
        rendered.yaml.push('\n');
    }
    if rendered.truncated_lines > 0 {
        rendered.yaml.push_str(&note(rendered.truncated_lines));
    }
    rendered
}

#[derive(Default)]
struct Out {
    lines: Vec<String>,
    refs: BTreeMap<String, i64>,
    seen: HashSet<String>,
}

/// Deepest nesting rendered.
const MAX_DEPTH: usize = 100;
/// Deepest nesting walked, flattened containers included.
const MAX_NESTING: usize = 400;

/// Renders node `id` at `depth` (indentation); `nesting` counts every
/// level walked, flattened ones too, so a deep page cannot exhaust the stack.
fn walk(by_id: &HashMap<&str, &AxNode>, id: &str, (depth, nesting): (usize, usize), out: &mut Out) {
    // The tree comes from the guest: a node seen twice (a cycle) or one too
    // deep is not followed.
    if depth > MAX_DEPTH || nesting > MAX_NESTING || !out.seen.insert(id.to_owned()) {
        return;
    }
    let Some(node) = by_id.get(id) else {
        return;
    };
    let role = node.role();
    if SKIPPED.contains(&role.as_str()) {
        return;
    }
    let name = node.name();
    if node.ignored || (TRANSPARENT.contains(&role.as_str()) && name.is_empty()) {
        for child in &node.child_ids {
            walk(by_id, child, (depth, nesting + 1), out);
        }
        return;
    }
    let indent = "  ".repeat(depth);
    if role == "StaticText" {
        if !name.is_empty() {
            out.lines.push(format!("{indent}- text: {}", scalar(&name)));
        }
        return;
    }
    let role = match role.as_str() {
        "image" => "img".to_owned(),
        "RootWebArea" | "WebArea" => "document".to_owned(),
        "" => "generic".to_owned(),
        _ => role,
    };
    let mut line = format!("{indent}- {role}");
    if !name.is_empty() {
        line.push(' ');
        line.push_str(&quoted(&name));
    }
    line.push_str(&attributes(node));
    if INTERACTIVE.contains(&role.as_str()) {
        if let Some(backend) = node.backend_dom_node_id {
            let r = format!("e{}", out.refs.len() + 1);
            line.push_str(&format!(" [ref={r}]"));
            out.refs.insert(r, backend);
        }
    }
    let value = node
        .value
        .as_ref()
        .map(|v| collapse(&v.text()))
        .unwrap_or_default();
    // Text that only repeats the name or the value says nothing more.
    let text = text_of(by_id, node);
    let children: Vec<&String> =
        if (!name.is_empty() && text == name) || (!value.is_empty() && text == value) {
            Vec::new()
        } else {
            node.child_ids.iter().collect()
        };
    let at = out.lines.len();
    out.lines.push(String::new());
    for child in children {
        walk(by_id, child, (depth + 1, nesting + 1), out);
    }
    if out.lines.len() > at + 1 {
        line.push(':');
        if !value.is_empty() {
            // A value and children: the value as a child line.
            out.lines
                .insert(at + 1, format!("{indent}  - /value: {}", scalar(&value)));
        }
    } else if !value.is_empty() {
        line.push_str(&format!(": {}", scalar(&value)));
    }
    out.lines[at] = line;
}

/// The text under `node`, as its StaticText descendants say it.
fn text_of(by_id: &HashMap<&str, &AxNode>, node: &AxNode) -> String {
    let mut parts = Vec::new();
    collect_text(by_id, node, &mut parts, 0);
    collapse(&parts.join(" "))
}

fn collect_text(
    by_id: &HashMap<&str, &AxNode>,
    node: &AxNode,
    parts: &mut Vec<String>,
    depth: usize,
) {
    // Deep trees of text are not a label's.
    if depth > 8 {
        parts.push("\u{0}".into());
        return;
    }
    for child in &node.child_ids {
        let Some(c) = by_id.get(child.as_str()) else {
            continue;
        };
        match c.role().as_str() {
            "StaticText" => parts.push(c.name()),
            "InlineTextBox" | "LineBreak" => {}
            role if c.ignored || TRANSPARENT.contains(&role) => {
                collect_text(by_id, c, parts, depth + 1)
            }
            // Another named node below: not plain text.
            _ => parts.push("\u{0}".into()),
        }
    }
}

/// `[checked]`, `[level=1]` and the like, in Playwright's words.
fn attributes(node: &AxNode) -> String {
    let mut out = String::new();
    let truthy = |v: &serde_json::Value| v == &serde_json::json!(true) || v == "true";
    if let Some(v) = node.property("checked") {
        if v == "mixed" {
            out.push_str(" [checked=mixed]");
        } else if truthy(v) {
            out.push_str(" [checked]");
        }
    }
    for flag in ["disabled", "expanded", "pressed", "selected"] {
        if let Some(v) = node.property(flag) {
            if flag == "pressed" && v == "mixed" {
                out.push_str(" [pressed=mixed]");
            } else if truthy(v) {
                out.push_str(&format!(" [{flag}]"));
            }
        }
    }
    if let Some(level) = node.property("level").and_then(|v| v.as_i64()) {
        out.push_str(&format!(" [level={level}]"));
    }
    out
}

/// Whitespace runs as one space, trimmed.
fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A double-quoted YAML string (JSON's escapes are YAML's).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A YAML scalar: plain when that reads back as the same string.
fn scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && !s.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@`~ ".contains(c))
        && !s.ends_with([' ', ':'])
        && !s.contains(": ")
        && !s.contains(" #")
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "null" | "on" | "off" | "~"
        )
        && s.parse::<f64>().is_err()
        && s.chars().all(|c| !c.is_control());
    if plain {
        s.to_owned()
    } else {
        quoted(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refs_come_in_the_order_they_were_given() {
        let refs = BTreeMap::from([("e10".into(), 1), ("e2".into(), 2), ("e1".into(), 3)]);
        assert_eq!(ref_order(&refs), ["e1", "e2", "e10"]);
    }

    fn node(id: u32, role: &str, name: &str, children: &[u32], backend: i64) -> serde_json::Value {
        json!({
            "nodeId": id.to_string(),
            "ignored": false,
            "role": {"type": "role", "value": role},
            "name": {"type": "computedString", "value": name},
            "childIds": children.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "parentId": if id == 1 { None } else { Some("x") },
            "backendDOMNodeId": backend,
        })
    }

    fn parse(v: Vec<serde_json::Value>) -> Vec<AxNode> {
        serde_json::from_value(serde_json::Value::Array(v)).unwrap()
    }

    fn form_page() -> Vec<AxNode> {
        let mut heading = node(3, "heading", "Sign up", &[4], 30);
        heading["properties"] =
            json!([{"name": "level", "value": {"type": "integer", "value": 1}}]);
        let mut textbox = node(6, "textbox", "Email", &[], 60);
        textbox["value"] = json!({"type": "string", "value": "a@b.c"});
        let mut ignored = node(2, "generic", "", &[3, 5], 20);
        ignored["ignored"] = json!(true);
        let mut check = node(9, "checkbox", "Terms", &[], 90);
        check["properties"] =
            json!([{"name": "checked", "value": {"type": "tristate", "value": "true"}}]);
        parse(vec![
            node(1, "RootWebArea", "Form", &[2], 1),
            ignored,
            heading,
            node(4, "StaticText", "Sign up", &[], 40),
            node(5, "generic", "", &[6, 7, 9, 10], 50),
            textbox,
            node(7, "button", "Send it", &[8], 70),
            node(8, "StaticText", "Send it", &[], 80),
            check,
            node(10, "paragraph", "", &[11], 100),
            node(11, "StaticText", "Note: read  this", &[], 110),
        ])
    }

    #[test]
    fn a_form_renders_like_an_aria_snapshot_with_refs() {
        let r = render(&form_page(), 10_000);
        assert_eq!(
            r.yaml,
            "- heading \"Sign up\" [level=1]\n\
             - textbox \"Email\" [ref=e1]: a@b.c\n\
             - button \"Send it\" [ref=e2]\n\
             - checkbox \"Terms\" [checked] [ref=e3]\n\
             - paragraph:\n  - text: \"Note: read this\"\n"
        );
        assert_eq!(r.refs["e1"], 60);
        assert_eq!(r.refs["e2"], 70);
        assert_eq!(r.refs["e3"], 90);
        assert_eq!(r.truncated_lines, 0);
    }

    #[test]
    fn past_the_cap_lines_are_counted_and_noted() {
        let r = render(&form_page(), 150);
        // The note included, within the cap.
        assert!(r.yaml.len() <= 150, "{}", r.yaml);
        assert!(r.truncated_lines > 0);
        assert!(r.yaml.ends_with(&format!(
            "# truncated: {} more lines past the snapshot cap of 150 bytes\n",
            r.truncated_lines
        )));
    }

    #[test]
    fn a_very_deep_page_is_cut_not_overflowed() {
        let mut nodes = vec![node(1, "RootWebArea", "", &[2], 1)];
        for id in 2..20_000u32 {
            nodes.push(node(id, "generic", "", &[id + 1], id.into()));
        }
        nodes.push(node(20_000, "button", "Deep", &[], 20_000));
        let r = render(&parse(nodes), 1000);
        assert_eq!(r.yaml, "", "past the nesting bound nothing is rendered");
    }

    #[test]
    fn scalars_are_quoted_only_when_yaml_would_misread_them() {
        assert_eq!(scalar("hello world"), "hello world");
        for s in [
            "true", "12", "- x", "a: b", "", " lead", "#x", "x #y", "tab\tin",
        ] {
            assert!(scalar(s).starts_with('"'), "{s}");
        }
        assert_eq!(quoted("say \"hi\""), r#""say \"hi\"""#);
    }

    #[test]
    fn an_empty_or_odd_tree_renders_without_panicking() {
        assert_eq!(render(&[], 100), Rendered::default());
        let cyclic = parse(vec![
            node(1, "RootWebArea", "", &[2], 1),
            node(2, "generic", "", &[3], 2),
            node(3, "button", "B", &[2], 3),
        ]);
        assert_eq!(render(&cyclic, 100).yaml, "- button \"B\" [ref=e1]\n");
        let dangling = parse(vec![node(1, "RootWebArea", "", &[7], 1)]);
        assert_eq!(render(&dangling, 100).yaml, "");
    }
}
