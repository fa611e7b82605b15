//! Call edges for the module graph: a module that calls a method of one of
//! the central types (`.start_maybe_warm(..)` on the collection) leans on
//! the module whose `impl` block defines that method, though it names no
//! path to it. The `impl` blocks of these types are spread over many
//! files, so the `use` lines alone cannot see these edges.
//!
//! Only inherent `impl` blocks of the types in [`SERVICE_TYPES`] count.
//! A call is matched by the method's name alone: `.name(` (or
//! `.name::<..>(`), and `Self::name(` / `Type::name(` for a listed type.
//! When methods (of any type or trait) of that name are defined in more
//! than one module of the crate, the call leans on the innermost folder
//! holding them all (`.running(` of `guest::files` or `guest::processes`
//! leans on `guest`); with no such folder below the crate root, or when the
//! name is in [`TOO_COMMON`], or a crate this one depends on defines a
//! method by that name (`ImageRegistry::limits` of the base crate beside
//! `Workspaces::limits`), the name is ambiguous and left out.

use std::collections::{BTreeMap, BTreeSet};

/// The types whose methods are followed: the collection, a workspace's
/// handle and the services and sub-handles they hand out.
pub const SERVICE_TYPES: &[&str] = &[
    "Workspaces",
    "Workspace",
    "Volumes",
    "Tasks",
    "Pools",
    "Snapshots",
    "Networks",
    "Images",
    "Kernels",
    "Metrics",
    "ServerPool",
    "HostSetup",
    "WorkspaceBrowser",
    "WorkspaceFiles",
    "WorkspaceProcesses",
];

/// Names also called on standard and foreign types (`Vec::get`,
/// `Child::wait`, `Iterator::find`, `Vec::drain`, tar's
/// `Header::set_size`, oci's `Reference::namespace`, ...): a call by such
/// a name says nothing about whose method it is.
pub const TOO_COMMON: &[&str] = &[
    "new",
    "get",
    "list",
    "from",
    "into",
    "clone",
    "default",
    "len",
    "is_empty",
    "iter",
    "insert",
    "remove",
    "contains",
    "wait",
    "send",
    "status",
    "run",
    "name",
    "path",
    "close",
    "open",
    "find",
    "drain",
    "set_size",
    "namespace",
];

/// What the call edges of a crate are.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Calls {
    /// Calling module to defining module to the methods called.
    pub edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Method names of the listed types left out as ambiguous.
    pub ambiguous: BTreeSet<String>,
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code without comments and the contents of string and character
/// literals (`"..."`, `r#"..."#`, `'x'`; lifetimes stay), so neither
/// can look like a call. Newlines are kept.
pub fn strip_comments_and_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        // A raw string's `r` may follow a `b` (`br"..."`), not a name.
        let byte_prefix = i > 0 && c[i - 1] == 'b' && !(i > 1 && is_ident(c[i - 2]));
        let prev_ident = i > 0 && is_ident(c[i - 1]) && !byte_prefix;
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0usize;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && !prev_ident
            && matches!(c.get(i + 1), Some('"') | Some('#'))
            && raw_start(&c, i + 1).is_some()
        {
            let (hashes, open) = raw_start(&c, i + 1).unwrap_or((0, i + 1));
            i = open + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                if c[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\n' {
                    out.push('\n');
                }
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && c.get(i + 1) == Some(&'\\') {
            // An escaped character: skip to its closing quote.
            i += 2;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// At `c[at]` just after an `r`: the number of `#`s and the index of the
/// opening quote of a raw string, if that is what starts there.
fn raw_start(c: &[char], at: usize) -> Option<(usize, usize)> {
    let mut j = at;
    while c.get(j) == Some(&'#') {
        j += 1;
    }
    (c.get(j) == Some(&'"')).then_some((j - at, j))
}

/// The identifier starting at `c[i]`, if one does.
fn ident_at(c: &[char], i: usize) -> Option<String> {
    let first = *c.get(i)?;
    if !(first.is_alphabetic() || first == '_') {
        return None;
    }
    Some(c[i..].iter().take_while(|ch| is_ident(**ch)).collect())
}

/// Whether the word `word` stands at `c[i]` (not inside a longer name).
fn word_at(c: &[char], i: usize, word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    c.get(i..i + w.len()) == Some(&w[..])
        && !(i > 0 && is_ident(c[i - 1]))
        && !c.get(i + w.len()).is_some_and(|ch| is_ident(*ch))
}

/// The index of the `}` closing the `{` at `c[open]` (or the end).
fn closing_brace(c: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, ch) in c.iter().enumerate().skip(open) {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    c.len()
}

/// The methods defined in stripped code's `impl` and `trait` blocks, as
/// (the type of an inherent impl, or `None` for a trait or trait impl,
/// the method's name).
pub fn methods_defined(code: &str) -> Vec<(Option<String>, String)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let is_impl = word_at(&c, i, "impl");
        if !is_impl && !word_at(&c, i, "trait") {
            i += 1;
            continue;
        }
        let Some(open) = (i..c.len()).find(|&j| matches!(c[j], '{' | ';' | '(' | ')')) else {
            break;
        };
        if c[open] != '{' {
            // `impl Trait` in a signature, or a declaration without a body.
            i += 4;
            continue;
        }
        let header: String = c[i + 4..open].iter().collect();
        let owner = if is_impl {
            inherent_type(&header)
        } else {
            None
        };
        let close = closing_brace(&c, open);
        let mut depth = 0usize;
        let mut j = open;
        while j < close {
            match c[j] {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ if depth == 1 && word_at(&c, j, "fn") => {
                    let mut k = j + 2;
                    while c.get(k).is_some_and(|ch| ch.is_whitespace()) {
                        k += 1;
                    }
                    if let Some(name) = ident_at(&c, k) {
                        out.push((owner.clone(), name));
                    }
                }
                _ => {}
            }
            j += 1;
        }
        i = close.max(i + 1);
    }
    out
}

