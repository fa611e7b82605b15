//! `cargo xtask modules`: each crate's module graph, read from its
//! `use crate::`/`super::` paths, with the cycles in it and the number of
//! source files per folder. The tidy rules fail on what this finds.
//!
//! A module here is a source file (`a/b.rs` or `a/b/mod.rs` is `a::b`);
//! test code (`#[cfg(test)]` onwards, `*_tests.rs`) is left out. An edge
//! `a -> b` means `a` names something of `b`; a module naming one of its
//! ancestors is not an edge (a child builds on its parent's items, and the
//! parent re-exports its children), but a path through a re-export counts
//! for the module that defines the item. [`Graph::with_calls`] adds the
//! calls of the central types' methods (`call_edges`) as edges too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::call_edges::{self, Calls};

/// One crate's modules and what each names.
#[derive(Debug, Default, Clone)]
pub struct Graph {
    /// Module path (`""` is the crate root) to the modules it uses.
    pub edges: BTreeMap<String, BTreeSet<String>>,
    /// The call edges among `edges` (empty until [`Graph::with_calls`]).
    pub calls: Calls,
}

/// The `src` directories of the crates under `crates/`, by crate folder.
pub fn crate_sources(root: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root.join("crates")) {
        for entry in entries.flatten() {
            let src = entry.path().join("src");
            if src.is_dir() {
                out.push((entry.file_name().to_string_lossy().into_owned(), src));
            }
        }
    }
    out.sort();
    out
}

/// The crates whose methods make a call by the same name ambiguous: the
/// base crate was split off the library, so a name both define is as
/// ambiguous as when both were one crate. (The guest agent's client and
/// vmm-core are left out: their method names mirror the handle's, and
/// counting them would hide the handle's calls.)
const SHARED_CRATES: &[&str] = &["base"];

/// The method names defined in the [`SHARED_CRATES`] the crate at `src`
/// depends on (keys of its manifest's `[dependencies]`).
fn dependency_methods(src: &Path) -> BTreeSet<String> {
    let Some(crate_dir) = src.parent() else {
        return BTreeSet::new();
    };
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap_or_default();
    let deps: BTreeSet<&str> = manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .flat_map(|section| section.lines().skip(1))
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .collect();
    let Some(crates) = crate_dir.parent() else {
        return BTreeSet::new();
    };
    let mut names = BTreeSet::new();
    for (folder, dep_src) in crate_sources(crates.parent().unwrap_or(crates)) {
        if deps.contains(folder.as_str()) && SHARED_CRATES.contains(&folder.as_str()) {
            for (_, text) in sources(&dep_src) {
                let code = call_edges::strip_comments_and_literals(&text);
                names.extend(
                    call_edges::methods_defined(&code)
                        .into_iter()
                        .map(|(_, n)| n),
                );
            }
        }
    }
    names
}

/// The module path of a source file relative to `src`, or `None` for a
/// test file or a second binary root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let name = rel.to_string_lossy().replace('\\', "/");
    if name.ends_with("_tests.rs") || name.split('/').any(|p| p == "tests") {
        return None;
    }
    let trimmed = name.strip_suffix(".rs")?;
    let parts: Vec<&str> = trimmed.split('/').collect();
    let parts = match parts.as_slice() {
        ["lib"] | ["main"] => return Some(String::new()),
        ["bin", ..] => return None,
        [rest @ .., "mod"] => rest.to_vec(),
        all => all.to_vec(),
    };
    Some(parts.join("::"))
}

/// Every `.rs` file under `dir`.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
}

/// The code of a file without its tests and comments.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands one `use` tree (`crate::{a, b::{C, D}}`) into its full paths.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = drop_aliases(tree)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = tree[open + 1..]
        .strip_suffix('}')
        .unwrap_or(&tree[open + 1..]);
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand_use(&format!("{prefix}{p}")))
        .collect()
}

