//! Repository rules on how the code is laid out and how its docs say so,
//! checked as tests (`cargo test -p xtask`): code names an item by the
//! module that defines it, docs/architecture.md names every folder, and the
//! module lists name every public module.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::cache::repo_root;
    use crate::modules::rust_files;

    /// The library crates whose code names an item by its defining module,
    /// never through the crate root's `pub use` (such a path is an arrow
    /// from a low layer up to lib.rs, which leans on everything).
    const NO_PATHS_THROUGH_THE_ROOT: &[&str] = &["crates/workspace/src", "crates/vmm-core/src"];

    /// Splits `a, b::{c, d}, e` at the commas outside braces.
    fn split_use_items(items: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let (mut depth, mut start) = (0usize, 0);
        for (i, c) in items.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    out.push(items[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(items[start..].trim());
        out.retain(|s| !s.is_empty());
        out
    }

    /// Expands one `use` tree (`a::{B, c::D as E}`) into (name, path) pairs.
    fn expand_use_tree(prefix: &str, tree: &str, out: &mut Vec<(String, String)>) {
        let tree = tree.trim();
        if let (Some(open), Some(close)) = (tree.find('{'), tree.rfind('}')) {
            let head = format!("{prefix}{}", &tree[..open]);
            for item in split_use_items(&tree[open + 1..close]) {
                expand_use_tree(&head, item, out);
            }
            return;
        }
        let (path, alias) = match tree.split_once(" as ") {
            Some((path, alias)) => (path.trim(), Some(alias.trim())),
            None => (tree, None),
        };
        let path = format!("{prefix}{path}");
        let name = alias.unwrap_or_else(|| path.rsplit("::").next().unwrap_or(&path));
        out.push((name.to_string(), path));
    }

    /// lib.rs's `pub use` items: each name with the path it is defined at
    /// (`crate::` for the crate's own modules), and the root modules' names.
    fn root_reexports(lib: &str) -> (Vec<(String, String)>, Vec<String>) {
        let code: String = lib
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| format!("{l}\n"))
            .collect();
        let modules: Vec<String> = code
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let rest = ["pub mod ", "pub(crate) mod ", "mod "]
                    .iter()
                    .find_map(|k| l.strip_prefix(k))?;
                Some(rest.strip_suffix(';')?.trim().to_string())
            })
            .collect();
        let mut names = Vec::new();
        for stmt in code.split("pub use ").skip(1) {
            let tree = stmt.split(';').next().unwrap_or_default();
            let tree = tree.split_whitespace().collect::<Vec<_>>().join(" ");
            expand_use_tree("", &tree, &mut names);
        }
        for (_, path) in &mut names {
            let first = path.split("::").next().unwrap_or_default();
            if modules.iter().any(|m| m == first) {
                *path = format!("crate::{path}");
            }
        }
        (names, modules)
    }

    /// Where `text` (a source file of the crate, not lib.rs) names a root
    /// re-export as `crate::Name` or in `crate::{.., Name, ..}`: (line,
    /// name). Comments are left out: a doc link names the public path.
    fn paths_through_the_root(
        text: &str,
        reexports: &[(String, String)],
        modules: &[String],
    ) -> Vec<(usize, String)> {
        let code: String = text
            .lines()
            .map(|l| {
                let comment = l.trim_start().starts_with("//");
                format!("{}\n", if comment { "" } else { l })
            })
            .collect();
        let is_reexport = |name: &str| reexports.iter().any(|(n, _)| n == name);
        let ident_end = |s: &str| {
            s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len())
        };
        let mut found = Vec::new();
        for (at, _) in code.match_indices("crate::") {
            let before = code[..at].chars().next_back().unwrap_or(' ');
            if before.is_ascii_alphanumeric() || before == '_' || before == ':' {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            let rest = &code[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1usize;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        depth = match c {
                            '{' => depth + 1,
                            '}' => depth - 1,
                            _ => depth,
                        };
                        depth == 0
                    })
                    .map_or(group.len(), |(i, _)| i);
                for item in split_use_items(&group[..end]) {
                    let name = &item[..ident_end(item)];
                    let whole = item[name.len()..].trim_start();
                    if is_reexport(name) && !whole.starts_with("::") {
                        found.push((line, name.to_string()));
                    }
                }
                continue;
            }
            let name = &rest[..ident_end(rest)];
            // `crate::m::..` with a module `m` of the same name is the module.
            let module_path =
                modules.iter().any(|m| m == name) && rest[name.len()..].starts_with("::");
            if is_reexport(name) && !module_path {
                found.push((line, name.to_string()));
            }
        }
        found
    }

    #[test]
    fn root_reexports_expand_and_paths_through_them_are_found() {
        let lib = "pub mod a;\nmod b;\n// pub use a::Hidden;\npub use a::{x::X, Y as Z};\npub use b::{\n    c,\n    D,\n};\npub use other_crate::E;\n";
        let (names, modules) = root_reexports(lib);
        assert_eq!(modules, ["a", "b"]);
        let pairs: Vec<(&str, &str)> = names
            .iter()
            .map(|(n, p)| (n.as_str(), p.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("X", "crate::a::x::X"),
                ("Z", "crate::a::Y"),
                ("c", "crate::b::c"),
                ("D", "crate::b::D"),
                ("E", "other_crate::E"),
            ]
        );
        let file = "use crate::X;\nuse crate::{a::x::X, Z};\n/// [`crate::D`]\nfn f() -> crate::D { crate::c(crate::b::c::g()) }\nuse crate::{\n    c,\n};\n";
        assert_eq!(
            paths_through_the_root(file, &names, &modules),
            [
                (1, "X".to_string()),
                (2, "Z".to_string()),
                (4, "D".to_string()),
                (4, "c".to_string()),
                (5, "c".to_string()),
            ]
        );
    }

    /// Code of a library crate names an item by the module that defines
    /// it; lib.rs's `pub use` lines are for the crate's users.
    #[test]
    fn library_code_names_items_by_their_defining_module() {
        let mut found = Vec::new();
        for src in NO_PATHS_THROUGH_THE_ROOT {
            let src = repo_root().join(src);
            let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
            let (reexports, modules) = root_reexports(&lib);
            let mut files = Vec::new();
            rust_files(&src, &mut files);
            for f in files.iter().filter(|f| **f != src.join("lib.rs")) {
                let text = std::fs::read_to_string(f).unwrap();
                for (line, name) in paths_through_the_root(&text, &reexports, &modules) {
                    let path = &reexports.iter().find(|(n, _)| *n == name).unwrap().1;
                    found.push(format!(
                        "{}:{line}: `crate::{name}` goes up through lib.rs's re-export; name `{path}`",
                        f.strip_prefix(repo_root()).unwrap_or(f).display()
                    ));
                }
            }
        }
        assert!(
            found.is_empty(),
            "name these by their defining module:\n{}",
            found.join("\n")
        );
    }

    /// Where docs/architecture.md looks for folders: each crate's folder
    /// and everything under it, and the guest programs' sources.
    const DOCUMENTED_FOLDER_ROOTS: &[&str] = &["crates", "xtask", "fuzz", "guest"];

    /// Every folder with a file in it under the roots (as
    /// `crates/workspace/src/store/`, from the repository root), without
    /// build output or hidden folders.
    fn source_folders() -> Vec<String> {
        fn walk(dir: &Path, out: &mut Vec<String>) -> bool {
            let mut has_file = false;
            let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            entries.sort();
            let at = out.len();
            for path in entries {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                if path.is_dir() {
                    if name != "target" && !name.starts_with('.') {
                        has_file |= walk(&path, out);
                    }
                } else {
                    has_file = true;
                }
            }
            if has_file {
                let rel = dir.strip_prefix(repo_root()).unwrap_or(dir);
                out.insert(at, format!("{}/", rel.display()));
            }
            has_file
        }
        let mut out = Vec::new();
        for root in DOCUMENTED_FOLDER_ROOTS {
            walk(&repo_root().join(root), &mut out);
        }
        // `crates/` itself holds only the crates.
        out.retain(|f| f != "crates/");
        out
    }

    /// The folders docs/architecture.md names: each `` `path/` `` under one
    /// of the roots.
    fn documented_folders(doc: &str) -> Vec<String> {
        doc.split('`')
            .skip(1)
            .step_by(2)
            .filter(|s| s.ends_with('/') && !s.contains(' '))
            .filter(|s| {
                DOCUMENTED_FOLDER_ROOTS
                    .iter()
                    .any(|r| s.starts_with(&format!("{r}/")))
            })
            .map(str::to_string)
            .collect()
    }

    /// docs/architecture.md says what each folder is for: it names every
    /// folder of the crates and the guest sources (as
    /// `` `crates/workspace/src/store/` ``) and no folder that is gone.
    #[test]
    fn architecture_doc_names_every_folder() {
        let doc = std::fs::read_to_string(repo_root().join("docs/architecture.md")).unwrap();
        let named = documented_folders(&doc);
        let folders = source_folders();
        assert!(folders.len() > 20, "{folders:?}");
        let mut problems = Vec::new();
        for f in &folders {
            if !named.contains(f) {
                problems.push(format!(
                    "add `{f}` to docs/architecture.md with a line on what it holds"
                ));
            }
        }
        for n in &named {
            if !folders.contains(n) {
                problems.push(format!(
                    "remove `{n}` from docs/architecture.md (no such folder), or name where it went"
                ));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// The files whose top docs list their public modules, each as
    /// `` [`name`] ``.
    const MODULE_LISTS: &[&str] = &["crates/workspace/src/lib.rs", "crates/mcp/src/tools/mod.rs"];

    #[test]
    fn module_lists_name_every_public_module() {
        let mut problems = Vec::new();
        for file in MODULE_LISTS {
            let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
            let docs: String = text
                .lines()
                .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
                .collect();
            let mut previous = "";
            for line in text.lines() {
                // A module only tests build is not part of the list.
                let test_only = previous.starts_with("#[cfg(") && previous.contains("test");
                previous = line.trim();
                let Some(name) = line
                    .trim()
                    .strip_prefix("pub mod ")
                    .and_then(|r| r.strip_suffix(';'))
                else {
                    continue;
                };
                if test_only {
                    continue;
                }
                if !docs.contains(&format!("[`{name}`]")) {
                    problems.push(format!(
                        "{file}: its top docs do not name [`{name}`]; say in a few words what it is"
                    ));
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
