//! Repository rules checked as a test (`cargo test -p xtask`).

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::cache::repo_root;

    const MAX_LINES: usize = 800;

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    rust_files(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every Cargo.toml of the workspace's crates.
    fn crate_manifests() -> Vec<PathBuf> {
        let mut manifests = vec![repo_root().join("xtask/Cargo.toml")];
        for entry in std::fs::read_dir(repo_root().join("crates"))
            .unwrap()
            .flatten()
        {
            manifests.push(entry.path().join("Cargo.toml"));
        }
        manifests
    }

    #[test]
    fn source_files_stay_small() {
        let files = all_rust_files();
        assert!(files.len() > 10);
        let long: Vec<String> = files
            .iter()
            .filter_map(|f| {
                let n = std::fs::read_to_string(f).unwrap().lines().count();
                (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.display()))
            })
            .collect();
        assert!(
            long.is_empty(),
            "split these into modules of one concern each: {long:?}"
        );
    }

    /// Each public type name is defined once in the whole workspace, so a
    /// name says which thing it is (the library's `Exited` and the wire's
    /// `ExecExit`, not two `Exited`s).
    #[test]
    fn public_type_names_are_used_once() {
        let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for f in all_rust_files() {
            let text = std::fs::read_to_string(&f).unwrap();
            for line in text.lines() {
                let line = line.trim_start();
                let Some(rest) = ["pub struct ", "pub enum ", "pub trait ", "pub type "]
                    .iter()
                    .find_map(|k| line.strip_prefix(k))
                else {
                    continue;
                };
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                seen.entry(name).or_default().push(f.display().to_string());
            }
        }
        assert!(seen.len() > 100, "{}", seen.len());
        let twice: Vec<String> = seen
            .into_iter()
            .filter(|(_, files)| files.len() > 1)
            .map(|(name, files)| format!("{name}: {}", files.join(", ")))
            .collect();
        assert!(
            twice.is_empty(),
            "give each its own name:\n{}",
            twice.join("\n")
        );
    }

    #[test]
    fn every_crate_uses_the_workspace_lints() {
        let manifests = crate_manifests();
        for m in manifests {
            let text = std::fs::read_to_string(&m).unwrap();
            assert!(
                text.contains("[lints]\nworkspace = true"),
                "{} must inherit [workspace.lints]",
                m.display()
            );
        }
    }

    #[test]
    fn guest_physical_addresses_live_in_layout() {
        // A literal address handed to GuestAddress outside layout.rs (and
        // outside tests and harnesses) should be a named layout constant.
        let mut files = Vec::new();
        rust_files(&repo_root().join("crates/vmm-core/src"), &mut files);
        for f in files {
            let harness = f.ends_with("fuzz.rs")
                || f.to_string_lossy().ends_with("_tests.rs")
                || f.components().any(|c| c.as_os_str() == "tests");
            if harness || f.ends_with("layout.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (i, line) in code.lines().enumerate() {
                let literal = line.split("GuestAddress(").skip(1).any(|rest| {
                    rest.trim_start().starts_with(|c: char| c.is_ascii_digit())
                        && !rest.starts_with("0)")
                });
                assert!(
                    !literal,
                    "{}:{}: literal guest address; name it in layout.rs",
                    f.display(),
                    i + 1
                );
            }
        }
    }

    fn all_rust_files() -> Vec<PathBuf> {
        let mut files = Vec::new();
        for dir in ["crates", "xtask", "fuzz/fuzz_targets"] {
            rust_files(&repo_root().join(dir), &mut files);
        }
        files
    }

    /// The part of a file that is not tests or comments, with line numbers.
    fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        code.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with("//"))
            .map(|(i, l)| (i + 1, l))
    }

    #[test]
    fn every_source_file_says_what_it_is() {
        let missing: Vec<String> = all_rust_files()
            .iter()
            .filter(|f| !std::fs::read_to_string(f).unwrap().starts_with("//!"))
            .map(|f| f.display().to_string())
            .collect();
        assert!(
            missing.is_empty(),
            "start these with a `//!` line saying what the file is: {missing:?}"
        );
    }

    #[test]
    fn core_crates_do_not_name_front_end_commands() {
        // The library names a remedy (workspace::Remedy); each front end
        // says it in its own words.
        const FRONT_END_WORDS: &[&str] = &[
            "`microagent ",
            " tool)",
            "the workspace_",
            "the image_",
            "force: true",
            "--force",
        ];
        let mut files = Vec::new();
        for dir in ["crates/vmm-core/src", "crates/workspace/src"] {
            rust_files(&repo_root().join(dir), &mut files);
        }
        let mut found = Vec::new();
        for f in files
            .iter()
            .filter(|f| !f.to_string_lossy().ends_with("_tests.rs"))
        {
            let text = std::fs::read_to_string(f).unwrap();
            for (n, line) in code_lines(&text) {
                if FRONT_END_WORDS.iter().any(|w| line.contains(w)) {
                    found.push(format!("{}:{n}: {}", f.display(), line.trim()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "core crates name what failed and a Remedy, not front-end commands:\n{}",
            found.join("\n")
        );
    }

    /// The CLI shows text from guests, images, registries and MCP clients
    /// only through its one escaper (`output::field`, `output::inert`,
    /// `output::guest_text`; `output::table` escapes every cell): a print
    /// that names a field known to carry such text must use one of them.
    #[test]
    fn the_cli_prints_outside_text_escaped() {
        const OUTSIDE_FIELDS: &[&str] = &[
            ".summary",
            ".reason",
            ".message",
            ".conflicts",
            ".console_tail",
            ".denials",
            ".labels",
            ".title",
            ".url",
            ".snapshot",
            ".version",
            ".manifest",
            ".boot_args",
            ".branch",
            ".description",
            ".error",
            ".left_out",
            "diff",
        ];
        const ESCAPERS: &[&str] = &["output::field", "output::inert", "output::guest_text", "f("];
        const PRINTS: &[&str] = &[
            "println!(",
            "eprintln!(",
            "print!(",
            "eprint!(",
            "writeln!(",
        ];
        let mut files = Vec::new();
        rust_files(&repo_root().join("crates/cli/src"), &mut files);
        let mut found = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let code: String = code_lines(&text).map(|(_, l)| format!("{l}\n")).collect();
            let mut rest = code.as_str();
            while let Some(at) = PRINTS.iter().filter_map(|p| rest.find(p)).min() {
                // The macro's arguments, to its closing parenthesis.
                let call = &rest[at..];
                let mut depth = 0usize;
                let mut end = call.len();
                for (i, c) in call.char_indices() {
                    match c {
                        '(' => depth += 1,
                        ')' if depth <= 1 => {
                            end = i + 1;
                            break;
                        }
                        ')' => depth -= 1,
                        _ => {}
                    }
                }
                let args = &call[..end];
                // `.url` the field, not `.url()` or `.url_of`.
                let names_outside = OUTSIDE_FIELDS.iter().any(|field| {
                    args.match_indices(field).any(|(i, _)| {
                        let next = args[i + field.len()..].chars().next().unwrap_or(' ');
                        !(next.is_alphanumeric() || next == '_' || next == '(')
                    })
                });
                if names_outside && !ESCAPERS.iter().any(|e| args.contains(e)) {
                    let line = args.lines().next().unwrap_or_default().trim();
                    found.push(format!("{}: {line}", f.display()));
                }
                rest = &call[end.max(1)..];
            }
        }
        assert!(
            found.is_empty(),
            "print these through crate::output::field (or inert for multi-line text):\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn only_binaries_end_the_process() {
        let mut found = Vec::new();
        for f in all_rust_files() {
            let binary = f.ends_with("src/main.rs")
                || f.components().any(|c| c.as_os_str() == "bin")
                || f.starts_with(repo_root().join("xtask"));
            if binary {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            for (n, line) in code_lines(&text) {
                if line.contains("process::exit(") {
                    found.push(format!("{}:{n}", f.display()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "return to the binary's main instead of exiting: {found:?}"
        );
    }

    #[test]
    fn internal_dependencies_go_through_the_workspace() {
        let manifests = crate_manifests();
        for m in manifests {
            let text = std::fs::read_to_string(&m).unwrap();
            let direct: Vec<&str> = text.lines().filter(|l| l.contains("{ path =")).collect();
            assert!(
                direct.is_empty(),
                "{}: {direct:?}: declare the crate in [workspace.dependencies] and use `.workspace = true`",
                m.display()
            );
        }
    }

    #[test]
    fn no_crate_has_a_module_cycle() {
        let mut sources = crate::modules::crate_sources(&repo_root());
        sources.push(("xtask".into(), repo_root().join("xtask/src")));
        assert!(sources.len() > 5);
        let mut found = Vec::new();
        for (name, src) in sources {
            for group in crate::modules::graph(&src).cycles() {
                found.push(format!("{name}: {}", group.join(" <-> ")));
            }
        }
        assert!(
            found.is_empty(),
            "module cycles (`cargo xtask modules` lists the edges in each); \
             move what both sides need below them:\n{}",
            found.join("\n")
        );
    }

    /// Folders are layers: no two modules at one level (top-level
    /// modules and folders, a folder's files and subfolders) lean on each
    /// other through anything under them.
    #[test]
    fn no_folder_leans_on_what_leans_on_it() {
        let mut sources = crate::modules::crate_sources(&repo_root());
        sources.push(("xtask".into(), repo_root().join("xtask/src")));
        let mut found = Vec::new();
        for (name, src) in sources {
            for (parent, group) in crate::modules::graph(&src).folder_cycles() {
                let at = if parent.is_empty() { "src" } else { &parent };
                found.push(format!("{name}: in {at}: {}", group.join(" <-> ")));
            }
        }
        assert!(
            found.is_empty(),
            "folders that lean on each other (`cargo xtask modules` lists them); \
             move what both need below both:\n{}",
            found.join("\n")
        );
    }

    /// The VMM process carries only the VMM: the `microagent-vmm` package's
    /// normal dependencies have no async runtime, command-line parser or
    /// MCP server (each would sit in every running workspace's memory).
    #[test]
    fn the_vmm_package_has_no_front_end_dependencies() {
        let out = std::process::Command::new(env!("CARGO"))
            .args([
                "tree",
                "--offline",
                "-p",
                "microagent-vmm",
                "-e",
                "normal",
                "--prefix",
                "none",
                "--format",
                "{p}",
            ])
            .current_dir(repo_root())
            .output()
            .expect("running cargo tree");
        assert!(
            out.status.success(),
            "cargo tree: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tree = String::from_utf8_lossy(&out.stdout);
        assert!(tree.contains("vmm-core"), "{tree}");
        let banned: Vec<&str> = tree
            .lines()
            .filter(|l| {
                let name = l.split_whitespace().next().unwrap_or("");
                ["tokio", "clap", "rmcp", "oci-client"].contains(&name)
            })
            .collect();
        assert!(
            banned.is_empty(),
            "microagent-vmm depends on {banned:?}; keep crates/vmm-host on the \
             `workspace` crate without its `client` feature"
        );
    }

    /// A library crate is folders of concerns: no level of its `src` holds
    /// more than this many source files.
    const MAX_FILES_PER_FOLDER: usize = 15;

    #[test]
    fn library_folders_stay_small() {
        let mut found = Vec::new();
        for (name, src) in crate::modules::crate_sources(&repo_root()) {
            if !src.join("lib.rs").is_file() {
                continue;
            }
            for (dir, n) in crate::modules::files_per_folder(&src) {
                if n > MAX_FILES_PER_FOLDER {
                    found.push(format!("crates/{name}/src/{}: {n} files", dir.display()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "group these into folders of one concern each (at most {MAX_FILES_PER_FOLDER} files a level): {found:?}"
        );
    }

    #[test]
    fn no_module_is_included_by_path() {
        // A file past the size limit is split by concern, not kept under it
        // by moving its tests to a sibling; test support is shared through
        // testkit, not included across crates.
        let found: Vec<String> = all_rust_files()
            .iter()
            .filter(|f| !f.ends_with("xtask/src/tidy.rs"))
            .filter_map(|f| {
                let text = std::fs::read_to_string(f).unwrap();
                text.lines()
                    .position(|l| l.trim_start().starts_with("#[path"))
                    .map(|n| format!("{}:{}", f.display(), n + 1))
            })
            .collect();
        assert!(found.is_empty(), "modules included by #[path]: {found:?}");
    }

    /// Host tools that read what a guest or an image made run only through
    /// `workspace::host_tool` (program-naming config overridden, memory,
    /// file size and time bounded): no other code starts them.
    #[test]
    fn host_tools_run_through_one_runner() {
        const TOOLS: &[&str] = &["git", "debugfs", "mkfs.ext4", "fakeroot"];
        let runner = repo_root().join("crates/workspace/src/host_tool.rs");
        let listed = std::fs::read_to_string(&runner).unwrap();
        for tool in TOOLS {
            assert!(
                listed.contains(&format!("\"{tool}\"")),
                "{tool} is not in host_tool's CONFINED_TOOLS"
            );
        }
        let mut found = Vec::new();
        for f in all_rust_files() {
            let path = f.to_string_lossy();
            let test_file = path.ends_with("_tests.rs")
                || path.ends_with("/tests.rs")
                || path.contains("/tests/")
                || path.contains("crates/testkit/");
            if f == runner || test_file || f.starts_with(repo_root().join("xtask")) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            for (n, line) in code_lines(&text) {
                let names_tool = |t: &&str| line.contains(&format!("\"{t}\""));
                let spawns = line.contains("Command::new(") && TOOLS.iter().any(names_tool);
                // Asking whether a tool is installed is fine; finding its
                // path to start it is the runner's.
                let finds = line.contains("host_tool(")
                    && TOOLS.iter().any(names_tool)
                    && !line.contains(".is_none()")
                    && !line.contains(".is_some()");
                if spawns || finds {
                    found.push(format!("{}:{n}: {}", f.display(), line.trim()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "run these through workspace::host_tool::HostTool:\n{}",
            found.join("\n")
        );
    }

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

    /// docs/security.md's trust-boundary inventory: every row names at
    /// least one test that feeds that boundary hostile input, and each
    /// named test exists.
    #[test]
    fn every_trust_boundary_has_its_hostile_test() {
        let doc = std::fs::read_to_string(repo_root().join("docs/security.md")).unwrap();
        let section = doc
            .split("\n## Trust-boundary inventory")
            .nth(1)
            .expect("docs/security.md has a `## Trust-boundary inventory` section");
        let section = section.split("\n## ").next().unwrap();
        let rows: Vec<&str> = section
            .lines()
            .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| what"))
            .collect();
        assert!(
            rows.len() >= 20,
            "the inventory has only {} rows",
            rows.len()
        );
        let mut sources = String::new();
        for f in all_rust_files() {
            sources.push_str(&std::fs::read_to_string(&f).unwrap());
        }
        let mut problems = Vec::new();
        for row in rows {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
            let tests = cells.last().copied().unwrap_or("");
            let names: Vec<&str> = tests
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|n| !n.is_empty())
                .collect();
            if names.is_empty() {
                problems.push(format!("no test named: {row}"));
            }
            for name in names {
                if !sources.contains(&format!("fn {name}(")) {
                    problems.push(format!("no `fn {name}` in the tree: {row}"));
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
