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
        const HOST_ADMIN: &[&str] = &["`microagent setup", "`microagent kernel install`"];
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
                // Host administration only the CLI does, so every front
                // end's user is sent to it (doctor's fixes).
                let line_left = HOST_ADMIN
                    .iter()
                    .fold(line.to_owned(), |l, admin| l.replace(admin, ""));
                if FRONT_END_WORDS.iter().any(|w| line_left.contains(w)) {
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

    /// The same layers, counting calls too: a module calling a method of
    /// the collection, a workspace's handle or a service (`Workspaces`,
    /// `Workspace`, `Volumes`, ...: `call_edges::SERVICE_TYPES`) leans on
    /// the module whose `impl` block defines it, though no path names it.
    /// Held at every level of every crate: between its top-level folders
    /// (its concerns) and between the files of each folder.
    #[test]
    fn no_folder_calls_what_calls_it() {
        let mut sources = crate::modules::crate_sources(&repo_root());
        sources.push(("xtask".into(), repo_root().join("xtask/src")));
        let mut found = Vec::new();
        for (name, src) in sources {
            let g = crate::modules::graph(&src).with_calls(&src);
            for (parent, group) in g.folder_cycles() {
                let at = if parent.is_empty() { "src" } else { &parent };
                found.push(format!("{name}: in {at}: {}", group.join(" <-> ")));
                for a in &group {
                    for b in group.iter().filter(|b| *b != a) {
                        for call in g.calls_between(&parent, a, b) {
                            found.push(format!("    {call}"));
                        }
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "folders that call each other's methods (`cargo xtask modules --edges` \
             lists the calls); move the method below both, or the call above:\n{}",
            found.join("\n")
        );
    }

    /// The VMM process carries only the VMM: the `microagent-vmm` package's
    /// normal dependencies have no async runtime, command-line parser, MCP
    /// server or client library (each would sit in every running
    /// workspace's memory); it shares records through the base crate.
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
                ["tokio", "clap", "rmcp", "oci-client", "workspace"].contains(&name)
            })
            .collect();
        assert!(
            banned.is_empty(),
            "microagent-vmm depends on {banned:?}; keep crates/vmm-host on the \
             `base` crate (crates/base), which has none of them"
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

    /// What the shipped programs print (messages, remedies, `--help`, the
    /// MCP tools' schemas) names the installed tool's commands, never the
    /// developer's: an installed user has no source checkout.
    #[test]
    fn shipped_words_name_no_developer_commands() {
        const DEVELOPER: &str = "cargo xtask";
        let mut found = Vec::new();
        for (name, src) in crate::modules::crate_sources(&repo_root()) {
            if name == "testkit" {
                continue;
            }
            let mut files = Vec::new();
            rust_files(&src, &mut files);
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                for (i, line) in code.lines().enumerate() {
                    let trimmed = line.trim_start();
                    // The CLI's doc comments are its `--help`.
                    let words =
                        !trimmed.starts_with("//") || (name == "cli" && trimmed.starts_with("///"));
                    if words && line.contains(DEVELOPER) {
                        found.push(format!("{}:{}", f.display(), i + 1));
                    }
                }
            }
        }
        let tools =
            std::fs::read_to_string(repo_root().join("crates/mcp/tests/tools_list.json")).unwrap();
        if tools.contains(DEVELOPER) {
            found.push("crates/mcp/tests/tools_list.json".into());
        }
        assert!(
            found.is_empty(),
            "say `microagent setup`, `microagent kernel install` or `microagent image build` instead of `{DEVELOPER}` in: {found:?}"
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
        let runner = repo_root().join("crates/base/src/host_tool.rs");
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