/// A use tree without its `as NAME` renames.
fn drop_aliases(tree: &str) -> String {
    let mut out = String::new();
    let mut rest = tree;
    while let Some(i) = rest.find(" as ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 4..];
        let end = after.find([',', '}']).unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every path the code names, as written: the trees of its `use`
/// statements, expanded, and `crate::`/`super::` paths in expressions.
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    let mut outside_uses = String::new();
    while let Some(at) = find_use(rest) {
        outside_uses.push_str(&rest[..at]);
        let after = &rest[at..];
        let start = after.find("use ").map_or(0, |i| i + 4);
        let end = after.find(';').unwrap_or(after.len());
        paths.extend(expand_use(&after[start..end]));
        rest = &after[(end + 1).min(after.len())..];
    }
    outside_uses.push_str(rest);
    for anchor in ["crate::", "super::"] {
        let mut text = outside_uses.as_str();
        while let Some(i) = text.find(anchor) {
            let before = text[..i].chars().next_back();
            let tail = &text[i..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                paths.push(tail[..len].trim_end_matches(':').to_owned());
            }
            text = &tail[len.max(anchor.len())..];
        }
    }
    paths
}

/// Where the next `use` statement starts (at a line's start, any `pub`).
fn find_use(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let body = trimmed
            .strip_prefix("pub(crate) ")
            .or_else(|| trimmed.strip_prefix("pub(super) "))
            .or_else(|| trimmed.strip_prefix("pub "))
            .unwrap_or(trimmed);
        if body.starts_with("use ") {
            return Some(offset + (line.len() - trimmed.len()));
        }
        offset += line.len();
    }
    None
}

/// Resolves a named path to the module that defines it, from `module`.
fn resolve(
    module: &str,
    path: &str,
    modules: &BTreeSet<String>,
    reexports: &BTreeMap<String, BTreeMap<String, String>>,
) -> Option<String> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<&str> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").collect()
    };
    match segments.first() {
        Some(&"crate") => {
            base.clear();
            segments.remove(0);
        }
        Some(&"super") => {
            while segments.first() == Some(&"super") {
                base.pop()?;
                segments.remove(0);
            }
        }
        _ => return None,
    }
    // The longest prefix that is a module, then a re-export from it.
    let mut current = base.join("::");
    for seg in segments {
        let next = if current.is_empty() {
            seg.to_owned()
        } else {
            format!("{current}::{seg}")
        };
        if modules.contains(&next) {
            current = next;
            continue;
        }
        if let Some(real) = reexports.get(&current).and_then(|r| r.get(seg)) {
            return Some(real.clone());
        }
        break;
    }
    Some(current)
}

/// Names a module re-exports (`pub use child::Name;`), to the module the
/// path resolves to.
fn reexports_of(module: &str, code: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in code.split(';') {
        let trimmed = line.trim_start();
        let Some(tree) = trimmed
            .strip_prefix("pub use ")
            .or_else(|| trimmed.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        for full in expand_use(tree) {
            let name = full.rsplit("::").next().unwrap_or("").to_owned();
            let rel = full
                .strip_prefix("self::")
                .or_else(|| full.strip_prefix("crate::"))
                .unwrap_or(&full);
            // The longest module prefix of the path, relative to `module`
            // (or to the root for `crate::`).
            let mut owner = None;
            let segs: Vec<&str> = rel.split("::").collect();
            for n in (1..segs.len()).rev() {
                let cand = segs[..n].join("::");
                let cand = if module.is_empty() || full.starts_with("crate::") {
                    cand
                } else {
                    format!("{module}::{cand}")
                };
                if modules.contains(&cand) {
                    owner = Some(cand);
                    break;
                }
            }
            if let Some(owner) = owner {
                out.insert(name, owner);
            }
        }
    }
    out
}

/// Paths through a child module named without `self::` (`steps::run()`
/// in the parent of `steps`), as `crate::` paths.
fn child_paths(module: &str, code: &str, modules: &BTreeSet<String>) -> Vec<String> {
    let prefix = if module.is_empty() {
        String::new()
    } else {
        format!("{module}::")
    };
    let children = modules.iter().filter_map(|m| {
        let rest = m.strip_prefix(&prefix)?;
        (!rest.is_empty() && !rest.contains("::")).then_some(rest)
    });
    let mut out = Vec::new();
    for child in children {
        let needle = format!("{child}::");
        let mut text = code;
        while let Some(i) = text.find(&needle) {
            let before = text[..i].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                out.push(format!("crate::{prefix}{child}"));
            }
            text = &text[i + needle.len()..];
        }
    }
    out
}