/// The type an `impl` header (what follows `impl`, up to its `{`) is an
/// inherent impl of: `<'a> Workspace<'a>` is `Workspace`, a trait impl
/// (`Drop for X`) is `None`.
fn inherent_type(header: &str) -> Option<String> {
    if header.split_whitespace().any(|w| w == "for") {
        return None;
    }
    let mut rest = header.trim_start();
    if rest.starts_with('<') {
        let mut depth = 0usize;
        let mut end = rest.len();
        for (j, ch) in rest.char_indices() {
            match ch {
                '<' => depth += 1,
                '>' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = rest[end..].trim_start();
    }
    let path: String = rest
        .chars()
        .take_while(|ch| is_ident(*ch) || *ch == ':')
        .collect();
    let name = path.rsplit("::").next()?.to_owned();
    (!name.is_empty()).then_some(name)
}

/// The method names stripped code calls: `.name(`, `.name::<T>(`, and
/// `Self::name(` or `Type::name(` for a type in `types`.
pub fn calls_in(code: &str, types: &[&str]) -> BTreeSet<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = BTreeSet::new();
    for i in 0..c.len() {
        let start = if c[i] == '.' && !(i > 0 && c[i - 1] == '.') {
            i + 1
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') && i > 0 && is_ident(c[i - 1]) {
            let mut s = i;
            while s > 0 && is_ident(c[s - 1]) {
                s -= 1;
            }
            let owner: String = c[s..i].iter().collect();
            if owner != "Self" && !types.contains(&owner.as_str()) {
                continue;
            }
            i + 2
        } else {
            continue;
        };
        let Some(name) = ident_at(&c, start) else {
            continue;
        };
        let mut k = start + name.chars().count();
        if c.get(k) == Some(&':') && c.get(k + 1) == Some(&':') && c.get(k + 2) == Some(&'<') {
            let mut depth = 0usize;
            k += 2;
            while k < c.len() {
                match c[k] {
                    '<' => depth += 1,
                    '>' => depth -= 1,
                    _ => {}
                }
                k += 1;
                if depth == 0 {
                    break;
                }
            }
        }
        if c.get(k) == Some(&'(') {
            out.insert(name);
        }
    }
    out
}

/// The one module of `modules`, or the innermost folder holding them all
/// (`None` if that is the crate root).
fn common_folder(modules: &BTreeSet<&String>) -> Option<String> {
    let mut parts: Option<Vec<&str>> = None;
    for m in modules {
        let segs: Vec<&str> = m.split("::").collect();
        parts = Some(match parts {
            None => segs,
            Some(p) => p
                .iter()
                .zip(&segs)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| *a)
                .collect(),
        });
    }
    let joined = parts?.join("::");
    (!joined.is_empty()).then_some(joined)
}