/// Each module's source text under `src`, by module path.
fn sources(src: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for f in &files {
        if let Some(m) = module_of(src, f) {
            out.insert(m, std::fs::read_to_string(f).unwrap_or_default());
        }
    }
    out
}

/// Reads the module graph of the crate whose sources are in `src`.
pub fn graph(src: &Path) -> Graph {
    let code: BTreeMap<String, String> = sources(src)
        .into_iter()
        .map(|(m, text)| (m, code_of(&text)))
        .collect();
    let modules: BTreeSet<String> = code.keys().cloned().collect();
    let reexports: BTreeMap<_, _> = code
        .iter()
        .map(|(m, c)| (m.clone(), reexports_of(m, c, &modules)))
        .collect();
    let mut g = Graph::default();
    for (module, text) in &code {
        let targets = g.edges.entry(module.clone()).or_default();
        let mut paths = named_paths(text);
        paths.extend(child_paths(module, text, &modules));
        for path in paths {
            let Some(target) = resolve(module, &path, &modules, &reexports) else {
                continue;
            };
            let ancestor = target.is_empty()
                || *module == target
                || module.starts_with(&format!("{target}::"));
            if !ancestor {
                targets.insert(target);
            }
        }
    }
    g
}

impl Graph {
    /// The graph with the calls of [`call_edges::SERVICE_TYPES`]' methods
    /// in the crate at `src` added as edges (and kept in `calls`).
    pub fn with_calls(mut self, src: &Path) -> Graph {
        let code: BTreeMap<String, String> = sources(src)
            .into_iter()
            .map(|(m, text)| {
                let code = text.split("#[cfg(test)]").next().unwrap_or("").to_owned();
                (m, code)
            })
            .collect();
        self.calls = call_edges::calls(&code, call_edges::SERVICE_TYPES, &dependency_methods(src));
        for (from, targets) in &self.calls.edges {
            let out = self.edges.entry(from.clone()).or_default();
            out.extend(targets.keys().cloned());
        }
        self
    }

    /// The calls that make up the edges from `a` to `b` among the children
    /// of `parent` (each child standing for everything under it), as
    /// "workspaces::lifecycle calls `start_maybe_warm` of snapshots::warm".
    pub fn calls_between(&self, parent: &str, a: &str, b: &str) -> Vec<String> {
        let under = |m: &str, child: &str| {
            let full = if parent.is_empty() {
                child.to_owned()
            } else {
                format!("{parent}::{child}")
            };
            m == full || m.starts_with(&format!("{full}::"))
        };
        let mut out = Vec::new();
        for (from, targets) in &self.calls.edges {
            if !under(from, a) {
                continue;
            }
            for (to, names) in targets {
                if under(to, b) {
                    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                    out.push(format!("{from} calls {} of {to}", names.join(", ")));
                }
            }
        }
        out
    }

    /// Each strongly connected group of two or more modules (Tarjan).
    pub fn cycles(&self) -> Vec<Vec<String>> {
        struct State<'a> {
            g: &'a Graph,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            on_stack: BTreeSet<&'a str>,
            out: Vec<Vec<String>>,
        }
        fn visit<'a>(s: &mut State<'a>, v: &'a str) {
            let i = s.index.len();
            s.index.insert(v, i);
            s.low.insert(v, i);
            s.stack.push(v);
            s.on_stack.insert(v);
            if let Some(targets) = s.g.edges.get(v) {
                for w in targets {
                    let w = w.as_str();
                    if !s.index.contains_key(w) {
                        visit(s, w);
                        let lw = s.low[w];
                        let lv = s.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(lw);
                    } else if s.on_stack.contains(w) {
                        let iw = s.index[w];
                        let lv = s.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(iw);
                    }
                }
            }
            if s.low[v] == s.index[v] {
                let mut group = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    group.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    s.out.push(group);
                }
            }
        }
        let mut s = State {
            g: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            out: Vec::new(),
        };
        for v in self.edges.keys() {
            if !s.index.contains_key(v.as_str()) {
                visit(&mut s, v);
            }
        }
        s.out.sort();
        s.out
    }
}

impl Graph {
    /// The graph among the children of module `parent` (`""` the root):
    /// each child stands for itself and every module under it, so an edge
    /// `a -> b` means something under `a` names something under `b`.
    fn among_children(&self, parent: &str) -> Graph {
        let prefix = if parent.is_empty() {
            String::new()
        } else {
            format!("{parent}::")
        };
        let child = |m: &str| -> Option<String> {
            let rest = m.strip_prefix(&prefix)?;
            let first = rest.split("::").next()?;
            (!first.is_empty()).then(|| first.to_owned())
        };
        let mut g = Graph::default();
        for (from, targets) in &self.edges {
            let Some(a) = child(from) else { continue };
            let out = g.edges.entry(a.clone()).or_default();
            for to in targets {
                if let Some(b) = child(to) {
                    if b != a {
                        out.insert(b);
                    }
                }
            }
        }
        g
    }

    /// The cycles among the children of every module with children (the
    /// root's top-level modules and folders, each folder's files and
    /// subfolders), as (the parent, the group): a folder is one concern
    /// only if what is in it does not also lean on what leans on it.
    pub fn folder_cycles(&self) -> Vec<(String, Vec<String>)> {
        let mut parents: BTreeSet<String> = BTreeSet::from([String::new()]);
        for m in self.edges.keys() {
            let parts: Vec<&str> = m.split("::").collect();
            for n in 1..parts.len() {
                parents.insert(parts[..n].join("::"));
            }
        }
        let mut out = Vec::new();
        for parent in parents {
            for group in self.among_children(&parent).cycles() {
                out.push((parent.clone(), group));
            }
        }
        out
    }
}

/// Source files (`.rs`, tests included) directly in each folder under `src`.
pub fn files_per_folder(src: &Path) -> BTreeMap<PathBuf, usize> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let dir = f.parent().unwrap_or(src);
        let rel = dir.strip_prefix(src).unwrap_or(dir).to_path_buf();
        *out.entry(rel).or_insert(0) += 1;
    }
    out
}