/// The call edges among a crate's modules, from each module's code
/// (tests already left out): each call of a listed type's method defined
/// in another module is an edge to that module, unless that module is an
/// ancestor of the caller (as for paths, a child builds on its parent).
/// `foreign` holds the method names the crate's dependencies define.
pub fn calls(code: &BTreeMap<String, String>, types: &[&str], foreign: &BTreeSet<String>) -> Calls {
    let stripped: BTreeMap<&String, String> = code
        .iter()
        .map(|(m, t)| (m, strip_comments_and_literals(t)))
        .collect();
    // Every method name to the modules defining a method by that name,
    // and the listed types' method names to their module.
    let mut anywhere: BTreeMap<String, BTreeSet<&String>> = BTreeMap::new();
    let mut listed: BTreeSet<String> = BTreeSet::new();
    for (module, text) in &stripped {
        for (owner, name) in methods_defined(text) {
            anywhere.entry(name.clone()).or_default().insert(module);
            if owner.is_some_and(|o| types.contains(&o.as_str())) {
                listed.insert(name);
            }
        }
    }
    let mut out = Calls::default();
    let mut target_of: BTreeMap<String, String> = BTreeMap::new();
    for name in &listed {
        let target = common_folder(&anywhere[name]);
        match target {
            Some(t) if !TOO_COMMON.contains(&name.as_str()) && !foreign.contains(name) => {
                target_of.insert(name.clone(), t);
            }
            _ => {
                out.ambiguous.insert(name.clone());
            }
        }
    }
    for (module, text) in &stripped {
        for name in calls_in(text, types) {
            let Some(target) = target_of.get(&name) else {
                continue;
            };
            let ancestor = target.is_empty()
                || *module == target
                || module.starts_with(&format!("{target}::"));
            if !ancestor {
                out.edges
                    .entry((*module).clone())
                    .or_default()
                    .entry(target.clone())
                    .or_default()
                    .insert(name);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_literals_are_not_code() {
        let text = "a.f(\"x.g(\", r#\"y.h(\"#, '.', '\\'', b\"z.i(\", br#\"q.\"p(\"#);\n\
                    // c.j(\n/* d.k( /* nested */ e.l( */ m.n::<T>(x)\nfn q<'a>(s: &'a str) { s.o('x') }";
        let code = strip_comments_and_literals(text);
        assert_eq!(
            calls_in(&code, &[]),
            ["f", "n", "o"].iter().map(|s| s.to_string()).collect()
        );
        assert!(code.contains("&'a str"), "lifetimes stay: {code}");
        assert_eq!(code.lines().count(), text.lines().count());
    }

    #[test]
    fn only_inherent_methods_of_a_type_are_its_own() {
        let code = "impl<'a> Workspace<'a> {\n    pub fn files(&self) -> X { fn inner() {} }\n}\n\
                    impl Drop for Workspace<'_> { fn drop(&mut self) {} }\n\
                    trait T { fn t(&self); fn u(&self) {} }\n\
                    fn free(x: impl Fn()) {}\n\
                    impl crate::a::Pools<'_> where X: Y { async fn fill(&self) {} }";
        assert_eq!(
            methods_defined(code),
            vec![
                (Some("Workspace".to_owned()), "files".to_owned()),
                (None, "drop".to_owned()),
                (None, "t".to_owned()),
                (None, "u".to_owned()),
                (Some("Pools".to_owned()), "fill".to_owned()),
            ]
        );
    }

    #[test]
    fn calls_by_path_count_only_for_listed_types() {
        let code = "Self::a(x); Workspaces::b(); Other::c(); x..d(); f(); e.g::<u8>(); h.i;";
        assert_eq!(
            calls_in(code, &["Workspaces"]),
            ["a", "b", "g"].iter().map(|s| s.to_string()).collect()
        );
    }

    #[test]
    fn a_call_leans_on_the_module_defining_the_method() {
        let code: BTreeMap<String, String> = [
            (
                "workspaces::lifecycle",
                "impl Workspaces { pub fn start(&self) { self.start_maybe_warm(); \
                 self.running(); self.helper(); self.get(); self.stop(); } \
                 fn stop(&self) {} }",
            ),
            (
                "snapshots::warm",
                "impl Workspaces { fn start_maybe_warm(&self) { Self::start(self) } }\n\
                 impl Other { fn helper(&self) {} }",
            ),
            (
                "guest::files",
                "impl Workspaces { fn running(&self) {} fn helper(&self) {} fn get(&self) {} \
                 fn stat(&self) {} }",
            ),
            (
                "guest::processes",
                "impl ProcessInfo { fn running(&self) -> bool { true } }",
            ),
            ("guest", "impl Workspace<'_> { fn parent_method(&self) {} }"),
            (
                "guest::exec",
                "// self.stop()\nfn f(w: W) { w.parent_method(); w.running(); w.stat(); \
                 \"w.stop()\"; }",
            ),
        ]
        .iter()
        .map(|(m, t)| (m.to_string(), t.to_string()))
        .collect();
        let found = calls(&code, SERVICE_TYPES, &BTreeSet::new());
        let edge = |from: &str, to: &str| -> Vec<String> {
            found
                .edges
                .get(from)
                .and_then(|t| t.get(to))
                .map_or(Vec::new(), |n| n.iter().cloned().collect())
        };
        assert_eq!(
            edge("workspaces::lifecycle", "snapshots::warm"),
            ["start_maybe_warm"]
        );
        // `running` is defined in two modules of `guest`: the call leans
        // on `guest`, and is no edge from inside it.
        assert_eq!(edge("workspaces::lifecycle", "guest"), ["running"]);
        assert_eq!(edge("snapshots::warm", "workspaces::lifecycle"), ["start"]);
        assert_eq!(edge("guest::exec", "guest::files"), ["stat"]);
        // A parent's method, a method in a comment or a string: no edge.
        assert_eq!(found.edges["guest::exec"].len(), 1);
        assert!(!found.edges.contains_key("guest::files"));
        // `helper` is defined in two modules, `get` is too common.
        assert_eq!(
            found.ambiguous,
            ["get", "helper"].iter().map(|s| s.to_string()).collect()
        );
    }
}