/// `cargo xtask modules [--edges]`: prints each crate's cycles and folder
/// sizes (or every edge, the call edges marked as such).
pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let all_edges = args.iter().any(|a| a == "--edges");
    let mut cycles = 0;
    for (name, src) in crate_sources(root) {
        let g = graph(&src);
        let with_calls = g.clone().with_calls(&src);
        if all_edges {
            for (from, targets) in &g.edges {
                for to in targets {
                    println!("{name}: {from} -> {to}");
                }
            }
            for (from, targets) in &with_calls.calls.edges {
                for (to, names) in targets {
                    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                    println!("{name}: {from} -> {to} (calls {})", names.join(", "));
                }
            }
            if !with_calls.calls.ambiguous.is_empty() {
                let names: Vec<&str> = with_calls
                    .calls
                    .ambiguous
                    .iter()
                    .map(String::as_str)
                    .collect();
                println!(
                    "{name}: calls not followed (ambiguous names): {}",
                    names.join(", ")
                );
            }
            continue;
        }
        let found = g.cycles();
        let edges: usize = g.edges.values().map(BTreeSet::len).sum();
        println!(
            "{name}: {} modules, {edges} edges, {} cycles",
            g.edges.len(),
            found.len()
        );
        for (dir, n) in files_per_folder(&src) {
            println!("  src/{}: {n} files", dir.display());
        }
        for group in &found {
            let shown: Vec<&str> = group
                .iter()
                .map(|m| if m.is_empty() { "(root)" } else { m.as_str() })
                .collect();
            println!("  cycle: {}", shown.join(" <-> "));
            for from in group {
                let inside: Vec<&str> = g.edges[from]
                    .iter()
                    .filter(|to| group.contains(to))
                    .map(String::as_str)
                    .collect();
                println!("    {from} -> {}", inside.join(", "));
            }
        }
        cycles += found.len();
        let folders = with_calls.folder_cycles();
        for (parent, group) in &folders {
            let at = if parent.is_empty() { "(root)" } else { parent };
            println!(
                "  cycle among the children of {at}: {}",
                group.join(" <-> ")
            );
            for a in group {
                for b in group.iter().filter(|b| *b != a) {
                    for call in with_calls.calls_between(parent, a, b) {
                        println!("    {call}");
                    }
                }
            }
        }
        cycles += folders.len();
    }
    if cycles > 0 {
        anyhow::bail!("{cycles} module cycles");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_that_lean_on_each_other_are_a_cycle() {
        // net::inner -> store::spec and store::spec -> net::ports: no two
        // files form a cycle, but the folders `net` and `store` do.
        let mut g = Graph::default();
        let edge = |g: &mut Graph, a: &str, b: &str| {
            g.edges
                .entry(a.to_owned())
                .or_default()
                .insert(b.to_owned());
            g.edges.entry(b.to_owned()).or_default();
        };
        edge(&mut g, "net::inner", "store::spec");
        edge(&mut g, "store::spec", "net::ports");
        edge(&mut g, "store::spec", "store::name");
        assert!(g.cycles().is_empty());
        assert_eq!(
            g.folder_cycles(),
            vec![(String::new(), vec!["net".to_owned(), "store".to_owned()])]
        );
        // Within a folder, files are children too.
        edge(&mut g, "store::name", "store::spec");
        assert!(g.folder_cycles().contains(&(
            "store".to_owned(),
            vec!["name".to_owned(), "spec".to_owned()]
        )));
    }

    #[test]
    fn use_trees_expand() {
        assert_eq!(
            expand_use("crate::{a, b::{C, D}, e::F as G}"),
            ["crate::a", "crate::b::C", "crate::b::D", "crate::e::F"]
        );
    }

    #[test]
    fn paths_resolve_through_modules_and_reexports() {
        let modules: BTreeSet<String> = ["", "a", "a::x", "b", "c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut reexports = BTreeMap::new();
        reexports.insert(
            String::new(),
            reexports_of("", "pub use c::Thing;\npub use a::x::{Y, Z};", &modules),
        );
        let r = |m: &str, p: &str| resolve(m, p, &modules, &reexports);
        assert_eq!(r("b", "crate::a::x::f").as_deref(), Some("a::x"));
        assert_eq!(r("b", "crate::Thing").as_deref(), Some("c"));
        assert_eq!(r("b", "crate::Z").as_deref(), Some("a::x"));
        assert_eq!(r("a::x", "super::super::b::f").as_deref(), Some("b"));
        assert_eq!(r("b", "std::fs").as_deref(), None);
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        let dir = std::env::temp_dir().join(format!("xtask-modules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("net")).unwrap();
        let write = |p: &str, t: &str| std::fs::write(dir.join(p), t).unwrap();
        write("lib.rs", "mod a; mod b; mod net;\npub use a::A;\n");
        write("a.rs", "use crate::b::B;\n");
        write("b.rs", "fn f() -> crate::A { todo() }\n");
        write("net/mod.rs", "mod inner; pub use inner::N;\n");
        write(
            "net/inner.rs",
            "use super::super::a::A;\n#[cfg(test)]\nuse crate::b;\n",
        );
        let g = graph(&dir);
        assert_eq!(g.cycles(), vec![vec!["a".to_owned(), "b".to_owned()]]);
        assert!(g
            .folder_cycles()
            .contains(&(String::new(), vec!["a".to_owned(), "b".to_owned()])));
        assert!(g.edges["net::inner"].contains("a"));
        assert!(
            !g.edges["net::inner"].contains("b"),
            "test code is left out"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
